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

step "Installing a pod network into the tenant (kube-router, hack/cni/kube-router.yaml)"
"$kubectl" --kubeconfig "$out/demo.kubeconfig" apply -f hack/cni/kube-router.yaml

# A second run keeps the worker it joined (starting the machine again would
# give it new keys).
if ! "$kubectl" -n tenants get host worker-1 >/dev/null 2>&1; then
  step "Starting a worker machine (hack/testhost: a container with systemd, sshd and containerd)"
  addr=$(go run ./hack/testhost up quickstart-worker -dir "$out" -registry-mirror "http://$node_ip:5000")

  step "Joining it to the tenant as Node worker-1 (apiary host add; the agent installs and joins over SSH)"
  bin/apiary host add worker-1 -n tenants --tenant demo --address "$addr" \
    --ssh-key-file "$out/quickstart-worker.key" --host-key "$(cat "$out/quickstart-worker.pub")"
fi
"$kubectl" -n tenants wait --for=jsonpath='{.status.phase}'=Ready host/worker-1 --timeout=10m
bin/apiary host list -n tenants
"$kubectl" --kubeconfig "$out/demo.kubeconfig" get nodes -o wide

step "Running a pod on the worker"
"$kubectl" --kubeconfig "$out/demo.kubeconfig" delete pod hello --ignore-not-found >/dev/null
"$kubectl" --kubeconfig "$out/demo.kubeconfig" run hello --image=docker.io/library/busybox:1.35.0 --restart=Never \
  -- sh -c 'echo "hello from pod $(hostname)"'
"$kubectl" --kubeconfig "$out/demo.kubeconfig" wait --for=jsonpath='{.status.phase}'=Succeeded pod/hello --timeout=3m
"$kubectl" --kubeconfig "$out/demo.kubeconfig" logs hello
"$kubectl" --kubeconfig "$out/demo.kubeconfig" get pod hello -o wide

cat <<EOF2

Done in $((SECONDS - start))s. What next:

  export KUBECONFIG=$KUBECONFIG          # the management cluster
  bin/apiary status -A                   # every tenant and its conditions
  bin/apiary status demo -n tenants      # one tenant in detail
  $kubectl --kubeconfig $out/demo.kubeconfig get nodes  # inside the tenant
  bin/apiary host list -n tenants        # the worker Host and its phase
  go run ./hack/devcluster logs          # component logs
  make down                              # tear everything down
EOF2
