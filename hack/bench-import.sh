#!/usr/bin/env bash
# bench-import.sh: measure `kubefill importer` against the tools a user would
# otherwise use, in the same run, on images generated here. Prints:
#   1. import throughput vs `qemu-img convert -O raw` of the same qcow2 on local disk
#   2. import throughput vs `curl` to a file followed by `qemu-img convert`
#   3. raw and .raw.gz imports vs `cp --sparse=always` of the raw file
#   4. peak RSS of the importer on the 2 GiB image and on a 20 GiB-virtual image
# The image is 2 GiB virtual with ~1 GiB of data (half random, half text),
# served over loopback HTTP with Range support. Times are medians of
# BENCH_RUNS interleaved runs (page cache hot). Tools: Go, qemu-img, curl,
# gzip, cp, /usr/bin/time. Takes a few minutes on 2 cores.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${BENCH_RUNS:-3}
W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/kubefill-bench.XXXXXX")
SRV_PID=
cleanup() {
	if [[ -n "$SRV_PID" ]]; then kill "$SRV_PID" 2>/dev/null || true; wait "$SRV_PID" 2>/dev/null || true; fi
	rm -rf "$W"
}
trap cleanup EXIT

for tool in go qemu-img curl gzip /usr/bin/time; do
	command -v "$tool" >/dev/null || { echo "bench-import: $tool is required" >&2; exit 1; }
done

log() { printf '[bench] %s\n' "$*" >&2; }

log "work dir $W"
(cd "$ROOT" && go build -o "$W/kubefill" ./cmd/kubefill)

# A small helper: generates the test image and serves files with Range support.
mkdir -p "$W/helper" "$W/srv" "$W/out" "$W/local"
cat >"$W/helper/main.go" <<'EOF'
package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
)

func main() {
	switch os.Args[1] {
	case "gen": // gen FILE MIB: 1 MiB random, 1 MiB text, 2 MiB hole, repeated
		f, err := os.Create(os.Args[2])
		if err != nil {
			panic(err)
		}
		mib, _ := strconv.Atoi(os.Args[3])
		rng := rand.New(rand.NewPCG(7, 7))
		buf := make([]byte, 1<<20)
		text := []byte("Kubefill streams virtual machine disk images into volumes, quickly and safely. 0123456789\n")
		for i := 0; i < mib; i++ {
			switch i % 4 {
			case 0:
				for j := 0; j < len(buf); j += 8 {
					v := rng.Uint64()
					for k := 0; k < 8; k++ {
						buf[j+k] = byte(v >> (8 * k))
					}
				}
			case 1:
				for j := range buf {
					buf[j] = text[(i*31+j)%len(text)]
				}
			default:
				continue
			}
			if _, err := f.WriteAt(buf, int64(i)<<20); err != nil {
				panic(err)
			}
		}
		if err := f.Truncate(int64(mib) << 20); err != nil {
			panic(err)
		}
		f.Close()
	case "serve": // serve DIR: prints the port, serves until killed
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		fmt.Println(ln.Addr().(*net.TCPAddr).Port)
		os.Stdout.Sync()
		panic(http.Serve(ln, http.FileServer(http.Dir(os.Args[2]))))
	}
}
EOF
(cd "$W/helper" && GOFLAGS= go mod init benchhelper >/dev/null 2>&1 && go build -o "$W/helperbin" .)

log "generating a 2 GiB image with 1 GiB of data"
"$W/helperbin" gen "$W/srv/disk.raw" 2048
qemu-img convert -q -f raw -O qcow2 "$W/srv/disk.raw" "$W/srv/disk.qcow2"
log "compressing (qcow2 zlib, gzip -1)"
qemu-img convert -q -c -f raw -O qcow2 "$W/srv/disk.raw" "$W/srv/disk-zlib.qcow2"
gzip -1 -c "$W/srv/disk.raw" >"$W/srv/disk.raw.gz"
log "generating a 20 GiB-virtual qcow2 (the 2 GiB image at 0 plus 64 MiB every 2 GiB)"
truncate -s 20G "$W/big.raw"
dd if="$W/srv/disk.raw" of="$W/big.raw" bs=1M conv=notrunc,sparse status=none
for i in 1 2 3 4 5 6 7 8 9; do
	dd if="$W/srv/disk.raw" of="$W/big.raw" bs=1M count=64 seek=$((i * 2048 + 100)) conv=notrunc,sparse status=none
done
qemu-img convert -q -f raw -O qcow2 "$W/big.raw" "$W/srv/big.qcow2"
rm -f "$W/big.raw"
for f in disk.qcow2 disk-zlib.qcow2; do cp "$W/srv/$f" "$W/local/$f"; done

exec 3< <("$W/helperbin" serve "$W/srv")
SRV_PID=$!
read -r PORT <&3
URL="http://127.0.0.1:$PORT"
log "serving on $URL"

# timed CMD...: runs CMD (a function below) under /usr/bin/time and prints
# "seconds maxrss_kib"; the RSS is the largest single process (bash, the
# importer, qemu-img or curl), so for the importer it is the importer's.
timed() {
	if ! /usr/bin/time -f '%e %M' -o "$W/time" bash -c "$*" >"$W/cmd.out" 2>&1; then
		echo "bench-import: command failed: $*" >&2
		cat "$W/cmd.out" >&2
		exit 1
	fi
	tail -n1 "$W/time"
}

