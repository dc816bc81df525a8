"""The Python package on CUDA tensors (PyTorch): forward and backward against PyTorch's own
attention in float32, the caller's stream, CUDA graph capture (which fails on any device
synchronisation inside the call), several streams at once, and the errors. Skipped where
PyTorch or a CUDA GPU is missing (CI has neither; the H200 runs these)."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import flashattn  # noqa: E402
from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func  # noqa: E402

F = torch.nn.functional


def sdpa(q, k, v, causal=False, scale=None):
    """PyTorch's attention in float32 with FA2's bottom-right causal mask, bshd in and out."""
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    sq, sk = q.shape[2], k.shape[2]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        mask = j <= i + sk - sq
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2)
    # Rows that see no key give 0 (FA2; SDPA would give NaN), with zero gradients: a finite
    # fill keeps the softmax's backward finite, and those rows are multiplied by 0.
    s = q @ k.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    p = torch.softmax(s.masked_fill(~mask, -1e9), dim=-1) * mask.any(dim=1, keepdim=True)
    return (p @ v).transpose(1, 2)


def rand(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


def close(got, want, what=""):
    got, want = got.float(), want.float()
    bad = (~torch.isfinite(got)).sum().item()
    assert bad == 0, f"{what}: {bad} non-finite values of {got.numel()}"
    err = (got - want).norm() / want.norm().clamp_min(1e-30)
    assert err < 1e-2, f"{what}: {differences(got, want)}"


def differences(got, want):
    """How `got` differs from `want`, for assertion messages: rel-L2, the largest difference
    and where, how many elements differ, and the norms."""
    got, want = got.float(), want.float()
    d = (got - want).abs()
    worst = int(d.reshape(-1).argmax()) if d.numel() else 0
    at = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), d.shape)) if d.numel() else ()
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    return (
        f"rel-L2 {err:.3e}, max |diff| {d.max().item():.3e} at {at} (got {got.reshape(-1)[worst].item():.6g}, "
        f"want {want.reshape(-1)[worst].item():.6g}), {int((d != 0).sum())} of {d.numel()} elements differ, "
        f"|got| {got.norm().item():.4g}, |want| {want.norm().item():.4g}"
    )


SHAPES = [
    # b, sq, sk, hq, hkv, d: odd lengths, GQA, MQA, sq != sk, each head dim the kernels serve
    (2, 137, 251, 8, 2, 128),
    (1, 1000, 1000, 4, 4, 64),
    (3, 65, 300, 6, 1, 256),
    (2, 256, 128, 4, 2, 96),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward(dtype, causal, shape):
    b, sq, sk, hq, hkv, d = shape
    q, k, v = (rand(b, s, h, d, dtype=dtype, seed=i) for i, (s, h) in enumerate([(sq, hq), (sk, hkv), (sk, hkv)]))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    want = sdpa(qr, kr, vr, causal)
    close(out, want, "out")
    do = rand(*out.shape, dtype=dtype, seed=9)
    out.backward(do)
    want.backward(do.float())
    for name, x, xr in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
        close(x.grad, xr.grad, name)


def reference_mods(q, k, v, causal=False, softcap=0.0, slopes=None):
    """Attention in float32 with FA2's score modifiers, bshd in and out: scores soft-capped
    (softcap * tanh(s / softcap)), then ALiBi's -slope |i + sk - sq - j| added (slopes [heads]
    or [batch, heads]), then the bottom-right causal mask; rows that see no key give 0."""
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    b, h, sq, d = q.shape
    sk = k.shape[2]
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    if slopes is not None:
        sl = slopes.float().reshape(-1 if slopes.dim() == 2 else 1, h, 1, 1)
        s = s - sl * (i + sk - sq - j).abs()
    mask = (j <= i + sk - sq) if causal else torch.ones_like(s[0, 0], dtype=torch.bool)
    p = torch.softmax(s.masked_fill(~mask, -1e9), dim=-1) * mask.any(dim=1, keepdim=True)
    return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, causal, softcap, alibi",
    [
        ((2, 137, 251, 8, 2, 128), False, 5.0, None),  # softcap alone
        ((2, 300, 200, 4, 1, 64), True, 0.0, "per batch"),  # ALiBi, rows that see no key
        ((1, 200, 333, 6, 2, 96), True, 2.0, "per head"),  # both, on attn_bwd's own head_dim
    ],
)
def test_backward_with_softcap_and_alibi(dtype, shape, causal, softcap, alibi):
    b, sq, sk, hq, hkv, d = shape
    q, k, v = (rand(b, s, h, d, dtype=dtype, seed=i) for i, (s, h) in enumerate([(sq, hq), (sk, hkv), (sk, hkv)]))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    slopes = None
    if alibi is not None:
        slopes = torch.tensor([2.0 ** (-8 * (i + 1) / hq) for i in range(hq)], device="cuda")
        if alibi == "per batch":
            slopes = torch.stack([slopes * (n + 1) for n in range(b)])
    out = flash_attn_func(q, k, v, causal=causal, softcap=softcap, alibi_slopes=slopes)
    qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    want = reference_mods(qr, kr, vr, causal, softcap, slopes)
    close(out, want, "out")
    do = rand(*out.shape, dtype=dtype, seed=9)
    out.backward(do)
    want.backward(do.float())
    for name, x, xr in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
        close(x.grad, xr.grad, name)


def test_packed_and_strided_views():
    qkv = rand(2, 200, 3, 8, 128)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    close(out, sdpa(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], True), "qkvpacked")
    q = rand(2, 100, 8, 64, seed=3)
    kv = rand(2, 300, 2, 2, 64, seed=4)
    close(flash_attn_kvpacked_func(q, kv), sdpa(q, kv[:, :, 0], kv[:, :, 1]), "kvpacked")
    # q as a transposed view of [b, h, s, d] memory
    qt = rand(2, 8, 100, 64, seed=5).transpose(1, 2)
    k, v = rand(2, 100, 8, 64, seed=6), rand(2, 100, 8, 64, seed=7)
    close(flash_attn_func(qt, k, v), sdpa(qt, k, v), "transposed q")
    # gradients through the packed view reach qkv
    qkv.requires_grad_(True)
    flash_attn_qkvpacked_func(qkv).sum().backward()
    assert qkv.grad is not None and torch.isfinite(qkv.grad).all()


def test_torch_attributes_read_the_same_tensor_as_dlpack():
    """PyTorch tensors are read through their own attributes (data_ptr, shape, stride), not
    a DLPack export: on views with offsets and odd strides both give the same bytes."""
    base = rand(2, 300, 3, 8, 64, seed=8)
    views = [
        (rand(2, 100, 8, 64, seed=9), base[:, 50:150, 1], base[:, 100:200, 2]),  # offsets
        (rand(2, 8, 100, 64, seed=10).transpose(1, 2), base[:, :200, 0], base[:, 1:201, 1]),
        (base[:1, :77, 0, 2:6], base[1:, 3:80, 1, :4], base[:1, 5:82, 2, 4:]),  # head slices
    ]
    stream = torch.cuda.current_stream().cuda_stream
    for q, k, v in views:
        b, sq, hq, _ = q.shape
        outs = []
        for fast in (True, False):
            out = torch.full_like(q, float("nan"))
            lse = torch.full((b, hq, sq), float("nan"), device="cuda")
            flashattn._native.forward(
                q, k, v, out, lse, None, True, -1, -1, 0.0, None, stream, True, torch=fast
            )
            outs.append((out, lse))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        close(outs[0][0], sdpa(q, k, v, True), f"view {q.shape} {q.stride()}")
    # A negated view holds other values than its memory: refused, never read as its memory.
    q = rand(1, 16, 2, 64)
    with pytest.raises(flashattn.FlashAttnError, match="resolve_neg"):
        flash_attn_func(torch._neg_view(q), q, q)


def test_runs_on_the_callers_stream_and_several_streams():
    q, k, v = rand(4, 2048, 16, 128, seed=1), rand(4, 2048, 16, 128, seed=2), rand(4, 2048, 16, 128, seed=3)
    want = flash_attn_func(q, k, v, causal=True)
    streams = [torch.cuda.Stream() for _ in range(3)]
    outs = []
    torch.cuda.synchronize()
    for s in streams:
        with torch.cuda.stream(s):
            outs.append([flash_attn_func(q, k, v, causal=True) for _ in range(4)])
    torch.cuda.synchronize()
    for per_stream in outs:
        for o in per_stream:
            assert torch.equal(o, want), "a call on another stream gave other bytes"


def test_more_streams_than_counter_slots():
    # Past the library's 64 scheduler counters a stream runs the static schedule: same bytes.
    # (torch.cuda.Stream() draws from a pool of 32; CuPy makes new streams.)
    cupy = pytest.importorskip("cupy")
    q, k, v = rand(1, 512, 8, 64, seed=1), rand(1, 512, 8, 64, seed=2), rand(1, 512, 8, 64, seed=3)
    want = flash_attn_func(q, k, v, causal=True)
    raw = [cupy.cuda.Stream(non_blocking=True) for _ in range(70)]
    torch.cuda.synchronize()
    outs = []
    for r in raw:
        with torch.cuda.stream(torch.cuda.ExternalStream(r.ptr)):
            outs.append(flash_attn_func(q, k, v, causal=True))
    torch.cuda.synchronize()
    assert all(torch.equal(o, want) for o in outs)


def test_threads_on_their_own_streams():
    import threading

    q, k, v = rand(2, 1024, 16, 128, seed=1), rand(2, 1024, 16, 128, seed=2), rand(2, 1024, 16, 128, seed=3)
    want = flash_attn_func(q, k, v, causal=True)
    torch.cuda.synchronize()
    results, errors = {}, []

    def work(i):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                results[i] = [flash_attn_func(q, k, v, causal=True) for _ in range(8)]
            s.synchronize()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert torch.cuda.current_device() == q.device.index
    assert all(torch.equal(o, want) for outs in results.values() for o in outs)


def test_batch_one_sequence_first_views():
    # Size-1 dimensions with any stride (PyTorch exports 1 there), forward and backward.
    q = rand(300, 1, 8, 64, seed=1).transpose(0, 1).requires_grad_(True)
    k = rand(300, 1, 8, 64, seed=2).transpose(0, 1).requires_grad_(True)
    v = rand(300, 1, 8, 64, seed=3).transpose(0, 1).requires_grad_(True)
    out = flash_attn_func(q, k, v, causal=True)
    qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    want = sdpa(qr, kr, vr, True)
    close(out, want, "out")
    do = rand(300, 1, 8, 64, seed=4).transpose(0, 1)
    out.backward(do)
    want.backward(do.float())
    close(q.grad, qr.grad, "dq")


def test_double_backward_raises():
    q = rand(1, 64, 2, 64).requires_grad_(True)
    (g,) = torch.autograd.grad(flash_attn_func(q, q, q).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_mixed_frameworks_refused():
    cupy = pytest.importorskip("cupy")
    q = rand(1, 16, 2, 64)
    with pytest.raises(flashattn.FlashAttnError, match="one framework"):
        flash_attn_func(q, cupy.from_dlpack(q), q)


def test_cuda_graph_capture_and_replay():
    b, s, h, d = 2, 1024, 16, 128
    q, k, v = rand(b, s, h, d, seed=1), rand(b, s, h, d, seed=2), rand(b, s, h, d, seed=3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernel outside the capture
        flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    # Capture fails if the call synchronises the device or uses the legacy stream.
    with torch.cuda.graph(g):
        out = flash_attn_func(q, k, v, causal=True)
    for seed in (11, 12, 13):
        for x, i in ((q, 0), (k, 1), (v, 2)):
            x.copy_(rand(b, s, h, d, seed=seed * 3 + i))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, flash_attn_func(q, k, v, causal=True)), f"replay {seed}"


def test_first_call_of_a_configuration_inside_a_capture_says_warm_up():
    q = rand(1, 256, 4, 128, seed=1)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(Exception) as e:
        with torch.cuda.graph(g):
            # a window no other test uses: its kernel is not compiled yet
            flash_attn_func(q, q, q, causal=True, window_size=(37, 0))
    chain, x = [], e.value
    while x is not None:
        chain.append(str(x))
        x = x.__cause__ or x.__context__
    assert any("warm-up" in m for m in chain), chain


def test_errors():
    q = rand(1, 16, 2, 64)
    with pytest.raises(flashattn.FlashAttnError, match="float16 or bfloat16"):
        flash_attn_func(q.float(), q.float(), q.float())
    with pytest.raises(flashattn.FlashAttnError, match="on one device"):
        flash_attn_func(q, q.cpu(), q)
    with pytest.raises(flashattn.FlashAttnError, match="head_dim"):
        flash_attn_func(q[..., ::2], q[..., ::2], q[..., ::2])
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="dropout"):
        flash_attn_func(q, q, q, dropout_p=0.1)


def test_cupy_arrays_on_the_current_stream():
    cupy = pytest.importorskip("cupy")
    q, k, v = (rand(2, 300, 4, 64, seed=i) for i in range(3))
    want = sdpa(q, k, v, causal=True)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        qc, kc, vc = (cupy.from_dlpack(x) for x in (q, k, v))
        out = flash_attn_func(qc, kc, vc, causal=True)
        assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float16
    s.synchronize()
    close(torch.from_dlpack(out), want, "cupy")


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_on_cuda(causal):
    from flashattn import flash_attn_varlen_func

    lq, lk, hq, hkv, d = [37, 300, 1], [50, 300, 129], 8, 2, 128
    q = rand(sum(lq), hq, d, seed=1)
    k, v = rand(sum(lk), hkv, d, seed=2), rand(sum(lk), hkv, d, seed=3)
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal)
    for i in range(len(lq)):
        qs, ks = slice(int(cq[i]), int(cq[i + 1])), slice(int(ck[i]), int(ck[i + 1]))
        want = sdpa(q[None, qs], k[None, ks], v[None, ks], causal)[0]
        close(out[qs], want, f"sequence {i}")


def _cu(lens):
    """Offsets of sequences of these lengths, int32 on the GPU."""
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def test_varlen_offsets_on_the_device_and_on_the_host_agree():
    """Offsets as CUDA tensors (read by the packed kernel, never copied) and as host lists (the
    library's per-sequence choice): the same outputs and gradients within the tolerance; int64
    device offsets are converted on the device."""
    from flashattn import flash_attn_varlen_func

    # Host offsets of this batch run one attn_wgmma launch per sequence on sm_90 (2048 rows
    # or more on average: per_sequence_pays); device offsets the packed attn_mma.
    lq, lk, hq, hkv, d = [37, 3000, 0, 5155], [50, 3000, 7, 5000], 8, 2, 128
    cq, ck = _cu(lq), _cu(lk)
    runs = []
    for offsets in ((cq, ck), (cq.tolist(), ck.tolist()), (cq.long(), ck.long())):
        q = rand(sum(lq), hq, d, seed=1).requires_grad_(True)
        k = rand(sum(lk), hkv, d, seed=2).requires_grad_(True)
        v = rand(sum(lk), hkv, d, seed=3).requires_grad_(True)
        out = flash_attn_varlen_func(q, k, v, *offsets, max(lq), max(lk), causal=True)
        out.backward(rand(*out.shape, seed=4))
        runs.append((out, q.grad, k.grad, v.grad))
    for other in runs[1:]:
        for name, a, b in zip(("out", "dq", "dk", "dv"), runs[0], other):
            close(a, b, name)


def test_varlen_forward_and_backward_captured_in_a_cuda_graph():
    """A packed forward and backward with the offsets on the device, captured in one CUDA graph
    and replayed with new offsets (same packed sizes): out and the gradients match eager calls
    on the new offsets."""
    from flashattn import flash_attn_varlen_func

    # max_seqlen_* bound every replay's sequences (a longer one would be cut: rows past it
    # keep what the buffer held).
    hq, hkv, d, total_q, total_k, mq, mk = 4, 2, 64, 300, 400, 300, 400
    cq, ck = _cu([100, 200]), _cu([150, 250])
    q = rand(total_q, hq, d, seed=1).requires_grad_(True)
    k = rand(total_k, hkv, d, seed=2).requires_grad_(True)
    v = rand(total_k, hkv, d, seed=3).requires_grad_(True)
    do = rand(total_q, hq, d, seed=4)

    def step():
        out = flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True)
        out.backward(do)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: the kernels compiled outside the capture
    torch.cuda.current_stream().wait_stream(side)
    for x in (q, k, v):
        x.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    for lq, lk in (([256, 44], [144, 256]), ([0, 300], [400, 0]), ([299, 1], [1, 399])):
        cq.copy_(_cu(lq))
        ck.copy_(_cu(lk))
        g.replay()
        torch.cuda.synchronize()
        grads = [x.grad.clone() for x in (q, k, v)]
        qe, ke, ve = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        want = flash_attn_varlen_func(qe, ke, ve, _cu(lq), _cu(lk), mq, mk, causal=True)
        want.backward(do)
        close(out, want, f"out {lq} {lk}")
        for name, a, b in zip(("dq", "dk", "dv"), grads, (qe.grad, ke.grad, ve.grad)):
            close(a, b, f"{name} {lq} {lk}")


def test_varlen_device_offsets_are_clamped_and_cut_to_max_seqlen():
    """Offsets on the device are not validated: ones that leave the packed tensors or decrease
    run without a fault (the kernels clamp them), and a sequence longer than max_seqlen_* is
    cut to it (its first rows and keys), as FlashAttention-2's grid cuts it."""
    from flashattn import flash_attn_varlen_func

    q, k, v = rand(60, 4, 64, seed=1), rand(60, 2, 64, seed=2), rand(60, 2, 64, seed=3)
    # Sequence 1: queries 10..60 (70 clamped to the 60 rows), no key (-7 below its start);
    # sequence 2: no query (5 below its start), keys 0..60 (2^30 clamped).
    bad_q = torch.tensor([0, 10, 70, 5], dtype=torch.int32, device="cuda")
    bad_k = torch.tensor([0, 10, -7, 1 << 30], dtype=torch.int32, device="cuda")
    q.requires_grad_(True)
    out = flash_attn_varlen_func(q, k, v, bad_q, bad_k, 60, 60)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    close(out[:10], sdpa(q[None, :10], k[None, :10], v[None, :10])[0], "the valid sequence")
    assert not out[10:].any(), "rows that see no key"
    cu = _cu([10, 50])
    out = flash_attn_varlen_func(q.detach(), k, v, cu, cu, 20, 20)
    close(out[10:30], sdpa(q[None, 10:30], k[None, 10:30], v[None, 10:30])[0], "cut to 20")


@pytest.mark.parametrize("d", [128, 36, 100])
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_on_cuda_matches_the_cpu_path(paged, d):
    """Head dims that are not a multiple of 8 (36, 100) run padded, as FlashAttention-2 runs
    them: the same output as the CPU path (which takes them as they are), the new rows in the
    caller's caches."""
    from flashattn import flash_attn_with_kvcache

    b, sq, hq, hkv, cap = 3, 2, 8, 2, 512
    q = rand(b, sq, hq, d, seed=1)
    kn, vn = rand(b, sq, hkv, d, seed=2), rand(b, sq, hkv, d, seed=3)
    lens = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
    if paged:
        page, nblocks = 64, b * cap // 64
        kc, vc = rand(nblocks, page, hkv, d, seed=4), rand(nblocks, page, hkv, d, seed=5)
        g = torch.Generator().manual_seed(0)
        table = torch.randperm(nblocks, generator=g).view(b, -1).to(torch.int32).cuda()
    else:
        kc, vc = rand(b, cap, hkv, d, seed=4), rand(b, cap, hkv, d, seed=5)
        table = None
    kc_cpu, vc_cpu = kc.cpu(), vc.cpu()
    got, lse = flash_attn_with_kvcache(
        q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, causal=True, return_softmax_lse=True
    )
    want, want_lse = flash_attn_with_kvcache(
        q.cpu(), kc_cpu, vc_cpu, kn.cpu(), vn.cpu(), cache_seqlens=lens.cpu(),
        block_table=None if table is None else table.cpu(), causal=True, return_softmax_lse=True,
    )
    assert got.shape == q.shape and got.is_contiguous()
    close(got.cpu(), want, "out")
    torch.testing.assert_close(lse.cpu(), want_lse, rtol=1e-3, atol=1e-3)
    assert torch.equal(kc.cpu(), kc_cpu) and torch.equal(vc.cpu(), vc_cpu), "appended rows differ"
    # Without new rows the caches stay as they are (d 36, 100: no copy back).
    before = kc.clone()
    again = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens + sq, block_table=table, causal=True)
    assert torch.equal(kc, before)
    close(again.cpu(), want, "out without new rows")


