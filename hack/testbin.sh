#!/usr/bin/env bash
# Builds the real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler), the node components the local cluster runs (kubelet,
# kube-proxy) and etcd from the Go module proxy, and caches them outside the
# work tree keyed by version. Prints the directory that holds the binaries, which
# is what envtest wants in KUBEBUILDER_ASSETS.
#
# k8s.io/kubernetes cannot be `go install`ed (its go.mod has replace directives),
# so we build it from a throwaway wrapper module that pins every staging module
# to its published tag. The Kubernetes binaries come from one `go build`, so
# kubelet and kube-proxy reuse the packages the control plane compiled.
set -euo pipefail
# shellcheck source=lib/wrapper.sh
. "$(dirname "$0")/lib/wrapper.sh"

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
CACHE_ROOT="${KUBEFILL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefill}"
OUT="$CACHE_ROOT/testbin/$K8S_VERSION"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd)

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
  [ -f "$OUT/.complete" ]
}

# Test packages and scripts may call this at the same time: one builds, the
# others wait for it and then find the cache filled.
claim_build "$OUT" have_all && exit 0

log() { echo "testbin: $*" >&2; }
start=$(date +%s)
log "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy) and etcd into $OUT"
log "this cold build takes about 20 minutes on 2 cores (once; later runs reuse the cache)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

k8s_gomod=$(gomod_of "k8s.io/kubernetes@$K8S_VERSION")
[ -f "$k8s_gomod" ] || { log "cannot find go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }

{
  echo "module kubefill.local/testbin"
  echo
  echo "go 1.26"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  staging_replaces "$k8s_gomod" "$STAGING_VERSION"
  echo ")"
} > go.mod

go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
       "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
       "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
       "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
       "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION" \
       go.etcd.io/etcd/server/v3 >&2

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"

mkdir -p "$work/bin"
go build -trimpath -ldflags "$ldflags" -o "$work/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy >&2
log "Kubernetes binaries built in $(( $(date +%s) - start ))s"
go build -trimpath -ldflags "-s -w" -o "$work/bin/etcd" go.etcd.io/etcd/server/v3 >&2

publish_dir "$work/bin" "$OUT"
log "built in $(( $(date +%s) - start ))s"
echo "$OUT"
