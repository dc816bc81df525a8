#!/usr/bin/env bash
# Run 37: the final binary (softcap's tanh back on rcp.approx, its 2 log2 e folded into the
# host's factor): the full check of wgmma and mma, memcheck on the softcap cases.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "check wgmma,mma (full sweep)"
timeout 300 $B check --kernel wgmma,mma > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check.txt | head -20 | tee -a $L
grep -cE "window\(|softcap|alibi" $OUT/check.txt | sed 's/^/modifier lines: /' | tee -a $L
el "memcheck softcap"; timeout 60 compute-sanitizer --tool memcheck $B check --quick --kernel wgmma,mma --filter softcap > /tmp/san.txt 2>&1; echo "exit $?" | tee -a $L
grep -E "ERROR SUMMARY|passed," /tmp/san.txt | sort | uniq -c | tee -a $L
el "done"
