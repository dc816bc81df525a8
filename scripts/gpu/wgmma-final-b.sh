#!/usr/bin/env bash
# Final pass B of the Hopper issue: the default bench sweep (512..16k, d64/d128, f16/bf16,
# causal off/on) plus d256, wgmma and mma side by side with the SDPA peers and the dense
# matrix-product ceiling, every line after 500 ms of warm-up; SM clock and power sampled.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 > /tmp/smi.txt 2>/dev/null &
SP=$!
# Plots are redrawn from bench.json afterwards (flashattn bench-plot): fewer files come back.
timeout 450 $B bench --peers --no-plot --head-dim 64,128,256 --out-dir $OUT/bench > $OUT/bench-log.txt 2>&1; echo "bench exit $?"
kill $SP; wait $SP 2>/dev/null
awk -F', ' '{n++; c+=$1; p+=$2; if($1<mn||n==1)mn=$1; if($1>mx)mx=$1; if($2>pm)pm=$2; if($3>tm)tm=$3} END {printf "smi samples %d: sm clock mean %.0f min %d max %d MHz; power mean %.0f max %.0f W; max temp %d C\n", n, c/n, mn, mx, p/n, pm, tm}' /tmp/smi.txt | tee -a $OUT/log.txt
grep -v "^\[peers" $OUT/bench-log.txt | tail -3
cat $OUT/bench/bench.txt
