#!/usr/bin/env bash
# Run 102: the deferred epilogue with each round's Q loaded during the round before (the
# producer draws the next tile a round early and issues its Q after this round's third K/V
# tile): a small check on a grid of 2, defer / nodefer interleaved (three rounds), the timeline
# at d128 1k on all SMs and on 66 (is the steady state's K wait a shared-bandwidth limit?),
# the full wgmma check and two hand-off checks on small grids, ncu (speed of light, memory,
# warp states) at d128 and d64 1k, then racecheck, synccheck, initcheck and memcheck on parts of
# the quick wgmma sweep.
set -uo pipefail
. scripts/gpu/lib.sh
printf '#!/bin/sh\nFLASHATTN_WGMMA_TILE=nodefer exec ./.gpu/flashattn "$@"\n' > /tmp/nodefer && chmod +x /tmp/nodefer
el "smoke: check wgmma d=128 none on grid=2"
FLASHATTN_WGMMA_TILE="grid=2" timeout 60 $B check --kernel wgmma --filter "d=128 none" > /tmp/c.txt 2>&1; rc=$?; echo "check exit $rc" | tee -a "$L"
tail -1 /tmp/c.txt | tee -a "$L"; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a "$L"
if [ $rc -ne 0 ]; then el "smoke failed: stop"; exit 0; fi
ab_rounds 3 "nodefer=/tmp/nodefer defer=$B" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
for spec in trace trace,grid=66; do
  el "timeline d128 1k ($spec)"
  FLASHATTN_WGMMA_TILE=$spec FLASHATTN_WGMMA_TRACE=/tmp/tr.json timeout 60 $B bench --kernels wgmma --dtype f16 --head-dim 128 --seqlen 1024 --causal off --warmup 2 --warmup-ms 300 --iters 20 --no-plot --out-dir /tmp/bt > /tmp/bt.log 2>&1; echo "bench exit $?" | tee -a "$L"
  python3 scripts/gpu/wgmma-trace.py /tmp/tr.json >> $OUT/trace.txt 2>&1
done
el "check --kernel wgmma"
timeout 200 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a "$L"
tail -1 $OUT/check-wgmma.txt | tee -a "$L"; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | head -8 | cut -c1-300 | tee -a "$L"
for v in "d=128|grid=2" "d=64 |grid=3"; do
  IFS='|' read -r filt spec <<< "$v"
  el "check wgmma '$filt' under $spec"
  FLASHATTN_WGMMA_TILE="$spec" timeout 100 $B check --kernel wgmma --filter "$filt" > /tmp/c.txt 2>&1; echo "check exit $?" | tee -a "$L"
  tail -1 /tmp/c.txt | tee -a "$L"; grep -v "^\[PASS\]" /tmp/c.txt | head -6 | cut -c1-300 | tee -a "$L"
done
for d in 128 64; do
  el "ncu d$d 1k"
  echo "==== wgmma f16 d$d 1k non-causal" >> $OUT/ncu.txt
  timeout 100 ncu --clock-control none --kernel-name attn_wgmma --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_read.sum.per_second,lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed \
    $B bench --kernels wgmma --dtype f16 --head-dim $d --seqlen 1024 --causal off --warmup-ms 0 --warmup 1 --iters 5 --no-plot --out-dir /tmp/bn >> $OUT/ncu.txt 2>&1; echo "ncu exit $?" | tee -a "$L"
done
for v in "racecheck|d=64" "synccheck|d=128" "initcheck|d=128" "memcheck|d=64"; do
  IFS='|' read -r tool filt <<< "$v"
  el "$tool $filt (quick sweep)"
  timeout 60 compute-sanitizer --tool $tool $B check --quick --kernel wgmma --filter "$filt" > /tmp/san.txt 2>&1; echo "$tool exit $?" | tee -a "$L"
  grep -E "SUMMARY|passed," /tmp/san.txt | sort | uniq -c | head -3 | tee -a "$L"; grep -c "^\[PASS\]" /tmp/san.txt | tee -a "$L"
done
el done
