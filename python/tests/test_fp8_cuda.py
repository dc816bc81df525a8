"""FP8 (float8_e4m3fn) through flash_attn_func on CUDA tensors (attn_wgmma_fp8, sm_90):
against a float64 reference of the dequantised inputs with the FP8 tolerance
(fp8_reference.py), descales per tensor and per (batch, kv head), GQA, the refusals, autograd,
CUDA graphs and torch.compile. Skipped without PyTorch or a CUDA GPU; the FP8 runs are skipped
on GPUs other than sm_90, where the refusal is tested instead."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import flashattn  # noqa: E402
from flashattn import _native, flash_attn_func  # noqa: E402
from fp8_reference import judge, quantise, reference  # noqa: E402

HOPPER = torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not HOPPER, reason="attn_wgmma_fp8 runs on sm_90 only")


def fp8_inputs(shape, per_head, seed=0):
    """q, k, v float8_e4m3fn on the GPU (about N(0, 1) once dequantised, never 0) and their
    descales: FlashAttention-3's (batch, heads_kv) float32 CUDA tensors, or Python floats."""
    b, sq, sk, hq, hkv, d = shape
    g = torch.Generator().manual_seed(seed)
    if per_head:
        ds = [(torch.rand(b, hkv, generator=g) * 1.5 + 0.25).cuda() for _ in range(3)]
    else:
        ds = [0.37, 1.9, 0.8]
    x = [torch.randn(b, s, h, d, generator=g).cuda() for s, h in ((sq, hq), (sk, hkv), (sk, hkv))]
    q, k, v = (quantise(t, dd, h) for t, dd, h in zip(x, ds, (hq, hkv, hkv)))
    return q, k, v, ds


def check(out, lse, r, what=""):
    problems, numbers = judge(r, out, lse)
    assert not problems, f"{what}: {problems} ({numbers})"


SHAPES = [
    # b, sq, sk, hq, hkv, d: odd lengths off the 128-row tiles, GQA, MQA, sq != sk
    (2, 137, 251, 8, 2, 128),
    (1, 1000, 1000, 4, 4, 64),
    (2, 256, 128, 4, 1, 64),
    (3, 65, 300, 6, 2, 128),
]


@needs_sm90
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-(batch,kv head)"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_forward(shape, causal, per_head):
    q, k, v, (qd, kd, vd) = fp8_inputs(shape, per_head, seed=sum(shape))
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                  v_descale=vd, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and out.is_cuda
    assert lse.dtype == torch.float32 and lse.shape == (shape[0], shape[3], shape[1])
    check(out, lse, reference(q, k, v, qd, kd, vd, causal=causal), f"{shape} causal={causal}")


@needs_sm90
def test_poisoned_outputs_and_the_cpu_backend_agree():
    """The native call on NaN-poisoned out and lse writes them all; the CPU backend on the
    same bytes is judged by the same reference."""
    shape = (2, 200, 333, 8, 2, 64)
    q, k, v, (qd, kd, vd) = fp8_inputs(shape, True, seed=3)
    out = torch.full(q.shape, torch.nan, dtype=torch.bfloat16, device="cuda")
    lse = torch.full((2, 8, 200), torch.nan, device="cuda")
    host = [(list(d.shape), d.reshape(-1).tolist()) for d in (qd, kd, vd)]
    stream = torch.cuda.current_stream().cuda_stream
    _native.fp8_forward(*(x.view(torch.uint8) for x in (q, k, v)), out, lse, *host,
                        None, True, -1, -1, 0.0, None, stream, True)
    r = reference(q, k, v, qd, kd, vd, causal=True)
    check(out, lse, r, "poisoned")
    cpu = flash_attn_func(q.cpu(), k.cpu(), v.cpu(), causal=True, q_descale=qd.cpu(),
                          k_descale=kd.cpu(), v_descale=vd.cpu(), return_attn_probs=True)
    check(cpu[0], cpu[1], r, "cpu")


@needs_sm90
def test_descales_of_every_form_and_on_the_host():
    q, k, v, _ = fp8_inputs((2, 130, 140, 4, 2, 128), False, seed=5)
    r = reference(q, k, v, 0.5, 1.5, 2.0)
    forms = [
        (0.5, 1.5, 2.0),
        (torch.tensor(0.5, device="cuda"), torch.tensor([1.5], device="cuda"), torch.tensor(2.0)),
        tuple(torch.full((2, 2), x, device="cuda") for x in (0.5, 1.5, 2.0)),
        tuple(torch.full((2, 2), x) for x in (0.5, 1.5, 2.0)),  # host tensors
        tuple(torch.tensor(x, device="cuda").expand(2, 2) for x in (0.5, 1.5, 2.0)),
    ]
    for qd, kd, vd in forms:
        out, lse, _ = flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd,
                                      return_attn_probs=True)
        check(out, lse, r, str(type(qd)))


