"""``flash_attn_with_kvcache`` on CUDA tensors (issue 40, items 4 and 5): rotary embeddings,
``cache_batch_idx`` and ``cache_leftpad`` against the PyTorch reference; a decode step
(append and attend) captured in a CUDA graph and replayed with new cache lengths written into
the captured tensor, each replay giving eager's bytes; index arrays read on the device (on the
host or of another type: refused); out-of-range device values clamped, never read past the
tensors; ALiBi slopes and a learnable sink on the device read there, in a captured step too.
Skipped where PyTorch or a CUDA GPU is missing (CI has neither)."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import flashattn  # noqa: E402
from flashattn import flash_attn_with_kvcache  # noqa: E402
from kvcache_cases import CASES, check_call, make_call, rel_l2  # noqa: E402
from kvcache_reference import kvcache_reference  # noqa: E402


def ints(x):
    return torch.tensor(x, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_kvcache_arguments_on_cuda_match_the_reference(name, dtype):
    for d, cap in ((32, 64), (128, 300)):
        kw = make_call(name, "cuda", dtype, seed=list(CASES).index(name), d=d, cap=cap)
        for splits in (0, 1, 3):
            check_call(flash_attn_with_kvcache, dict(kw, num_splits=splits), 2e-2,
                       f"{name} {dtype} d{d} splits {splits}")


def test_kvcache_arguments_on_cuda_match_the_cpu_path():
    """The same call on CUDA and on the CPU backend: close outputs, and the appended (rotated)
    keys the same bytes (the GPU rotates with the host's operations)."""
    kw = make_call("everything", "cuda", torch.float16, d=64, cap=128)
    cpu = {n: (x.cpu() if torch.is_tensor(x) else x) for n, x in kw.items()}
    out = flash_attn_with_kvcache(**kw)
    want = flash_attn_with_kvcache(**cpu)
    assert rel_l2(out.cpu(), want) < 2e-3
    assert torch.equal(kw["k_cache"].cpu(), cpu["k_cache"]) and torch.equal(kw["v_cache"].cpu(), cpu["v_cache"])


@pytest.mark.parametrize("name", ["everything", "rotary-paged", "batch-idx-repeat"])
def test_a_decode_step_replays_in_a_cuda_graph(name):
    """One decoding step (new rows appended, then attention) captured in a CUDA graph, then
    replayed with new values written into the captured cache_seqlens (and new q, k, v): each
    replay gives the bytes of the same call run eagerly on the caches as they were before
    it, out and caches, and matches the reference. The capture itself fails if the call
    synchronises or copies from the host."""
    kw = make_call(name, "cuda", torch.float16, b=4, sq=1, d=128, cap=256)
    new = 0 if kw.get("k") is None else kw["k"].shape[1]
    pads = kw.get("cache_leftpad")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernels outside the capture
        flash_attn_with_kvcache(**dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone()))
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flash_attn_with_kvcache(**kw)
    gen = torch.Generator().manual_seed(7)
    for step in range(4):
        lens = torch.randint(0, 256 - new + 1, (4,), generator=gen)
        if pads is not None:
            lens = torch.maximum(lens, pads.cpu().long())
        if name == "batch-idx-repeat":
            lens[1] = lens[0]
        kw["cache_seqlens"].copy_(lens.to(device="cuda", dtype=torch.int32))
        for n in ("q", "k", "v"):
            if kw.get(n) is not None:
                kw[n].copy_(torch.randn(kw[n].shape, generator=gen).to(kw[n]))
        before = kw["k_cache"].clone(), kw["v_cache"].clone()
        g.replay()
        eager_k, eager_v = before[0].clone(), before[1].clone()
        eager = flash_attn_with_kvcache(**dict(kw, k_cache=eager_k, v_cache=eager_v))
        torch.cuda.synchronize()
        assert torch.equal(out, eager), f"step {step}: replay differs from eager"
        assert torch.equal(kw["k_cache"], eager_k) and torch.equal(kw["v_cache"], eager_v), f"step {step}: caches"
        want, _, _ = kvcache_reference(**dict(kw, k_cache=before[0], v_cache=before[1]))
        assert rel_l2(out, want) < 2e-2, f"step {step}"


