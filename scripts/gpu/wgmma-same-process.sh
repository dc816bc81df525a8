#!/usr/bin/env bash
# Run 123: ours (the Python package) and cuDNN in one process, alternating case by case, over
# long timing windows (same-process.py), on the d64/d128 1k-16k cases of run 119's sweep; SM
# clock and power sampled.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 > "$OUT/smi.csv" 2>/dev/null &
SP=$!
timeout 420 python3 scripts/gpu/same-process.py docs/results/bench-h200.json "$OUT" 800 2>"$OUT/peers-log.txt" | tee -a "$L"
kill $SP; wait $SP 2>/dev/null
el done