import_http() { # FILE [SIZE]
	rm -f "$W/out/disk.img"
	env -i PATH="$PATH" IMPORTER_SOURCE=http IMPORTER_ENDPOINT="$URL/$1" IMPORTER_IMAGE_SIZE="${2:-2Gi}" \
		FILESYSTEM_OVERHEAD=0 OWNER_UID=bench \
		"$W/kubefill" importer --data-path "$W/out/disk.img" --block-path "$W/none" --scratch-dir "$W/none" \
		--metrics-addr "" --termination-log "$W/termination-log"
}
qemu_local() { rm -f "$W/out/q.raw"; qemu-img convert -f qcow2 -O raw "$W/local/$1" "$W/out/q.raw"; }
curl_qemu() {
	rm -f "$W/out/dl" "$W/out/c.raw"
	curl -sSf -o "$W/out/dl" "$URL/$1" && qemu-img convert -f qcow2 -O raw "$W/out/dl" "$W/out/c.raw"
	rm -f "$W/out/dl"
}
cp_sparse() { rm -f "$W/out/cp.raw"; cp --sparse=always "$W/srv/disk.raw" "$W/out/cp.raw"; }
export W URL
export -f import_http qemu_local curl_qemu cp_sparse

log "checking correctness once"
import_http disk-zlib.qcow2 >/dev/null 2>&1
grep -q '"outcome":"Succeeded"' "$W/termination-log" || { cat "$W/termination-log" >&2; exit 1; }
want=$(sha256sum <"$W/srv/disk.raw" | cut -d' ' -f1)
got=$(sha256sum <"$W/out/disk.img" | cut -d' ' -f1)
[[ "$want" == "$got" ]] || { echo "bench-import: imported image differs from the source" >&2; exit 1; }
log "sha256 of the import matches the source ($got)"

declare -A T M
add() { T[$1]+="${2} "; M[$1]+="${3} "; }
median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
maxof() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | tail -n1; }

for run in $(seq 1 "$RUNS"); do
	log "round $run/$RUNS"
	for case in q_local q_curl q_import z_local z_curl z_import cp raw_import gz_import; do
		case $case in
		q_local) r=$(timed qemu_local disk.qcow2) ;;
		q_curl) r=$(timed curl_qemu disk.qcow2) ;;
		q_import) r=$(timed import_http disk.qcow2) ;;
		z_local) r=$(timed qemu_local disk-zlib.qcow2) ;;
		z_curl) r=$(timed curl_qemu disk-zlib.qcow2) ;;
		z_import) r=$(timed import_http disk-zlib.qcow2) ;;
		cp) r=$(timed cp_sparse) ;;
		raw_import) r=$(timed import_http disk.raw) ;;
		gz_import) r=$(timed import_http disk.raw.gz) ;;
		esac
		add "$case" $r
	done
done
log "20 GiB-virtual image"
r=$(timed import_http big.qcow2 20Gi)
add big_import $r
rm -f "$W/out/"*

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b <= 0) b = 0.001; printf "%.2f", a / b }'; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
med() { median "${T[$1]}"; }

echo
echo "kubefill import benchmark: 2 GiB virtual, 1 GiB data, loopback HTTP, median of $RUNS runs (seconds)"
line() { printf '  %-42s %7s   (runs: %s)\n' "$1" "$(med "$2")" "${T[$2]% }"; }
line "qemu-img convert, local qcow2" q_local
line "curl + qemu-img convert, qcow2" q_curl
line "kubefill importer, qcow2 over HTTP" q_import
line "qemu-img convert, local zlib qcow2" z_local
line "curl + qemu-img convert, zlib qcow2" z_curl
line "kubefill importer, zlib qcow2 over HTTP" z_import
line "cp --sparse=always, raw" cp
line "kubefill importer, raw over HTTP" raw_import
line "kubefill importer, raw.gz over HTTP" gz_import
line "kubefill importer, 20 GiB-virtual qcow2" big_import
echo "  (the importer fsyncs before it reports success; qemu-img, curl and cp do not)"
echo
echo "1. throughput vs local qemu-img convert (goal >= 0.9x):  qcow2 $(ratio "$(med q_local)" "$(med q_import)")x   zlib qcow2 $(ratio "$(med z_local)" "$(med z_import)")x"
echo "2. throughput vs curl + qemu-img convert (goal >= 1.5x): qcow2 $(ratio "$(med q_curl)" "$(med q_import)")x   zlib qcow2 $(ratio "$(med z_curl)" "$(med z_import)")x"
echo "3. throughput vs cp --sparse=always of the raw file:     raw $(ratio "$(med cp)" "$(med raw_import)")x   raw.gz $(ratio "$(med cp)" "$(med gz_import)")x"
echo "4. importer peak RSS (goal < 64 MiB):                   2 GiB qcow2 $(mib "$(maxof "${M[q_import]}")") MiB   2 GiB zlib qcow2 $(mib "$(maxof "${M[z_import]}")") MiB   raw.gz $(mib "$(maxof "${M[gz_import]}")") MiB   20 GiB-virtual qcow2 $(mib "$(maxof "${M[big_import]}")") MiB"
echo "   (qemu-img convert peak RSS for comparison: $(mib "$(maxof "${M[z_local]}")") MiB)"
