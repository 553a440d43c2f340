#!/usr/bin/env bash
# Runs the e2e suites on the local management cluster.
#
# 1. Starts the cluster if it is not running, runs e2e/ (Apiary end to end)
#    and e2e/cluster's TestCluster on it.
# 2. If this run started the cluster: tears it down, then runs
#    e2e/cluster's TestLifecycle, which itself brings a cluster up from
#    nothing, down (checking that nothing is left on the host), up again and
#    down. With a cluster that was already running (yours), step 2 is not
#    run, so that it is not torn down; CI always starts from nothing.
# 3. On a failure, prints each failed test's own output last
#    (hack/testdigest): the reason a run is red, in the tail of a long log.
#
# gotestsum runs go test: it prints what go test -v prints and keeps the
# events (go test -json) the digest reads.
set -euo pipefail
cd "$(dirname "$0")/.."
devcluster() { go run ./hack/devcluster "$@"; }
events=$(mktemp -d)
trap 'rm -rf "$events"' EXIT
gotest() { # gotest EVENTS-FILE GO-TEST-ARGS...
  local json=$1
  shift
  go tool gotestsum --format standard-verbose --jsonfile "$events/$json" -- "$@"
}
started=0
devcluster status >/dev/null 2>&1 || started=1
if [ "$started" = 1 ]; then
  trap 'rm -rf "$events"; echo "tearing down the cluster this run started" >&2; devcluster down' EXIT
fi
devcluster up
set +e
# shellcheck disable=SC2086 # E2E_FLAGS holds flags.
gotest e2e.json -tags e2e -count=1 -p 1 -timeout 80m -skip TestLifecycle ${E2E_FLAGS:-} ./e2e/... 2>&1 | tee "${APIARY_E2E_LOG:-/dev/null}"
rc=${PIPESTATUS[0]}
set -e
if [ "$started" = 1 ]; then
  devcluster down
  trap 'rm -rf "$events"' EXIT
  set +e
  APIARY_E2E_LIFECYCLE=1 gotest lifecycle.json -tags e2e -count=1 -timeout 20m -run TestLifecycle ./e2e/cluster/ 2>&1 | tee -a "${APIARY_E2E_LOG:-/dev/null}"
  lrc=${PIPESTATUS[0]}
  set -e
  [ "$lrc" = 0 ] || rc=$lrc
else
  echo "e2e/cluster TestLifecycle not run: a cluster was already running (run make e2e without one to include it)" >&2
fi
if [ "$rc" != 0 ]; then
  for json in "$events"/*.json; do
    go run ./hack/testdigest "$json" || true
  done
fi
exit "$rc"
