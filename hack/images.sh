#!/usr/bin/env bash
# Builds the images the local node runs, as OCI archives that
# `ctr -n k8s.io images import --all-platforms` loads: no Docker, no registry.
#
#   hack/images.sh [OUTDIR]     (default _output/images)
#
#   kubefill.oci.tar      kubefill/kubefill:{dev,e2e,$VERSION}  the product: kubefill, qemu-img, prlimit
#   busybox.oci.tar       busybox:1.36                          the tests' shell (Debian's static busybox)
#   pause.oci.tar         registry.k8s.io/pause:3.10.2          the pod sandbox containerd wants
#   kubefill-dev.oci.tar  kubefill-test/dev:e2e                 kubefill-dev (the CSI node plugin) and a shell
#
# The Go binaries come from one `go build` (static, -trimpath, the version
# stamped as `make build` does) so they share the build cache; the rootfs
# trees live in a temporary directory, so nothing but OUTDIR is written in
# the work tree. The images are reproducible: the same inputs give the same
# bytes.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/_output/images}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
VERSION="${VERSION:-$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)}"
# An image tag allows [A-Za-z0-9_.-] only (a describe of a +build tag would not fit).
VERSION_TAG="$(printf '%s' "$VERSION" | tr -c 'A-Za-z0-9_.-' '-')"
BUSYBOX="${BUSYBOX:-/bin/busybox}"
QEMU_IMG="${QEMU_IMG:-/usr/bin/qemu-img}"
# The path a container searches; the worker pods' commands are bare `kubefill`.
IMAGE_PATH="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/kubefill-images.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
BIN="$WORK/bin"

# step NAME CMD...: runs a step and prints how long it took.
step() {
  local name="$1" t0 t1
  shift
  echo "images: $name ..."
  t0=$(date +%s%N)
  "$@"
  t1=$(date +%s%N)
  local ms=$(((t1 - t0) / 1000000))
  printf 'images: %s done in %d.%01ds\n' "$name" $((ms / 1000)) $((ms % 1000 / 100))
}

need() {
  [ -x "$1" ] || { echo "images: $1 is missing ($2)" >&2; exit 1; }
}
need "$BUSYBOX" "apt-get install busybox-static"
need "$QEMU_IMG" "apt-get install qemu-utils"
need /usr/bin/prlimit "apt-get install util-linux"
need /usr/bin/cp "apt-get install coreutils"
if ldd "$BUSYBOX" >/dev/null 2>&1; then
  echo "images: $BUSYBOX is dynamically linked; the shell images need Debian's busybox-static" >&2
  exit 1
fi

build_go() {
  # One invocation: the four mains share compiled packages. -X on a main
  # without a version variable is ignored by the linker.
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$VERSION" -o "$BIN/" \
    ./cmd/kubefill ./tests/cluster/cmd/kubefill-dev ./tests/cluster/cmd/pause ./hack/mkimage)
}

# usr_merged ROOTFS: Debian's merged-/usr links, so that the paths ldd
# prints (/lib/x86_64-linux-gnu/..., /lib64/ld-linux-x86-64.so.2) resolve
# in the image as they do on the host.
usr_merged() {
  mkdir -p "$1/usr/bin" "$1/usr/sbin" "$1/usr/lib" "$1/usr/lib64"
  ln -s usr/bin "$1/bin"
  ln -s usr/sbin "$1/sbin"
  ln -s usr/lib "$1/lib"
  ln -s usr/lib64 "$1/lib64"
}

