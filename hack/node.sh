#!/usr/bin/env bash
# Builds the programs a real local node runs besides kubelet and kube-proxy
# (those come from hack/testbin.sh), and caches them outside the work tree
# keyed by version. Prints the directory that holds them, flat:
#   - containerd, ctr, containerd-shim-runc-v2   (github.com/containerd/containerd/v2)
#   - bridge, host-local, loopback, portmap      (github.com/containernetworking/plugins)
#   - coredns                                    (github.com/coredns/coredns)
# runc is not built here: the node uses Debian's /usr/sbin/runc (hack/apt-packages.txt).
#
# All three come from one throwaway wrapper module, so the packages they share
# (grpc, protobuf, client-go, x/net, ...) are compiled once. Every part is built
# with the same static tags (they only select files in the standard library and
# containerd), which also lets the parts share compiled packages; the shim adds
# no_grpc, as containerd's Makefile does. CoreDNS is built from a main package
# written here that imports only the plugins a cluster DNS without upstream
# forwarding needs, in the order of CoreDNS's own directive list.
set -euo pipefail
# shellcheck source=lib/wrapper.sh
. "$(dirname "$0")/lib/wrapper.sh"

CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CNI_VERSION="${CNI_VERSION:-v1.10.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE_ROOT="${KUBEFILL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefill}"

CONTAINERD_MOD=github.com/containerd/containerd/v2
CNI_MOD=github.com/containernetworking/plugins
COREDNS_MOD=github.com/coredns/coredns
CNI_PLUGINS=(main/bridge ipam/host-local main/loopback meta/portmap)
# No forward plugin: the cluster DNS never asks a server outside the cluster.
# bind: CoreDNS listens on the node address only, never on every interface.
COREDNS_PLUGINS=(bind errors log health ready kubernetes cache loadbalance whoami)
# The plugin set is part of the cache key: a different set is another build.
PLUGIN_KEY=$(printf '%s ' "${COREDNS_PLUGINS[@]}" | sha256sum | cut -c1-8)
OUT="$CACHE_ROOT/node/containerd-$CONTAINERD_VERSION-cni-$CNI_VERSION-coredns-$COREDNS_VERSION-$PLUGIN_KEY"
BINARIES=(containerd ctr containerd-shim-runc-v2 bridge host-local loopback portmap coredns)

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
  [ -f "$OUT/.complete" ]
}

# Test packages and scripts may call this at the same time: one builds, the
# others wait for it and then find the cache filled.
claim_build "$OUT" have_all && exit 0

log() { echo "node: $*" >&2; }
start=$(date +%s)
log "building containerd $CONTAINERD_VERSION (containerd, ctr, containerd-shim-runc-v2), CNI plugins $CNI_VERSION (bridge, host-local, loopback, portmap) and CoreDNS $COREDNS_VERSION (plugins ${COREDNS_PLUGINS[*]}) into $OUT"
log "this cold build takes about 8 minutes on 2 cores (once; later runs reuse the cache)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