def test_int_and_absent_cache_seqlens_in_a_cuda_graph():
    """An int cache_seqlens (and None: full caches) is filled into a device tensor on the
    stream: such a call is captured too."""
    kw = make_call("leftpad", "cuda", torch.float16)
    kw.pop("cache_leftpad")
    for lens in (17, None):
        call = dict(kw, cache_seqlens=lens, k=None, v=None)
        eager = flash_attn_with_kvcache(**call)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = flash_attn_with_kvcache(**call)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), lens


def test_index_arrays_are_int32_tensors_on_the_device():
    kw = make_call("everything", "cuda", torch.float16)
    cases = [
        (dict(cache_seqlens=kw["cache_seqlens"].cpu()), "on q's device"),
        (dict(block_table=torch.zeros(3, 4, dtype=torch.int32)), "on q's device"),
        (dict(cache_seqlens=kw["cache_seqlens"].long()), "must be int32"),
        (dict(cache_batch_idx=kw["cache_batch_idx"].long()), "must be int32"),
        (dict(cache_leftpad=[0, 0, 0]), "int32 tensor"),
        (dict(cache_leftpad=kw["cache_leftpad"][:2]), "expected \\[batch\\]"),
        (dict(rotary_sin=None), "rotary_cos was given without"),
        (dict(rotary_cos=kw["rotary_cos"].float(), rotary_sin=kw["rotary_sin"].float()), "one element type"),
        (dict(k=None, v=None), "pass k and v"),
    ]
    for changes, match in cases:
        with pytest.raises(flashattn.FlashAttnError, match=match):
            flash_attn_with_kvcache(**dict(kw, **changes))
    paged = make_call("rotary-paged", "cuda", torch.float16)
    with pytest.raises(flashattn.FlashAttnUnsupportedError, match="cache_leftpad with a paged cache"):
        flash_attn_with_kvcache(**dict(paged, cache_leftpad=ints([0, 0, 0])))


def test_out_of_range_device_values_are_clamped():
    """Device values are not validated: lengths past the capacity and negative, first rows
    past the length, cache sequences and pages outside the cache compute the call with the
    clamped values (kernels/decode/kv_cache.cuh) and touch nothing outside the tensors (the
    guard rows around the caches stay as they were)."""
    kw = make_call("everything", "cuda", torch.float16, cap=64)
    new, cache_batch = kw["k"].shape[1], kw["k_cache"].shape[0]
    raw = dict(cache_seqlens=ints([-5, 10_000, 20]), cache_batch_idx=ints([-3, 1, 99]),
               cache_leftpad=ints([3, -2, 50]))
    lens = raw["cache_seqlens"].clamp(0, 64 - new)
    clamped = dict(cache_seqlens=lens, cache_batch_idx=raw["cache_batch_idx"].clamp(0, cache_batch - 1),
                   cache_leftpad=torch.minimum(raw["cache_leftpad"].clamp(min=0), lens))
    # The caches inside larger buffers: the rows around them must stay untouched.
    for layout_kw, table in ((kw, None), (make_call("rotary-paged", "cuda", torch.float16), "table")):
        if table:
            b = layout_kw["q"].shape[0]
            nblocks = layout_kw["k_cache"].shape[0]
            bad = layout_kw["block_table"].clone()
            bad[0, 0], bad[1, 1], bad[2, 2] = -7, nblocks + 5, 2**31 - 1
            # no new rows (a clamped page may be another sequence's), so no rotary either
            plain = dict(k=None, v=None, rotary_cos=None, rotary_sin=None)
            raw = dict(cache_seqlens=ints([-1, 5000, 33][:b]), block_table=bad, **plain)
            clamped = dict(cache_seqlens=raw["cache_seqlens"].clamp(0, 64), block_table=bad.clamp(0, nblocks - 1),
                           **plain)
        big_k = torch.full((layout_kw["k_cache"].shape[0] + 2, *layout_kw["k_cache"].shape[1:]), 7.0,
                           device="cuda", dtype=torch.float16)
        big_v = big_k.clone()
        big_k[1:-1], big_v[1:-1] = layout_kw["k_cache"], layout_kw["v_cache"]
        got = flash_attn_with_kvcache(**dict(layout_kw, k_cache=big_k[1:-1], v_cache=big_v[1:-1], **raw))
        want, want_k, want_v = kvcache_reference(**dict(layout_kw, **clamped))
        torch.cuda.synchronize()
        assert torch.isfinite(got).all() and rel_l2(got, want) < 2e-2, table
        for guard in (big_k[0], big_k[-1], big_v[0], big_v[-1]):
            assert (guard == 7.0).all(), "a write outside the cache"
        assert rel_l2(big_k[1:-1], want_k) < 1e-3 and rel_l2(big_v[1:-1], want_v) < 1e-3


