#!/usr/bin/env bash
# Run 98: the next tile's Q and first two K/V tiles prefetched into L2 by the producer after it
# has issued this tile's loads, the tile counter drawn at the round's start (`flashattn-e`, on
# top of run 97's D), against HEAD (`flashattn`) and D: the quick wgmma check on E (cut at
# 60 s), A/D/E interleaved (d64/d128 1k/2k/4k/16k, causal and not, two rounds), E's timeline.
set -uo pipefail
. scripts/gpu/lib.sh
el "check --quick --kernel wgmma (E)"
timeout 60 ./.gpu/flashattn-e check --quick --kernel wgmma > $OUT/check-quick-e.txt 2>&1; echo "check exit $?" | tee -a "$L"
grep -c "^\[PASS\]" $OUT/check-quick-e.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-quick-e.txt | head -8 | cut -c1-300 | tee -a "$L"
ab_rounds 2 "a=./.gpu/flashattn d=./.gpu/flashattn-d e=./.gpu/flashattn-e" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
el "trace E d128 1k"
FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 90 ./.gpu/flashattn-e bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
python3 scripts/gpu/wgmma-trace.py /tmp/tr.json > $OUT/trace-e.txt 2>&1
el done
