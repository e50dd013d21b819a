#!/usr/bin/env bash
# bench-load.sh: load and scale figures of the controller, run as a process of
# its own (the built `kubefill controller`) against the local cluster
# (tests/load), at the full counts:
#   1. 100 DataVolumes created at once on the real node, 20 of them clones of
#      one source and the rest blank and small HTTP imports mixed: all
#      Succeeded, the time to the last, the controller's peak RSS (goal
#      < 150 MiB); then its request rate once they are done (goal: near zero
#      a minute on, < 0.5 requests/s; KUBEFILL_LOAD_DV_IDLE=1, which the CI's
#      shorter run leaves out);
#   2. 10,000 PVCs, 10,000 pods and 200 StorageClasses that are none of
#      Kubefill's business (and the finished DataVolumes): a new controller's
#      peak RSS once synced (goal < 200 MiB) and its request rate a minute
#      after it started.
# The counts can be changed: KUBEFILL_LOAD_DVS, KUBEFILL_LOAD_CLONES,
# KUBEFILL_LOAD_PVCS, KUBEFILL_LOAD_PODS, KUBEFILL_LOAD_CLASSES (the CI runs
# 20/5 and 2000/2000/50). Needs root (the local cluster), like the e2e stage.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash hack/deps.sh
KUBEBUILDER_ASSETS="$(bash hack/testbin.sh)"
export KUBEBUILDER_ASSETS
bash hack/sidecars.sh >/dev/null
bash hack/node.sh >/dev/null
export KUBEFILL_LOAD_DVS=${KUBEFILL_LOAD_DVS:-100} KUBEFILL_LOAD_CLONES=${KUBEFILL_LOAD_CLONES:-20}
export KUBEFILL_LOAD_PVCS=${KUBEFILL_LOAD_PVCS:-10000} KUBEFILL_LOAD_PODS=${KUBEFILL_LOAD_PODS:-10000}
export KUBEFILL_LOAD_CLASSES=${KUBEFILL_LOAD_CLASSES:-200} KUBEFILL_LOAD_DV_IDLE=1
go test -count=1 -timeout 60m -v ./tests/load/ | grep --line-buffered -v '^=== \(RUN\|PAUSE\|CONT\)'
