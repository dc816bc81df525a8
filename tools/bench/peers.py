#!/usr/bin/env python3
"""PyTorch SDPA peers for `flashattn bench`, timed the same way as our kernels.

Backends (torch.nn.attention.sdpa_kernel): flash = SDPBackend.FLASH_ATTENTION
(FlashAttention-2), cudnn = SDPBackend.CUDNN_ATTENTION, efficient =
SDPBackend.EFFICIENT_ATTENTION (memory-efficient). Also "flashattn": this repository's Python
package (`flashattn.flash_attn_func` on the same tensors, in bshd, with the same timer), when it
is importable: a same-process cross-check of the Rust bench's numbers.

Method, as ours: tensors created [b, s, h, d] and viewed [b, h, s, d] with .transpose(1, 2)
(the same memory layout as our bshd), random normal inputs rotated among `sets` input sets,
`warmup` untimed calls and then more until `warmup_ms` milliseconds have passed (steady
clocks), then `iters` calls each between two CUDA events; median, min, p90
(nearest rank); TFLOP/s from the FLOPs the request gives (the same model as ours). Peak memory
per case: torch.cuda.max_memory_allocated() during one call after a reset, minus what was
allocated before it (the inputs).

Request (JSON, from a file path, a JSON string, or stdin):
  {"iters": 30, "warmup": 10, "warmup_ms": 500, "peers": ["flash", "cudnn", "efficient"],
   "cases": [{"id": "...", "dtype": "f16", "batch": 32, "seqlen": 512, "heads": 32,
              "head_dim": 64, "causal": false, "flops": 6.9e10, "sets": 2}]}
  Optional per case: "seqlen_q" (query rows, default seqlen) and "heads_kv" (GQA through
  SDPA's enable_gqa, default heads), for decoding shapes.
The dense matrix-product ceiling is measured in the same run under the same warm-up: a torch
matmul of two random 8192 x 8192 matrices per dtype of the cases (2 * 8192^3 FLOPs), reported
under "matmul", so that every kernel can be read as a fraction of it.

Response (JSON, to --out FILE or stdout):
  {"ok": true, "error": null, "torch": "...", "cudnn": "...", "cuda": "...", "device": "...",
   "matmul": [{"dtype": "f16", "n": 8192, "median_ms": ..., "tflops": ...}],
   "results": [{"id": "...", "peer": "flash", "median_ms": ..., "min_ms": ..., "p90_ms": ...,
                "iters": 30, "tflops": ..., "peak_mem_beyond_inputs_bytes": ...,
                "extra_mem_bytes": ...} or {"id": "...", "peer": "...", "skipped": "why"}]}
A backend that raises is recorded as skipped with its message; without torch or a GPU the
response has ok = false and the reason in "error". Progress goes to stderr.

  python3 tools/bench/peers.py [REQUEST] [--out FILE]   run the peers
  python3 tools/bench/peers.py --fake [REQUEST] [--out FILE]   fake timings (no torch; for tests)
  python3 tools/bench/peers.py --selftest               check the parts that need no torch
"""

import argparse
import contextlib
import json
import math
import sys
import time
import warnings

PEERS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
# Peers a request may name besides the SDPA backends (not in the default list).
EXTRA_PEERS = ("flashattn",)
DTYPES = ("f16", "bf16")


