#!/usr/bin/env python3
"""Same-process cross-check (issue 15): the cases of a `flashattn bench` JSON timed again by
the bench's peers.py ($PEERS, default tools/bench/peers.py) with the Python package
("flashattn") and cuDNN side by side, under the bench's own method (iters, warm-up, input sets, FLOP counts). Prints, per case, the Rust bench's wgmma
TFLOP/s, the package's, and their ratio.

    python3 scripts/device/py-crosscheck.py BENCH_JSON OUT_JSON

XC_PEERS (default "flashattn,cudnn") names the peers to run.
"""
import json
import os
import subprocess
import sys

bench = json.load(open(sys.argv[1]))
m = bench["method"]
req = {
    "iters": m["iters"], "warmup": m["warmup"], "warmup_ms": m["warmup_ms"],
    "peers": os.environ.get("XC_PEERS", "flashattn,cudnn").split(","),
    "cases": [dict(c["case"], id=c["id"], flops=c["flops"], sets=c["sets"]) for c in bench["cases"]],
}
subprocess.run([sys.executable, os.environ.get("PEERS", "tools/bench/peers.py"), json.dumps(req), "--out", sys.argv[2]], check=True)
resp = json.load(open(sys.argv[2]))
py = {(r["id"], r["peer"]): r for r in resp["results"]}
print(f"{'case':34} {'rust wgmma':>10} {'python':>10} {'py/rust':>8} {'cudnn':>8}")
for c in bench["cases"]:
    rust = next((r["timing"]["tflops"] for r in c["results"] if r["name"] == "wgmma" and r.get("timing")), None)
    ours = py.get((c["id"], "flashattn"), {}).get("tflops")
    cud = py.get((c["id"], "cudnn"), {}).get("tflops")
    ratio = f"{ours / rust:8.3f}" if ours and rust else "       -"
    print(f"{c['id']:34} {rust or 0:10.1f} {ours or 0:10.1f} {ratio} {cud or 0:8.1f}")
    if not ours:
        print("   flashattn:", py.get((c["id"], "flashattn")))
