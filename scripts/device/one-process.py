#!/usr/bin/env python3
"""Ours (the Python package, attn_wgmma) and cuDNN timed in one process, case by case,
over long windows: the d64/d128 1k-16k cases of a bench JSON (their shapes, FLOPs and input
sets), each line after WARMUP_MS of warm-up and timed over enough launches to last ~250 ms or
more (1000 up to 2k, 200 from 4k), so that the median spans several periods of the power
limiter rather than the ~8 ms of the sweep's 30 launches. Round 1 times ours first in each
case, round 2 cuDNN first. Prints ours / cuDNN per case and round, and the sweep's ratio.

    python3 scripts/device/one-process.py BENCH_JSON OUT_DIR [WARMUP_MS]
"""
import json
import os
import statistics
import subprocess
import sys

bench = json.load(open(sys.argv[1]))
out = sys.argv[2]
warmup_ms = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
cases = [c for c in bench["cases"] if c["case"]["head_dim"] in (64, 128) and c["case"]["seqlen"] >= 1024]
sweep = {}
for c in cases:
    r = {x["name"]: x.get("timing", {}).get("median_ms") for x in c["results"]}
    if r.get("wgmma") and r.get("cudnn"):
        sweep[c["id"]] = r["cudnn"] / r["wgmma"]
ratios = {}
for rnd, peers in ((1, ["flashattn", "cudnn"]), (2, ["cudnn", "flashattn"])):
    for part, iters in (([c for c in cases if c["case"]["seqlen"] <= 2048], 1000), ([c for c in cases if c["case"]["seqlen"] > 2048], 200)):
        req = {"iters": iters, "warmup": 10, "warmup_ms": warmup_ms, "peers": peers,
               "cases": [dict(c["case"], id=c["id"], flops=c["flops"], sets=c["sets"]) for c in part]}
        path = f"{out}/same-{rnd}-{iters}.json"
        subprocess.run([sys.executable, os.environ.get("PEERS", "tools/bench/peers.py"), json.dumps(req), "--out", path], check=False)
        try:
            resp = json.load(open(path))
        except (OSError, ValueError):
            continue
        res = {(r["id"], r["peer"]): r for r in resp["results"]}
        for c in part:
            a, b = res.get((c["id"], "flashattn"), {}), res.get((c["id"], "cudnn"), {})
            if a.get("median_ms") and b.get("median_ms"):
                ratios.setdefault(c["id"], {})[rnd] = (b["median_ms"] / a["median_ms"], a["median_ms"], b["median_ms"])
print(f"{'case':34} {'sweep':>6} {'round 1':>8} {'round 2':>8} {'mean':>6}   ours / cudnn us (round 1)")
below = 0
for c in cases:
    r = ratios.get(c["id"], {})
    vals = [r[k][0] for k in sorted(r)]
    mean = statistics.mean(vals) if vals else float("nan")
    below += mean < 1.0
    us = f"{r[1][1] * 1e3:8.1f} / {r[1][2] * 1e3:8.1f}" if 1 in r else ""
    cells = " ".join(f"{r[k][0]:8.3f}" if k in r else "       -" for k in (1, 2))
    print(f"{c['id']:34} {sweep.get(c['id'], float('nan')):6.3f} {cells} {mean:6.3f}   {us}")
print(f"cases with the mean below 1.0: {below} of {len(cases)}")
