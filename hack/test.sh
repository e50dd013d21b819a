#!/usr/bin/env bash
# Runs Kubefill's tests. With no argument it runs every stage in order:
#   checks       gofmt, go.mod tidy, go vet, generated files up to date, API module builds alone
#   unit         go test over the product packages and the API module (the
#                fuzz targets' corpora run here as regression tests), then
#                fuzzing within a fixed budget (hack/fuzz.sh)
#   integration  tests/integration against a real kube-apiserver and etcd
#   e2e          the local cluster's own tests (real node start/stop, dev up/down,
#                tests/cluster/selftest), then tests/e2e on a cluster, and
#                tests/installed and tests/load on one they share
# Name stages to run only those: hack/test.sh unit integration
# With e2e, unit, integration and the harness's tests that need no real node
# run beside it (SIDE_BY_SIDE=0: one after the other).
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
# Tests that call t.Parallel (integration, e2e, the harness's self-tests,
# the installed tenancy tests) wait on pods and the API, not on the CPU:
# four at once on two cores.
PARALLEL="${TEST_PARALLEL:-4}"
# The e2e tests' parallel group runs once the stages beside it have ended,
# and waits on pods far more than on the CPU: six at once, chosen longest
# first by the package's own scheduler (tests/e2e/schedule_test.go), so
# go test's -parallel is set above the number of tests.
E2E_PARALLEL="${TEST_E2E_PARALLEL:-6}"
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
  # The steps' total counts integration's time and e2e's both, though they
  # run side by side; this is the run's own.
  echo "wall time of this run: $(( $(date +%s) - t0 ))s"
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
  gotest integration -count=1 -timeout 20m -parallel "$PARALLEL" ./tests/integration/...
}

# The harness's tests that start a real node; the rest of tests/cluster and
# tests/csi need none and run beside the end-to-end tests.
REAL_NODE_HARNESS_TESTS='^(TestRealNodeStartStop|TestDevUpDown)$'

# run_harness_parts runs the harness's own tests that need no real node: the
# CSI driver (csi-sanity, loop devices, bind mounts), the pause binary, and
# tests/cluster's control-plane starts and restarts.
run_harness_parts() {
  stage "the harness's own tests that need no real node"
  KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
  export KUBEBUILDER_ASSETS
  bash hack/sidecars.sh >/dev/null
  local pkgs
  pkgs=$(go list ./tests/csi/... ./tests/cluster/cmd/...)
  # shellcheck disable=SC2086 # package paths, one a line
  gotest harness-parts -count=1 -timeout 20m $pkgs
  gotest harness-cluster -count=1 -timeout 20m -skip "$REAL_NODE_HARNESS_TESTS" ./tests/cluster/
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
  # The harness's parts that need no real node run beside (run_harness_parts);
  # here the ones that start one: the real node's start and stop (nothing
  # left on the host) and the dev CLI's up and down; then its self-tests on
  # a cluster of their own (one real node at a time: not beside
  # tests/cluster's own starts).
  in_lane harness_parts || run_harness_parts
  gotest harness -count=1 -timeout 20m -run "$REAL_NODE_HARNESS_TESTS" ./tests/cluster/
  gotest harness-selftest -count=1 -timeout 20m -parallel "$PARALLEL" ./tests/cluster/selftest/
  KUBEFILL_E2E_PARALLEL="$E2E_PARALLEL" gotest e2e -count=1 -timeout 40m -parallel 64 ./tests/e2e/...
  # tests/installed and tests/load share one cluster after e2e's, which
  # kubefill-dev starts and, after both, removes, checking that nothing is
  # left on the host. First the install itself (manifests/ applied, every
  # component a pod from the image) and a smoke set against it, uninstalled
  # at its end; then load and scale at small counts, the controller as a
  # process (full counts: make bench-load).
  local dev shared
  dev="$REPORT/kubefill-dev"
  go build -o "$dev" ./tests/cluster/cmd/kubefill-dev
  shared=$(mktemp -d "${TMPDIR:-/tmp}/kubefill-cluster-shared-XXXXXX")
  cleanup+=("\"$dev\" down --dir \"$shared\" >/dev/null 2>&1 || true")
  step shared-cluster-up "$dev" up --dir "$shared"
  export KUBEFILL_SHARED_CLUSTER="$shared"
  gotest installed -count=1 -timeout 20m -parallel "$PARALLEL" ./tests/installed/...
  gotest load -count=1 -timeout 15m ./tests/load/...
  unset KUBEFILL_SHARED_CLUSTER
  step shared-cluster-down "$dev" down --dir "$shared"
}

