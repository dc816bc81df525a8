#!/usr/bin/env bash
# Run 104: d128 with three consumer warpgroups (Br 192, Bc 64, 160 registers each: no spills),
# so that each consumer's softmax runs under two others' GEMMs (FA3's d64 shape), against the
# default (two consumers, Bc 128, pingpong): interleaved, d128 1k-16k both masks, two rounds,
# no pingpong / pingpong ring / four stages; the d128 check under the first; then, on the
# default kernel (runs 99-100's), ncu (speed of light, compute, memory, warp states,
# scheduler) at d128 and d64 1k, and synccheck and initcheck on parts of the quick sweep.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin w3 "64,2,wg3,nopp"; tile_bin w3pp "64,2,wg3"; tile_bin w3s4 "64,4,wg3,nopp"
ab_rounds 2 "default=$B w3=/tmp/w3 w3pp=/tmp/w3pp w3s4=/tmp/w3s4" --dtype f16 --head-dim 128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
check_wgmma 70 $OUT/check-w3.txt "$B" "64,2,wg3,nopp" --filter "d=128"
for d in 128 64; do
  ncu_sol $d sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
done
for v in "synccheck|d=128" "initcheck|d=64"; do
  IFS='|' read -r tool filt <<< "$v"
  sanitize $tool "$filt" 60
done
el done
