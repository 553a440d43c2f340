#!/usr/bin/env bash
# Builds the upstream binaries Apiary's tests and images run, from source
# through the Go module proxy (nothing is downloaded from release sites).
#
#   hack/build-upstream.sh [BIN...]     default: kube-apiserver kubectl etcd etcdctl
#
# Output: $APIARY_CACHE/bin/<version>/<bin> (APIARY_CACHE defaults to
# ~/.cache/apiary). A binary already there is not rebuilt. Binaries are static
# (CGO_ENABLED=0) so that the same files fit scratch images later, and the
# Kubernetes ones are version-stamped (else they report v0.0.0 and kubectl
# version fails to parse the server version).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
cache=${APIARY_CACHE:-$HOME/.cache/apiary}
export CGO_ENABLED=0 GOFLAGS=-mod=mod

bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(kube-apiserver kubectl etcd etcdctl)

major=${KUBE_VERSION#v}; major=${major%%.*}
minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build() { # name dir pkg outdir ldflags
  local name=$1 dir=$2 pkg=$3 out=$4/$1 ldflags=$5
  if [ -x "$out" ]; then return 0; fi
  mkdir -p "$4"
  echo "building $name ($pkg) into $out" >&2
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "built $name in $((SECONDS - start))s" >&2
}

for b in "${bins[@]}"; do
  case $b in
    etcd)    build etcd "$here/tools/etcd" go.etcd.io/etcd/server/v3 "$cache/bin/etcd-$ETCD_VERSION" "" ;;
    etcdctl) build etcdctl "$here/tools/etcd" go.etcd.io/etcd/etcdctl/v3 "$cache/bin/etcd-$ETCD_VERSION" "" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|kubelet|kubeadm|kubectl)
             build "$b" "$here/tools" "k8s.io/kubernetes/cmd/$b" "$cache/bin/kubernetes-$KUBE_VERSION" "$stamp" ;;
    *) echo "unknown binary $b" >&2; exit 2 ;;
  esac
done
