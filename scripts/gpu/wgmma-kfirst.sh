#!/usr/bin/env bash
# Run 103: the producer issues K_{n+1} before V_n (K one key tile ahead of V), in both orders of
# the epilogue; the deferred epilogue's next Q after the fourth K tile. Small checks on grids
# of 2 and 3 for both (the hand-offs), then HEAD (run 100's kernel) / nodefer / defer
# interleaved (d64/d128 1k-16k, both masks, three rounds) and the timelines at d128 1k.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin nodefer nodefer
for v in "d=128 none|grid=2" "d=128 none|nodefer,grid=2" "d=64 causal|grid=3" "d=64 causal|nodefer,grid=3"; do
  IFS='|' read -r filt spec <<< "$v"
  check_wgmma 60 /tmp/c.txt "$B" "$spec" --filter "$filt" || { el "check failed: stop"; exit 0; }
done
ab_rounds 3 "head=./.gpu/flashattn-head nodefer=/tmp/nodefer defer=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
for spec in trace trace,nodefer; do
  timeline "$B" $spec 128 1024 off $OUT/trace.txt
done
el done
