#!/usr/bin/env bash
# Final sweep in the sustained (power-limited) state: default bench (warm-up 500 ms per line)
# with peers and plots; SM clock and power sampled throughout.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 > /tmp/smi.txt 2>/dev/null &
SP=$!
$B bench --peers --out-dir $OUT/bench > /tmp/bench.log 2>&1; echo "bench exit $?"
kill $SP; wait $SP 2>/dev/null
awk -F', ' '{n++; c+=$1; p+=$2; if($1<mn||n==1)mn=$1; if($1>mx)mx=$1; if($2>pm)pm=$2; if($3>tm)tm=$3} END {printf "smi samples %d: sm clock mean %.0f min %d max %d MHz; power mean %.0f max %.0f W; max temp %d C\n", n, c/n, mn, mx, p/n, pm, tm}' /tmp/smi.txt | tee $OUT/clocks.txt
grep -E "^(f16|bf16)" $OUT/bench/bench.txt | awk '{print $1,$2,$3,$4,$9}' | head -60
