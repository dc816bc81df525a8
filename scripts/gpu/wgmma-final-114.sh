#!/usr/bin/env bash
# Run 114: the final kernel of this session (idle consumers, each consumer's own key tiles,
# speculative maxima, three consumers at d64 for every length): the default bench sweep with
# the peers and d256 (wgmma-final-b.sh: README table), the quick d64 check under the new
# d64 default, and ncu's profile of d64 and d128 at 1k (f16, non-causal).
set -uo pipefail
. scripts/gpu/lib.sh
el "bench sweep"
bash scripts/gpu/wgmma-final-b.sh | tail -3 | tee -a "$L"
check_wgmma 40 /tmp/c.txt "$B" "" --quick --filter "d=64 "
for d in 64 128; do
  ncu_sol $d sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
done
gzip -f "$OUT/ncu.txt"
el done
