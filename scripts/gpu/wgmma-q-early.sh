#!/usr/bin/env bash
# Run 99: the Q tile released after the tile's last S = Q K^T completes (in the last key tile's
# iteration) instead of after its softmax and P V (`flashattn-f`, on top of run 97's D): the
# full wgmma check on F, then D/F interleaved (d64/d128 1k/2k/4k/16k, causal and not, two
# rounds), and F's timeline at d128 1k.
set -uo pipefail
. scripts/gpu/lib.sh
el "check --kernel wgmma (F)"
timeout 230 ./.gpu/flashattn-f check --kernel wgmma > $OUT/check-wgmma-f.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-wgmma-f.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-wgmma-f.txt | head -8 | cut -c1-300 | tee -a "$L"
ab_rounds 2 "d=./.gpu/flashattn-d f=./.gpu/flashattn-f" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
el "trace F d128 1k"
FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 90 ./.gpu/flashattn-f bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
python3 scripts/gpu/wgmma-trace.py /tmp/tr.json > $OUT/trace-f.txt 2>&1
el done
