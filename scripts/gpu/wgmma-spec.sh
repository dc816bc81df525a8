#!/usr/bin/env bash
# Run 111: the running maxima kept without the quad's shuffles where a warp may (tile flag
# `spec`, SPEC_MAX) against the default, one binary, interleaved: f16 and bf16, d64/d128,
# 1k-16k, both masks, three rounds. Then the full wgmma check under `spec`, and synccheck on
# the d128 part of the quick sweep under it.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin spec spec
ab_rounds 3 "base=$B spec=/tmp/spec" --dtype both --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
check_wgmma 270 /tmp/check-wgmma.txt "$B" spec
gzip -c /tmp/check-wgmma.txt > $OUT/check-wgmma-spec.txt.gz
el "synccheck d=128 (quick sweep, spec)"
FLASHATTN_WGMMA_TILE=spec timeout 75 compute-sanitizer --tool synccheck "$B" check --quick --kernel wgmma --filter d=128 > /tmp/san.txt 2>&1; echo "synccheck exit $?" | tee -a "$L"
grep -E "SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"
el done
