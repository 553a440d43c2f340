#!/usr/bin/env bash
# Installs the Debian packages the local management cluster needs and a fresh
# machine lacks. Everything else (Kubernetes, etcd, containerd, CNI plugins,
# CoreDNS, MetalLB, the registry, helm) is built from source by
# hack/build-upstream.sh. docker.io and debootstrap are for the SSH test hosts
# (e2e/sshhost: a dockerd of its own and a debootstrapped Debian image).
# ipset and busybox-static go into images: kube-router (the test CNI) runs
# iptables, ipset and ip from this machine like kube-proxy runs iptables, and
# its CNI-config init container and the e2e workload run busybox. chromium
# (headless) is the real browser the dashboard's tests drive.
set -euo pipefail
pkgs=(make git runc iptables conntrack iproute2 socat ca-certificates docker.io debootstrap ipset busybox-static chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages: ${missing[*]}; run as root (or install them) first" >&2
  exit 1
fi
echo "installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