def test_varlen_and_kvcache_run_on_tensors_that_require_grad():
    """FA2 code calls them on tensors that require grad without taking gradients: the
    forward runs (varlen: the same bytes as without grad); only a backward through the KV
    cache raises the documented type."""
    from flashattn import flash_attn_varlen_func, flash_attn_with_kvcache

    q = rand(10, 2, 64).requires_grad_(True)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)
    with torch.no_grad():
        want = flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)
    assert out.requires_grad and torch.equal(out.detach(), want)
    qd = rand(2, 1, 8, 64, seed=2).requires_grad_(True)
    kc, vc = rand(2, 64, 2, 64, seed=3), rand(2, 64, 2, 64, seed=4)
    out = flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=40)
    assert out.requires_grad
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="no backward"):
        out.sum().backward()


VARLEN_GRAD_CASES = [
    # lens_q, lens_k, hq, hkv, d, causal, softcap, alibi: sequences without queries or keys,
    # sq != sk, GQA/MQA, head dims attn_bwd takes as they are and padded ones (100, 200)
    ([0, 1, 17, 128, 300], [5, 17, 1, 128, 300], 4, 2, 128, True, 0.0, False),
    ([300, 64, 5], [200, 64, 700], 6, 1, 64, False, 0.0, False),
    ([77, 0, 513], [77, 9, 513], 4, 4, 100, True, 0.0, False),
    ([129, 40], [257, 40], 2, 1, 200, False, 0.0, False),
    ([200, 33], [150, 90], 4, 2, 96, True, 4.0, True),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", VARLEN_GRAD_CASES)
def test_varlen_backward_on_cuda(dtype, case):
    """flash_attn_varlen_func's gradients (one attn_bwd launch over every sequence) against
    PyTorch's autograd through float32 attention, sequence by sequence."""
    from flashattn import flash_attn_varlen_func

    lens_q, lens_k, hq, hkv, d, causal, softcap, alibi = case
    cq = torch.tensor([0] + [sum(lens_q[: i + 1]) for i in range(len(lens_q))], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + [sum(lens_k[: i + 1]) for i in range(len(lens_k))], dtype=torch.int32, device="cuda")
    q = rand(sum(lens_q), hq, d, dtype=dtype, seed=1).requires_grad_(True)
    k = rand(sum(lens_k), hkv, d, dtype=dtype, seed=2).requires_grad_(True)
    v = rand(sum(lens_k), hkv, d, dtype=dtype, seed=3).requires_grad_(True)
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / hq) for i in range(hq)], device="cuda") if alibi else None
    out = flash_attn_varlen_func(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal,
                                 softcap=softcap, alibi_slopes=slopes)
    do = rand(*out.shape, dtype=dtype, seed=9)
    out.backward(do)
    qr, kr, vr = (x.detach().float().requires_grad_(True) for x in (q, k, v))
    parts = []
    for b in range(len(lens_q)):
        sq_, sk_ = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lens_q[b] == 0:
            continue
        if lens_k[b] == 0:
            parts.append(qr[sq_] * 0)  # no key: out 0, no gradient
            continue
        parts.append(reference_mods(qr[sq_][None], kr[sk_][None], vr[sk_][None], causal, softcap, slopes)[0])
    want = torch.cat(parts)
    close(out, want, "out")
    want.backward(do.float())
    for name, x, xr in (("dq", q, qr), ("dk", k, kr), ("dv", v, vr)):
        close(x.grad, xr.grad, name)


