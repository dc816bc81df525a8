#!/usr/bin/env bash
# Run 74: attn_wgmma's consumers no longer start every tile in lockstep (a tile barrier per
# consumer; with pingpong the turns run in one ring across tiles), the causal order's group
# size without a 64-bit division, __syncwarp before each empty-barrier arrive; attn_bwd_wgmma's
# dS reads P from a copy. The full wgmma check, the hand-off checks on small grids, sanitizers,
# the backward check, then an interleaved A/B (default against FLASHATTN_WGMMA_TILE=lockstep)
# and a short backward bench.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma full"
timeout 200 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | grep -v "^checking\|passed" | head -8 | cut -c1-300 | tee -a $L
for v in "d=128 |grid=2" "d=64 |grid=3" "d=64 |128,2,grid=2"; do
  f=${v%%|*}; spec=${v#*|}
  el "check wgmma '$f' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 90 $B check --kernel wgmma --filter "$f" > /tmp/cg.txt 2>&1; echo "check exit $?" | tee -a $L
  tail -1 /tmp/cg.txt | tee -a $L; grep -v "^\[PASS\]" /tmp/cg.txt | grep -v "^checking\|passed" | head -5 | cut -c1-300 | tee -a $L
  cat /tmp/cg.txt >> $OUT/check-grids.txt
done
for run in "racecheck|grid=2|f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=128&causal" "synccheck|grid=2|f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=128&causal" "memcheck|grid=3|f16 b=1 sq=1000 sk=1000 hq=2 hkv=2 d=64&none"; do
  IFS='|' read -r tool spec f <<< "$run"
  el "$tool ($spec): $f"
  FLASHATTN_WGMMA_TILE="$spec" timeout 100 compute-sanitizer --tool $tool $B check --kernel wgmma --filter "$f" > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
  cat /tmp/san.txt >> $OUT/sanitizers.txt
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" /tmp/san.txt | sort | uniq -c | head -4 | cut -c1-200 | tee -a $L
done
el "check backward"
timeout 150 $B check --kernel mma --filter backward > $OUT/check-backward.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-backward.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-backward.txt | grep -v "^checking\|passed" | head -8 | cut -c1-300 | tee -a $L
el "racecheck backward d128 causal"
timeout 100 compute-sanitizer --tool racecheck $B check --kernel mma --filter "f16 backward b=1 sq=700 sk=900 hq=4 hkv=2 d=128 causal" > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
cat /tmp/san.txt >> $OUT/sanitizers.txt; grep -E "RACECHECK SUMMARY|passed" /tmp/san.txt | sort | uniq -c | head -3 | tee -a $L
SEQ=${SEQ:-1024,2048,4096,16384}
for i in 1 2; do
  for spec in "" "lockstep"; do
    label=${spec:-default}
    el "bench $label ($i)"
    FLASHATTN_WGMMA_TILE="$spec" timeout 150 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen $SEQ --no-plot --out-dir /tmp/v_${label}_$i > /tmp/v.log 2>&1 || tail -3 /tmp/v.log | tee -a $L
    grep -E "^f16" /tmp/v_${label}_$i/bench.txt | awk -v l=$label -v i=$i '{print l, i, $0}' >> $OUT/ab.txt
  done
done
el "bench backward (bwd)"
timeout 120 $B bench --backward --kernels bwd --dtype f16 --head-dim 64,128 --seqlen 1024,4096 --no-plot --out-dir /tmp/bb > /tmp/bb.log 2>&1; echo "exit $?" | tee -a $L
tail -n +4 /tmp/bb/bench.txt | tee -a $L; cp /tmp/bb/bench.txt $OUT/bench-backward.txt
el "done"
