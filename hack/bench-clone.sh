#!/usr/bin/env bash
# bench-clone.sh: clone benchmarks on the local cluster (tests/e2e
# TestCloneBenchmark), measured in one run and printed as ratios:
#   1. a host-assisted clone of a 2 GiB-virtual disk.img holding 1 GiB of data,
#      DataVolume created -> Succeeded, against `cp --sparse=always` (+ fsync)
#      of the same disk.img on the same disk; then the same data 20 GiB-virtual
#      (time growth: goal < 1.3x, only data travels);
#   2. snapshot and CSI clones at 1 GiB and 8 GiB, Kubefill's own time being
#      the total minus the CSI driver's CreateSnapshot/CreateVolume time from
#      its call log (goal: flat, within 1.3x);
#   3. the cloner's and the upload server's peak RSS (goal < 64 MiB each).
# Needs root (the local cluster), like the e2e stage; about 20 GiB of free
# disk under the cluster's directory ($TMPDIR) and a few minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash hack/deps.sh
KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
export KUBEBUILDER_ASSETS
bash hack/sidecars.sh >/dev/null
bash hack/node.sh >/dev/null
KUBEFILL_BENCH_CLONE=1 go test -count=1 -timeout 60m -run '^TestCloneBenchmark$' -v ./tests/e2e/ \
  | grep -v '^=== \(RUN\|PAUSE\|CONT\)'