@needs_sm90
def test_packed_forms_and_strided_views():
    qkv = quantise(torch.randn(2, 200, 3, 8, 128, device="cuda"), None, 8)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    r = reference(q, k, v, 0.5, 0.7, 1.2, causal=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, q_descale=0.5, k_descale=0.7,
                                              v_descale=1.2, return_attn_probs=True)
    check(out[0], out[1], r, "qkvpacked")
    kv = qkv[:, :, 1:]
    out2 = flashattn.flash_attn_kvpacked_func(q, kv, causal=True, q_descale=0.5, k_descale=0.7,
                                              v_descale=1.2)
    assert torch.equal(out2, out[0])


@needs_sm90
def test_what_the_kernel_does_not_take_is_refused():
    q, k, v, _ = fp8_inputs((1, 64, 64, 2, 2, 96), False, seed=7)
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="64, 128"):
        flash_attn_func(q, k, v)
    q, k, v, _ = fp8_inputs((1, 64, 64, 2, 2, 64), False, seed=7)
    for kw, match in [
        (dict(window_size=(8, 0)), "sliding window"),
        (dict(softcap=5.0), "softcap"),
        (dict(alibi_slopes=torch.tensor([0.5, 0.25], device="cuda")), "ALiBi"),
    ]:
        with pytest.raises(flashattn.FlashAttnUnsupportedError, match=match):
            flash_attn_func(q, k, v, **kw)
    with pytest.raises(flashattn.FlashAttnError, match="on one device"):
        flash_attn_func(q, k.cpu(), v)
    with pytest.raises(flashattn.FlashAttnError, match="is on cpu|is on cuda"):
        flash_attn_func(q.cpu(), k.cpu(), v.cpu(), q_descale=torch.ones(1, 2, device="cuda"))
    with pytest.raises(flashattn.FlashAttnError, match=r"\[batch, heads_kv\]"):
        flash_attn_func(q, k, v, k_descale=torch.ones(2, 1, device="cuda"))


@pytest.mark.skipif(HOPPER, reason="the refusal of GPUs other than sm_90")
def test_fp8_on_a_gpu_other_than_sm90_is_refused():
    q, k, v, _ = fp8_inputs((1, 64, 64, 2, 2, 64), False, seed=9)
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="sm_90"):
        flash_attn_func(q, k, v)


@needs_sm90
def test_tensors_that_require_grad_run_the_forward_and_refuse_the_backward():
    q, k, v, ds = fp8_inputs((2, 128, 128, 4, 2, 64), True, seed=11)
    qg = q.clone().requires_grad_(True)
    out = flash_attn_func(qg, k, v, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    assert out.requires_grad
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="no backward"):
        out.float().sum().backward()


@needs_sm90
def test_cuda_graph_capture_with_python_float_descales():
    """Per-tensor descales as Python floats: the call enqueues its two kernels only and is
    captured and replayed; descale tensors on the GPU, and per-(batch, kv head) descales,
    are refused inside a capture with a message."""
    b, s, h, d = 2, 512, 8, 128
    q, k, v, _ = fp8_inputs((b, s, s, h, h, d), False, seed=13)
    kw = dict(causal=True, q_descale=0.5, k_descale=1.5, v_descale=0.8)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernels outside the capture
        flash_attn_func(q, k, v, **kw)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flash_attn_func(q, k, v, **kw)
    for seed in (21, 22):
        q2, k2, v2, _ = fp8_inputs((b, s, s, h, h, d), False, seed=seed)
        for x, y in ((q, q2), (k, k2), (v, v2)):
            x.copy_(y)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, flash_attn_func(q, k, v, **kw)), f"replay {seed}"
    for descale, match in [
        (torch.ones(b, h, device="cuda"), "CUDA graph capture"),
        (torch.ones(b, h), "copied from host memory"),
    ]:
        g2 = torch.cuda.CUDAGraph()
        with pytest.raises(Exception) as e:
            with torch.cuda.graph(g2):
                flash_attn_func(q, k, v, causal=True, q_descale=descale)
        chain, x = [], e.value
        while x is not None:
            chain.append(str(x))
            x = x.__cause__ or x.__context__
        assert any(match in m for m in chain), chain


@needs_sm90
def test_torch_compile_fullgraph_matches_eager():
    q, k, v, ds = fp8_inputs((2, 300, 300, 8, 2, 128), True, seed=15)

    def f(q, k, v, qd, kd, vd):
        a = flash_attn_func(q, k, v, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        b = flash_attn_func(q, k, v, q_descale=0.5, k_descale=1.5, v_descale=0.8)
        return a, b

    want = f(q, k, v, *ds)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v, *ds)
    assert all(torch.equal(x, y) for x, y in zip(got, want))


@needs_sm90
def test_torch_compile_reduce_overhead_with_python_float_descales():
    f = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True, q_descale=0.5, k_descale=1.5),
                      mode="reduce-overhead", fullgraph=True)
    for seed in range(3):
        q, k, v, _ = fp8_inputs((2, 512, 512, 8, 8, 64), False, seed=30 + seed)
        assert torch.equal(f(q, k, v), flash_attn_func(q, k, v, causal=True, q_descale=0.5, k_descale=1.5)), seed
