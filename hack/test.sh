#!/usr/bin/env bash
# Runs Kubefill's tests. With no argument it runs every stage in order:
#   checks       gofmt, go.mod tidy, go vet, generated files up to date, API module builds alone
#   unit         go test over the product packages and the API module (the
#                fuzz targets' corpora run here as regression tests), then
#                fuzzing within a fixed budget (hack/fuzz.sh)
#   integration  tests/integration against a real kube-apiserver and etcd
#   e2e          the local cluster's own tests (csi-sanity, real node start/stop,
#                tests/cluster/selftest), then tests/e2e, tests/installed and tests/load on it
# Name stages to run only those: hack/test.sh unit integration
#
# Every go test runs with -json through tests/internal/testreport, which
# prints what go test would and keeps the events in $KUBEFILL_TEST_REPORT
# (default _output/test-report); at the end each step's wall time and its
# ten slowest tests are printed. TEST_VERBOSE=1 prints every test's output.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(checks unit integration e2e)

API_DIR=staging/src/github.com/kubefill/kubefill-api
# Tests that call t.Parallel (e2e, the harness's self-tests) wait on pods and
# the API, not on the CPU: four at once on two cores.
PARALLEL="${TEST_PARALLEL:-4}"
REPORT="${KUBEFILL_TEST_REPORT:-$PWD/_output/test-report}"
rm -rf "$REPORT" && mkdir -p "$REPORT"
go build -o "$REPORT/testreport" ./tests/internal/testreport
t0=$(date +%s)
stage() { echo; echo "=== $1 ($(( $(date +%s) - t0 ))s elapsed)"; }

# On exit, however the run ends: what stages asked to clean up, then the summary.
cleanup=()
on_exit() {
  local c
  for c in "${cleanup[@]}"; do eval "$c"; done
  echo
  echo "=== where the time went (events in $REPORT)"
  "$REPORT/testreport" summary -dir "$REPORT" || true
}
trap on_exit EXIT

# step NAME CMD... runs CMD (a subshell with set -e) and records its wall
# time and outcome as NAME.
step() {
  local name=$1 start rc
  shift
  start=$(date +%s%N)
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  printf '%s\t%s\t%s\n' "$name" "$(awk -v ns=$(( $(date +%s%N) - start )) 'BEGIN { printf "%.1f", ns / 1e9 }')" \
    "$([ $rc = 0 ] && echo ok || echo "failed (exit $rc)")" >>"$REPORT/steps.tsv"
  return $rc
}
# gotest NAME ARGS... is step NAME over `go test -json ARGS`.
gotest() {
  local name=$1
  shift
  step "$name" go_test_json "$name" "$@"
}
go_test_json() {
  local name=$1
  shift
  go test -json "$@" | "$REPORT/testreport" tee -dir "$REPORT" -step "$name" ${TEST_VERBOSE:+-v}
}

has_go_files() { [ -d "$1" ] && [ -n "$(find "$1" -name '*.go' -print -quit)" ]; }

checks() {
  make --no-print-directory fmt
  go mod tidy -diff || { echo "go.mod is not tidy: run 'go mod tidy'"; return 1; }
  go vet ./...
  (cd "$API_DIR" && go vet ./... && go build ./...)
  make --no-print-directory verify-generated
}

run_checks() {
  stage "checks"
  step checks checks
}

run_unit() {
  stage "unit tests"
  bash hack/deps.sh
  local pkgs=(./cmd/...)
  has_go_files pkg && pkgs+=(./pkg/...)
  # The test kit and the harness's small shared packages have tests of their own.
  pkgs+=(./tests/kit/... ./tests/internal/...)
  gotest unit -count=1 -timeout 15m "${pkgs[@]}"
  (cd "$API_DIR" && gotest unit-api -count=1 ./...)
  if [ -f hack/fuzz.sh ]; then
    stage "fuzzing within a budget"
    step fuzz bash hack/fuzz.sh
  fi
}

run_integration() {
  stage "integration tests (real kube-apiserver + etcd)"
  KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
  export KUBEBUILDER_ASSETS
  gotest integration -count=1 -timeout 20m ./tests/integration/...
}

e2e_builds() {
  bash hack/deps.sh
  bash hack/testbin.sh >/dev/null
  # The CSI sidecars are built once from the Go module proxy and cached;
  # building them here shows the cold-build time on a fresh machine.
  local t
  t=$(date +%s)
  bash hack/sidecars.sh >/dev/null
  echo "sidecars ready in $(( $(date +%s) - t ))s"
  # KubeVirt's own virtctl, for tests/e2e/virtctl_test.go (built and cached the same way).
  t=$(date +%s)
  bash hack/virtctl.sh >/dev/null
  echo "virtctl ready in $(( $(date +%s) - t ))s"
  # The real node's containerd, runc shim, CNI plugins and CoreDNS, and the
  # images its pods run (built here, no registry).
  t=$(date +%s)
  bash hack/node.sh >/dev/null
  echo "node binaries ready in $(( $(date +%s) - t ))s"
  t=$(date +%s)
  bash hack/images.sh "$KUBEFILL_IMAGES" >/dev/null
  echo "images built in $(( $(date +%s) - t ))s"
}

run_e2e() {
  if ! has_go_files tests/e2e; then
    stage "e2e: no tests/e2e yet, skipped"
    return
  fi
  stage "end-to-end tests (local cluster)"
  KUBEFILL_IMAGES="$(mktemp -d)"
  export KUBEFILL_IMAGES
  cleanup+=('rm -rf "$KUBEFILL_IMAGES"')
  step e2e-builds e2e_builds
  KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
  KUBEFILL_VIRTCTL="$(bash hack/virtctl.sh)/virtctl"
  export KUBEBUILDER_ASSETS KUBEFILL_VIRTCTL
  # The harness's own parts: CSI driver (csi-sanity), the real node's start
  # and stop (nothing left on the host), the dev CLI's up and down; then its
  # self-tests on a cluster of their own (one real node at a time: not
  # beside tests/cluster's own starts).
  local harness
  harness=$(go list ./tests/csi/... ./tests/cluster/... | grep -v /tests/cluster/selftest)
  # shellcheck disable=SC2086 # package paths, one a line
  gotest harness -count=1 -timeout 20m $harness
  gotest harness-selftest -count=1 -timeout 20m -parallel "$PARALLEL" ./tests/cluster/selftest/
  gotest e2e -count=1 -timeout 40m -parallel "$PARALLEL" ./tests/e2e/...
  # The install itself (manifests/ applied, every component a pod from the
  # image) and a smoke set against it; a cluster of its own, after e2e's.
  gotest installed -count=1 -timeout 20m ./tests/installed/...
  # Load and scale at small counts, the controller as a process (full counts: make bench-load).
  gotest load -count=1 -timeout 15m ./tests/load/...
}

for s in "${stages[@]}"; do
  case "$s" in
    checks) run_checks ;;
    unit) run_unit ;;
    integration) run_integration ;;
    e2e) run_e2e ;;
    *) echo "unknown stage $s (want checks, unit, integration or e2e)" >&2; exit 2 ;;
  esac
done
echo; echo "=== all requested stages passed in $(( $(date +%s) - t0 ))s"
