#!/usr/bin/env bash
# Run 109: the final kernel of this stop (run 108's nosplit binary with the row sums in P V
# kept to f16 at padded head dims that are multiples of 64): the full wgmma check, memcheck on
# the d128 part of the quick sweep (the V stages' new layout), racecheck on its d64 part.
set -uo pipefail
. scripts/gpu/lib.sh
check_wgmma 200 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > $OUT/check-wgmma.txt.gz
sanitize memcheck d=128 30
sanitize racecheck d=64 45
el done
