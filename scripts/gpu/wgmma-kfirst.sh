#!/usr/bin/env bash
# Run 103: the producer issues K_{n+1} before V_n (K one key tile ahead of V), in both orders of
# the epilogue; the deferred epilogue's next Q after the fourth K tile. Small checks on grids
# of 2 and 3 for both (the hand-offs), then HEAD (run 100's kernel) / nodefer / defer
# interleaved (d64/d128 1k-16k, both masks, three rounds) and the timelines at d128 1k.
set -uo pipefail
. scripts/gpu/lib.sh
printf '#!/bin/sh\nFLASHATTN_WGMMA_TILE=nodefer exec ./.gpu/flashattn "$@"\n' > /tmp/nodefer && chmod +x /tmp/nodefer
for v in "d=128 none|grid=2" "d=128 none|nodefer,grid=2" "d=64 causal|grid=3" "d=64 causal|nodefer,grid=3"; do
  IFS='|' read -r filt spec <<< "$v"
  el "check wgmma '$filt' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 60 $B check --kernel wgmma --filter "$filt" > /tmp/c.txt 2>&1; rc=$?; echo "check exit $rc" | tee -a "$L"
  tail -1 /tmp/c.txt | tee -a "$L"; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a "$L"
  if [ $rc -ne 0 ]; then el "check failed: stop"; exit 0; fi
done
ab_rounds 3 "head=./.gpu/flashattn-head nodefer=/tmp/nodefer defer=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
for spec in trace trace,nodefer; do
  el "timeline d128 1k ($spec)"
  FLASHATTN_WGMMA_TILE=$spec FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 60 $B bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
  python3 scripts/gpu/wgmma-trace.py /tmp/tr.json >> $OUT/trace.txt 2>&1
done
el done
