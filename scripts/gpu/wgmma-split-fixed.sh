#!/usr/bin/env bash
# Run 107: J (P packed inside the softmax, half by half) with its waits outside the huge-logit
# branch, the new default, against HEAD's binary (the kernel of runs 99-100,
# ./.gpu/flashattn-head), with the row sums in P V (`vsum`, a knob) beside them: interleaved,
# f16 d64/d128 1k-16k both masks, two rounds; the d128 1k timeline under vsum; the quick d64
# and d128 check under vsum; the full wgmma check of the default, racecheck on its d64 part of
# the quick sweep (the huge-logit case that hung in run 106 is there), synccheck on its d128
# part.
set -uo pipefail
. scripts/gpu/lib.sh
tile_bin vsum vsum
ab_rounds 2 "head=./.gpu/flashattn-head new=$B vsum=/tmp/vsum" --dtype f16 --head-dim 64,128 --seqlen 1k,2k,4k,16k --causal both --warmup-ms 300 --iters 20
timeline "$B" trace,vsum 128 1024 off $OUT/trace.txt
check_wgmma 40 /tmp/check-vsum-64.txt "$B" vsum --quick --filter d=64
check_wgmma 40 /tmp/check-vsum-128.txt "$B" vsum --quick --filter d=128
cat /tmp/check-vsum-64.txt /tmp/check-vsum-128.txt | gzip -c > $OUT/check-vsum.txt.gz
check_wgmma 290 /tmp/check-wgmma.txt "$B" ""
gzip -c /tmp/check-wgmma.txt > $OUT/check-wgmma.txt.gz
sanitize racecheck d=64 70
sanitize synccheck d=128 70
el done