# copy_with_libs ROOTFS BINARY DEST: copies a dynamically linked host binary
# to DEST in ROOTFS with exactly the shared libraries ldd lists, and the
# loader, each at its path on the host (the directory resolved, the file
# dereferenced).
copy_with_libs() {
  local rootfs="$1" bin="$2" dest="$3" lib dir out
  install -D -m 0755 "$bin" "$rootfs$dest"
  out="$(ldd "$bin")" || { echo "images: ldd $bin failed" >&2; return 1; }
  if grep -q 'not found' <<<"$out"; then
    echo "images: $bin has missing libraries:" >&2
    echo "$out" >&2
    return 1
  fi
  # "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" and "/lib64/ld-linux-x86-64.so.2 (0x...)";
  # linux-vdso has no file.
  for lib in $(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$out"); do
    dir="$(cd "$(dirname "$lib")" && pwd -P)"
    mkdir -p "$rootfs$dir"
    cp -L "$lib" "$rootfs$dir/$(basename "$lib")"
  done
}

# etc_files ROOTFS USER...: /etc/passwd and /etc/group with root, the given
# "name:uid:home" users (each its own group) and nobody; nsswitch for glibc.
etc_files() {
  local rootfs="$1" u name uid home
  shift
  mkdir -p "$rootfs/etc"
  {
    echo "root:x:0:0:root:/root:/bin/sh"
    for u in "$@"; do
      IFS=: read -r name uid home <<<"$u"
      echo "$name:x:$uid:$uid:$name:$home:/usr/sbin/nologin"
    done
    echo "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
  } >"$rootfs/etc/passwd"
  {
    echo "root:x:0:"
    for u in "$@"; do
      IFS=: read -r name uid home <<<"$u"
      echo "$name:x:$uid:"
    done
    echo "nogroup:x:65534:"
  } >"$rootfs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
}

tmp_dir() {
  mkdir -p "$1/tmp"
  chmod 1777 "$1/tmp"
}

# busybox_applets ROOTFS: /bin/busybox and a link in /bin for each applet.
busybox_applets() {
  local rootfs="$1" a
  install -D -m 0755 "$BUSYBOX" "$rootfs/bin/busybox"
  for a in $("$BUSYBOX" --list); do
    [ "$a" = busybox ] || ln -s busybox "$rootfs/bin/$a"
  done
}

# check_rootfs ROOTFS UID:GID CMD...: runs CMD inside ROOTFS as that user.
# chroot needs root; without it the image's own loader and libraries run
# the command, which still proves the library set is complete.
check_rootfs() {
  local rootfs="$1" user="$2"
  shift 2
  if [ "$(id -u)" = 0 ]; then
    chroot --userspec="$user" "$rootfs" "$@"
  else
    "$rootfs/usr/lib64/ld-linux-x86-64.so.2" --library-path "$rootfs/usr/lib/x86_64-linux-gnu" "$rootfs$1" "${@:2}"
  fi
}

mkimage() { "$BIN/mkimage" "$@"; }

kubefill_image() {
  local r="$WORK/kubefill"
  usr_merged "$r"
  install -m 0755 "$BIN/kubefill" "$r/usr/bin/kubefill"
  copy_with_libs "$r" "$QEMU_IMG" /usr/bin/qemu-img
  # The data path wraps qemu-img in prlimit when it finds one (CDI's
  # address-space and CPU limits).
  copy_with_libs "$r" /usr/bin/prlimit /usr/bin/prlimit
  # 107 is CDI's worker uid; 65532 is what manifests/install runs the
  # controller, API server and upload proxy as.
  etc_files "$r" "kubefill:107:/home/kubefill" "nonroot:65532:/home/nonroot"
  mkdir -p "$r/home/kubefill" "$r/home/nonroot" "$r/root"
  chmod 0755 "$r/home/kubefill" "$r/home/nonroot"
  chmod 0700 "$r/root"
  printf 'home/kubefill 107:107\nhome/nonroot 65532:65532\n' >"$WORK/kubefill.owners"
  tmp_dir "$r"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
  fi
  local v
  v="$(check_rootfs "$r" 107:107 /usr/bin/qemu-img --version)"
  echo "${v%%$'\n'*}"
  check_rootfs "$r" 107:107 /usr/bin/prlimit --version
  if [ "$(id -u)" = 0 ]; then
    chroot --userspec=107:107 "$r" /usr/bin/kubefill version
  else
    "$r/usr/bin/kubefill" version
  fi
  mkimage --rootfs "$r" --owners "$WORK/kubefill.owners" --out "$OUT/kubefill.oci.tar" \
    --tag "kubefill/kubefill:dev,kubefill/kubefill:e2e,kubefill/kubefill:$VERSION_TAG" \
    --entrypoint '["/usr/bin/kubefill"]' --user 107:107 --workdir / --env "$IMAGE_PATH"
}

busybox_image() {
  local r="$WORK/busybox"
  busybox_applets "$r"
  # Scripts that name /usr/bin/env or /sbin/ip find the same applets.
  mkdir -p "$r/usr"
  ln -s ../bin "$r/usr/bin"
  ln -s ../bin "$r/usr/sbin"
  ln -s bin "$r/sbin"
  etc_files "$r"
  mkdir -p "$r/root"
  chmod 0700 "$r/root"
  tmp_dir "$r"
  if [ "$(id -u)" = 0 ]; then chroot "$r" sh -c 'echo busybox shell ok'; fi
  mkimage --rootfs "$r" --out "$OUT/busybox.oci.tar" --tag busybox:1.36 \
    --cmd '["sh"]' --workdir / --env "$IMAGE_PATH"
}

pause_image() {
  local r="$WORK/pause"
  mkdir -p "$r"
  install -m 0755 "$BIN/pause" "$r/pause"
  mkimage --rootfs "$r" --out "$OUT/pause.oci.tar" --tag registry.k8s.io/pause:3.10.2 \
    --entrypoint '["/pause"]' --user 65535:65535 --workdir /
}

kubefill_dev_image() {
  local r="$WORK/kubefill-dev"
  # A real /bin for the busybox applets, so no merged-/usr links here; /lib
  # and /lib64 still lead to where GNU cp's libraries are copied.
  mkdir -p "$r/usr/lib" "$r/usr/lib64"
  ln -s usr/lib "$r/lib"
  ln -s usr/lib64 "$r/lib64"
  busybox_applets "$r"
  install -D -m 0755 "$BIN/kubefill-dev" "$r/usr/bin/kubefill-dev"
  # The hostpath driver copies volumes with `cp --sparse=always`, which
  # busybox's cp lacks; GNU cp in /usr/bin comes first in PATH.
  copy_with_libs "$r" /usr/bin/cp /usr/bin/cp
  etc_files "$r"
  tmp_dir "$r"
  if [ "$(id -u)" = 0 ]; then
    local v
    v="$(chroot "$r" /usr/bin/cp --version)"
    echo "${v%%$'\n'*}"
    chroot "$r" /usr/bin/cp --sparse=always /etc/passwd /tmp/sparse-check
    rm -f "$r/tmp/sparse-check"
  fi
  mkimage --rootfs "$r" --out "$OUT/kubefill-dev.oci.tar" --tag kubefill-test/dev:e2e \
    --entrypoint '["/usr/bin/kubefill-dev"]' --user 0:0 --workdir / --env "$IMAGE_PATH"
}

t_all=$(date +%s)
step "go build (kubefill $VERSION, kubefill-dev, pause, mkimage)" build_go
step "kubefill.oci.tar" kubefill_image
step "busybox.oci.tar" busybox_image
step "pause.oci.tar" pause_image
step "kubefill-dev.oci.tar" kubefill_dev_image
echo "images: all built in $(($(date +%s) - t_all))s into $OUT:"
ls -l "$OUT"/*.oci.tar
