#!/usr/bin/env bash
# Issue 15, fourth call: after the DLPack handshake change (stream=-1 on the producer's own
# current stream), the CUDA tests again, the host cost of a call broken down, and the
# Python/Rust cross-check in both orders.
set -uo pipefail
. scripts/gpu/lib.sh
py_setup
timeout 200 python3 -m pytest -q -p no:cacheprovider python/tests/test_cuda.py -ra 2>&1 | tail -4 | tee -a $L
timeout 120 python3 - <<'P' 2>&1 | tee -a $L
import time, torch, flashattn
from flashattn import _native
q = torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.float16)
out, lse = torch.empty_like(q), torch.empty(1, 8, 128, device="cuda")
s = torch.cuda.current_stream().cuda_stream
def per_call(fn, n=3000):
    for _ in range(200): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host
for label, fn in [
    ("flashattn.flash_attn_func", lambda: flashattn.flash_attn_func(q, q, q)),
    ("_native.forward (outputs given)", lambda: _native.forward(q, q, q, out, lse, None, False, -1, -1, 0.0, None, s, True)),
    ("5 x __dlpack__(stream=-1)", lambda: [q.__dlpack__(stream=-1) for _ in range(5)]),
    ("5 x __dlpack__(stream=handle)", lambda: [q.__dlpack__(stream=s if s else 1) for _ in range(5)]),
    ("2 x torch.empty", lambda: (torch.empty_like(q), torch.empty(1, 8, 128, device="cuda"))),
    ("torch SDPA", lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)),
]:
    print(f"{label:34}: {per_call(fn):7.1f} us of host time per call")
P
el "Rust bench, then Python"
timeout 100 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xb > /dev/null 2>&1
timeout 150 python3 scripts/gpu/py-crosscheck.py /tmp/xb/bench.json $OUT/crosscheck-d1.json 2>/dev/null | tee -a $L
el "Python (same request), then Rust"
timeout 150 python3 scripts/gpu/py-crosscheck.py /tmp/xb/bench.json $OUT/crosscheck-d2.json 2>/dev/null > /dev/null
timeout 100 $B bench --kernels wgmma --dtype f16 --head-dim 64,128 --seqlen 1024,4096,16384 --no-plot --out-dir /tmp/xr > /dev/null 2>&1
python3 - <<'P' | tee -a $L
import json, os
py = {(r["id"], r["peer"]): r for r in json.load(open(os.environ["OUT"] + "/crosscheck-d2.json"))["results"]}
rust = {c["id"]: next(r["timing"]["tflops"] for r in c["results"] if r["name"] == "wgmma") for c in json.load(open("/tmp/xr/bench.json"))["cases"]}
for cid, rt in rust.items():
    p = py.get((cid, "flashattn"), {}).get("tflops") or 0
    print(f"{cid:34} python {p:7.1f} rust-after {rt:7.1f} py/rust {p / rt:6.3f}")
P
el done
