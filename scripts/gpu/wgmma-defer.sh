#!/usr/bin/env bash
# Run 101: the deferred epilogue (a tile's O stored after the next tile's first S = Q K^T is
# issued; two Q buffers, O staged in the finished tile's Q buffer; d <= 128), the default now,
# against `nodefer` (the previous order) in the same binary: a small check on a grid of 2
# first (the hand-offs), then defer / nodefer interleaved (d64/d128 1k-16k, both masks, three
# rounds), the timeline at d128 1k, the hand-off checks on small grids and the full wgmma check.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin nodefer nodefer
check_wgmma 60 /tmp/c.txt "$B" grid=2 --filter "d=128 none" || { el "smoke failed: stop"; exit 0; }
ab_rounds 3 "nodefer=/tmp/nodefer defer=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
timeline "$B" trace 128 1024 off $OUT/trace-defer.txt
for v in "d=128|grid=2" "d=64 |grid=3" "d=64 |nopp,wg3,grid=2"; do
  IFS='|' read -r filt spec <<< "$v"
  check_wgmma 100 /tmp/c.txt "$B" "$spec" --filter "$filt"
  cat /tmp/c.txt >> $OUT/check-wgmma-grid.txt
done
check_wgmma 230 $OUT/check-wgmma.txt "$B" ""
el done
