#!/usr/bin/env bash
# Run 96: the softmax of both accumulator rows at once (row maxima as trees, one branch for
# huge logits around both rows' exponentials: `flashattn-b`), and with it lse written after
# the O store is issued (`flashattn-c`), against the kernel of HEAD (`flashattn`). The wgmma
# check on C, then A/B/C interleaved (wgmma alone, f16, d64/d128, 1k/4k/16k, causal and not,
# two rounds), then C's timeline at d128 1k and 16k (run 95 had HEAD's).
set -uo pipefail
. scripts/gpu/lib.sh
el "check --kernel wgmma (C)"
timeout 200 ./.gpu/flashattn-c check --kernel wgmma > $OUT/check-wgmma-c.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-wgmma-c.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-wgmma-c.txt | head -8 | cut -c1-300 | tee -a "$L"
ab_rounds 2 "a=./.gpu/flashattn b=./.gpu/flashattn-b c=./.gpu/flashattn-c" --dtype f16 --head-dim 64,128 --seqlen 1k,4k,16k --causal both --warmup-ms 300 --iters 20
for spec in "128 1024 off" "128 16384 off" "64 1024 off"; do
  set -- $spec
  el "trace C d$1 $2 causal $3"
  FLASHATTN_WGMMA_TILE=trace FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 90 ./.gpu/flashattn-c bench --kernels wgmma --dtype f16 --head-dim $1 --seqlen $2 --causal $3 --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
  echo "== C d$1 $2 causal $3" >> $OUT/trace.txt
  python3 scripts/gpu/wgmma-trace.py /tmp/tr.json >> $OUT/trace.txt 2>&1
done
el done
