#!/usr/bin/env bash
# Run 100: the kernel of this stop (softmax of both rows at once, short epilogue addressing,
# lse after the O store, Q released after the last S; run 99's full check passed on it): the
# default bench sweep with the peers and d256 (wgmma-final-b.sh: README table, SM clock and
# power sampled), then racecheck and memcheck on parts of the quick wgmma sweep.
set -uo pipefail
. scripts/gpu/lib.sh
sweep_sanitized "racecheck d=64 50" "memcheck d=128 40"
el done
