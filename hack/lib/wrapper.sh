# Shared by hack/testbin.sh and hack/sidecars.sh, which build programs whose
# own go.mod replaces the Kubernetes staging modules with local paths: they
# build from a throwaway wrapper module instead, and publish into a cache.

# staging_replaces KUBERNETES_GOMOD VERSION prints replace lines pinning every
# staging module that k8s.io/kubernetes's go.mod names to its published tag.
# sample-controller and sample-cli-plugin are not served, and nothing we
# build needs them.
staging_replaces() {
  grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$1" \
    | awk '{print $1}' \
    | grep -vE '^k8s\.io/(sample-controller|sample-cli-plugin)$' \
    | sort -u \
    | while read -r m; do echo "	$m => $m $2"; done
}

# publish_dir BUILT OUT moves a finished build into the cache directory OUT
# in one step, so a reader never sees half a set of binaries, and marks it
# complete.
publish_dir() {
  mkdir -p "$(dirname "$2")"
  rm -rf "$2.tmp" && mv "$1" "$2.tmp"
  rm -rf "$2" && mv "$2.tmp" "$2"
  touch "$2/.complete"
}

# claim_build OUT HAVE prints OUT and returns 0 when the function HAVE finds
# the cache complete, waiting first for a build another process is running;
# otherwise it takes the build lock (fd 9, held until exit) and returns 1.
claim_build() {
  "$2" && { echo "$1"; return 0; }
  mkdir -p "$(dirname "$1")"
  exec 9>"$(dirname "$1")/.lock"
  if ! flock -n 9; then
    echo "$(basename "$(dirname "$1")"): another build is running; waiting for it" >&2
    flock 9
  fi
  "$2" && { echo "$1"; return 0; }
  return 1
}

# gomod_of MODULE@VERSION prints the path of that module's go.mod in the
# module cache, downloading it when needed.
gomod_of() {
  go mod download -json "$1" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p'
}
