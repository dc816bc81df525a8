#!/usr/bin/env bash
# Run 97: run 96's softmax (both rows at once) and lse after the O store, plus the O staging
# addresses as a per-lane base, one XOR per chunk and constant offsets (`flashattn-d`), against
# HEAD's kernel (`flashattn`): the quick wgmma check on D, A/D interleaved over d64/d128/d256
# 1k/2k/4k/16k causal and not (two rounds), D's timeline at d128 1k, and ncu's stall reasons
# per SASS instruction for D at d128 4k (to read the softmax's stalls).
set -uo pipefail
. scripts/gpu/lib.sh
check_wgmma 100 $OUT/check-quick-d.txt ./.gpu/flashattn-d "" --quick
ab_rounds 2 "a=./.gpu/flashattn d=./.gpu/flashattn-d" --dtype f16 --head-dim 64,128,256 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
timeline ./.gpu/flashattn-d trace 128 1024 off $OUT/trace-d.txt
el "ncu stalls per instruction, D d128 4k"
timeout 150 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section WarpStateStats --section SourceCounters -o /tmp/rep \
  ./.gpu/flashattn-d bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 4096 --causal off --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn > $OUT/ncu-run.txt 2>&1; echo "ncu exit $?" | tee -a $L
ncu -i /tmp/rep.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip > $OUT/ncu-source-d128-4k.csv.gz
ncu -i /tmp/rep.ncu-rep --page details 2>/dev/null | grep -i -E "stall|issue|warp cycles" | head -40 > $OUT/ncu-stalls.txt
ls -la $OUT | tee -a "$L"
el done
