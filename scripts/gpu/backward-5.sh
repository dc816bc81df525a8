#!/usr/bin/env bash
# Run 63: the deterministic mode in descending key-block order (the grid's first blocks take
# the last key blocks): its check cases (5 runs each), memcheck/racecheck on a causal GQA case
# with 7 key blocks, the bench (bwd, bwd-det, f16; peers of run 62), `check --quick --kernel
# all` (ptx.cuh and hopper.cuh gained helpers); the 4-warp 64-row tile at d64 (two blocks per SM).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 300 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -8 | cut -c1-300 | tee -a $L
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool $B check --kernel mma --filter "f16 backward b=1 sq=700&causal deterministic" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | sort | uniq -c | head -5 | tee -a $L
done
el "bench --backward (f16)"
timeout 200 $B bench --backward --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; grep -E "^f16" $OUT/bench-backward.txt | tee -a $L; tail -2 /tmp/bb.log | tee -a $L
el "tile 4,64 at d64 (two blocks per SM)"
FLASHATTN_BWD_TILE=4,64 timeout 60 $B bench --backward --dtype f16 --head-dim 64 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "exit $?" | tee -a $L
grep -E "^f16" /tmp/bt/bench.txt | tee -a $L
el "check --quick --kernel all"
timeout 200 $B check --quick --kernel all > $OUT/check-quick.txt 2>&1; echo "check exit $?" | tee -a $L; tail -1 $OUT/check-quick.txt | tee -a $L
el "done"
