#!/usr/bin/env bash
# Run 88: PyTorch tensors read through their own attributes (data_ptr, shape, stride) instead
# of a DLPack export, and a leaner Python wrapper: the CUDA tests, the host time per call
# broken down (py-host.py), then three interleaved rounds of the Rust bench and the package
# alone in peers.py (no cuDNN between our lines, as in the Rust bench) on the 12 f16 cases.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
py_tests
py_host
for i in 1 2 3; do
  el "cross-check $i"
  timeout 80 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr$i > /dev/null 2>&1
  XC_PEERS=flashattn timeout 120 python3 scripts/gpu/py-crosscheck.py /tmp/xr$i/bench.json /tmp/xc$i.json > /dev/null 2>&1
done
cp /tmp/xr1/bench.json $OUT/rust1.json; cp /tmp/xc1.json $OUT/py1.json
python3 - <<'P' | tee -a "$L"
import json, statistics as st
rust, py, hr, hp = {}, {}, {}, {}
for i in (1, 2, 3):
    for c in json.load(open(f"/tmp/xr{i}/bench.json"))["cases"]:
        r = next(r for r in c["results"] if r["name"] == "wgmma")
        rust.setdefault(c["id"], []).append(r["timing"]["tflops"]); hr.setdefault(c["id"], []).append(r.get("host_us") or 0)
    for r in json.load(open(f"/tmp/xc{i}.json"))["results"]:
        if r.get("tflops"):
            py.setdefault(r["id"], []).append(r["tflops"]); hp.setdefault(r["id"], []).append(r.get("host_us") or 0)
m = lambda xs: st.median(xs) if xs else float("nan")
f = lambda xs: " ".join(f"{x:6.1f}" for x in xs)
print(f"{'case':32} {'rust x3':>20} {'package x3':>20} {'pkg/rust':>8} {'host us: rust':>13} {'package':>7}")
for k in rust:
    print(f"{k:32} {f(rust[k]):>20} {f(py.get(k, [])):>20} {m(py.get(k,[]))/m(rust[k]):8.3f} {m(hr[k]):13.1f} {m(hp.get(k,[])):7.1f}")
P
el done