def test_varlen_backward_deterministic_on_cuda():
    """deterministic=True: dq the same bytes over 5 runs (the varlen backward's fixed order)."""
    from flashattn import flash_attn_varlen_func

    lens = [300, 7, 1000]
    cu = torch.tensor([0, 300, 307, 1307], dtype=torch.int32, device="cuda")
    x = rand(sum(lens), 4, 128, seed=4)
    do = rand(sum(lens), 4, 128, seed=5)
    grads = []
    for _ in range(5):
        q = x.clone().requires_grad_(True)
        flash_attn_varlen_func(q, x, x, cu, cu, 1000, 1000, causal=True, deterministic=True).backward(do)
        grads.append(q.grad)
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


def reference_lse(q, k, causal=False, window=(-1, -1)):
    """The log-sum-exp of each row's scaled scores in float32, [batch, heads, seqlen_q]; -inf
    where a row sees no key."""
    q, k = (x.float().transpose(1, 2) for x in (q, k))
    sq, sk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    if window[1] >= 0:
        keep &= j <= i + window[1]
    return torch.logsumexp(s.masked_fill(~keep, float("-inf")), dim=-1)


def lse_close(got, want, what):
    assert torch.equal(torch.isinf(got), torch.isinf(want)), f"{what}: rows without keys differ"
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-3, atol=2e-2, msg=what)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_return_attn_probs_like_flash_attn_2(dtype):
    """(out, softmax_lse, S_dmask): out as without it, lse against float32, S_dmask FA2's
    placeholder at dropout 0 (an empty tensor of q's dtype on q's device); with gradients
    too, and for the packed and variable-length functions."""
    from flashattn import flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func

    b, sq, sk, hq, hkv, d = 2, 300, 200, 8, 2, 128
    q, k, v = rand(b, sq, hq, d, dtype=dtype, seed=1), rand(b, sk, hkv, d, dtype=dtype, seed=2), rand(b, sk, hkv, d, dtype=dtype, seed=3)
    plain = flash_attn_func(q, k, v, causal=True)
    out, lse, s_dmask = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, plain)
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32 and lse.device == q.device
    lse_close(lse, reference_lse(q, k, causal=True), "lse")
    assert s_dmask.shape == (0,) and s_dmask.dtype == dtype and s_dmask.device == q.device
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out_g, lse_g, _ = flash_attn_func(qg, kg, vg, 0.0, None, True, (-1, -1), 0.0, None, False, True)
    assert torch.equal(out_g.detach(), plain) and torch.equal(lse_g, lse) and not lse_g.requires_grad
    out_g.backward(rand(*out.shape, dtype=dtype, seed=9))
    assert all(torch.isfinite(x.grad).all() for x in (qg, kg, vg))
    kv = torch.stack([k, v], dim=2)
    out_kv, lse_kv, _ = flashattn.flash_attn_kvpacked_func(q, kv, causal=True, return_attn_probs=True)
    close(out_kv, plain, "kvpacked")
    torch.testing.assert_close(lse_kv, lse)
    # Variable length: lse [heads, total_q].
    lens = [37, 250, 1]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    qs, ks, vs = (rand(sum(lens), hq, d, dtype=dtype, seed=i) for i in (4, 5, 6))
    out_v, lse_v, s_v = flash_attn_varlen_func(qs, ks, vs, cu, cu, 250, 250, causal=True, return_attn_probs=True)
    assert lse_v.shape == (hq, sum(lens)) and s_v.shape == (0,)
    for i in range(len(lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        close(out_v[rows], sdpa(qs[None, rows], ks[None, rows], vs[None, rows], True)[0], f"varlen {i}")
        lse_close(lse_v[:, rows], reference_lse(qs[None, rows], ks[None, rows], True)[0], f"varlen lse {i}")
    qkv = torch.stack([qs, ks, vs], dim=1)
    out_p, lse_p, _ = flash_attn_varlen_qkvpacked_func(qkv, cu, 250, causal=True, return_attn_probs=True)
    assert torch.equal(out_p, out_v) and torch.equal(lse_p, lse_v)


def test_window_size_as_a_tensor():
    q, k, v = rand(1, 300, 4, 64, seed=1), rand(1, 300, 4, 64, seed=2), rand(1, 300, 4, 64, seed=3)
    want = flash_attn_func(q, k, v, window_size=(64, 8))
    close(want, sdpa_window(q, k, v, (64, 8)), "window")
    for pair in (torch.tensor([64, 8]), torch.tensor([64, 8], device="cuda"), [64, 8]):
        assert torch.equal(flash_attn_func(q, k, v, window_size=pair), want), pair
    out, lse, _ = flash_attn_func(q, k, v, window_size=torch.tensor([64, 8], device="cuda"), return_attn_probs=True)
    lse_close(lse, reference_lse(q, k, window=(64, 8)), "window lse")


def sdpa_window(q, k, v, window):
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
    sq, sk = qf.shape[2], kf.shape[2]
    i = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    keep = (j >= i - window[0]) & (j <= i + window[1])
    return F.scaled_dot_product_attention(qf, kf, vf, attn_mask=keep).transpose(1, 2)


def test_varlen_packed_forms_on_cuda():
    from flashattn import flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func

    lens = [100, 7, 300]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    qkv = rand(sum(lens), 3, 4, 96, seed=1)
    want = flash_attn_varlen_func(*(qkv[:, i].contiguous() for i in range(3)), cu, cu, 300, 300, causal=True)
    assert torch.equal(flash_attn_varlen_qkvpacked_func(qkv, cu, 300, causal=True), want)
    got = flash_attn_varlen_kvpacked_func(qkv[:, 0], qkv[:, 1:], cu, cu, 300, 300, causal=True)
    assert torch.equal(got, want)
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="block_table"):
        flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, 300, 300, block_table=cu[None])