class Skip(Exception):
    """A backend refused a case; the message says why."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_request(text):
    """Parses and checks a request; raises ValueError naming what is wrong."""
    req = json.loads(text)
    if not isinstance(req, dict) or not isinstance(req.get("cases"), list):
        raise ValueError("request must be an object with a list 'cases'")
    req.setdefault("iters", 30)
    req.setdefault("warmup", 10)
    req.setdefault("warmup_ms", 0)
    req.setdefault("peers", list(PEERS))
    for p in req["peers"]:
        if p not in PEERS and p not in EXTRA_PEERS:
            raise ValueError(f"unknown peer {p!r}; known: {', '.join([*PEERS, *EXTRA_PEERS])}")
    for c in req["cases"]:
        for key in ("id", "dtype", "batch", "seqlen", "heads", "head_dim", "causal", "flops"):
            if key not in c:
                raise ValueError(f"case {c.get('id', '?')} lacks {key!r}")
        if c["dtype"] not in DTYPES:
            raise ValueError(f"case {c['id']}: dtype {c['dtype']!r} is not f16 or bf16")
        c.setdefault("sets", 2)
    return req


def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def summarize(times_ms, flops):
    """Median (mean of the middle two for even counts), min, p90 (nearest rank), TFLOP/s."""
    t = sorted(times_ms)
    n = len(t)
    if n == 0 or any(not math.isfinite(x) for x in t):
        return None
    median = t[n // 2] if n % 2 == 1 else 0.5 * (t[n // 2 - 1] + t[n // 2])
    p90 = t[math.ceil(0.9 * n) - 1]
    tflops = flops / (median * 1e-3) / 1e12 if median > 0 else 0.0
    return {"median_ms": median, "min_ms": t[0], "p90_ms": p90, "iters": n, "tflops": tflops}


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def time_case(torch, F, backend, case, iters, warmup, warmup_ms=0):
    """Times one backend on one case; returns a result dict (raises on backend errors)."""
    from torch.nn.attention import sdpa_kernel

    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
    b, s, h, d = case["batch"], case["seqlen"], case["heads"], case["head_dim"]
    # Decoding shapes: seqlen_q query rows against seqlen keys, heads_kv key/value heads (GQA).
    sq, hkv = int(case.get("seqlen_q", s)), int(case.get("heads_kv", h))
    causal = bool(case["causal"])
    nsets = max(1, int(case.get("sets", 2)))
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)

    def make(rows, heads):
        return torch.randn(b, rows, heads, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)

    backward = bool(case.get("backward", False))
    if backward:
        # The backward of one forward per set (FlashAttention's benchmark_backward): gradients
        # of q, k, v for a random dO, the graph kept between calls.
        nsets = 1
    sets = [(make(sq, h), make(s, hkv), make(s, hkv)) for _ in range(nsets)]
    gqa = hkv != h
    if backend == "flashattn":
        import flashattn

        # Our package takes bshd: the views' own memory, no copy.
        def call(i):
            q, k, v = sets[i % nsets]
            return flashattn.flash_attn_func(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal
            )
    elif gqa:
        # enable_gqa (torch >= 2.5) reads each kv head once per group, as we do; a backend
        # that refuses it is skipped rather than fed repeated heads (4x the bytes).
        def call(i):
            q, k, v = sets[i % nsets]
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    else:
        def call(i):
            q, k, v = sets[i % nsets]
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    if backward:
        fwd = call
        sets = [tuple(x.detach().requires_grad_(True) for x in st) for st in sets]
        graph = {}

        def call(i):
            st = sets[i % nsets]
            if i % nsets not in graph:
                out = fwd(i)
                graph[i % nsets] = (out, torch.randn_like(out))
            out, d_out = graph[i % nsets]
            return torch.autograd.grad(out, st, d_out, retain_graph=True)[0]

    mode = contextlib.nullcontext() if backward else torch.inference_mode()
    chosen = contextlib.nullcontext() if backend == "flashattn" else sdpa_kernel(backend)
    with mode, chosen:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                for i in range(max(1, warmup)):
                    call(i)
                torch.cuda.synchronize()
                # steady clocks: keep the GPU busy for warmup_ms before timing (as ours)
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < warmup_ms / 1e3:
                    for i in range(8):
                        call(i)
                    torch.cuda.synchronize()
            except Exception as e:
                why = first_line(e)
                notes = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
                if notes:
                    why += " (" + "; ".join(dict.fromkeys(notes))[:300] + ")"
                raise Skip(why) from None
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = call(0)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        out_bytes = out.numel() * out.element_size()
        del out
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        host = []
        for i in range(iters):
            starts[i].record()
            t = time.perf_counter()
            call(warmup + i)
            host.append((time.perf_counter() - t) * 1e6)
            ends[i].record()
        torch.cuda.synchronize()
        times = [st.elapsed_time(en) for st, en in zip(starts, ends)]
    r = summarize(times, float(case["flops"]))
    if r is None:
        raise Skip("non-finite event times")
    lse_bytes = b * h * sq * 4
    r["peak_mem_beyond_inputs_bytes"] = int(peak)
    r["extra_mem_bytes"] = int(max(0, peak - out_bytes - lse_bytes))
    # median host time of one call in the timed loop (us): what the caller's thread pays
    r["host_us"] = sorted(host)[len(host) // 2]
    return r


MATMUL_N = 8192


def time_matmul(torch, dtype_name, iters, warmup, warmup_ms, n=MATMUL_N):
    """Times torch.matmul of two random n x n matrices with the attention cases' method."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4321)
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    with torch.inference_mode():
        for _ in range(max(1, warmup)):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warmup_ms / 1e3:
            for _ in range(4):
                torch.matmul(a, b)
            torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            torch.matmul(a, b)
            ends[i].record()
        torch.cuda.synchronize()
    r = summarize([st.elapsed_time(en) for st, en in zip(starts, ends)], 2.0 * n**3)
    if r is None:
        raise Skip("non-finite event times")
    r.update({"dtype": dtype_name, "n": n})
    return r


