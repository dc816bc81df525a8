#!/usr/bin/env bash
# Run 34: the score modifiers (sliding window, softcap, ALiBi) on the GPU kernels. The check of
# wgmma and mma on the full sweep (the plain cases too: the key-tile loop changed), the
# modifier cases under compute-sanitizer, then the window bench: window 4096 against dense
# causal at 16k-64k tokens (one sequence), and a plain wgmma line set to compare with run 32.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma,mma (full sweep)"
timeout ${CHECK_S:-240} $B check --kernel wgmma,mma --json $OUT/check.json > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check.txt | head -20 | tee -a $L
grep -cE "window\(|softcap|alibi" $OUT/check.txt | sed 's/^/modifier lines: /' | tee -a $L
for spec in "memcheck|wgmma|window(" "memcheck|mma|window(" "racecheck|wgmma|alibi"; do
  IFS='|' read -r tool kern filt <<< "$spec"
  el "compute-sanitizer $tool on check --quick --kernel $kern --filter $filt"
  timeout ${SAN_S:-55} compute-sanitizer --tool $tool $B check --quick --kernel $kern --filter "$filt" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Hazard" /tmp/san.txt | sort | uniq -c | sort -rn | head -4 | tee -a $L
done
SEQ=${SEQ:-16k,32k,64k}
el "bench window 4096,0 causal"
timeout 90 $B bench --kernels wgmma,mma --dtype f16 --head-dim 64,128 --seqlen $SEQ --causal on --window 4096,0 --no-plot --out-dir /tmp/bw > /tmp/bw.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bw/bench.json $OUT/bench-window.json; cp /tmp/bw/bench.txt $OUT/bench-window.txt; cat /tmp/bw/bench.txt | tee -a $L
el "bench dense causal"
timeout 90 $B bench --kernels wgmma,mma --dtype f16 --head-dim 64,128 --seqlen $SEQ --causal on --no-plot --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bd/bench.txt $OUT/bench-dense-causal.txt; cat /tmp/bd/bench.txt | tee -a $L
el "bench plain wgmma (compare with run 32)"
timeout 80 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1k,4k,16k --no-plot --out-dir /tmp/bp > /tmp/bp.log 2>&1; echo "bench exit $?" | tee -a $L
cat /tmp/bp/bench.txt | tee -a $L
el "done"
