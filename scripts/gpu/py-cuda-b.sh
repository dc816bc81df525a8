#!/usr/bin/env bash
# Issue 15, second call: the transformers example (renamed attention), the full wgmma check of
# the kernel whose scheduler counter now zeroes itself (and takes a null counter in graph
# captures), memcheck on small cases, an A/B of that kernel against the previous one
# (.gpu/flashattn-old, commit a7c0bab), and the Python/Rust cross-check again in the other
# order (Python first).
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
el "examples/transformers_attention.py"
for dt in float16 bfloat16; do
  timeout 120 python3 python/examples/transformers_attention.py --dtype $dt 2>&1 | grep -v -i warn | tail -4 | tee -a $L
done
el "check --kernel wgmma (full)"
timeout 260 $B check --kernel wgmma > $OUT/check-wgmma.txt 2>&1; echo "check exit $?" | tee -a $L
tail -1 $OUT/check-wgmma.txt | tee -a $L; grep -v "^\[PASS\]" $OUT/check-wgmma.txt | grep -v "^checking\|passed" | head -5 | cut -c1-300 | tee -a $L
el "memcheck, small cases"
timeout 100 compute-sanitizer --tool memcheck --print-limit 5 $B check --kernel wgmma --filter "b=1&sq=300&d=64" > /tmp/mc.txt 2>&1; echo "memcheck exit $?" | tee -a $L; grep -E "ERROR SUMMARY|passed" /tmp/mc.txt | tail -2 | tee -a $L
for i in 1 2; do
  for bin in old new; do
    el "bench $bin ($i)"
    exe=$B; [ $bin = old ] && exe=./.gpu/flashattn-old
    timeout 100 $exe bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/ab_${bin}_$i > /tmp/ab.log 2>&1 || tail -3 /tmp/ab.log | tee -a $L
    grep -E "^f16" /tmp/ab_${bin}_$i/bench.txt | awk -v l=$bin -v i=$i '{print l, i, $0}' >> $OUT/ab.txt
  done
done
el "cross-check, Python first then Rust"
timeout 120 python3 scripts/gpu/py-crosscheck.py /tmp/ab_new_2/bench.json $OUT/crosscheck-pyfirst.json 2>/dev/null > /tmp/x1.txt
timeout 60 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr > /dev/null 2>&1
python3 - <<'P' | tee -a $L
import json
import os
py = {(r["id"], r["peer"]): r for r in json.load(open(os.environ["OUT"] + "/crosscheck-pyfirst.json"))["results"]}
rust = {c["id"]: next(r["timing"]["tflops"] for r in c["results"] if r["name"] == "wgmma") for c in json.load(open("/tmp/xr/bench.json"))["cases"]}
print(f"{'case':34} {'python':>8} {'rust after':>10} {'py/rust':>8}")
for cid, rt in rust.items():
    p = py.get((cid, "flashattn"), {}).get("tflops")
    print(f"{cid:34} {p or 0:8.1f} {rt:10.1f} {(p or 0) / rt:8.3f}")
P
el done
