#!/usr/bin/env bash
# Run 118: the producer draws its next tile under this tile's K/V loads, the consumers' tile
# setup runs before their wait for Q, and without pingpong (d64) the epilogue runs before the
# trailing key tiles' passes; against HEAD's binary (c3310d4, .gpu/flashattn-base). Quick
# checks on grids of 2-3 blocks (also d64 with 3 stages), the A/B (d64/d128 1k-4k, d256), d64
# with 3 stages against the new default at 1k-16k, timelines of d64 causal 1k and d128 1k,
# then the full check.
set -uo pipefail
. scripts/gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv | tee -a "$L"
quick_checks 60 "d=64 |grid=2" "d=128|grid=3" "d=256|grid=2" "d=64 |128,3,wg3,nopp,grid=3"
gzip "$OUT/check-wgmma-grid.txt"
tile_bin s3 128,3,wg3,nopp
ab_rounds 3 "base=./.gpu/flashattn-base new=$B" --dtype both --head-dim 64,128 --seqlen 1k,2k,4k --causal both --warmup-ms 300 --iters 20
mv "$OUT/ab.txt" "$OUT/ab-new.txt"
ab_rounds 3 "new=$B s3=/tmp/s3" --dtype both --head-dim 64 --seqlen 1k,2k,4k,8k,16k --causal both --warmup-ms 300 --iters 20
mv "$OUT/ab.txt" "$OUT/ab-s3.txt"
ab_rounds 2 "base=./.gpu/flashattn-base new=$B" --dtype both --head-dim 256 --seqlen 1k,2k,4k --causal both --warmup-ms 300 --iters 20
mv "$OUT/ab.txt" "$OUT/ab-d256.txt"
timeline "$B" trace 64 1024 on "$OUT/timeline.txt"
timeline "$B" trace 128 1024 off "$OUT/timeline.txt"
check_wgmma 170 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > "$OUT/check-wgmma.txt.gz"
el done
