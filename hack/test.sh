#!/usr/bin/env bash
# Runs Kubefill's tests. With no argument it runs every stage in order:
#   checks       gofmt, go.mod tidy, go vet, generated files up to date, API module builds alone
#   unit         go test over the product packages and the API module
#   integration  tests/integration against a real kube-apiserver and etcd
#   e2e          the local cluster's own tests (csi-sanity, real node start/stop), then tests/e2e on it
# Name stages to run only those: hack/test.sh unit integration
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(checks unit integration e2e)

API_DIR=staging/src/github.com/kubefill/kubefill-api
t0=$(date +%s)
stage() { echo; echo "=== $1 ($(( $(date +%s) - t0 ))s elapsed)"; }

has_go_files() { [ -d "$1" ] && [ -n "$(find "$1" -name '*.go' -print -quit)" ]; }

run_checks() {
  stage "checks"
  make --no-print-directory fmt
  go mod tidy -diff || { echo "go.mod is not tidy: run 'go mod tidy'"; exit 1; }
  go vet ./...
  (cd "$API_DIR" && go vet ./... && go build ./...)
  make --no-print-directory verify-generated
}

run_unit() {
  stage "unit tests"
  bash hack/deps.sh
  local pkgs=(./cmd/...)
  has_go_files pkg && pkgs+=(./pkg/...)
  # The test kit and the harness's small shared packages have tests of their own.
  pkgs+=(./tests/kit/... ./tests/internal/...)
  go test -count=1 -timeout 15m "${pkgs[@]}"
  (cd "$API_DIR" && go test -count=1 ./...)
  if [ -f hack/fuzz.sh ]; then
    stage "short fuzzing"
    bash hack/fuzz.sh
  fi
}

run_integration() {
  stage "integration tests (real kube-apiserver + etcd)"
  KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
  export KUBEBUILDER_ASSETS
  go test -count=1 -timeout 20m ./tests/integration/...
}

run_e2e() {
  if ! has_go_files tests/e2e; then
    stage "e2e: no tests/e2e yet, skipped"
    return
  fi
  stage "end-to-end tests (local cluster)"
  bash hack/deps.sh
  KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
  export KUBEBUILDER_ASSETS
  # The CSI sidecars are built once from the Go module proxy and cached;
  # building them here shows the cold-build time on a fresh machine.
  local t
  t=$(date +%s)
  bash hack/sidecars.sh >/dev/null
  echo "sidecars ready in $(( $(date +%s) - t ))s"
  # KubeVirt's own virtctl, for tests/e2e/virtctl_test.go (built and cached the same way).
  t=$(date +%s)
  KUBEFILL_VIRTCTL="$(bash hack/virtctl.sh)/virtctl"
  export KUBEFILL_VIRTCTL
  echo "virtctl ready in $(( $(date +%s) - t ))s"
  # The real node's containerd, runc shim, CNI plugins and CoreDNS, and the
  # images its pods run (built here, no registry).
  t=$(date +%s)
  bash hack/node.sh >/dev/null
  echo "node binaries ready in $(( $(date +%s) - t ))s"
  t=$(date +%s)
  KUBEFILL_IMAGES="$(mktemp -d)"
  export KUBEFILL_IMAGES
  trap 'rm -rf "$KUBEFILL_IMAGES"' EXIT
  bash hack/images.sh "$KUBEFILL_IMAGES" >/dev/null
  echo "images built in $(( $(date +%s) - t ))s"
  # The harness's own parts: CSI driver (csi-sanity), the real node's start
  # and stop (nothing left on the host), the dev CLI's up and down.
  go test -count=1 -timeout 20m ./tests/csi/... ./tests/cluster/...
  go test -count=1 -timeout 40m ./tests/e2e/...
  # The install itself (manifests/ applied, every component a pod from the
  # image) and a smoke set against it; a cluster of its own, after e2e's.
  go test -count=1 -timeout 20m ./tests/installed/...
  # Load and scale at small counts, the controller as a process (full counts: make bench-load).
  go test -count=1 -timeout 15m ./tests/load/...
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
