#!/usr/bin/env bash
# Short fuzzing of the parsers that read untrusted input: format detection,
# the qcow2 header and image parsers, the vmdk descriptor and vhdx header
# readers, the tar extractor, the upload and clone token parser and the
# admission webhooks' request decoding. Go fuzzes one target per run.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-10s}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
while read -r pkg target; do
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
done <<'TARGETS'
./pkg/datapath/format/ FuzzDetect
./pkg/datapath/format/ FuzzMinDecompressedSize
./pkg/datapath/qcow2/ FuzzParseHeader
./pkg/datapath/qcow2/ FuzzImage
./pkg/datapath/format/ FuzzVMDK
./pkg/datapath/format/ FuzzVHDX
./pkg/datapath/format/ FuzzDecoderMemory
./pkg/datapath/archive/ FuzzExtract
./pkg/token/ FuzzValidate
./pkg/apiserver/admission/ FuzzReview
TARGETS
