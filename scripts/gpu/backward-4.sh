#!/usr/bin/env bash
# Run 62: the deterministic mode (dQ tiles added in key-block order): the backward check with
# its deterministic cases (5 runs each, identical bytes), sanitizers on deterministic cases,
# then the bench against SDPA, f16 and bf16, both masks, lines bwd and bwd-det.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check backward"
timeout 300 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -8 | cut -c1-300 | tee -a $L
grep deterministic $OUT/check-backward.txt | head -3 | cut -c1-250 | tee -a $L
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool $B check --kernel mma --filter "f16 backward b=1 sq=300&deterministic" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Error|Hazard" /tmp/san.txt | sort | uniq -c | head -5 | tee -a $L
done
el "bench --backward --peers (f16, bf16)"
timeout 330 $B bench --backward --peers --dtype both --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt; cp /tmp/bb/bench.json $OUT/bench-backward.json; cat $OUT/bench-backward.txt | tee -a $L; tail -2 /tmp/bb.log | tee -a $L
el "done"
