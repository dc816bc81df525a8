#!/usr/bin/env bash
# The first GPU run of the backward pass (attn_bwd): the layout probe (its transposed-A
# experiment is new), the backward cases of the check (both dtypes, d8-d128, none/causal/
# window, GQA/MQA, odd lengths, refusals; ~30 NVRTC compiles), memcheck and racecheck on small
# cases, then a short backward bench against SDPA's backends.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "probe"
timeout 60 $B probe > $OUT/probe.txt 2>&1; echo "probe exit $?" | tee -a $L; grep -E "^\[FAIL\]|all layout" $OUT/probe.txt | tee -a $L
el "check backward"
timeout ${CHECK_S:-300} $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | head -20 | cut -c1-300 | tee -a $L
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool $B check --kernel mma --filter "f16 backward b=2 sq=33&none" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
done
el "bench --backward --peers (d64, d128; 1k, 4k, 16k; f16)"
timeout 120 $B bench --backward --peers --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bb/bench.txt $OUT/bench-backward.txt 2>/dev/null; cp /tmp/bb/bench.json $OUT/bench-backward.json 2>/dev/null; cat $OUT/bench-backward.txt | tee -a $L; tail -3 /tmp/bb.log | tee -a $L
el "done"
