# Apiary — see README.md. Every target builds what it needs; nothing is
# downloaded except Go modules and Debian packages.

SHELL := /usr/bin/env bash
KUBE_VERSION ?= v1.37.2
ETCD_VERSION ?= v3.6.16
APIARY_CACHE ?= $(HOME)/.cache/apiary
# Where hack/build-upstream.sh puts the from-source upstream binaries; the
# integration tests find kube-apiserver, kubectl and etcd through these.
export APIARY_KUBE_BIN := $(APIARY_CACHE)/bin/kubernetes-$(KUBE_VERSION)
export APIARY_ETCD_BIN := $(APIARY_CACHE)/bin/etcd-$(ETCD_VERSION)
export APIARY_CACHE KUBE_VERSION ETCD_VERSION

CONTROLLER_GEN := go tool controller-gen
GO_TEST_FLAGS ?=

.PHONY: all build generate verify-generated vet fmt-check deps tools images unit fuzz integration e2e test bench quickstart cluster-up cluster-down down clean help

all: build

help: ## Show the targets.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## Build the apiary binary into bin/.
	CGO_ENABLED=0 go build -trimpath -o bin/apiary ./cmd/apiary

generate: ## Regenerate deepcopy, CRDs, RBAC and webhook manifests.
	$(CONTROLLER_GEN) object paths=./operator/api/...
	$(CONTROLLER_GEN) crd paths=./operator/api/... output:crd:artifacts:config=charts/apiary/crds
	$(CONTROLLER_GEN) rbac:roleName=apiary-operator paths=./operator/... output:rbac:artifacts:config=charts/apiary/files/rbac
	$(CONTROLLER_GEN) webhook paths=./operator/... output:webhook:artifacts:config=charts/apiary/files/webhook

verify-generated: generate ## Fail when generated files are out of date.
	@git diff --exit-code -- operator/api charts/apiary/crds charts/apiary/files || \
	  { echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; }

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed: $$out" >&2; exit 1; }

# One pass with both tags: no package holds files of both, and every
# untagged file is in it too (three passes type-checked those three times).
vet: ## go vet, including the integration- and e2e-tagged files.
	go vet -tags integration,e2e ./...

deps: ## Install the Debian packages a fresh machine lacks (runc, iptables, conntrack, ...).
	hack/install-deps.sh

tools: ## Build every upstream binary from source (cached; 26 to 38 min cold on 2 cores): Kubernetes v1.37 and v1.36, etcd, containerd, CNI, CoreDNS, MetalLB, registry, helm, konnectivity, kube-router, Prometheus (promtool and server).
	hack/build-upstream.sh all

images: tools ## Save docker-save tarballs of every image (the local cluster pushes them to its registry itself).
	go run ./hack/images/cmd/build-images -previous -save $(APIARY_CACHE)/images/tarballs

cluster-up: deps tools ## Start the local management cluster (idempotent).
	go run ./hack/devcluster up

cluster-down: ## Stop the local management cluster and remove what it made.
	go run ./hack/devcluster down

down: ## Tear down what make quickstart started (its worker machine, dockerd, the local cluster).
	go run ./hack/testhost down
	go run ./hack/devcluster down

quickstart: deps tools ## Local cluster, Helm install, a demo tenant, its kubeconfig, kubectl through its LoadBalancer.
	hack/quickstart.sh

unit: deps ## Unit tests (no external processes; some read host tools such as iptables, which deps installs).
	go test $(GO_TEST_FLAGS) ./...

# Budgets in executions, about 10 to 15 s each on 2 cores: a budget in
# seconds races Go 1.26's fuzz coordinator at its deadline (go.dev/issue/75804,
# fixed in Go 1.27), which fails a run under load with a bare "context
# deadline exceeded" and no failing input. -timeout bounds a hung worker.
fuzz: ## A short run of each fuzz target (their seeds run in unit too).
	go test -run '^$$' -fuzz '^FuzzExtraArgs$$' -fuzztime 30000x -timeout 5m ./operator/webhooks
	go test -run '^$$' -fuzz '^FuzzValidateHost$$' -fuzztime 15000x -timeout 5m ./operator/webhooks
	go test -run '^$$' -fuzz '^FuzzQuote$$' -fuzztime 2000x -timeout 5m ./hosts
	go test -run '^$$' -fuzz '^FuzzParsePreflight$$' -fuzztime 30000x -timeout 5m ./hosts

integration: deps tools ## Integration tests against real kube-apiserver and etcd.
	go test -tags integration -count=1 $(GO_TEST_FLAGS) ./...

e2e: deps tools ## The e2e suite on the local management cluster (started and torn down if not running).
	hack/e2e.sh

test: fmt-check verify-generated vet unit fuzz integration e2e ## Every test: unit, integration, e2e.

bench: tools ## Benchmarks; see docs/benchmarks.md.
	go test -tags integration -run '^$$' -bench . -benchmem ./bench/...

clean:
	rm -rf bin/
