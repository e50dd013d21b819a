#!/usr/bin/env bash
# Short fuzzing of the parsers that read untrusted images: format detection
# and the qcow2 header and image parsers. Go fuzzes one target per run.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-10s}"
while read -r pkg target; do
  echo "fuzz: $target ($pkg, $FUZZTIME)"
  go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg"
done <<'TARGETS'
./pkg/datapath/format/ FuzzDetect
./pkg/datapath/format/ FuzzMinDecompressedSize
./pkg/datapath/qcow2/ FuzzParseHeader
./pkg/datapath/qcow2/ FuzzImage
TARGETS
