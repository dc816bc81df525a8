#!/usr/bin/env bash
# Run 29: the check of every rung on the full sweep (now with the field reports of turn 2:
# padded head dims 1..255, broadcast k/v, large-logit inputs; and d64 on three consumer
# warpgroups), compute-sanitizer on the new paths, then wgmma tile variants for causal
# short sequences (wgmma alone).
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "info"; $B info > $OUT/info.txt 2>&1; grep -i "wgmma\|GPU" $OUT/info.txt | head -4 | tee -a $L
el "check all rungs"; timeout ${CHECK_S:-300} $B check --json $OUT/check.json > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check.txt | head -12 | tee -a $L
grep -c "padded-d" $OUT/check.txt | sed 's/^/padded-d lines: /' | tee -a $L
grep -E "broadcast-kv|d4-rows|lse~|q=k~|logits~" $OUT/check.txt | head -6 | tee -a $L
for spec in "memcheck|wgmma|d=64" "racecheck|wgmma|d=64" "synccheck|wgmma|d=64" "memcheck|mma|padded-d" "memcheck|wgmma|broadcast"; do
  IFS='|' read -r tool kern filt <<< "$spec"
  el "compute-sanitizer $tool on check --quick --kernel $kern --filter $filt"
  timeout ${SAN_S:-100} compute-sanitizer --tool $tool $B check --quick --kernel $kern --filter "$filt" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a $L
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed,|Hazard" /tmp/san.txt | sort | uniq -c | sort -rn | head -4 | tee -a $L
done
SEQ=${SEQ:-1024,2048,4096}
for v in ${VARIANTS:-}; do
  IFS='|' read -r label dims spec <<< "$v"
  el "variant $label ($dims: $spec)"
  FLASHATTN_WGMMA_TILE="$spec" timeout 120 $B bench --kernels wgmma --dtype f16 --head-dim $dims --seqlen $SEQ --causal ${MASK:-both} --out-dir /tmp/v_$label > /tmp/v_$label.log 2>&1 || tail -3 /tmp/v_$label.log | tee -a $L
  grep -E "^f16" /tmp/v_$label/bench.txt | awk -v l=$label '{print l, $0}' | tee -a $OUT/variants.txt | tee -a $L
done
el "done"
