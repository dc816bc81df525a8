"""flash_attn_varlen_func with its offsets on the device (read by the packed attn_mma kernel,
graph-safe) against the same call with host offsets (the library's per-sequence choice:
attn_wgmma on sm_90 for up to 64 sequences), and SDPA's FlashAttention-2 backend over the
padded batch as a peer, in one process, cases interleaved, both orders.

    python3 scripts/device/varlen-offsets.py OUT.json [threshold]

Prints one line per case: milliseconds (median of 5 windows of 20 calls) forward and forward +
backward for each way, and the ratio device / host.
"""

import json
import statistics
import sys

import torch

import flashattn
from flashattn import flash_attn_varlen_func

CASES = [
    # lengths, heads_q, heads_kv, head_dim, causal
    ([2048] * 8, 16, 16, 128, True),
    ([2048] * 8, 16, 16, 128, False),
    ([64, 512, 8192, 1000, 3000, 129, 2048, 4096], 16, 16, 128, True),
    ([512] * 64, 16, 16, 64, True),
    ([1024] * 16, 32, 8, 128, True),
]
# `threshold`: where one launch per sequence stops paying (src/cuda/fwd/varlen.rs
# PER_SEQUENCE_MAX and its length rule): batches of 8-64 sequences of 256-4k rows.
THRESHOLD = [
    ([n] * b, 16, 16, d, True)
    for d in (64, 128)
    for b, n in ((8, 256), (8, 1024), (16, 512), (16, 2048), (32, 256), (32, 1024), (32, 4096),
                 (64, 1024), (64, 4096))
]


def timed(fn, windows=5, calls=20):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(windows):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / calls)
    return statistics.median(out)


def main():
    results = []
    cases = THRESHOLD if sys.argv[2:] == ["threshold"] else CASES
    for lens, hq, hkv, d, causal in cases:
        total, longest = sum(lens), max(lens)
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda h: torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
        q, k, v = mk(hq), mk(hkv), mk(hkv)
        do = mk(hq)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        host = cu.tolist()
        ways = {"device": (cu, cu), "host": (host, host)}
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))

        def fwd(off):
            return lambda: flash_attn_varlen_func(q, k, v, *off, longest, longest, causal=causal)

        def fwd_bwd(off):
            def run():
                out = flash_attn_varlen_func(qg, kg, vg, *off, longest, longest, causal=causal)
                torch.autograd.grad(out, (qg, kg, vg), do)
            return run

        row = {"lens": lens, "heads_q": hq, "heads_kv": hkv, "head_dim": d, "causal": causal}
        times = {f"{w}_{p}": [] for w in ways for p in ("fwd", "fwd_bwd")}
        for order in (("device", "host"), ("host", "device")):
            for w in order:
                times[f"{w}_fwd"].append(timed(fwd(ways[w])))
                times[f"{w}_fwd_bwd"].append(timed(fwd_bwd(ways[w])))
        for key, xs in times.items():
            row[key + "_ms"] = min(xs)
        row["fwd_device_over_host"] = row["device_fwd_ms"] / row["host_fwd_ms"]
        row["fwd_bwd_device_over_host"] = row["device_fwd_bwd_ms"] / row["host_fwd_bwd_ms"]
        results.append(row)
        print(
            f"{len(lens)} seqs total {total} max {longest} hq={hq} hkv={hkv} d={d} causal={causal}: "
            f"fwd device {row['device_fwd_ms']:.3f} host {row['host_fwd_ms']:.3f} ms "
            f"({row['fwd_device_over_host']:.2f}x time); fwd+bwd device "
            f"{row['device_fwd_bwd_ms']:.3f} host {row['host_fwd_bwd_ms']:.3f} ms "
            f"({row['fwd_bwd_device_over_host']:.2f}x time)",
            flush=True,
        )
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "flashattn": flashattn.__file__,
                   "cases": results}, f, indent=1)


if __name__ == "__main__":
    main()