def test_what_the_backward_refuses_is_refused_at_the_forward_call(monkeypatch):
    """With gradients wanted, the forward asks the GPU backward's own choice of tile before
    it launches: a tile that cannot run (here forced through FLASHATTN_BWD_TILE: 64 rows per
    step at head_dim 128) fails at flash_attn_func, not in .backward()."""
    q = rand(1, 128, 2, 128).requires_grad_(True)
    monkeypatch.setenv("FLASHATTN_BWD_TILE", "4,64")
    with pytest.raises(flashattn.FlashAttnError, match="FLASHATTN_BWD_TILE"):
        flash_attn_func(q, q, q)
    with torch.no_grad():
        flash_attn_func(q, q, q)  # no gradient wanted: the forward runs
    monkeypatch.delenv("FLASHATTN_BWD_TILE")
    flash_attn_func(q, q, q).sum().backward()
    assert torch.isfinite(q.grad).all()


# ---- torch.compile: the calls as torch.library custom ops ----


class _Attention(torch.nn.Module):
    """GQA self-attention through the packed form and flash_attn_func (with a window)."""

    def __init__(self, dim=512, heads=8, heads_kv=2):
        super().__init__()
        self.h, self.hkv, self.d = heads, heads_kv, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * heads_kv) * self.d, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k, v = q.view(b, s, self.h, self.d), k.view(b, s, self.hkv, self.d), v.view(b, s, self.hkv, self.d)
        o = flash_attn_func(q, k, v, causal=True) + flash_attn_func(q, k, v, window_size=(64, 0), softcap=30.0)
        kv = torch.stack([k, v], dim=2)
        o = o + flash_attn_kvpacked_func(q, kv, causal=True, deterministic=True)
        return self.proj(o.reshape(b, s, -1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_compile_fullgraph_matches_eager(dtype):
    """No graph break (fullgraph=True, inductor). The attention alone: the compiled call runs
    the same native forward on the same tensors as eager, so the same bytes (after eager is
    checked against itself: a difference there is the kernel's, not torch.compile's). The
    module (strided q/k/v views of one projection, a window with softcap, a stacked kv): its
    out and each parameter's gradient (qkv.weight by its q, k and v rows) within rounding of
    eager's; not the same bytes, since inductor sums the three attention outputs and their
    gradients in float32 where eager rounds after each add, and the GPU backward's dQ adds
    with atomics."""
    attn = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True), fullgraph=True)
    q, k, v = rand(2, 300, 8, 128, dtype=dtype, seed=1), rand(2, 300, 2, 128, dtype=dtype, seed=2), rand(2, 300, 2, 128, dtype=dtype, seed=3)
    want = flash_attn_func(q, k, v, causal=True)
    again = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(again, want), f"eager forward, run twice, not the same bytes (the kernel): {differences(again, want)}"
    got = attn(q, k, v)
    assert torch.equal(got, want), f"compiled forward not eager's bytes: {differences(got, want)}"

    torch.manual_seed(0)
    model = _Attention().to("cuda", dtype)
    x = rand(2, 257, 512, dtype=dtype, seed=4)
    # The gradient of out: unit-scale random values (FlashAttention-2's tests do the same).
    # A loss such as out.square().mean() over these 263k elements gives gradients near 1e-6,
    # below float16's smallest normal (6.1e-5): every gradient is then a subnormal with ~5 %
    # steps, and eager and compiled differ by several % in the q and k rows for that reason.
    dy = rand(2, 257, 512, dtype=dtype, seed=5)
    want = model(x)
    want.backward(dy)
    want_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x)
    got.backward(dy)
    close(got, want, "the compiled module's out against eager's")
    d, h, hkv = model.d, model.h, model.hkv
    rows = {
        "qkv.weight": [("q rows", 0, h * d), ("k rows", h * d, (h + hkv) * d), ("v rows", (h + hkv) * d, (h + 2 * hkv) * d)],
        "proj.weight": [("all", 0, None)],
    }
    for name, p in model.named_parameters():
        assert p.grad is not None, f"compiled: no gradient reached {name}"
        for part, lo, hi in rows[name]:
            close(p.grad[lo:hi], want_grads[name][lo:hi], f"compiled gradient of {name} ({part}) against eager's")


