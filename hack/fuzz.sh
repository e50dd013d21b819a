#!/usr/bin/env bash
# Fuzzing of the parsers that read untrusted input (format detection, the
# qcow2 header and image parsers, the vmdk descriptor and vhdx header
# readers, the tar extractor, the upload and clone token parser and the
# admission webhooks' request decoding), within a fixed budget per run.
#
# Go fuzzes one target per run, each with an instrumented build of its
# package, so all ten cost minutes. A run fuzzes targets for FUZZTIME each
# until FUZZ_BUDGET (wall time, builds included) would be exceeded, and
# the next run goes on with the target after the last one fuzzed (kept in
# the cache directory), so consecutive runs cover them all in turn.
# FUZZ_BUDGET=0 fuzzes nothing; FUZZ_ALL=1 fuzzes every target.
#
# The corpora (f.Add seeds and testdata/fuzz, where a failing input found
# here is written) run as regression tests in every plain `go test`, so
# the unit stage checks them all on every run whatever this script fuzzes.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-10s}"
FUZZ_BUDGET="${FUZZ_BUDGET:-60}"
CACHE_ROOT="${KUBEFILL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubefill}"
NEXT="$CACHE_ROOT/fuzz-next"

targets=(
  "./pkg/datapath/format/ FuzzDetect"
  "./pkg/datapath/format/ FuzzMinDecompressedSize"
  "./pkg/datapath/qcow2/ FuzzParseHeader"
  "./pkg/datapath/qcow2/ FuzzImage"
  "./pkg/datapath/format/ FuzzVMDK"
  "./pkg/datapath/format/ FuzzVHDX"
  "./pkg/datapath/format/ FuzzDecoderMemory"
  "./pkg/datapath/archive/ FuzzExtract"
  "./pkg/token/ FuzzValidate"
  "./pkg/apiserver/admission/ FuzzReview"
)
n=${#targets[@]}
first=0
if [ -z "${FUZZ_ALL:-}" ]; then
  [ -f "$NEXT" ] && first=$(( $(cat "$NEXT") % n )) || true
fi
fuzz_secs=${FUZZTIME%s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
fuzzed=() skipped=()
for (( i = 0; i < n; i++ )); do
  idx=$(( (first + i) % n ))
  read -r pkg target <<<"${targets[$idx]}"
  elapsed=$(( $(date +%s) - start ))
  # The next target needs its fuzz time and a build (a guess: as long).
  if [ -z "${FUZZ_ALL:-}" ] && { [ "$FUZZ_BUDGET" = 0 ] || [ $(( elapsed + 2 * fuzz_secs )) -gt "$FUZZ_BUDGET" ]; }; then
    skipped+=("$target")
    continue
  fi
  for attempt in 1 2; do
    echo "fuzz: $target ($pkg, $FUZZTIME)"
    if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$out"; then
      break
    fi
    # Go's fuzzer sometimes reports its own -fuzztime running out as a
    # failure ("context deadline exceeded") on a loaded machine. That, with
    # no failing input written, is retried once; anything else fails.
    if [ "$attempt" = 1 ] && grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written' "$out"; then
      echo "fuzz: $target: the fuzzer timed itself out without a failing input; once more"
      continue
    fi
    exit 1
  done
  fuzzed+=("$target")
  mkdir -p "$CACHE_ROOT" && echo $(( idx + 1 )) >"$NEXT"
done
echo "fuzz: fuzzed ${#fuzzed[@]} of $n targets in $(( $(date +%s) - start ))s (budget ${FUZZ_BUDGET}s${FUZZ_ALL:+, FUZZ_ALL}): ${fuzzed[*]:-none}"
[ ${#skipped[@]} -eq 0 ] || echo "fuzz: left for the next runs: ${skipped[*]}"