def run(req):
    """Runs every peer on every case; never raises for a backend or case failure."""
    resp = {"ok": False, "error": None, "torch": None, "cudnn": None, "cuda": None, "device": None, "matmul": [], "results": []}
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend
    except Exception as e:  # torch missing or broken
        resp["error"] = f"PyTorch is not importable: {first_line(e)}"
        return resp
    resp["torch"] = str(torch.__version__)
    resp["cuda"] = str(torch.version.cuda)
    try:
        v = torch.backends.cudnn.version()
        resp["cudnn"] = None if v is None else str(v)
    except Exception:
        pass
    if not torch.cuda.is_available():
        resp["error"] = f"torch {torch.__version__} sees no CUDA GPU"
        return resp
    resp["device"] = torch.cuda.get_device_name()
    resp["ok"] = True
    iters, warmup, warmup_ms = int(req["iters"]), int(req["warmup"]), int(req["warmup_ms"])
    for dt in dict.fromkeys(c["dtype"] for c in req["cases"]):
        try:
            m = time_matmul(torch, dt, iters, warmup, warmup_ms)
            log(f"[peers] matmul {dt} {MATMUL_N}^3: {m['tflops']:.1f} TFLOP/s")
        except Exception as e:
            m = {"dtype": dt, "n": MATMUL_N, "skipped": str(e) if isinstance(e, Skip) else first_line(e)}
        finally:
            torch.cuda.empty_cache()
        resp["matmul"].append(m)
    total = len(req["cases"]) * len(req["peers"])
    done = 0
    for case in req["cases"]:
        for peer in req["peers"]:
            done += 1
            item = {"id": case["id"], "peer": peer}
            try:
                backend = "flashattn" if peer == "flashattn" else getattr(SDPBackend, PEERS[peer])
                item.update(time_case(torch, F, backend, case, iters, warmup, warmup_ms))
                log(f"[peers {done}/{total}] {case['id']} {peer}: {item['tflops']:.1f} TFLOP/s")
            except Exception as e:
                item["skipped"] = str(e) if isinstance(e, Skip) else first_line(e)
                log(f"[peers {done}/{total}] {case['id']} {peer}: skipped: {item['skipped']}")
            finally:
                torch.cuda.empty_cache()
            resp["results"].append(item)
    return resp


def fake(req):
    """A response with made-up timings (100/200/50/150 TFLOP/s), for tests without torch."""
    rates = {"flash": 100.0, "cudnn": 200.0, "efficient": 50.0, "flashattn": 150.0}
    resp = {"ok": True, "error": None, "torch": "fake", "cudnn": "fake", "cuda": "fake", "device": "fake", "results": []}
    resp["matmul"] = [
        dict(summarize([2.0 * MATMUL_N**3 / 600e12 * 1e3] * int(req["iters"]), 2.0 * MATMUL_N**3), dtype=dt, n=MATMUL_N)
        for dt in dict.fromkeys(c["dtype"] for c in req["cases"])
    ]
    for case in req["cases"]:
        for peer in req["peers"]:
            ms = float(case["flops"]) / (rates[peer] * 1e12) * 1e3
            item = {"id": case["id"], "peer": peer}
            item.update(summarize([ms] * int(req["iters"]), float(case["flops"])))
            item["peak_mem_beyond_inputs_bytes"] = 0
            item["extra_mem_bytes"] = 0
            resp["results"].append(item)
    return resp


def clean(obj):
    """Replaces non-finite floats by None so the output is strict JSON."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    if isinstance(obj, float):
        return finite(obj)
    return obj


def selftest():
    req = parse_request(
        '{"iters": 20, "cases": [{"id": "a", "dtype": "f16", "batch": 1, "seqlen": 512,'
        ' "heads": 2, "head_dim": 64, "causal": true, "flops": 2e12}]}'
    )
    assert req["warmup"] == 10 and req["warmup_ms"] == 0 and req["peers"] == list(PEERS) and req["cases"][0]["sets"] == 2
    s = summarize([float(x) for x in range(20, 0, -1)], 2e12)
    assert (s["median_ms"], s["min_ms"], s["p90_ms"], s["iters"]) == (10.5, 1.0, 18.0, 20), s
    assert abs(s["tflops"] - 2e12 / 10.5e-3 / 1e12) < 1e-9
    assert summarize([3.0, 1.0, 2.0], 0.0)["median_ms"] == 2.0
    f = fake(req)
    assert len(f["results"]) == 3 and abs(f["results"][1]["tflops"] - 200.0) < 1e-6
    assert len(f["matmul"]) == 1 and abs(f["matmul"][0]["tflops"] - 600.0) < 1e-6
    json.loads(json.dumps(clean(f), allow_nan=False))
    for bad in ('{"cases": 1}', '{"cases": [{"id": "x"}]}', '{"cases": [], "peers": ["nope"]}'):
        try:
            parse_request(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
    print("peers.py selftest ok")


def read_request(arg):
    if arg is None or arg == "-":
        return sys.stdin.read()
    if arg.lstrip().startswith("{"):
        return arg
    with open(arg, encoding="utf-8") as f:
        return f.read()


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch SDPA peers for flashattn bench")
    ap.add_argument("request", nargs="?", help="request JSON: a file, a JSON string, or - / nothing for stdin")
    ap.add_argument("--out", help="write the response here instead of stdout")
    ap.add_argument("--fake", action="store_true", help="made-up timings, no torch (tests)")
    ap.add_argument("--selftest", action="store_true", help="check the torch-free parts and exit")
    args = ap.parse_args(argv)
    if args.selftest:
        selftest()
        return 0
    try:
        req = parse_request(read_request(args.request))
    except (ValueError, OSError) as e:
        resp = {"ok": False, "error": f"bad request: {e}", "results": []}
    else:
        resp = fake(req) if args.fake else run(req)
    text = json.dumps(clean(resp), indent=1, allow_nan=False)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
