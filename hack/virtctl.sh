#!/usr/bin/env bash
# Builds KubeVirt's real CLI, virtctl (kubevirt.io/kubevirt/cmd/virtctl), from
# the Go module proxy and caches it outside the work tree keyed by version, so
# the e2e tests can check that `virtctl image-upload` works against Kubefill
# unchanged. Prints the directory that holds the binary.
#
# kubevirt.io/kubevirt cannot be `go install`ed: its go.mod replaces
# kubevirt.io/api and kubevirt.io/client-go with ./staging directories, which
# the module zip does not even contain (they are modules of their own). As
# hack/testbin.sh does for Kubernetes, we build from a throwaway wrapper module
# that copies kubevirt's replace directives and points the staging ones at
# their published tags, which KubeVirt releases with the same version.
set -euo pipefail
# shellcheck source=lib/wrapper.sh
. "$(dirname "$0")/lib/wrapper.sh"

# The proxy does not list kubevirt.io/kubevirt versions but serves exact ones;
# v1.7.0 is the newest that builds from it: v1.8.0 is served but needs
# kubevirt.io/virt-template-* v0.1.7, which the checksum database does not know
# (404), and we do not turn checksum verification off.
VIRTCTL_VERSION="${VIRTCTL_VERSION:-v1.7.0}"
CACHE_ROOT="${KUBEFILL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefill}"
OUT="$CACHE_ROOT/virtctl/$VIRTCTL_VERSION"

have_it() { [ -x "$OUT/virtctl" ] && [ -f "$OUT/.complete" ]; }

# Test processes and hack/test.sh may call this at the same time: one builds,
# the others wait for it and then find the cache filled.
claim_build "$OUT" have_it && exit 0

log() { echo "virtctl: $*" >&2; }

start=$(date +%s)
log "building kubevirt.io/kubevirt/cmd/virtctl@$VIRTCTL_VERSION into $OUT"
log "this cold build takes about 6 minutes on 2 cores, 3 with a warm module cache (once; later runs reuse the cache)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

kv_gomod=$(gomod_of "kubevirt.io/kubevirt@$VIRTCTL_VERSION")
[ -f "$kv_gomod" ] || { log "cannot find go.mod of kubevirt.io/kubevirt@$VIRTCTL_VERSION"; exit 1; }

# kubevirt_replaces prints the body of kubevirt's replace block: published
# versions as they are, ./staging/src/<module> paths as <module> at the
# release's own tag.
kubevirt_replaces() {
  awk '/^replace \($/ {in_block=1; next} in_block && /^\)$/ {in_block=0} in_block && /=>/' "$kv_gomod" \
    | while read -r line; do
        case "$line" in
          *"=> ./staging/src/"*)
            # The module path after ./staging/src/ at the release's own tag.
            echo "	${line%%=>*}=> ${line##*=> ./staging/src/} $VIRTCTL_VERSION" ;;
          *"=> ./"*|*"=> ../"*) log "unexpected local replace: $line"; return 1 ;;
          *) echo "	$line" ;;
        esac
      done
}

{
  echo "module kubefill.local/virtctl"
  echo
  echo "go 1.26"
  echo
  echo "require kubevirt.io/kubevirt $VIRTCTL_VERSION"
  echo
  echo "replace ("
  kubevirt_replaces
  echo ")"
} > go.mod

go get "kubevirt.io/kubevirt/cmd/virtctl@$VIRTCTL_VERSION" >&2

# virtctl version reports the client's version from client-go's variables.
ldflags="-s -w \
 -X kubevirt.io/client-go/version.gitVersion=$VIRTCTL_VERSION \
 -X kubevirt.io/client-go/version.gitTreeState=clean"

mkdir -p "$work/bin"
go build -trimpath -ldflags "$ldflags" -o "$work/bin/virtctl" kubevirt.io/kubevirt/cmd/virtctl >&2

publish_dir "$work/bin" "$OUT"
log "built in $(( $(date +%s) - start ))s"
echo "$OUT"
