#!/usr/bin/env bash
# Run 87: the Python package's CUDA path on the current commit (tests, examples), the host
# time per call broken down (py-host.py) next to the Rust bench's own host time per launch
# (bench JSON host_us), and the same-process cross-check of the 12 f16 cases (d64/d128, 1k/
# 4k/16k, causal and not) in three interleaved rounds, medians.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
py_tests
py_examples
py_host
timeout 60 $B bench --kernels wgmma,mma --dtype f16 --head-dim 64 --causal off --seqlen 128 --tokens 128 --hidden 512 --no-plot --out-dir /tmp/h > /dev/null 2>&1
python3 -c "
import json
for c in json.load(open('/tmp/h/bench.json'))['cases']:
    for r in c['results']: print('rust bench', c['id'], r['name'], 'host_us', r.get('host_us'), 'gpu us', r['timing']['median_ms']*1e3)
" | tee -a "$L"
for i in 1 2 3; do
  el "cross-check $i"
  timeout 80 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr$i > /dev/null 2>&1
  timeout 120 python3 scripts/gpu/py-crosscheck.py /tmp/xr$i/bench.json /tmp/xc$i.json > /dev/null 2>&1
done
cp /tmp/xr1/bench.json $OUT/rust1.json; cp /tmp/xc1.json $OUT/py1.json
python3 - <<'P' | tee -a "$L"
import json, statistics as st
rust, py, cud, hr, hp, hc = {}, {}, {}, {}, {}, {}
for i in (1, 2, 3):
    for c in json.load(open(f"/tmp/xr{i}/bench.json"))["cases"]:
        r = next(r for r in c["results"] if r["name"] == "wgmma")
        rust.setdefault(c["id"], []).append(r["timing"]["tflops"]); hr.setdefault(c["id"], []).append(r.get("host_us") or 0)
    for r in json.load(open(f"/tmp/xc{i}.json"))["results"]:
        if not r.get("tflops"): continue
        d, h = (py, hp) if r["peer"] == "flashattn" else (cud, hc)
        d.setdefault(r["id"], []).append(r["tflops"]); h.setdefault(r["id"], []).append(r.get("host_us") or 0)
m = lambda xs: st.median(xs) if xs else float("nan")
print(f"{'case':32} {'rust':>7} {'package':>7} {'cudnn':>7} {'pkg/rust':>8} {'pkg/cudnn':>9} {'host us: rust':>13} {'package':>7} {'cudnn':>6}")
for k in rust:
    print(f"{k:32} {m(rust[k]):7.1f} {m(py.get(k,[])):7.1f} {m(cud.get(k,[])):7.1f} {m(py.get(k,[]))/m(rust[k]):8.3f} {m(py.get(k,[]))/m(cud.get(k,[])):9.3f} {m(hr[k]):13.1f} {m(hp.get(k,[])):7.1f} {m(hc.get(k,[])):6.1f}")
P
el done