def test_torch_compile_varlen_and_kvcache_on_cuda():
    from flashattn import flash_attn_varlen_func, flash_attn_with_kvcache

    def decode(q, kc, vc, kn, vn, lens, qs, cu):
        o = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)
        ov = flash_attn_varlen_func(qs, qs, qs, cu, cu, 300, 300, causal=True)
        return o, ov

    q, kn, vn = rand(3, 1, 8, 100, seed=1), rand(3, 1, 2, 100, seed=2), rand(3, 1, 2, 100, seed=3)  # d 100: padded
    kc, vc = rand(3, 512, 2, 100, seed=4), rand(3, 512, 2, 100, seed=5)
    lens = torch.tensor([0, 77, 400], dtype=torch.int32, device="cuda")
    qs = rand(437, 4, 64, seed=6)
    cu = torch.tensor([0, 37, 337, 437], dtype=torch.int32, device="cuda")
    kc2, vc2 = kc.clone(), vc.clone()
    want = decode(q, kc, vc, kn, vn, lens, qs, cu)
    got = torch.compile(decode, fullgraph=True)(q, kc2, vc2, kn, vn, lens, qs, cu)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


def test_torch_compile_reduce_overhead_captures_the_forward():
    """mode="reduce-overhead" records flash_attn_func in CUDA graphs (it enqueues on the
    current stream without synchronising) and replays it on new inputs."""
    f = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True), mode="reduce-overhead", fullgraph=True)
    for seed in range(4):
        q, k, v = (rand(2, 512, 8, 64, seed=seed * 3 + i) for i in range(3))
        assert torch.equal(f(q, k, v), flash_attn_func(q, k, v, causal=True)), seed


