#!/usr/bin/env bash
# Issue 15, sixth call: after the review fixes (per-thread stream without a counter, the
# caller's current context restored, one framework per CUDA call, CuPy's stream of the array's
# device, size-1 strides, NVRTC builtins by glob, once_differentiable, capture refusals) and
# varlen/kvcache on CUDA: the Python tests, the examples, and the cross-check three times
# interleaved (Rust bench, then peers.py's flashattn on its cases), medians of the three.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
el pytest
timeout 240 python3 -m pytest -q -p no:cacheprovider python/tests -ra 2>&1 | tail -8 | tee -a $L
el examples
timeout 90 python3 python/examples/torch_module.py 2>&1 | tail -2 | tee -a $L
timeout 90 python3 python/examples/transformers_attention.py 2>&1 | grep -v -i warn | tail -2 | tee -a $L
for i in 1 2 3; do
  el "cross-check $i"
  timeout 60 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr$i > /dev/null 2>&1
  timeout 100 python3 scripts/gpu/py-crosscheck.py /tmp/xr$i/bench.json $OUT/xc$i.json > /dev/null 2>&1
done
python3 - <<'P' | tee -a $L
import json, os, statistics as st
rust, py = {}, {}
for i in (1, 2, 3):
    for c in json.load(open(f"/tmp/xr{i}/bench.json"))["cases"]:
        rust.setdefault(c["id"], []).append(next(r["timing"]["tflops"] for r in c["results"] if r["name"] == "wgmma"))
    for r in json.load(open(os.environ["OUT"] + f"/xc{i}.json"))["results"]:
        if r["peer"] == "flashattn" and r.get("tflops"):
            py.setdefault(r["id"], []).append(r["tflops"])
print(f"{'case':34} {'rust (3)':>22} {'python (3)':>22} {'median py/rust':>14}")
for cid in rust:
    a, b = rust[cid], py.get(cid, [0])
    print(f"{cid:34} {' '.join(f'{x:6.1f}' for x in a):>22} {' '.join(f'{x:6.1f}' for x in b):>22} {st.median(b) / st.median(a):14.3f}")
P
el done
