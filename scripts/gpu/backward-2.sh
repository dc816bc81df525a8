#!/usr/bin/env bash
# Run 60: attn_bwd with 8 warps (128 keys), Q/dO/lse/D loaded one step ahead in two buffers,
# dQ through a shared f32 tile and bulk reductions (sm_90); 64 rows per step at d<=64. The
# backward check, sanitizers on a multi-step case, the bench against SDPA, then the other
# geometries (FLASHATTN_BWD_TILE) against the default in separate runs.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 300 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -20 | cut -c1-300 | tee -a $L
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool $B check --kernel mma --filter "f16 backward b=1 sq=300" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | sort | uniq -c | head -5 | tee -a $L
done
el "bench --backward --peers"
timeout 150 $B bench --backward --peers --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; cat $OUT/bench-backward.txt | tee -a $L; tail -3 /tmp/bb.log | tee -a $L
for v in "64 8,32" "64 4,32" "128 4,32"; do
  set -- $v
  el "tile $2 at d$1"
  FLASHATTN_BWD_TILE=$2 timeout 60 $B bench --backward --dtype f16 --head-dim $1 --seqlen 1024,4096,16384 --warmup-ms 200 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "exit $?" | tee -a $L
  grep -E "^f16" /tmp/bt/bench.txt | tee -a $L
done
el "done"
