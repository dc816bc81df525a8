#!/usr/bin/env bash
# Run 120: d64 causal on three consumers with smaller key tiles (Bc 64 and 96, tile overrides
# of the final binary) against the default Bc 128: since each consumer runs only its own key
# tiles, a smaller Bc leaves less of the diagonal masked. The A/B at 1k-4k causal and 1k-2k
# non-causal (control), then the causal d64 part of the quick check under each.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin b64 64,2,wg3,nopp
tile_bin b96 96,2,wg3,nopp
tile_bin b64s3 64,3,wg3,nopp
ab_rounds 3 "base=$B b64=/tmp/b64 b96=/tmp/b96 b64s3=/tmp/b64s3" --dtype both --head-dim 64 --seqlen 1k,2k,4k --causal on --warmup-ms 300 --iters 20
ab_rounds 2 "base=$B b64=/tmp/b64 b96=/tmp/b96" --dtype both --head-dim 64 --seqlen 1k,2k --causal off --warmup-ms 300 --iters 20
quick_checks 45 "d=64 &causal|64,2,wg3,nopp" "d=64 &causal|96,2,wg3,nopp"
gzip "$OUT/check-wgmma-grid.txt"
el done