# ---- learnable attention sinks (gpt-oss; issue 40 item 2) ----


def reference_sink(q, k, v, sink, causal=False, window=(-1, -1), softcap=0.0):
    """gpt-oss's attention in float32, bshd in and out: each row's visible logits and its
    head's sink in one softmax, the sink's column dropped; also the lse (sink included)."""
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    b, h, sq, d = q.shape
    sk = k.shape[2]
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    center = i + sk - sq
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        mask &= j <= center
    if window[0] >= 0:
        mask &= j >= center - window[0]
    if window[1] >= 0:
        mask &= j <= center + window[1]
    s = s.masked_fill(~mask, float("-inf"))
    logits = torch.cat([s, sink.float().reshape(1, h, 1, 1).expand(b, h, sq, 1)], dim=-1)
    p = torch.softmax(logits, dim=-1)[..., :-1]
    return (p @ v).transpose(1, 2), torch.logsumexp(logits, dim=-1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, causal, window, softcap",
    [
        ((2, 137, 251, 8, 2, 128), False, (-1, -1), 0.0),  # attn_wgmma / attn_bwd_wgmma
        ((2, 300, 200, 4, 1, 64), True, (-1, -1), 0.0),  # rows that see no key, MQA
        ((1, 200, 333, 6, 2, 96), True, (-1, -1), 0.0),
        ((1, 97, 97, 2, 2, 77), True, (20, -1), 0.0),  # odd head_dim (padded), a window
        ((1, 150, 150, 4, 2, 64), False, (-1, -1), 5.0),  # with softcap (attn_bwd)
    ],
)
def test_learnable_sink_forward_and_backward(dtype, shape, causal, window, softcap):
    """out, lse and the gradients of q, k, v and the sink (a float32 parameter, and a bf16 one
    on bf16 inputs) against PyTorch's autograd in float32."""
    b, sq, sk, hq, hkv, d = shape
    q, k, v = (rand(b, s, h, d, dtype=dtype, seed=i) for i, (s, h) in enumerate([(sq, hq), (sk, hkv), (sk, hkv)]))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    sink_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    sink = torch.linspace(-1.0, 3.0, hq, device="cuda").to(sink_dtype).requires_grad_(True)
    out, lse, _ = flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, learnable_sink=sink,
        return_attn_probs=True,
    )
    refs = [x.detach().float().requires_grad_(True) for x in (q, k, v, sink)]
    want, want_lse = reference_sink(*refs, causal=causal, window=window, softcap=softcap)
    close(out, want, "out")
    assert (lse - want_lse).abs().max() < 2e-3, "lse"
    do = rand(*out.shape, dtype=dtype, seed=9)
    out.backward(do)
    want.backward(do.float())
    for name, x, xr in zip(("dq", "dk", "dv", "d_sink"), (q, k, v, sink), refs):
        assert x.grad.dtype == x.dtype, name
        close(x.grad, xr.grad, name)


