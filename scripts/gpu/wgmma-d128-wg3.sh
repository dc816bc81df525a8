#!/usr/bin/env bash
# Run 104: d128 with three consumer warpgroups (Br 192, Bc 64, 160 registers each: no spills),
# so that each consumer's softmax runs under two others' GEMMs (FA3's d64 shape), against the
# default (two consumers, Bc 128, pingpong): interleaved, d128 1k-16k both masks, two rounds,
# no pingpong / pingpong ring / four stages; the d128 check under the first; then, on the
# default kernel (runs 99-100's), ncu (speed of light, compute, memory, warp states,
# scheduler) at d128 and d64 1k, and synccheck and initcheck on parts of the quick sweep.
set -uo pipefail
. scripts/gpu/lib.sh
mk() { printf '#!/bin/sh\nFLASHATTN_WGMMA_TILE=%s exec ./.gpu/flashattn "$@"\n' "$2" > /tmp/$1 && chmod +x /tmp/$1; }
mk w3 "64,2,wg3,nopp"; mk w3pp "64,2,wg3"; mk w3s4 "64,4,wg3,nopp"
ab_rounds 2 "default=$B w3=/tmp/w3 w3pp=/tmp/w3pp w3s4=/tmp/w3s4" --dtype f16 --head-dim 128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
el "check wgmma d=128 under 64,2,wg3,nopp"
FLASHATTN_WGMMA_TILE="64,2,wg3,nopp" timeout 70 $B check --kernel wgmma --filter "d=128" > $OUT/check-w3.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-w3.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-w3.txt | head -6 | cut -c1-300 | tee -a "$L"
for d in 128 64; do
  el "ncu d$d 1k"
  echo "==== wgmma f16 d$d 1k non-causal" >> $OUT/ncu.txt
  timeout 100 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    $B bench --kernels wgmma --dtype f16 --head-dim $d --seqlen 1024 --causal off --warmup-ms 0 --warmup 1 --iters 20 --no-plot --out-dir /tmp/bn >> $OUT/ncu.txt 2>&1; echo "ncu exit $?" | tee -a "$L"
done
for v in "synccheck|d=128" "initcheck|d=64"; do
  IFS='|' read -r tool filt <<< "$v"
  el "$tool $filt (quick sweep)"
  timeout 60 compute-sanitizer --tool $tool $B check --quick --kernel wgmma --filter "$filt" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a "$L"
  grep -E "SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"; grep -c "^\[PASS\]" /tmp/san.txt | tee -a "$L"
done
el done
