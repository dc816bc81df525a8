#!/usr/bin/env bash
# Run 117: each consumer's Q rows load and free on barriers of their own (the producer hands
# consumer 0 its next tile first, the others after the next tile's first K load). Quick checks
# on grids of 2-3 blocks (d256: O staged in the Q rows), the A/B against run 116's binary
# (the causal shift) at 1k-2k, d64 causal with 3 stages, then the full check.
set -uo pipefail
. scripts/gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$L"
quick_checks 60 "d=64 |grid=2" "d=128|grid=3" "d=256|grid=2"
gzip "$OUT/check-wgmma-grid.txt"
tile_bin s3 128,3,wg3,nopp
ab_rounds 3 "shift=./.gpu/flashattn-shift new=$B" --dtype both --head-dim 64,128 --seqlen 1k,2k --causal both --warmup-ms 300 --iters 20
ab_rounds 2 "shift=./.gpu/flashattn-shift new=$B s3=/tmp/s3" --dtype both --head-dim 64 --seqlen 1k,2k,4k --causal on --warmup-ms 300 --iters 20
check_wgmma 200 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > "$OUT/check-wgmma.txt.gz"
el done
