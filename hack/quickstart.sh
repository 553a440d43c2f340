#!/usr/bin/env bash
# make quickstart: from nothing to a tenant control plane answering through a
# LoadBalancer on this machine. Every step is idempotent; run it again to
# resume after a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${QUICKSTART_DIR:-$PWD/.quickstart}
mkdir -p "$out"
cache=${APIARY_CACHE:-$HOME/.cache/apiary}
helm=$cache/bin/helm-v3.22.0/helm
kubectl=$cache/bin/kubernetes-v1.37.2/kubectl
step() { printf '\n==> %s\n' "$*" >&2; }
start=$SECONDS

step "Starting the local management cluster (hack/devcluster up)"
go run ./hack/devcluster up
export KUBECONFIG=$(go run ./hack/devcluster kubeconfig -path)

step "Building bin/apiary"
make -s build

step "Installing the Helm chart (charts/apiary) into apiary-system"
# The operator pulls node bundles from the local registry at the node address.
node_ip=$("$kubectl" get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
"$helm" upgrade --install apiary charts/apiary --namespace apiary-system --create-namespace \
  --set image.pullPolicy=Always \
  --set defaultDataStore.managed.storage.emptyDir=true \
  --set operator.nodeBundle.repository="$node_ip:5000/apiaryhq/node-bundle" \
  --set operator.nodeBundle.insecure=true \
  --wait --timeout 5m
"$kubectl" wait --for=condition=Ready datastore/default --timeout=5m

step "Creating the demo tenant control plane tenants/demo"
"$kubectl" create namespace tenants --dry-run=client -o yaml | "$kubectl" apply -f - >/dev/null
"$kubectl" apply -f - <<'YAML'
apiVersion: apiary.dev/v1alpha1
kind: TenantControlPlane
metadata: {name: demo, namespace: tenants}
spec:
  version: v1.37.2
  replicas: 2
YAML
"$kubectl" -n tenants wait --for=condition=Ready tcp/demo --timeout=5m
bin/apiary status -n tenants

step "Writing the tenant's admin kubeconfig to $out/demo.kubeconfig"
bin/apiary kubeconfig demo -n tenants > "$out/demo.kubeconfig"

step "Talking to the tenant through its LoadBalancer"
"$kubectl" --kubeconfig "$out/demo.kubeconfig" get namespaces

cat <<EOF2

Done in $((SECONDS - start))s. What next:

  export KUBECONFIG=$KUBECONFIG          # the management cluster
  bin/apiary status -A                   # every tenant and its conditions
  bin/apiary status demo -n tenants      # one tenant in detail
  $kubectl --kubeconfig $out/demo.kubeconfig get ns     # inside the tenant
  go run ./hack/devcluster logs          # component logs
  make down                              # tear everything down
EOF2
