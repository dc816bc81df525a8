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
    err = (got - want).norm() / want.norm().clamp_min(1e-30)
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    assert err < 1e-2, f"{what}: rel-L2 {err:.3e}"


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
    q, k, v = rand(1, 512, 8, 64, seed=1), rand(1, 512, 8, 64, seed=2), rand(1, 512, 8, 64, seed=3)
    want = flash_attn_func(q, k, v, causal=True)
    streams = [torch.cuda.Stream() for _ in range(80)]
    torch.cuda.synchronize()
    outs = []
    for s in streams:
        with torch.cuda.stream(s):
            outs.append(flash_attn_func(q, k, v, causal=True))
    torch.cuda.synchronize()
    assert all(torch.equal(o, want) for o in outs)


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


def test_errors():
    q = rand(1, 16, 2, 64)
    with pytest.raises(flashattn.FlashAttnError, match="float16 or bfloat16"):
        flash_attn_func(q.float(), q.float(), q.float())
    with pytest.raises(flashattn.FlashAttnError, match="on one device"):
        flash_attn_func(q, q.cpu(), q)
    with pytest.raises(flashattn.FlashAttnError, match="head_dim"):
        flash_attn_func(q[..., ::2], q[..., ::2], q[..., ::2])
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_func(q, q, q, dropout_p=0.1)
    qg = q.clone().requires_grad_(True)
    with pytest.raises(flashattn.FlashAttnError, match="softcap"):
        flash_attn_func(qg, q, q, softcap=5.0).sum().backward()


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