def test_first_decode_of_a_configuration_inside_a_capture_says_warm_up():
    """Compiling a configuration's kernels cannot be captured: the first call of one inside a
    capture raises and says to warm up (head_dim 72 with rotary: no other test compiles it)."""
    kw = make_call("rotary-causal", "cuda", torch.float16, d=72)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(Exception) as e:
        with torch.cuda.graph(g):
            flash_attn_with_kvcache(**kw)
    chain, x = [], e.value
    while x is not None:
        chain.append(str(x))
        x = x.__cause__ or x.__context__
    assert any("warm-up" in m for m in chain), chain


@pytest.mark.parametrize("splits", [1, 3])
def test_a_decode_step_with_sink_and_alibi_on_the_device_replays_in_a_cuda_graph(splits):
    """ALiBi slopes (per batch entry) and a learnable sink (bfloat16) as tensors on q's device
    are read there (issue 40, item 4): a decoding step with both is captured in a CUDA graph
    and replayed with new cache lengths, new slopes and new sink logits written into the
    captured tensors; each replay gives the bytes of the same call with the values passed as
    host arrays (the same kernels, the values copied per call), with one split and with the
    split-KV combine (which reads the sink too)."""
    gen = torch.Generator().manual_seed(11)
    b, hq, hkv, d, cap = 4, 8, 2, 128, 512
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q = rnd(b, 1, hq, d).half().cuda()
    k_cache, v_cache = (rnd(b, cap, hkv, d).half().cuda() for _ in range(2))
    lens = ints([100, 511, 7, 300])
    slopes = (torch.rand(b, hq, generator=gen) * 0.1).cuda()
    sink = rnd(hq).bfloat16().cuda()
    kw = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=lens, causal=True,
              alibi_slopes=slopes, learnable_sink=sink, num_splits=splits)

    def on_host():
        return flash_attn_with_kvcache(**dict(kw, alibi_slopes=slopes.cpu().numpy(),
                                              learnable_sink=sink.float().cpu().numpy()))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles the kernels outside the capture
        flash_attn_with_kvcache(**kw)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flash_attn_with_kvcache(**kw)
    for step in range(3):
        lens.copy_(torch.randint(1, cap + 1, (b,), generator=gen).to(device="cuda", dtype=torch.int32))
        slopes.copy_((torch.rand(b, hq, generator=gen) * 0.2).cuda())
        sink.copy_(rnd(hq).mul(3).bfloat16().cuda())
        g.replay()
        want = on_host()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"step {step}: the replay did not read the new values"
    # The device values are the ones read: a step with other host values differs.
    other = flash_attn_with_kvcache(**dict(kw, learnable_sink=sink.float().cpu().numpy() + 2.0,
                                           alibi_slopes=slopes.cpu().numpy()))
    assert not torch.equal(other, out)


def test_sink_and_slopes_on_another_device_or_dtype_are_refused():
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.float16)
    cache = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.float16)
    call = dict(q=q, k_cache=cache, v_cache=cache.clone(), cache_seqlens=ints([10, 64]))
    with pytest.raises(flashattn.FlashAttnError, match="learnable_sink is int32"):
        flash_attn_with_kvcache(**call, learnable_sink=torch.zeros(4, dtype=torch.int32, device="cuda"))
    with pytest.raises(flashattn.FlashAttnError, match="alibi_slopes has shape"):
        flash_attn_with_kvcache(**call, alibi_slopes=torch.zeros(3, device="cuda"))
    with pytest.raises(flashattn.FlashAttnError, match="learnable_sink has shape"):
        flash_attn_with_kvcache(**call, learnable_sink=torch.zeros(5, device="cuda"))
