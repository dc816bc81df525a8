#!/usr/bin/env bash
# Run 116: causal blocks end at the last query row (the partial block first, block_row0). The
# quick checks on grids of 2-3 blocks, the A/B of d64 causal (HEAD's binary, this one, this one
# with 3 stages) and d64 non-causal 1k as a control (no shift there), then the full check.
set -uo pipefail
. scripts/gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$L"
quick_checks 50 "d=64 |grid=2" "d=128|grid=3"
gzip "$OUT/check-wgmma-grid.txt"
tile_bin s3 128,3,wg3,nopp
ab_rounds 3 "base=./.gpu/flashattn-base new=$B s3=/tmp/s3" --dtype both --head-dim 64 --seqlen 1k,2k,4k --causal on --warmup-ms 300 --iters 20
ab_rounds 2 "base=./.gpu/flashattn-base new=$B" --dtype both --head-dim 64,128 --seqlen 1k --causal off --warmup-ms 300 --iters 20
check_wgmma 200 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > "$OUT/check-wgmma.txt.gz"
el done
