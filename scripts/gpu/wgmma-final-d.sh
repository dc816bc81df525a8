#!/usr/bin/env bash
# Run 100: the kernel of this stop (softmax of both rows at once, short epilogue addressing,
# lse after the O store, Q released after the last S; run 99's full check passed on it): the
# default bench sweep with the peers and d256 (wgmma-final-b.sh: README table, SM clock and
# power sampled), then racecheck and memcheck on parts of the quick wgmma sweep.
set -uo pipefail
. scripts/gpu/lib.sh
el "bench sweep"
bash scripts/gpu/wgmma-final-b.sh | tail -3 | tee -a "$L"
el "racecheck d=64 (quick sweep)"
timeout 50 compute-sanitizer --tool racecheck $B check --quick --kernel wgmma --filter "d=64" > /tmp/race.txt 2>&1; echo "racecheck exit $?" | tee -a "$L"
grep -E "RACECHECK SUMMARY|passed," /tmp/race.txt | sort | uniq -c | head -3 | tee -a "$L"; grep -c "^\[PASS\]" /tmp/race.txt | tee -a "$L"
el "memcheck d=128 (quick sweep)"
timeout 40 compute-sanitizer --tool memcheck $B check --quick --kernel wgmma --filter "d=128" > /tmp/mem.txt 2>&1; echo "memcheck exit $?" | tee -a "$L"
grep -E "ERROR SUMMARY|passed," /tmp/mem.txt | sort | uniq -c | head -3 | tee -a "$L"; grep -c "^\[PASS\]" /tmp/mem.txt | tee -a "$L"
el done