# The stages that need no local cluster (unit with its fuzzing, integration
# with a kube-apiserver and etcd of its own) run beside e2e when it runs:
# e2e's stage waits on one real node at a time, and these do not need it.
# Their output is kept and printed once they end; SIDE_BY_SIDE=0 runs
# every stage one after the other.
wants() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
lane=()
if [ "${SIDE_BY_SIDE:-1}" = 1 ] && wants e2e; then
  for s in "${stages[@]}"; do
    case "$s" in unit | integration) lane+=("$s") ;; esac
  done
  has_go_files tests/e2e && lane+=(harness_parts)
fi
in_lane() { local s; for s in "${lane[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
lane_pid=
start_lane() {
  stage "${lane[*]} beside the end-to-end tests; their output once they end"
  # Installed once here, not by both lanes at once.
  bash hack/deps.sh
  # A process group of its own, so that an early exit ends all of it.
  set -m
  (for s in "${lane[@]}"; do "run_$s"; done) >"$REPORT/beside-e2e.out" 2>&1 &
  lane_pid=$!
  set +m
  cleanup+=('stop_lane')
}
stop_lane() {
  [ -n "$lane_pid" ] || return 0
  if kill -0 "$lane_pid" 2>/dev/null; then
    kill -TERM -- "-$lane_pid" 2>/dev/null || true
    wait "$lane_pid" 2>/dev/null || true
    echo; echo "=== ${lane[*]}, stopped early: their output"
    cat "$REPORT/beside-e2e.out"
  fi
  lane_pid=
}
wait_lane() {
  local rc=0
  wait "$lane_pid" || rc=$?
  lane_pid=
  echo; echo "=== ${lane[*]}, run beside the end-to-end tests ($(( $(date +%s) - t0 ))s elapsed): their output"
  cat "$REPORT/beside-e2e.out"
  [ $rc = 0 ] || echo "=== ${lane[*]} failed (exit $rc)"
  return $rc
}

# run_e2e in a subshell: what it asks to clean up is done when the
# subshell ends, not left to the parent (whose list also stops the lane).
e2e_subshell() {
  local first=${#cleanup[@]}
  trap 'for c in "${cleanup[@]:'"$first"'}"; do eval "$c"; done' EXIT
  run_e2e
}

for s in "${stages[@]}"; do
  case "$s" in
    checks) run_checks ;;
    unit) in_lane unit || run_unit ;;
    integration) in_lane integration || run_integration ;;
    e2e)
      if [ ${#lane[@]} -eq 0 ]; then
        run_e2e
        continue
      fi
      start_lane
      # e2e in a subshell of its own with set -e (a || would switch it
      # off), so that the stages beside it are waited for and reported
      # however e2e ends.
      set +e
      (set -e; e2e_subshell)
      e2e_rc=$?
      set -e
      lane_rc=0
      wait_lane || lane_rc=$?
      [ $e2e_rc = 0 ] || exit $e2e_rc
      [ $lane_rc = 0 ] || exit $lane_rc
      ;;
    *) echo "unknown stage $s (want checks, unit, integration or e2e)" >&2; exit 2 ;;
  esac
done
echo; echo "=== all requested stages passed in $(( $(date +%s) - t0 ))s"
