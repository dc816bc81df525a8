#!/usr/bin/env bash
# Why does the Rust bench read our 1k lines lower than the Python package does (run 84)? The
# 1k cases at the default 16k tokens (kernels of 30-50 us) and at 64k tokens (4x longer
# launches): if the difference is per-launch (host or gaps between launches), it shrinks at
# 64k. Rust bench, then peers.py (flashattn, cudnn) on its cases, then the Rust bench again.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
for t in 16384 65536; do
  timeout 40 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024 --tokens $t --no-plot --out-dir /tmp/r1_$t > /dev/null 2>&1
done
python3 - <<'P'
import json
a = json.load(open("/tmp/r1_16384/bench.json")); b = json.load(open("/tmp/r1_65536/bench.json"))
a["cases"] += b["cases"]
json.dump(a, open("/tmp/both.json", "w"))
P
timeout 120 python3 scripts/gpu/py-crosscheck.py /tmp/both.json $OUT/xc.json 2>/dev/null | tee -a $L
for t in 16384 65536; do
  timeout 40 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024 --tokens $t --no-plot --out-dir /tmp/r2_$t > /dev/null 2>&1
  grep -E "^f16" /tmp/r2_$t/bench.txt | sed "s/^/rust again tokens=$t: /" | tee -a $L
done
