#!/usr/bin/env bash
# Builds the upstream binaries Apiary's tests and images run, from source
# through the Go module proxy (nothing is downloaded from release sites).
#
#   hack/build-upstream.sh [NAME...]   default: kube-apiserver kubectl etcd etcdctl
#   hack/build-upstream.sh all         every binary below
#   hack/build-upstream.sh --list      print "name path" of every binary (builds nothing)
#
# A NAME is a component (builds all of its binaries) or a single binary:
#   component     output dir ($APIARY_CACHE/bin/...)  binaries              tools module
#   kubernetes    kubernetes-v1.37.2    kube-apiserver kube-controller-manager kube-scheduler
#                                       kube-proxy kubelet kubeadm kubectl      hack/tools
#   kubernetes-previous  kubernetes-v1.36.3  the same seven, named          hack/tools/kubernetes-previous
#                 previous/<binary> here (the previous minor: upgrade tests start there)
#   etcd          etcd-v3.6.16          etcd etcdctl                            hack/tools/etcd
#   containerd    containerd-v2.4.2     containerd containerd-shim-runc-v2 ctr  hack/tools/containerd
#   cni           cni-v1.10.0           bridge host-local loopback portmap firewall  hack/tools/cni
#   coredns       coredns-v1.14.6       coredns (without cloud plugins: main.go) hack/tools/coredns
#   coredns-previous  coredns-v1.14.2   coredns, named previous/coredns here    hack/tools/coredns-previous
#                 (each Kubernetes minor with the CoreDNS its kubeadm pairs it with)
#   metallb       metallb-v0.16.2       controller                              hack/tools/metallb (+ patch, see metallb_modfile)
#   registry      registry-v3.1.2       registry                                hack/tools/registry
#   helm          helm-v3.22.0          helm                                    hack/tools/helm
#   konnectivity  konnectivity-v0.36.0  proxy-server proxy-agent                hack/tools/konnectivity
#   kube-router   kube-router-v2.1.0    kube-router                             hack/tools/kube-router
#                 (the CNI of the e2e tests and make quickstart; see hack/cni/kube-router.yaml)
#   prometheus    prometheus-v0.316.0   promtool (checks and unit-tests the     hack/tools/prometheus
#                 chart's alert rules and dashboard: charts/*_test.go),
#                 prometheus (the server the e2e suite scrapes the operator with)
#
# Output: $APIARY_CACHE/bin/<component>-<version>/<bin> (APIARY_CACHE defaults
# to ~/.cache/apiary). A binary already there is not rebuilt (delete it to
# rebuild). Every binary is static (CGO_ENABLED=0, checked after the build) so
# that the same files fit scratch images, and is version-stamped where the
# upstream Makefile stamps it (else e.g. Kubernetes reports v0.0.0 and kubectl
# version fails to parse the server version). Versions come from the tools
# modules' go.mod; KUBE_VERSION/ETCD_VERSION/... may be set but must agree.
# Each build prints its time; several binaries of one tools module share
# compiled packages (the Go build cache), so the first one takes the longest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${APIARY_CACHE:-$HOME/.cache/apiary}
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false"

# modver DIR MODULE: the version of MODULE that the tools module in DIR requires.
modver() {
  local v
  v=$(awk -v m="$2" '($1 == m || ($1 == "require" && $2 == m)) && $0 !~ /=>/ { print ($1 == m ? $2 : $3); exit }' "$1/go.mod")
  [ -n "$v" ] || { echo "$1/go.mod does not require $2" >&2; exit 2; }
  echo "$v"
}
# pin VAR DIR MODULE: sets VAR to the version from go.mod; an environment
# override must agree with it (else the cache dir would lie).
pin() {
  local var=$1 v
  v=$(modver "$2" "$3")
  if [ -n "${!var:-}" ] && [ "${!var}" != "$v" ]; then
    echo "$var=${!var} but $2/go.mod pins $3 $v: change the tools module instead" >&2; exit 2
  fi
  printf -v "$var" %s "$v"
}
pin KUBE_VERSION "$here/tools" k8s.io/kubernetes
pin KUBE_PREVIOUS_VERSION "$here/tools/kubernetes-previous" k8s.io/kubernetes
pin ETCD_VERSION "$here/tools/etcd" go.etcd.io/etcd/server/v3
pin CONTAINERD_VERSION "$here/tools/containerd" github.com/containerd/containerd/v2
pin CNI_VERSION "$here/tools/cni" github.com/containernetworking/plugins
pin COREDNS_VERSION "$here/tools/coredns" github.com/coredns/coredns
pin COREDNS_PREVIOUS_VERSION "$here/tools/coredns-previous" github.com/coredns/coredns
pin METALLB_VERSION "$here/tools/metallb" go.universe.tf/metallb
pin REGISTRY_VERSION "$here/tools/registry" github.com/distribution/distribution/v3
pin HELM_VERSION "$here/tools/helm" helm.sh/helm/v3
pin KONNECTIVITY_VERSION "$here/tools/konnectivity" sigs.k8s.io/apiserver-network-proxy
pin KUBE_ROUTER_VERSION "$here/tools/kube-router" github.com/cloudnativelabs/kube-router/v2
pin PROMETHEUS_VERSION "$here/tools/prometheus" github.com/prometheus/prometheus

