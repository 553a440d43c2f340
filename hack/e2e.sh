#!/usr/bin/env bash
# Runs the e2e suite on the local management cluster. Starts the cluster if it
# is not running, and tears down only what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
devcluster() { go run ./hack/devcluster "$@"; }
started=0
devcluster status >/dev/null 2>&1 || started=1
if [ "$started" = 1 ]; then
  trap 'echo "tearing down the cluster this run started" >&2; devcluster down' EXIT
fi
devcluster up
set +e
go test -tags e2e -count=1 -timeout 40m -v ${E2E_FLAGS:-} ./e2e/... 2>&1 | tee "${APIARY_E2E_LOG:-/dev/null}"
rc=${PIPESTATUS[0]}
set -e
exit "$rc"
