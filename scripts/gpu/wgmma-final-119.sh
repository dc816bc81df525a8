#!/usr/bin/env bash
# Run 119: the kernel of commit c3310d4 (the causal shift; run 118's changes reverted): the
# default bench sweep with the peers and d256 (wgmma-final-b.sh: README table), then initcheck
# (not run on the kernels since run 110), racecheck, synccheck and memcheck on parts of the
# quick sweep.
set -uo pipefail
. scripts/gpu/lib.sh
sweep_sanitized "initcheck d=64 60" "initcheck d=128 40" "racecheck d=64 60" "synccheck d=128 35" "memcheck d=64 30"
el done
