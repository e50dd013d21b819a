#!/usr/bin/env bash
# Builds the real CSI sidecars that the local test cluster runs around our
# hostpath CSI driver:
#   - csi-provisioner      (github.com/kubernetes-csi/external-provisioner/v6)
#   - snapshot-controller  (github.com/kubernetes-csi/external-snapshotter/v8)
#   - csi-snapshotter      (github.com/kubernetes-csi/external-snapshotter/v8)
# and caches them outside the work tree keyed by their versions. Prints the
# directory that holds the binaries.
#
# Neither module can be `go install`ed (their go.mod files carry replace
# directives), so, as hack/testbin.sh does for the control plane, we build them
# from a throwaway wrapper module. It pins every k8s.io staging module to one
# published tag, and requires the snapshotter's client/v8 module explicitly
# because upstream replaces it with ./client.
set -euo pipefail
# shellcheck source=lib/wrapper.sh
. "$(dirname "$0")/lib/wrapper.sh"

PROVISIONER_VERSION="${PROVISIONER_VERSION:-v6.4.0}"
SNAPSHOTTER_VERSION="${SNAPSHOTTER_VERSION:-v8.7.0}"
SIDECAR_STAGING_VERSION="${SIDECAR_STAGING_VERSION:-v0.37.0}"
CACHE_ROOT="${KUBEFILL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefill}"
OUT="$CACHE_ROOT/sidecars/provisioner-$PROVISIONER_VERSION-snapshotter-$SNAPSHOTTER_VERSION-k8s-$SIDECAR_STAGING_VERSION"
BINARIES=(csi-provisioner snapshot-controller csi-snapshotter)

major_of() { local v="${1#v}"; echo "v${v%%.*}"; }
PROVISIONER_MOD="github.com/kubernetes-csi/external-provisioner/$(major_of "$PROVISIONER_VERSION")"
SNAPSHOTTER_MAJOR="$(major_of "$SNAPSHOTTER_VERSION")"
SNAPSHOTTER_MOD="github.com/kubernetes-csi/external-snapshotter/$SNAPSHOTTER_MAJOR"
SNAPSHOT_CLIENT_MOD="github.com/kubernetes-csi/external-snapshotter/client/$SNAPSHOTTER_MAJOR"

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
  [ -f "$OUT/.complete" ]
}

# Test packages run in parallel and each may call this script: one builds,
# the others wait for it and then find the cache filled.
claim_build "$OUT" have_all && exit 0

log() { echo "sidecars: $*" >&2; }

start=$(date +%s)
log "building $PROVISIONER_MOD@$PROVISIONER_VERSION and $SNAPSHOTTER_MOD@$SNAPSHOTTER_VERSION into $OUT"
log "this cold build takes about 6 to 7 minutes on 2 cores (once; later runs reuse the cache)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

# The provisioner requires some k8s.io/kubernetes release for a few helpers;
# that module's own go.mod lists the staging modules that need a replace.
prov_gomod=$(gomod_of "$PROVISIONER_MOD@$PROVISIONER_VERSION")
[ -f "$prov_gomod" ] || { log "cannot find go.mod of $PROVISIONER_MOD@$PROVISIONER_VERSION"; exit 1; }
k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$prov_gomod")
[ -n "$k8s_version" ] || { log "$PROVISIONER_MOD@$PROVISIONER_VERSION does not require k8s.io/kubernetes"; exit 1; }
k8s_gomod=$(gomod_of "k8s.io/kubernetes@$k8s_version")
[ -f "$k8s_gomod" ] || { log "cannot find go.mod of k8s.io/kubernetes@$k8s_version"; exit 1; }

{
  echo "module kubefill.local/sidecars"
  echo
  echo "go 1.26"
  echo
  echo "require ("
  echo "	$PROVISIONER_MOD $PROVISIONER_VERSION"
  echo "	$SNAPSHOTTER_MOD $SNAPSHOTTER_VERSION"
  echo "	$SNAPSHOT_CLIENT_MOD $SNAPSHOTTER_VERSION"
  echo ")"
  echo
  echo "replace ("
  staging_replaces "$k8s_gomod" "$SIDECAR_STAGING_VERSION"
  echo ")"
} > go.mod

go get "$PROVISIONER_MOD/cmd/csi-provisioner@$PROVISIONER_VERSION" \
       "$SNAPSHOTTER_MOD/cmd/snapshot-controller@$SNAPSHOTTER_VERSION" \
       "$SNAPSHOTTER_MOD/cmd/csi-snapshotter@$SNAPSHOTTER_VERSION" \
       "$SNAPSHOT_CLIENT_MOD@$SNAPSHOTTER_VERSION" >&2

mkdir -p "$work/bin"
go build -trimpath -ldflags "-s -w -X main.version=$PROVISIONER_VERSION" -o "$work/bin/" \
  "$PROVISIONER_MOD/cmd/csi-provisioner" >&2
go build -trimpath -ldflags "-s -w -X main.version=$SNAPSHOTTER_VERSION" -o "$work/bin/" \
  "$SNAPSHOTTER_MOD/cmd/snapshot-controller" \
  "$SNAPSHOTTER_MOD/cmd/csi-snapshotter" >&2

publish_dir "$work/bin" "$OUT"
log "built in $(( $(date +%s) - start ))s"
echo "$OUT"
