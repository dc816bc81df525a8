#!/usr/bin/env bash
# Run 47: fewer splits won in run 46 (16 beat 32..128 at batch 1): batch 1 with 4..20 splits
# and batch 8 with 1..4, stages 3 and 4.
set -uo pipefail
B=${FLASHATTN:-./.gpu/flashattn}
L=$OUT/log.txt
for cfg in "1 4,8,12,16,20,24" "8 1,2,3,4,6"; do
  set -- $cfg
  timeout 250 $B bench --decode --dtype f16 --decode-batch $1 --decode-seqlen 8k,32k,128k --decode-q 1 --decode-pages 0 --decode-stages 3,4 --decode-splits $2 --warmup-ms 100 --iters 20 --out-dir /tmp/bd$1 > /tmp/bd$1.log 2>&1; echo "bench exit $?" | tee -a $L
  cp /tmp/bd$1/bench-decode.json $OUT/bench-decode-splits-b$1.json
  python3 - $1 <<'PY' | tee -a $L
import json, sys
d = json.load(open(f"/tmp/bd{sys.argv[1]}/bench-decode.json"))
for s in d["shapes"]:
    print("batch", s["batch"], s["seqlen_k"], "read", round(s["read_gbps"]))
    for l in sorted(s["lines"], key=lambda l: -l["gbps"])[:6]:
        print("   ", l["layout"], round(l["gbps"]), round(l["median_us"], 1))
PY
done