# The order CoreDNS runs plugins in is its directive list; keep ours in that
# order, and stop if a plugin we want is not in this release.
coredns_dir=$(go mod download -json "$COREDNS_MOD@$COREDNS_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
zdirectives="$coredns_dir/core/dnsserver/zdirectives.go"
[ -f "$zdirectives" ] || { log "cannot find core/dnsserver/zdirectives.go of $COREDNS_MOD@$COREDNS_VERSION"; exit 1; }
upstream_order=$(awk '/^var Directives/{d=1; next} d && /^}/{exit} d {gsub(/[",[:space:]]/, ""); if ($0 != "") print}' "$zdirectives")
ordered=()
for d in $upstream_order; do
  for p in "${COREDNS_PLUGINS[@]}"; do [ "$d" = "$p" ] && ordered+=("$p"); done
done
[ "${#ordered[@]}" -eq "${#COREDNS_PLUGINS[@]}" ] || {
  log "CoreDNS $COREDNS_VERSION lacks some of the plugins ${COREDNS_PLUGINS[*]} (found ${ordered[*]})"; exit 1; }

{
  echo "module kubefill.local/node"
  echo
  echo "go 1.26"
  echo
  echo "require ("
  echo "	$CONTAINERD_MOD $CONTAINERD_VERSION"
  echo "	$CNI_MOD $CNI_VERSION"
  echo "	$COREDNS_MOD $COREDNS_VERSION"
  echo ")"
} > go.mod

mkdir coredns
{
  echo "// Command coredns is CoreDNS $COREDNS_VERSION with only the plugins a cluster DNS needs."
  echo "package main"
  echo
  echo "import ("
  echo "	\"github.com/coredns/coredns/core/dnsserver\""
  echo "	\"github.com/coredns/coredns/coremain\""
  echo
  for p in "${ordered[@]}"; do echo "	_ \"$COREDNS_MOD/plugin/$p\""; done
  echo ")"
  echo
  echo "func main() {"
  echo "	// The order plugins handle a query in, as in CoreDNS's own list."
  printf '\tif err := dnsserver.SetDirectives([]string{'
  first=1
  for p in "${ordered[@]}"; do
    [ "$first" = 1 ] || printf ', '
    printf '"%s"' "$p"; first=0
  done
  printf '}); err != nil {\n'
  echo "		panic(err)"
  echo "	}"
  echo "	coremain.Run()"
  echo "}"
} > coredns/main.go

cni_pkgs=()
for p in "${CNI_PLUGINS[@]}"; do cni_pkgs+=("$CNI_MOD/plugins/$p"); done
coredns_pkgs=("$COREDNS_MOD/core/dnsserver" "$COREDNS_MOD/coremain")
for p in "${ordered[@]}"; do coredns_pkgs+=("$COREDNS_MOD/plugin/$p"); done

go get "$CONTAINERD_MOD/cmd/containerd@$CONTAINERD_VERSION" \
       "$CONTAINERD_MOD/cmd/ctr@$CONTAINERD_VERSION" \
       "$CONTAINERD_MOD/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
       "${cni_pkgs[@]/%/@$CNI_VERSION}" \
       "${coredns_pkgs[@]/%/@$COREDNS_VERSION}" >&2

tags="urfave_cli_no_docs osusergo netgo static_build"
containerd_ldflags="-s -w -X $CONTAINERD_MOD/version.Version=$CONTAINERD_VERSION -X $CONTAINERD_MOD/version.Package=$CONTAINERD_MOD"
mkdir -p "$work/bin"

t=$(date +%s)
go build -trimpath -tags "$tags" -ldflags "$containerd_ldflags" -o "$work/bin/" \
  "$CONTAINERD_MOD/cmd/containerd" "$CONTAINERD_MOD/cmd/ctr" >&2
log "containerd and ctr built in $(( $(date +%s) - t ))s"

t=$(date +%s)
go build -trimpath -tags "$tags no_grpc" -ldflags "$containerd_ldflags" -o "$work/bin/" \
  "$CONTAINERD_MOD/cmd/containerd-shim-runc-v2" >&2
log "containerd-shim-runc-v2 built in $(( $(date +%s) - t ))s"

t=$(date +%s)
go build -trimpath -tags "$tags" \
  -ldflags "-s -w -X $CNI_MOD/pkg/utils/buildversion.BuildVersion=$CNI_VERSION" -o "$work/bin/" \
  "${cni_pkgs[@]}" >&2
log "CNI plugins built in $(( $(date +%s) - t ))s"

t=$(date +%s)
go build -trimpath -tags "$tags" \
  -ldflags "-s -w -X $COREDNS_MOD/coremain.gitTag=$COREDNS_VERSION" -o "$work/bin/coredns" \
  ./coredns >&2
log "coredns built in $(( $(date +%s) - t ))s"

# Cheap checks that each binary runs and says what it is, so a broken build
# never lands in the cache.
check() { # WANT CMD...: CMD's output must contain WANT
  local want="$1" out; shift
  if ! out=$("$@" 2>&1 </dev/null) || [[ "$out" != *"$want"* ]]; then
    log "check failed: $* printed:"; echo "$out" | sed 's/^/node:   /' >&2; exit 1
  fi
  log "ok: ${*//"$b/"/}: $(echo "$out" | tr -s '\n' ' ')"
}
b="$work/bin"
check "$CONTAINERD_VERSION" "$b/containerd" --version
check "$CONTAINERD_VERSION" "$b/ctr" --version
check "$CONTAINERD_VERSION" "$b/containerd-shim-runc-v2" -v
for p in "${CNI_PLUGINS[@]}"; do
  n=$(basename "$p")
  check '"supportedVersions"' env CNI_COMMAND=VERSION "$b/$n"
  check "CNI $n plugin $CNI_VERSION" env -u CNI_COMMAND "$b/$n"
done
check "CoreDNS-${COREDNS_VERSION#v}" "$b/coredns" -version
# -plugins prints one registered plugin a line. Besides ours it lists three
# that our plugins import and so register (metadata by cache, kubernetes and
# log; prometheus, i.e. plugin/metrics, by cache; transfer by kubernetes).
# They are not in the directive list we set, so a Corefile cannot use them.
listed=$("$b/coredns" -plugins | grep -v '^$' | sort | tr '\n' ' ')
wanted=$(printf '%s\n' "${COREDNS_PLUGINS[@]}" metadata prometheus transfer | sort | tr '\n' ' ')
[ "$listed" = "$wanted" ] || { log "coredns -plugins lists '$listed', want '$wanted'"; exit 1; }
log "ok: coredns -plugins: $listed"

publish_dir "$work/bin" "$OUT"
log "built in $(( $(date +%s) - start ))s"
echo "$OUT"