@pytest.mark.parametrize("device_offsets", [True, False])
def test_learnable_sink_gradient_through_varlen_on_cuda(device_offsets):
    """The sink's gradient through a packed batch (offsets on the device or the host) is the
    sum of the sequences' dense ones, and dq, dk, dv theirs."""
    hq, d = 4, 64
    lens = [65, 0, 200]
    cu = _cu(lens)
    offsets = (cu, cu) if device_offsets else (cu.tolist(), cu.tolist())
    x = [rand(265, hq, d, seed=s) for s in (1, 2, 3)]
    do = rand(265, hq, d, seed=4)
    sink0 = torch.tensor([0.5, -1.0, 2.0, 4.0], device="cuda")
    q, k, v = (t.clone().requires_grad_(True) for t in x)
    sink = sink0.clone().requires_grad_(True)
    out = flashattn.flash_attn_varlen_func(q, k, v, *offsets, 200, 200, causal=True,
                                           learnable_sink=sink)
    out.backward(do)
    qd, kd, vd = (t.clone().requires_grad_(True) for t in x)
    sd = sink0.clone().requires_grad_(True)
    for a, e in ((0, 65), (65, 265)):
        part = flash_attn_func(qd[None, a:e], kd[None, a:e], vd[None, a:e], causal=True,
                               learnable_sink=sd)
        part.backward(do[None, a:e])
    for name, a, b in (("dq", q, qd), ("dk", k, kd), ("dv", v, vd), ("d_sink", sink, sd)):
        close(a.grad, b.grad, name)
    assert sink.grad.abs().sum() > 0


