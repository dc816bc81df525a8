#!/usr/bin/env bash
# Run 102: the deferred epilogue with each round's Q loaded during the round before (the
# producer draws the next tile a round early and issues its Q after this round's third K/V
# tile): a small check on a grid of 2, defer / nodefer interleaved (three rounds), the timeline
# at d128 1k on all SMs and on 66 (is the steady state's K wait a shared-bandwidth limit?),
# the full wgmma check and two hand-off checks on small grids, ncu (speed of light, memory,
# warp states) at d128 and d64 1k, then racecheck, synccheck, initcheck and memcheck on parts of
# the quick wgmma sweep.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin nodefer nodefer
check_wgmma 60 /tmp/c.txt "$B" grid=2 --filter "d=128 none" || { el "smoke failed: stop"; exit 0; }
ab_rounds 3 "nodefer=/tmp/nodefer defer=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
for spec in trace trace,grid=66; do
  timeline "$B" $spec 128 1024 off $OUT/trace.txt
done
check_wgmma 200 $OUT/check-wgmma.txt "$B" ""
for v in "d=128|grid=2" "d=64 |grid=3"; do
  IFS='|' read -r filt spec <<< "$v"
  check_wgmma 100 /tmp/c.txt "$B" "$spec" --filter "$filt"
done
for d in 128 64; do
  ncu_sol $d sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_read.sum.per_second,lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed
done
for v in "racecheck|d=64" "synccheck|d=128" "initcheck|d=128" "memcheck|d=64"; do
  IFS='|' read -r tool filt <<< "$v"
  sanitize $tool "$filt" 60
done
el done
