#!/usr/bin/env bash
# Run 122: is the gap between ncu's cycle counts (run 121: ours fewer cycles than cuDNN on 8 of
# the 10 cases below 1.0) and the sweep's ratios a clock difference in the sustained state?
# Three cases, ours (Rust bench) and cuDNN (bench/peers.py) alternating, two rounds, each after
# 3 s of warm-up and timed over 1000 launches, with nvidia-smi sampling SM clock, power and
# temperature every 50 ms; wgmma-power.py reads each phase's clock and power.
set -uo pipefail
. scripts/gpu/lib.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" 2>/dev/null &
SP=$!
sleep 1
for round in 1 2; do
  for c in "f16 128 off 1024" "bf16 128 on 1024" "f16 64 on 1024"; do
    read -r dt d causal sk <<< "$c"
    b=$((16384 / sk)); h=$((2048 / d)); cz=false; [ "$causal" = on ] && cz=true
    id="$dt-d$d-$causal-$sk"
    echo "phase ours $id $round start $(date +%s.%N)" >> "$OUT/phases.txt"
    timeout 60 "$B" bench --kernels wgmma --dtype "$dt" --head-dim "$d" --seqlen "$sk" --causal "$causal" --warmup-ms 3000 --iters 1000 --no-plot --out-dir /tmp/p > /tmp/p.log 2>&1
    echo "phase ours $id $round end $(date +%s.%N) median_ms $(python3 -c "import json; c=json.load(open('/tmp/p/bench.json'))['cases'][0]; print(c['results'][0]['timing']['median_ms'])")" >> "$OUT/phases.txt"
    req="{\"iters\":1000,\"warmup\":10,\"warmup_ms\":3000,\"peers\":[\"cudnn\"],\"cases\":[{\"id\":\"$id\",\"dtype\":\"$dt\",\"batch\":$b,\"seqlen\":$sk,\"heads\":$h,\"head_dim\":$d,\"causal\":$cz,\"flops\":1e12,\"sets\":2}]}"
    echo "phase cudnn $id $round start $(date +%s.%N)" >> "$OUT/phases.txt"
    timeout 90 python3 bench/peers.py "$req" --out /tmp/pc.json > /tmp/pc.log 2>&1
    echo "phase cudnn $id $round end $(date +%s.%N) median_ms $(python3 -c "import json; print(json.load(open('/tmp/pc.json'))['results'][0].get('median_ms'))")" >> "$OUT/phases.txt"
    el "$id round $round"
  done
done
kill $SP; wait $SP 2>/dev/null
python3 scripts/gpu/wgmma-power.py "$OUT/phases.txt" "$OUT/smi.csv" | tee -a "$L"
el done
