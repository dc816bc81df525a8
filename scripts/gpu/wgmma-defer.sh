#!/usr/bin/env bash
# Run 101: the deferred epilogue (a tile's O stored after the next tile's first S = Q K^T is
# issued; two Q buffers, O staged in the finished tile's Q buffer; d <= 128), the default now,
# against `nodefer` (the previous order) in the same binary: a small check on a grid of 2
# first (the hand-offs), then defer / nodefer interleaved (d64/d128 1k-16k, both masks, three
# rounds), the timeline at d128 1k, the hand-off checks on small grids and the full wgmma check.
set -uo pipefail
. scripts/gpu/lib.sh
printf '#!/bin/sh\nFLASHATTN_WGMMA_TILE=nodefer exec ./.gpu/flashattn "$@"\n' > /tmp/nodefer && chmod +x /tmp/nodefer
el "smoke: check wgmma d=128 none on grid=2"
FLASHATTN_WGMMA_TILE="grid=2" timeout 60 $B check --kernel wgmma --filter "d=128 none" > /tmp/c.txt 2>&1; rc=$?; echo "check exit $rc" | tee -a "$L"
tail -1 /tmp/c.txt | tee -a "$L"; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a "$L"
if [ $rc -ne 0 ]; then el "smoke failed: stop"; exit 0; fi
ab_rounds 3 "nodefer=/tmp/nodefer defer=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
el "trace d128 1k"
FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 60 $B bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
python3 scripts/gpu/wgmma-trace.py /tmp/tr.json > $OUT/trace-defer.txt 2>&1
for v in "d=128|grid=2" "d=64 |grid=3" "d=64 |nopp,wg3,grid=2"; do
  IFS='|' read -r filt spec <<< "$v"
  el "check wgmma '$filt' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 100 $B check --kernel wgmma --filter "$filt" > /tmp/c.txt 2>&1; echo "check exit $?" | tee -a "$L"
  tail -1 /tmp/c.txt | tee -a "$L"; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a "$L"
  cat /tmp/c.txt >> $OUT/check-wgmma-grid.txt
done
el "check --kernel wgmma"
timeout 230 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-wgmma.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -8 | cut -c1-300 | tee -a "$L"
el done
