#!/usr/bin/env bash
# The main job (`make dev`): brings up the local single-node cluster with real
# storage and Kubefill (controller, API server, upload proxy), and shows it working: a PVC on the
# default storage class is provisioned by the real external-provisioner
# through our hostpath CSI driver, bound by the real PV controller, written by
# one pod and read back by another; then a DataVolume imports a small qcow2
# over HTTP, its phase and progress are printed, and a pod checks the bytes
# against qemu-img's conversion; then `kubefill upload dv` uploads the same
# qcow2 through the upload proxy, and a pod checks those bytes too. The
# cluster stays up; `bash hack/dev.sh down` removes everything it made
# (processes, pods, mounts, links, cgroups, iptables rules, files).
# The node is real: kubelet, containerd, kube-proxy and CoreDNS run every pod
# from images built here (hack/images.sh); nothing is pulled.
#
#   bash hack/dev.sh          # or: bash hack/dev.sh up
#   bash hack/dev.sh down
#   bash hack/dev.sh check    # up, the demo, then down (leaves nothing behind)
#
# INSTALLED=1 (`make dev INSTALLED=1`) installs Kubefill as an operator
# would instead of running it on the host: `kubectl apply -k manifests`
# (and the metrics Service of manifests/monitoring) with the image built
# here, so the controller, API server and upload proxy run as Deployments
# on the node, with the certificates the controller makes; the CDI
# resource is created, `kubectl get cdi,deploy -n kubefill-system` printed,
# and the same demo runs against the installed components.
#
# KUBEFILL_DEV_DIR (default /tmp/kubefill-dev) holds the cluster's state,
# kubeconfigs, logs and volumes. Needs root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DIR="${KUBEFILL_DEV_DIR:-/tmp/kubefill-dev}"
CACHE_ROOT="${KUBEFILL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefill}"
BIN="$CACHE_ROOT/dev/kubefill-dev"
action="${1:-up}"
INSTALLED="${INSTALLED:-}"
case "$INSTALLED" in ""|0|false|no) INSTALLED= ;; *) INSTALLED=1 ;; esac

log() { echo "dev: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "the local cluster needs root (bind mounts, network namespaces)"
  exit 1
fi

# The helper binary (CSI driver, up/down) is built from this
# checkout; the lock is the one the Go test harness takes for the same file.
build_helper() {
  mkdir -p "$CACHE_ROOT/dev"
  flock "$CACHE_ROOT/dev/.lock" env GOTOOLCHAIN=local go build -o "$BIN" ./tests/cluster/cmd/kubefill-dev
}

kubefill_summary() {
  if [ -n "$INSTALLED" ]; then
    cat <<EOF
  Kubefill is installed from manifests/ (kubectl apply -k manifests) with
  kubefill/kubefill:dev: Deployments kubefill-controller, kubefill-apiserver
  and kubefill-uploadproxy in kubefill-system, the APIService
  v1beta1.upload.cdi.kubevirt.io, the webhooks, and the CDI resource "cdi".
  Check it:  kubectl get cdi,deploy -n kubefill-system
  Logs:      kubectl logs -n kubefill-system deploy/kubefill-controller
  Metrics:   the Service kubefill-prometheus-metrics (port 8080, /metrics)
EOF
  else
    cat <<EOF
  Kubefill (built from this checkout) runs as part of the cluster: its CRDs,
  its controller, its aggregated API server behind the APIService
  v1beta1.upload.cdi.kubevirt.io, and its upload proxy (URL in CDIConfig
  status.uploadProxyURL). Logs: $DIR/logs/kubefill-*.log
EOF
  fi
}

case "$action" in
  up)
    start=$(date +%s)
    # Debian packages first (qemu-img, iproute2, …): the demo converts and
    # checks images with them, and a fresh machine has none of them.
    log "Debian packages (hack/deps.sh)"
    bash hack/deps.sh
    log "control plane, kubelet, CSI sidecars, containerd and CoreDNS (built once, about 30 minutes cold on 2 cores; cached in ${CACHE_ROOT})"
    bash hack/testbin.sh >/dev/null
    bash hack/sidecars.sh >/dev/null
    bash hack/node.sh >/dev/null
    t=$(date +%s)
    log "helper binary (CSI driver, cluster; a minute or two cold)"
    build_helper
    log "helper binary ready in $(( $(date +%s) - t ))s"
    if [ -n "$INSTALLED" ]; then
      log "Kubefill installed from manifests/ (INSTALLED=1): its pods run from kubefill/kubefill:dev"
      "$BIN" up --dir "$DIR" --installed
    else
      "$BIN" up --dir "$DIR" --kubefill
    fi
    KUBECONFIG="$DIR/admin.kubeconfig"
    log "demo: a PVC provisioned, bound, written by a pod and read back by another;"
    log "      then a qcow2 imported through a DataVolume by Kubefill, and one uploaded"
    log "      with kubefill upload through the upload proxy; bytes checked each time"
    "$BIN" demo --kubeconfig "$KUBECONFIG" --import-from-dir "$DIR"
    cat <<EOF

The local cluster is up ($(( $(date +%s) - start ))s including builds).

  export KUBECONFIG=$KUBECONFIG

  Storage classes: kubefill-hostpath (default, Immediate) and
  kubefill-hostpath-wffc (WaitForFirstConsumer), both with volume expansion;
  VolumeSnapshotClass kubefill-hostpath-snapclass.
  Pods run on node kubefill-node (kubelet and containerd), from images built
  from this checkout: kubefill/kubefill:dev (the workers), busybox:1.36,
  kubefill-test/dev:e2e (the CSI node plugin), registry.k8s.io/pause:3.10.2.
  Component logs: $DIR/logs/   Pod logs: kubectl logs, or $DIR/pod-logs/

$(kubefill_summary)

Next steps:
  create DataVolumes (cdi.kubevirt.io/v1beta1) against \$KUBECONFIG
  upload a disk image from this machine:
    go run ./cmd/kubefill upload dv my-disk --size=1Gi --image-path=disk.qcow2 \\
        --ca-cert=$DIR/kubefill/kubefill-system/proxy-ca.crt
  bash hack/dev.sh down     (remove everything)
EOF
    ;;
  check)
    # Up, the demo, and down again whatever happened: the whole main job in
    # one command that leaves nothing behind.
    trap 'bash "$ROOT/hack/dev.sh" down' EXIT
    bash "$ROOT/hack/dev.sh" up
    ;;
  down)
    if [ ! -x "$BIN" ]; then
      build_helper
    fi
    "$BIN" down --dir "$DIR"
    ;;
  *)
    echo "usage: bash hack/dev.sh [up|down|check]" >&2
    exit 2
    ;;
esac
