#!/usr/bin/env python3
"""Ours (the Python package) and the SDPA peers timed in one process, case by case, over long
windows: the d64/d128 1k-16k cases of a bench JSON (their shapes, FLOPs and input sets), each
line after WARMUP_MS of warm-up and timed over enough launches to last ~250 ms or more (1000
up to 2k, 200 from 4k), so that the median spans several periods of the power limiter rather
than the ~8 ms of the sweep's 30 launches. Round 1 times ours first in each case, round 2 the
peers first. Prints ours / cuDNN per case and round (and ours / FlashAttention-2 for the
backward), and the sweep's ratio.

A forward JSON (`bench`) times the forward against cuDNN; a backward JSON (`bench
--backward`, its cases carry "backward": true) times `torch.autograd.grad` of the package's
`flash_attn_func` against SDPA's cuDNN and FlashAttention-2 backends (peers.py: one forward
per input set, the graph kept, a random dO).

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
backward = any(c["case"].get("backward") for c in cases)
ours_line = "bwd" if backward else "wgmma"
peers = ["cudnn", "flash"] if backward else ["cudnn"]
sweep = {}
for c in cases:
    r = {x["name"]: x.get("timing", {}).get("median_ms") for x in c["results"]}
    if r.get(ours_line) and r.get("cudnn"):
        sweep[c["id"]] = r["cudnn"] / r[ours_line]
# ratios[id][peer][round] = (peer ms / ours ms, ours ms, peer ms)
ratios = {}
for rnd, order in ((1, ["flashattn"] + peers), (2, peers + ["flashattn"])):
    for part, iters in (([c for c in cases if c["case"]["seqlen"] <= 2048], 1000), ([c for c in cases if c["case"]["seqlen"] > 2048], 200)):
        if not part:
            continue
        req = {"iters": iters, "warmup": 10, "warmup_ms": warmup_ms, "peers": order,
               "cases": [dict(c["case"], id=c["id"], flops=c["flops"], sets=c["sets"]) for c in part]}
        path = f"{out}/same-{'bwd-' if backward else ''}{rnd}-{iters}.json"
        subprocess.run([sys.executable, os.environ.get("PEERS", "tools/bench/peers.py"), json.dumps(req), "--out", path], check=False)
        try:
            resp = json.load(open(path))
        except (OSError, ValueError):
            continue
        res = {(r["id"], r["peer"]): r for r in resp["results"]}
        for c in part:
            a = res.get((c["id"], "flashattn"), {})
            for peer in peers:
                b = res.get((c["id"], peer), {})
                if a.get("median_ms") and b.get("median_ms"):
                    ratios.setdefault(c["id"], {}).setdefault(peer, {})[rnd] = (b["median_ms"] / a["median_ms"], a["median_ms"], b["median_ms"])
print(f"{'backward' if backward else 'forward'}: ours over each peer, > 1 means ours is faster")
head = f"{'case':34} {'sweep':>6} {'cudnn 1':>8} {'cudnn 2':>8} {'mean':>6}"
if "flash" in peers:
    head += f" {'fa2 mean':>8}"
print(head + "   ours / cudnn us (round 1)")
below = 0
for c in cases:
    r = ratios.get(c["id"], {})
    rc = r.get("cudnn", {})
    vals = [rc[k][0] for k in sorted(rc)]
    mean = statistics.mean(vals) if vals else float("nan")
    below += mean < 1.0
    us = f"{rc[1][1] * 1e3:8.1f} / {rc[1][2] * 1e3:8.1f}" if 1 in rc else ""
    cells = " ".join(f"{rc[k][0]:8.3f}" if k in rc else "       -" for k in (1, 2))
    line = f"{c['id']:34} {sweep.get(c['id'], float('nan')):6.3f} {cells} {mean:6.3f}"
    if "flash" in peers:
        fv = [v[0] for v in r.get("flash", {}).values()]
        line += f" {statistics.mean(fv) if fv else float('nan'):8.3f}"
    print(line + f"   {us}")
print(f"cases with the mean over cuDNN below 1.0: {below} of {len(cases)}")
json.dump({"backward": backward, "ratios": ratios}, open(f"{out}/one-process{'-bwd' if backward else ''}.json", "w"), indent=1)