@pytest.mark.parametrize("paged", [False, True])
def test_learnable_sink_in_flash_attn_with_kvcache_on_cuda(paged):
    """flash_attn_with_kvcache with a sink on CUDA (split-KV included: a long cache) against
    the CPU path."""
    from flashattn import flash_attn_with_kvcache

    b, hq, hkv, d, cap = 3, 8, 2, 128, 4096
    q = rand(b, 1, hq, d, seed=1)
    lens = torch.tensor([0, 1000, 4096], dtype=torch.int32, device="cuda")
    if paged:
        page, nblocks = 256, b * cap // 256
        kc, vc = rand(nblocks, page, hkv, d, seed=2), rand(nblocks, page, hkv, d, seed=3)
        g = torch.Generator().manual_seed(0)
        table = torch.randperm(nblocks, generator=g).view(b, -1).to(torch.int32).cuda()
    else:
        kc, vc = rand(b, cap, hkv, d, seed=2), rand(b, cap, hkv, d, seed=3)
        table = None
    sink = torch.linspace(-2, 3, hq, device="cuda")
    got, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,
                                       learnable_sink=sink, return_softmax_lse=True)
    want, want_lse = flash_attn_with_kvcache(
        q.cpu(), kc.cpu(), vc.cpu(), cache_seqlens=lens.cpu(),
        block_table=None if table is None else table.cpu(), learnable_sink=sink.cpu(),
        return_softmax_lse=True,
    )
    close(got[1:].cpu(), want[1:], "out")
    assert not got[0].any()
    torch.testing.assert_close(lse.cpu(), want_lse, rtol=1e-3, atol=1e-3)


def test_learnable_sink_varlen_and_capture():
    """A packed batch with a sink (a sequence without keys: its lse is the sink) against the
    dense calls; a sink inside a CUDA graph capture is refused with the package's error."""
    hq, d = 4, 64
    lq, lk = [65, 40, 200], [300, 0, 70]
    cq = torch.tensor([0, 65, 105, 305], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, 300, 300, 370], dtype=torch.int32, device="cuda")
    q, k, v = rand(305, hq, d, seed=1), rand(370, 2, d, seed=2), rand(370, 2, d, seed=3)
    sink = torch.tensor([0.5, -1.0, 2.0, 4.0], device="cuda")
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, k, v, cq, ck, 200, 300, causal=True, learnable_sink=sink, return_attn_probs=True
    )
    for n in (0, 2):
        a, e = int(cq[n]), int(cq[n + 1])
        ka, ke = int(ck[n]), int(ck[n + 1])
        want, want_lse = reference_sink(q[None, a:e], k[None, ka:ke], v[None, ka:ke], sink, causal=True)
        close(out[None, a:e], want, f"sequence {n}")
        assert (lse[:, a:e] - want_lse[0]).abs().max() < 2e-3
    assert torch.equal(lse[:, 65:105], sink[:, None].expand(hq, 40))
    assert not out[65:105].any()
    x = rand(1, 256, 4, 64, seed=4)
    flash_attn_func(x, x, x, learnable_sink=sink)  # warm-up outside the capture
    g = torch.cuda.CUDAGraph()
    with pytest.raises(Exception) as e:
        with torch.cuda.graph(g):
            flash_attn_func(x, x, x, learnable_sink=sink)
    chain, err = [], e.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert any(isinstance(x, flashattn.FlashAttnError) and "capture" in str(x) for x in chain), chain
    with pytest.raises(flashattn.FlashAttnError, match="on cpu but q is on cuda"):
        flash_attn_func(x, x, x, learnable_sink=sink.cpu())
