#!/usr/bin/env bash
# Bring-up of attn_wgmma on the H200: info, the layout probe (and its injected faults), the
# wgmma check (quick, then the full sweep), and a quick side-by-side bench with the peers.
# Each step is time-boxed, so a hung kernel costs its box, not the lease.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
t0=$(date +%s)
el() { echo "[t=$(( $(date +%s)-t0 ))s] $*" | tee -a $L; }
el "info"; $B info 2>&1 | tee -a $L
el "probe"; timeout 60 $B probe > $OUT/probe.txt 2>&1; echo "probe exit $?" | tee -a $L
grep -E "^\[FAIL\]|^layout|passed|caught" $OUT/probe.txt | head -20 | tee -a $L
timeout 60 $B probe --inject-fault > $OUT/probe-fault.txt 2>&1; echo "probe --inject-fault exit $? (1 expected)" | tee -a $L
grep -E "^\[FAIL\]|caught" $OUT/probe-fault.txt | head -20 | tee -a $L
el "check wgmma quick"; timeout 120 $B check --kernel wgmma --quick > $OUT/check-quick.txt 2>&1; echo "check quick exit $?" | tee -a $L
grep -v "^\[PASS\]" $OUT/check-quick.txt | head -30 | tee -a $L
el "check wgmma full"; timeout ${CHECK_S:-200} $B check --kernel wgmma > $OUT/check.txt 2>&1; echo "check exit $?" | tee -a $L
grep -v "^\[PASS\]" $OUT/check.txt | head -30 | tee -a $L
el "bench quick"; timeout ${BENCH_S:-240} $B bench --peers --kernels wgmma,mma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --out-dir $OUT/bench > $OUT/bench.log 2>&1; echo "bench exit $?" | tee -a $L
cat $OUT/bench/bench.txt 2>/dev/null | tee -a $L
el "done"
