#!/usr/bin/env bash
# Run 46: split count and pipeline depth at batch 1 (8k, 32k, 128k), where cuDNN led by
# 1.15-1.45x in run 45: forced splits 16..128 at stages 2, 3, 4.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
timeout 400 $B bench --decode --dtype f16 --decode-batch 1 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0 --decode-stages 2,3,4 --decode-splits 16,32,64,96,128 --warmup-ms 100 --iters 20 --out-dir /tmp/bd > /tmp/bd.log 2>&1; echo "bench exit $?" | tee -a $L
cp /tmp/bd/bench-decode.json $OUT/bench-decode-splits.json
python3 - <<'PY' | tee -a $L
import json
d = json.load(open("/tmp/bd/bench-decode.json"))
for s in d["shapes"]:
    print(s["seqlen_k"], "read", round(s["read_gbps"]))
    for l in sorted(s["lines"], key=lambda l: -l["gbps"])[:8]:
        print("   ", l["layout"], round(l["gbps"]), round(l["median_us"], 1))
PY
