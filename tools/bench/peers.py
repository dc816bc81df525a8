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
clocks), then the timed calls, each between two CUDA events: `iters` of them, or more when
`window_ms` asks for a longer window (enough calls to last that long at the per-call wall time
seen during the warm-up, at most `max_iters`); median, min, p90 (nearest rank); TFLOP/s from
the FLOPs the request gives (the same model as ours). Peak memory per case:
torch.cuda.max_memory_allocated() during one call after a reset, minus what was allocated
before it (the inputs).

Request (JSON):
  {"iters": 30, "warmup": 10, "warmup_ms": 500, "window_ms": 0, "max_iters": 20000,
   "times": false, "peers": ["flash", "cudnn", "efficient"],
   "cases": [{"id": "...", "dtype": "f16", "batch": 32, "seqlen": 512, "heads": 32,
              "head_dim": 64, "causal": false, "flops": 6.9e10, "sets": 2}]}
  Optional per case: "seqlen_q" (query rows, default seqlen) and "heads_kv" (GQA through
  SDPA's enable_gqa, default heads), for decoding shapes; "backward": true times
  torch.autograd.grad of one forward per input set instead. "times": true adds every timed
  call's milliseconds ("times_ms") to each result (the bench pools two rounds). "matmul": the
  dtypes whose dense matrix-product ceiling to time (default: the cases' dtypes): a torch
  matmul of two random 8192 x 8192 matrices (2 * 8192^3 FLOPs) under the same warm-up and
  window, reported under "matmul", so that every kernel can be read as a fraction of it.
  "seq": any value, echoed in the response (serve mode).

Response (JSON):
  {"ok": true, "error": null, "torch": "...", "cudnn": "...", "cuda": "...", "device": "...",
   "seq": ..., "matmul": [{"dtype": "f16", "n": 8192, "median_ms": ..., "tflops": ...}],
   "results": [{"id": "...", "peer": "flash", "median_ms": ..., "min_ms": ..., "p90_ms": ...,
                "iters": 30, "tflops": ..., "window_ms": ..., "host_us": ...,
                "peak_mem_beyond_inputs_bytes": ..., "extra_mem_bytes": ...}
               or {"id": "...", "peer": "...", "skipped": "why"}]}
  window_ms: the wall time of the timed calls. A backend that raises is recorded as skipped
  with its message; without torch or a GPU the response has ok = false and the reason in
  "error". Progress goes to stderr.

Serve mode (--serve): one persistent process for the whole bench, torch and CUDA initialised
once. It first writes a hello line (the response's environment fields and "ready": true; ok =
false with the reason when torch or the GPU is missing), then reads one request per line on
stdin and writes one response per line on stdout, until stdin closes. Anything else printed to
stdout (by torch or a library) is redirected to stderr, so stdout carries only those lines. A
malformed line gets {"ok": false, "error": "bad request: ..."} and the loop goes on.

  python3 tools/bench/peers.py [REQUEST] [--out FILE]   run the peers once (REQUEST: a file,
                                                        a JSON string, or - / nothing: stdin)
  python3 tools/bench/peers.py --serve                  serve requests, one per line
  python3 tools/bench/peers.py --fake [--serve] [...]   fake timings (no torch; for tests)
  python3 tools/bench/peers.py --selftest               check the parts that need no torch
"""

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
import warnings

PEERS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
# Peers a request may name besides the SDPA backends (not in the default list).
EXTRA_PEERS = ("flashattn",)
DTYPES = ("f16", "bf16")
# The most timed calls a window may ask for (the Rust bench uses the same cap).
MAX_ITERS = 20000
MATMUL_N = 8192
ENV_KEYS = ("ok", "error", "torch", "cudnn", "cuda", "device")


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
    req.setdefault("window_ms", 0)
    req.setdefault("max_iters", MAX_ITERS)
    req.setdefault("times", False)
    req.setdefault("peers", list(PEERS))
    for key in ("iters", "warmup", "warmup_ms", "window_ms", "max_iters"):
        v = req[key]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{key!r} must be a non-negative number, not {v!r}")
    if req["iters"] < 1 or req["max_iters"] < 1:
        raise ValueError("'iters' and 'max_iters' must be at least 1")
    if not isinstance(req["peers"], list):
        raise ValueError("'peers' must be a list")
    for p in req["peers"]:
        if p not in PEERS and p not in EXTRA_PEERS:
            raise ValueError(f"unknown peer {p!r}; known: {', '.join([*PEERS, *EXTRA_PEERS])}")
    for c in req["cases"]:
        if not isinstance(c, dict):
            raise ValueError("every case must be an object")
        for key in ("id", "dtype", "batch", "seqlen", "heads", "head_dim", "causal", "flops"):
            if key not in c:
                raise ValueError(f"case {c.get('id', '?')} lacks {key!r}")
        if c["dtype"] not in DTYPES:
            raise ValueError(f"case {c['id']}: dtype {c['dtype']!r} is not f16 or bf16")
        c.setdefault("sets", 2)
    if req.get("matmul") is None:
        req["matmul"] = list(dict.fromkeys(c["dtype"] for c in req["cases"]))
    if not isinstance(req["matmul"], list) or any(d not in DTYPES for d in req["matmul"]):
        raise ValueError(f"'matmul' must be a list of f16 / bf16, not {req['matmul']!r}")
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


def window_iters(iters, window_ms, per_call_ms, max_iters=MAX_ITERS):
    """Timed calls: `iters`, or enough to last `window_ms` at `per_call_ms` each, at most
    `max_iters` (never fewer than `iters`)."""
    iters = int(iters)
    if window_ms <= 0 or not (per_call_ms > 0 and math.isfinite(per_call_ms)):
        return iters
    return max(iters, min(math.ceil(window_ms / per_call_ms), int(max_iters)))


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def warm_up(torch, call, warmup, warmup_ms, window_ms):
    """`warmup` calls, then batches of 8 until `warmup_ms` have passed (steady clocks, as
    ours); returns the wall time per call seen in those batches (ms), or that of one batch
    of 8 when the window needs an estimate and the batches did not run."""
    for i in range(max(1, warmup)):
        call(i)
    torch.cuda.synchronize()
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < warmup_ms / 1e3:
        for i in range(8):
            call(i)
        torch.cuda.synchronize()
        calls += 8
    elapsed = time.perf_counter() - t0
    if calls == 0 and window_ms > 0:
        t0 = time.perf_counter()
        for i in range(8):
            call(i)
        torch.cuda.synchronize()
        calls, elapsed = 8, time.perf_counter() - t0
    return elapsed * 1e3 / calls if calls else float("nan")


def timed_calls(torch, call, n, offset):
    """`n` calls each between two CUDA events; returns (ms per call, host us per call, wall ms
    of the whole loop)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    host = []
    t0 = time.perf_counter()
    for i in range(n):
        starts[i].record()
        t = time.perf_counter()
        call(offset + i)
        host.append((time.perf_counter() - t) * 1e6)
        ends[i].record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    return [st.elapsed_time(en) for st, en in zip(starts, ends)], host, wall


def time_case(torch, F, backend, case, req):
    """Times one backend on one case; returns a result dict (raises on backend errors)."""
    from torch.nn.attention import sdpa_kernel

    iters, warmup, warmup_ms = int(req["iters"]), int(req["warmup"]), float(req["warmup_ms"])
    window_ms = float(req["window_ms"])
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
                per_call = warm_up(torch, call, warmup, warmup_ms, window_ms)
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
        n = window_iters(iters, window_ms, per_call, req["max_iters"])
        times, host, wall = timed_calls(torch, call, n, warmup)
    r = summarize(times, float(case["flops"]))
    if r is None:
        raise Skip("non-finite event times")
    lse_bytes = b * h * sq * 4
    r["peak_mem_beyond_inputs_bytes"] = int(peak)
    r["extra_mem_bytes"] = int(max(0, peak - out_bytes - lse_bytes))
    # median host time of one call in the timed loop (us): what the caller's thread pays
    r["host_us"] = sorted(host)[len(host) // 2]
    r["window_ms"] = wall
    if req["times"]:
        r["times_ms"] = times
    return r


def time_matmul(torch, dtype_name, req, n=MATMUL_N):
    """Times torch.matmul of two random n x n matrices with the attention cases' method."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(4321)
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)

    def call(_):
        return torch.matmul(a, b)

    with torch.inference_mode():
        per_call = warm_up(torch, call, int(req["warmup"]), float(req["warmup_ms"]), float(req["window_ms"]))
        iters = window_iters(int(req["iters"]), float(req["window_ms"]), per_call, req["max_iters"])
        times, _, wall = timed_calls(torch, call, iters, 0)
    r = summarize(times, 2.0 * n**3)
    if r is None:
        raise Skip("non-finite event times")
    r.update({"dtype": dtype_name, "n": n, "window_ms": wall})
    return r


def init_torch():
    """Imports torch and starts CUDA once; returns (context or None, the environment fields)."""
    env = {"ok": False, "error": None, "torch": None, "cudnn": None, "cuda": None, "device": None}
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend
    except Exception as e:  # torch missing or broken
        env["error"] = f"PyTorch is not importable: {first_line(e)}"
        return None, env
    env["torch"] = str(torch.__version__)
    env["cuda"] = str(torch.version.cuda)
    try:
        v = torch.backends.cudnn.version()
        env["cudnn"] = None if v is None else str(v)
    except Exception:
        pass
    if not torch.cuda.is_available():
        env["error"] = f"torch {torch.__version__} sees no CUDA GPU"
        return None, env
    try:
        torch.zeros(1, device="cuda")  # the CUDA context, now rather than in the first case
        env["device"] = torch.cuda.get_device_name()
    except Exception as e:
        env["error"] = f"CUDA did not start: {first_line(e)}"
        return None, env
    env["ok"] = True
    return (torch, F, SDPBackend), env


def run(req, ctx, env):
    """Runs the matmul ceilings, then every peer on every case; never raises for a backend or
    case failure. `ctx`, `env`: what init_torch returned."""
    resp = dict(env, matmul=[], results=[])
    if ctx is None:
        return resp
    torch, F, SDPBackend = ctx
    for dt in req["matmul"]:
        try:
            m = time_matmul(torch, dt, req)
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
                item.update(time_case(torch, F, backend, case, req))
                log(f"[peers {done}/{total}] {case['id']} {peer}: {item['tflops']:.1f} TFLOP/s over {item['iters']} calls")
            except Exception as e:
                item["skipped"] = str(e) if isinstance(e, Skip) else first_line(e)
                log(f"[peers {done}/{total}] {case['id']} {peer}: skipped: {item['skipped']}")
            finally:
                torch.cuda.empty_cache()
            resp["results"].append(item)
    return resp


# Made-up rates of --fake (TFLOP/s), and the matmul's.
FAKE_RATES = {"flash": 100.0, "cudnn": 200.0, "efficient": 50.0, "flashattn": 150.0}
FAKE_MATMUL = 600.0
FAKE_ENV = {"ok": True, "error": None, "torch": "fake", "cudnn": "fake", "cuda": "fake", "device": "fake"}


def fake(req, state=None):
    """A response with made-up timings (the FAKE_RATES), for tests without torch. Each request
    served through `state` ({"served": n}) runs 0.2 % slower than the one before (a clock
    drifting down), so that two rounds of a case differ; every call of a line takes the same
    time, and a window sets the count of calls as for real."""
    drift = 1.0 + 0.002 * (state or {}).get("served", 0)

    def result(flops, rate):
        ms = flops / (rate * 1e12) * 1e3 * drift
        n = window_iters(req["iters"], req["window_ms"], ms, req["max_iters"])
        r = summarize([ms] * n, flops)
        r["window_ms"] = ms * n
        if req["times"]:
            r["times_ms"] = [ms] * n
        return r

    resp = dict(FAKE_ENV, matmul=[], results=[])
    for dt in req["matmul"]:
        resp["matmul"].append(dict(result(2.0 * MATMUL_N**3, FAKE_MATMUL), dtype=dt, n=MATMUL_N))
    for case in req["cases"]:
        for peer in req["peers"]:
            item = {"id": case["id"], "peer": peer}
            item.update(result(float(case["flops"]), FAKE_RATES[peer]))
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


def serve(fake_mode, lines, write):
    """The serve loop: the hello, then one response per request line of `lines` (an iterable
    of text lines) through `write` (takes a dict), until `lines` ends."""
    if fake_mode:
        ctx, env = None, dict(FAKE_ENV)
    else:
        ctx, env = init_torch()
    write(dict(env, ready=True))
    log(f"[peers] serving ({'fake timings' if fake_mode else env['device'] or env['error']})")
    state = {"served": 0}
    for line in lines:
        text = line.strip()
        if not text:
            continue
        seq = None
        try:
            obj = json.loads(text)
            seq = obj.get("seq") if isinstance(obj, dict) else None
            req = parse_request(text)
        except ValueError as e:
            resp = dict(env, ok=False, error=f"bad request: {e}", matmul=[], results=[])
        else:
            try:
                resp = fake(req, state) if fake_mode else run(req, ctx, env)
            except Exception as e:  # a bug here must not take the server down
                resp = dict(env, ok=False, error=f"peers.py failed: {first_line(e)}", matmul=[], results=[])
            state["served"] += 1
        resp["seq"] = seq
        write(resp)


def selftest():
    req = parse_request(
        '{"iters": 20, "cases": [{"id": "a", "dtype": "f16", "batch": 1, "seqlen": 512,'
        ' "heads": 2, "head_dim": 64, "causal": true, "flops": 2e12}]}'
    )
    assert req["warmup"] == 10 and req["warmup_ms"] == 0 and req["peers"] == list(PEERS) and req["cases"][0]["sets"] == 2
    assert req["window_ms"] == 0 and req["max_iters"] == MAX_ITERS and req["matmul"] == ["f16"] and not req["times"]
    s = summarize([float(x) for x in range(20, 0, -1)], 2e12)
    assert (s["median_ms"], s["min_ms"], s["p90_ms"], s["iters"]) == (10.5, 1.0, 18.0, 20), s
    assert abs(s["tflops"] - 2e12 / 10.5e-3 / 1e12) < 1e-9
    assert summarize([3.0, 1.0, 2.0], 0.0)["median_ms"] == 2.0
    # Windows: enough calls to last window_ms, never fewer than iters, at most max_iters.
    assert window_iters(30, 0, 0.1) == 30
    assert window_iters(30, 250, 0.1) == 2500
    assert window_iters(30, 250, 100.0) == 30
    assert window_iters(30, 250, 1e-6, 20000) == 20000
    assert window_iters(30, 250, float("nan")) == 30
    f = fake(req)
    assert len(f["results"]) == 3 and abs(f["results"][1]["tflops"] - 200.0) < 1e-6
    assert len(f["matmul"]) == 1 and abs(f["matmul"][0]["tflops"] - 600.0) < 1e-6
    json.loads(json.dumps(clean(f), allow_nan=False))
    for bad in ('{"cases": 1}', '{"cases": [{"id": "x"}]}', '{"cases": [], "peers": ["nope"]}',
                '{"cases": [], "matmul": ["f32"]}', '{"cases": [], "window_ms": -1}', '{"cases": [], "iters": 0}'):
        try:
            parse_request(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
    # The serve loop: hello first, one answer per non-empty line with its seq, bad lines
    # answered and survived, windows and times honoured, the drift between requests.
    case = '{"id": "a", "dtype": "f16", "batch": 1, "seqlen": 512, "heads": 2, "head_dim": 64, "causal": true, "flops": 2e9}'
    lines = [
        '{"seq": 1, "iters": 20, "window_ms": 10, "times": true, "matmul": [], "peers": ["cudnn"], "cases": [%s]}\n' % case,
        "\n",
        "not json\n",
        '{"seq": 3, "cases": [], "peers": ["nope"]}\n',
        '{"seq": 4, "iters": 20, "matmul": ["bf16"], "cases": []}\n',
        '{"seq": 5, "iters": 20, "window_ms": 10, "times": true, "matmul": [], "peers": ["cudnn"], "cases": [%s]}\n' % case,
    ]
    out = []
    serve(True, io.StringIO("".join(lines)), out.append)
    assert len(out) == 6 and out[0]["ready"] and out[0]["ok"], out
    assert [o.get("seq") for o in out[1:]] == [1, None, 3, 4, 5], out
    one, five = out[1]["results"][0], out[5]["results"][0]
    # 2e9 FLOPs at 200 TFLOP/s: 0.01 ms a call, so a 10 ms window takes 1000 calls.
    assert out[1]["ok"] and one["peer"] == "cudnn" and one["iters"] == 1000 and len(one["times_ms"]) == 1000, one
    assert one["window_ms"] >= 10 - 1e-9 and out[1]["matmul"] == []
    assert not out[2]["ok"] and out[2]["error"].startswith("bad request") and not out[3]["ok"], out
    assert out[4]["ok"] and out[4]["results"] == [] and out[4]["matmul"][0]["dtype"] == "bf16"
    assert five["median_ms"] > one["median_ms"] * 1.001, (one, five)
    for o in out:
        json.loads(json.dumps(clean(o), allow_nan=False))
    print("peers.py selftest ok")


def read_request(arg):
    if arg is None or arg == "-":
        return sys.stdin.read()
    if arg.lstrip().startswith("{"):
        return arg
    with open(arg, encoding="utf-8") as f:
        return f.read()


def serve_stdio(fake_mode):
    """Serve mode on the process's stdin and stdout: the protocol gets its own copy of
    stdout, and file descriptor 1 (and sys.stdout) go to stderr, so that what torch or a
    library prints cannot corrupt a response line."""
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr

    def write(obj):
        proto.write(json.dumps(clean(obj), allow_nan=False) + "\n")
        proto.flush()

    serve(fake_mode, iter(sys.stdin.readline, ""), write)


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch SDPA peers for flashattn bench")
    ap.add_argument("request", nargs="?", help="request JSON: a file, a JSON string, or - / nothing for stdin")
    ap.add_argument("--out", help="write the response here instead of stdout")
    ap.add_argument("--serve", action="store_true", help="answer one request per stdin line, one response per stdout line")
    ap.add_argument("--fake", action="store_true", help="made-up timings, no torch (tests)")
    ap.add_argument("--selftest", action="store_true", help="check the torch-free parts and exit")
    args = ap.parse_args(argv)
    if args.selftest:
        selftest()
        return 0
    if args.serve:
        if args.request or args.out:
            ap.error("--serve reads its requests from stdin and answers on stdout: no REQUEST or --out")
        serve_stdio(args.fake)
        return 0
    try:
        req = parse_request(read_request(args.request))
    except (ValueError, OSError) as e:
        resp = {"ok": False, "error": f"bad request: {e}", "results": []}
    else:
        if args.fake:
            resp = fake(req)
        else:
            ctx, env = init_torch()
            resp = run(req, ctx, env)
    text = json.dumps(clean(resp), indent=1, allow_nan=False)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
