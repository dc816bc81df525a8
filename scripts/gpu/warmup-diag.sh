#!/usr/bin/env bash
# Does a longer warm-up move clocks? causal d64, warm-up 0 / 100 / 300 ms, clocks sampled.
B=${FLASHATTN:-./.gpu/flashattn}
for wm in 0 100 300; do
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 20 > /tmp/smi.$wm.txt 2>/dev/null &
  SP=$!
  $B bench --no-plot --seqlen 1k,4k --head-dim 64 --causal on --dtype f16 --warmup-ms $wm --kernels mma --tiles "2,4,64,q,l,e,h" --out-dir /tmp/dg$wm > /dev/null 2>&1
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
  echo "warmup-ms $wm:"; grep -E "^f16" /tmp/dg$wm/bench.txt
  awk -F', ' '{c[NR]=$1; p[NR]=$2} END {mn=1e9; mx=0; pm=0; for(i=1;i<=NR;i++){if(c[i]<mn)mn=c[i]; if(c[i]>mx)mx=c[i]; if(p[i]>pm)pm=p[i]}; print "  samples " NR " sm clock min " mn " max " mx " MHz, peak power " pm " W"}' /tmp/smi.$wm.txt
done