# kube_stamp VERSION: the ldflags that stamp a Kubernetes version.
kube_stamp() {
  local major minor pkg out=""
  major=${1#v}; major=${major%%.*}
  minor=${1#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$out"
}
cd_pkg=github.com/containerd/containerd/v2
containerd_stamp="-X $cd_pkg/version.Version=$CONTAINERD_VERSION -X $cd_pkg/version.Package=github.com/containerd/containerd/v2"
cni_stamp="-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_VERSION"
reg_pkg=github.com/distribution/distribution/v3
registry_stamp="-X $reg_pkg/version.version=$REGISTRY_VERSION -X $reg_pkg/version.mainpkg=$reg_pkg"
# helm's Makefile also stamps the Kubernetes version it assumes when no
# cluster is asked (helm template's .Capabilities.KubeVersion): without it
# that is v1.20.0, which fails charts with a kubeVersion constraint.
helm_kube=$(modver "$here/tools/helm" k8s.io/client-go); helm_kube=${helm_kube#v0.}; helm_kube=${helm_kube%%.*}
helm_stamp="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  helm_stamp+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_kube"
done

# spec[binary]="output dir under $cache/bin|tools module dir|package|build tags|ldflags"
kube_bins=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubeadm kubectl)
cni_bins=(bridge host-local loopback portmap firewall)
declare -A spec
for b in "${kube_bins[@]}"; do
  spec[$b]="kubernetes-$KUBE_VERSION|$here/tools|k8s.io/kubernetes/cmd/$b||$(kube_stamp "$KUBE_VERSION")"
  spec[previous/$b]="kubernetes-$KUBE_PREVIOUS_VERSION|$here/tools/kubernetes-previous|k8s.io/kubernetes/cmd/$b||$(kube_stamp "$KUBE_PREVIOUS_VERSION")"
done
spec[etcd]="etcd-$ETCD_VERSION|$here/tools/etcd|go.etcd.io/etcd/server/v3||"
spec[etcdctl]="etcd-$ETCD_VERSION|$here/tools/etcd|go.etcd.io/etcd/etcdctl/v3||"
cd_tags="no_btrfs no_devmapper no_zfs"
for b in containerd containerd-shim-runc-v2 ctr; do
  spec[$b]="containerd-$CONTAINERD_VERSION|$here/tools/containerd|$cd_pkg/cmd/$b|$cd_tags|$containerd_stamp"
done
cni_pkg=github.com/containernetworking/plugins/plugins
spec[bridge]="cni-$CNI_VERSION|$here/tools/cni|$cni_pkg/main/bridge||$cni_stamp"
spec[loopback]="cni-$CNI_VERSION|$here/tools/cni|$cni_pkg/main/loopback||$cni_stamp"
spec[host-local]="cni-$CNI_VERSION|$here/tools/cni|$cni_pkg/ipam/host-local||$cni_stamp"
spec[portmap]="cni-$CNI_VERSION|$here/tools/cni|$cni_pkg/meta/portmap||$cni_stamp"
spec[firewall]="cni-$CNI_VERSION|$here/tools/cni|$cni_pkg/meta/firewall||$cni_stamp"
# CoreDNS's main with the plugins a cluster's DNS uses (see its main.go).
spec[coredns]="coredns-$COREDNS_VERSION|$here/tools/coredns|github.com/apiaryhq/apiary/hack/tools/coredns||"
spec[previous/coredns]="coredns-$COREDNS_PREVIOUS_VERSION|$here/tools/coredns-previous|github.com/apiaryhq/apiary/hack/tools/coredns-previous||"
spec[controller]="metallb-$METALLB_VERSION|$here/tools/metallb|go.universe.tf/metallb/controller||"
spec[registry]="registry-$REGISTRY_VERSION|$here/tools/registry|$reg_pkg/cmd/registry||$registry_stamp"
spec[helm]="helm-$HELM_VERSION|$here/tools/helm|helm.sh/helm/v3/cmd/helm||$helm_stamp"
spec[proxy-server]="konnectivity-$KONNECTIVITY_VERSION|$here/tools/konnectivity|sigs.k8s.io/apiserver-network-proxy/cmd/server||"
kr_pkg=github.com/cloudnativelabs/kube-router/v2
# kube-router's Makefile stamps its version; without it the binary says "".
spec[kube-router]="kube-router-$KUBE_ROUTER_VERSION|$here/tools/kube-router|$kr_pkg/cmd/kube-router||-X $kr_pkg/pkg/version.Version=$KUBE_ROUTER_VERSION -X $kr_pkg/pkg/version.BuildDate=1970-01-01T00:00:00Z"
spec[proxy-agent]="konnectivity-$KONNECTIVITY_VERSION|$here/tools/konnectivity|sigs.k8s.io/apiserver-network-proxy/cmd/agent||"
spec[promtool]="prometheus-$PROMETHEUS_VERSION|$here/tools/prometheus|github.com/prometheus/prometheus/cmd/promtool||"
# The server for the e2e suite's scrape of the operator: remove_all_sd
# leaves out every service discovery but static targets (the cloud SDKs
# are most of its build), the UI's assets are not embedded (its API is
# what the tests use).
spec[prometheus]="prometheus-$PROMETHEUS_VERSION|$here/tools/prometheus|github.com/prometheus/prometheus/cmd/prometheus|remove_all_sd|"

declare -A groups=(
  [kubernetes]="${kube_bins[*]}"
  [kubernetes-previous]="${kube_bins[*]/#/previous/}"
  [etcd]="etcd etcdctl"
  [containerd]="containerd containerd-shim-runc-v2 ctr"
  [cni]="${cni_bins[*]}"
  [coredns]=coredns
  [coredns-previous]=previous/coredns
  [metallb]=controller
  [registry]=registry
  [helm]=helm
  [konnectivity]="proxy-server proxy-agent"
  [kube-router]=kube-router
  [prometheus]="promtool prometheus"
)
order=(kubernetes etcd containerd cni coredns metallb registry helm konnectivity kube-router prometheus kubernetes-previous coredns-previous)

# metallb_modfile prepares a `go build -modfile` for the MetalLB controller and
# prints its path. MetalLB v0.16.2 requires github.com/metallb/frr-k8s
# v0.0.27, which the module proxy does not serve; hack/tools/metallb replaces
# it with v0.0.21, whose API lacks what metallb's frr-k8s BGP backend writes:
# Advertise.PrefixesWithAsPathPrepend and the type AsPathPrependPrefixes.
# This makes, in the cache (nothing is copied into this repo), a copy of
# v0.0.21's api/v1beta1 from the module cache with both added, and a copy of
# the tools module's go.mod/go.sum that replaces frr-k8s with it. (go build
# -overlay cannot patch files in the module cache.) The controller only
# allocates addresses and never runs that backend (the speaker would), so
# this only has to compile.
metallb_modfile() {
  local src dir=$cache/patched/metallb-$METALLB_VERSION dst
  dst=$dir/frr-k8s
  # go list names the module's directory only once it is in the module
  # cache (a fresh machine has nothing there yet).
  (cd "$here/tools/metallb" && go mod download github.com/metallb/frr-k8s) || return 1
  src=$(cd "$here/tools/metallb" && go list -m -f '{{with .Replace}}{{.Dir}}{{else}}{{.Dir}}{{end}}' github.com/metallb/frr-k8s)
  [ -d "$src/api/v1beta1" ] || { echo "metallb: no frr-k8s source in the module cache ($src)" >&2; return 1; }
  rm -rf "$dir"
  mkdir -p "$dst/api/v1beta1"
  cp "$src/go.mod" "$src/LICENSE" "$dst/"
  local f
  for f in "$src"/api/v1beta1/*.go; do
    case $f in *_test.go) ;; *) cp "$f" "$dst/api/v1beta1/" ;; esac
  done
  chmod -R u+w "$dst"
  if ! grep -q 'AsPathPrependPrefixes' "$dst"/api/v1beta1/*.go; then
    local types=$dst/api/v1beta1/frrconfiguration_types.go
    awk '/^type Advertise struct/ { in_adv = 1 }
         in_adv && /^}/ {
           print "\n\t// PrefixesWithAsPathPrepend: prefixes advertised with an AS path prepend (added for metallb v0.16.2)."
           print "\t// +optional"
           print "\tPrefixesWithAsPathPrepend []AsPathPrependPrefixes `json:\"withAsPathPrepend,omitempty\"`"
           in_adv = 0
         }
         { print }' "$src/api/v1beta1/frrconfiguration_types.go" >"$types"
    grep -q PrefixesWithAsPathPrepend "$types" || { echo "metallb: no Advertise struct in $src/api/v1beta1" >&2; return 1; }
    cat >"$dst/api/v1beta1/zz_apiary_aspathprepend.go" <<'EOF2'
// Added by Apiary's hack/build-upstream.sh: the part of frr-k8s v0.0.27's API
// that metallb v0.16.2 uses and v0.0.21 lacks.

package v1beta1

// AsPathPrependPrefixes is a list of prefixes advertised with an AS path
// prepended AsPathPrepend times.
type AsPathPrependPrefixes struct {
	Prefixes      []string `json:"prefixes,omitempty"`
	AsPathPrepend uint8    `json:"asPathPrepend,omitempty"`
}
EOF2
  fi
  sed "s#^replace github.com/metallb/frr-k8s => .*#replace github.com/metallb/frr-k8s => $dst#" \
    "$here/tools/metallb/go.mod" >"$dir/go.mod"
  grep -q "^replace github.com/metallb/frr-k8s => $dst\$" "$dir/go.mod" ||
    { echo "metallb: hack/tools/metallb/go.mod has no replace of github.com/metallb/frr-k8s" >&2; return 1; }
  cp "$here/tools/metallb/go.sum" "$dir/go.sum"
  echo "$dir/go.mod"
}

# A binary's file is its name without a "previous/" prefix.
path_of() { local s=${spec[$1]}; echo "$cache/bin/${s%%|*}/${1##*/}"; }

build() { # name
  local name=$1 comp dir pkg tags ldflags out
  IFS='|' read -r comp dir pkg tags ldflags <<<"${spec[$name]}"
  out=$cache/bin/$comp/${name##*/}
  if [ -x "$out" ]; then echo "cached $name ($out)" >&2; return 0; fi
  mkdir -p "$(dirname "$out")"
  echo "building $name ($pkg) into $out" >&2
  local start=$SECONDS env=()
  # Its go.sum lines are already there; the checksum database refuses the
  # versions that aren't the newest, so never ask it about this module.
  [ "$comp" != "konnectivity-$KONNECTIVITY_VERSION" ] || env=(GONOSUMDB=sigs.k8s.io/apiserver-network-proxy)
  # A temporary name of our own: two builds of the same binary at once
  # (parallel sessions) must not write one file.
  local tmp="$out.tmp.$$"
  trap "rm -f -- '$tmp'" EXIT
  local extra=() modfile
  if [ "$name" = controller ]; then modfile=$(metallb_modfile) || exit 1; extra=(-modfile "$modfile"); fi
  (cd "$dir" && env "${env[@]}" go build -trimpath ${tags:+-tags "$tags"} "${extra[@]}" -ldflags "-s -w $ldflags" -o "$tmp" "$pkg")
  if ! go version -m "$tmp" | grep -q 'CGO_ENABLED=0'; then
    echo "$name: not a static (CGO_ENABLED=0) build" >&2; exit 1
  fi
  mv -f "$tmp" "$out"
  trap - EXIT
  echo "built $name in $((SECONDS - start))s" >&2
  built+=("$name:$((SECONDS - start))s")
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(kube-apiserver kubectl etcd etcdctl)
if [ "${names[0]}" = --list ]; then
  for g in "${order[@]}"; do for b in ${groups[$g]}; do echo "$b $(path_of "$b")"; done; done
  exit 0
fi
want=()
for n in "${names[@]}"; do
  if [ "$n" = all ]; then
    for g in "${order[@]}"; do want+=(${groups[$g]}); done
  elif [ -n "${groups[$n]:-}" ]; then
    want+=(${groups[$n]})
  elif [ -n "${spec[$n]:-}" ]; then
    want+=("$n")
  else
    echo "unknown name $n; components: all ${order[*]}; binaries: ${!spec[*]}" >&2; exit 2
  fi
done

built=()
total=$SECONDS
declare -A done_
for b in "${want[@]}"; do
  [ -z "${done_[$b]:-}" ] || continue
  done_[$b]=1
  build "$b"
done
if [ ${#built[@]} -gt 0 ]; then
  echo "built ${#built[@]} binaries in $((SECONDS - total))s: ${built[*]}" >&2
fi
