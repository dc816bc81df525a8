"""flashattn's calls as ``torch.library`` custom ops, for ``torch.compile``.

Dynamo cannot trace into the native extension, so under ``torch.compile`` (and
``torch.export``) the public functions call these ops instead: opaque to the compiler, with
fake (meta) implementations that give the outputs' shapes, dtypes and strides, and autograd
formulas, so that a model calling ``flash_attn_func`` (packed forms, varlen, KV cache)
compiles with ``fullgraph=True``. Each op's real implementation is the eager path's own
code, so compiled and eager calls run the same native calls on the same bytes.

- ``flashattn::fwd`` / ``flashattn::bwd``: the dense forward (out, lse) and its gradients
  (a learnable sink's too: ``bwd`` returns it as a fourth tensor, empty without a sink).
- ``flashattn::varlen_fwd`` / ``flashattn::varlen_bwd``: the packed variable-length forward,
  and its backward (``flashattn._varlen_backward``, the eager path's: one launch per kernel
  over every sequence on CUDA). Offsets on the device are read there without synchronising,
  so they carry no ``cudagraph_unsafe`` tag (as the dense ops: ALiBi slopes and sinks are
  copied to the host in both).
- ``flashattn::kvcache_fwd``: decoding against a KV cache; writes the new rows into
  ``k_cache``/``v_cache`` in place (declared as mutated), no autograd. It reads its index
  tensors on the device without synchronising, so it carries no ``cudagraph_unsafe`` tag.

Imported only by callers that pass PyTorch tensors (the package does not need torch);
the ops are registered once, on import.
"""

import inspect
from typing import List, Optional, Tuple

import torch
from torch import Tensor

import flashattn as _fa

_OPS = "flashattn"


def _syncs():
    """The tags of an op that copies arguments to the host (a synchronisation on CUDA: the FP8
    op's descales):
    ``cudagraph_unsafe``, so that ``torch.compile(mode="reduce-overhead")`` leaves it out of
    its CUDA graphs, where the torch version has the tag."""
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    if tag is None or "tags" not in inspect.signature(torch.library.custom_op).parameters:
        return {}
    return {"tags": (tag,)}


def _scores(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes):
    """The native calls' score arguments from the ops' flat ones."""
    return (softmax_scale, causal, window_left, window_right, softcap, _fa._slopes(alibi_slopes))


def _lse_shape(q: Tensor) -> List[int]:
    if q.dim() != 4:
        raise _fa.FlashAttnError(
            f"q has {q.dim()} dimensions {tuple(q.shape)}; expected 4: [batch, seqlen, heads, head_dim]"
        )
    b, sq, hq, _ = q.shape
    return [b, hq, sq]


def _fake_out_lse(q: Tensor, dtype=None) -> Tuple[Tensor, Tensor]:
    """A dense forward's fake (out, lse): out like q (of `dtype`, None: q's), lse float32
    ``[batch, heads_q, seqlen_q]``."""
    return q.new_empty(q.shape, dtype=dtype), q.new_empty(_lse_shape(q), dtype=torch.float32)


# ---- the dense forward and backward ----


@torch.library.custom_op(f"{_OPS}::fwd", mutates_args=())
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    check_backward: bool,
    learnable_sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """out ``[batch, seqlen_q, heads_q, head_dim]`` and lse float32 ``[batch, heads_q,
    seqlen_q]``, both compact (``flash_attn_func``'s forward; `deterministic` is the
    backward's, `check_backward` refuses on CUDA now what the GPU backward would refuse;
    `learnable_sink` ``[heads_q]`` on q's device, or None)."""
    scores = _scores(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes)
    sink = _fa._sink(learnable_sink, q)
    return _fa._run_forward(q, k, v, scores, check_backward=check_backward, sink=sink)


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
      deterministic, check_backward, learnable_sink=None):
    return _fake_out_lse(q)


@torch.library.custom_op(f"{_OPS}::bwd", mutates_args=())
def bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    learnable_sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq (q's shape), dk, dv (k's shape), compact, of ``flashattn::fwd``'s out, and the
    learnable sink's gradient, float32 ``[heads_q]`` (an empty tensor without a sink)."""
    scores = _scores(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes)
    sink = _fa._sink(learnable_sink, q)
    dq, dk, dv, d_sink = _fa._run_backward(
        (q, k, v, out, lse), dout, scores, deterministic, sink, sink_grad=sink is not None
    )
    if d_sink is None:
        d_sink = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, d_sink


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
      alibi_slopes, deterministic, learnable_sink=None):
    sinks = 0 if learnable_sink is None else q.shape[2]
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((sinks,), dtype=torch.float32))


def _fwd_setup(ctx, inputs, output):
    q, k, v, scale, causal, left, right, softcap, slopes, deterministic, _, sink = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, slopes, sink)
    ctx.args = (scale, causal, left, right, softcap)
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, _dlse):
    q, k, v, out, lse, slopes, sink = ctx.saved_tensors
    dq, dk, dv, d_sink = bwd(dout, q, k, v, out, lse, *ctx.args, slopes, ctx.deterministic, sink)
    d_sink = None if sink is None else d_sink.to(sink.dtype)
    return dq, dk, dv, None, None, None, None, None, None, None, None, d_sink


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


# ---- the packed variable-length forward and backward ----


def _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                 deterministic, learnable_sink=None):
    """The eager path's checked call (offsets on the device kept there, others copied to the
    host and checked; inputs made compact): (call, q, k, v)."""
    return _fa._varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        (softmax_scale, causal, window_left, window_right, softcap, _fa._slopes(alibi_slopes)),
        deterministic, learnable_sink,
    )


@torch.library.custom_op(f"{_OPS}::varlen_fwd", mutates_args=())
def varlen_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    learnable_sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """out ``[total_q, heads_q, head_dim]`` and lse float32 ``[heads_q, total_q]``
    (``flash_attn_varlen_func``'s forward)."""
    call, q, k, v = _varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, window_left, window_right, softcap, alibi_slopes, deterministic, learnable_sink,
    )
    return call.forward(q, k, v)


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, alibi_slopes, deterministic, learnable_sink=None):
    if q.dim() != 3:
        raise _fa.FlashAttnError(
            f"q has {q.dim()} dimensions {tuple(q.shape)}; expected 3: [total_q, heads_q, head_dim]"
        )
    total_q, hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((hq, total_q), dtype=torch.float32)


@torch.library.custom_op(f"{_OPS}::varlen_bwd", mutates_args=())
def varlen_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    learnable_sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv of ``flashattn::varlen_fwd``'s out (``flashattn._varlen_backward``, the
    eager path's), and the learnable sink's gradient, float32 ``[heads_q]`` (an empty tensor
    without a sink)."""
    call, q, k, v = _varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, window_left, window_right, softcap, alibi_slopes, deterministic, learnable_sink,
    )
    dq, dk, dv, d_sink = _fa._varlen_backward(
        (q, k, v, out, lse), dout, call, sink_grad=learnable_sink is not None
    )
    if d_sink is None:
        d_sink = q.new_empty((0,), dtype=torch.float32)
    return dq, dk, dv, d_sink


@varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic,
      learnable_sink=None):
    sinks = 0 if learnable_sink is None else q.shape[1]
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((sinks,), dtype=torch.float32))


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *rest, sink = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, rest[-2], sink)
    ctx.args = rest  # max_seqlen_q, max_seqlen_k, scale, causal, left, right, softcap, slopes, deterministic
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k, slopes, sink = ctx.saved_tensors
    max_q, max_k, scale, causal, left, right, softcap, _, deterministic = ctx.args
    wants_sink = sink is not None and ctx.needs_input_grad[-1]
    dq, dk, dv, d_sink = varlen_bwd(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, left, right,
        softcap, slopes, deterministic, sink.detach() if wants_sink else None,
    )
    return (dq, dk, dv) + (None,) * 11 + (d_sink.to(sink.dtype) if wants_sink else None,)


varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup)


# ---- decoding against a KV cache ----


@torch.library.custom_op(f"{_OPS}::kvcache_fwd", mutates_args=("k_cache", "v_cache"))
def kvcache_fwd(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    cache_seqlens_all: Optional[int],
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    block_table: Optional[Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    alibi_slopes: Optional[Tensor],
    num_splits: int,
    learnable_sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """out like q and lse float32 ``[batch, heads_q, seqlen_q]`` (``flash_attn_with_kvcache``;
    the new rows k, v written into the caches in place). ``cache_seqlens`` per sequence, or
    ``cache_seqlens_all`` for every one, or neither (full caches). No synchronisation on CUDA
    (the index tensors are read on the device), so ``mode="reduce-overhead"`` may capture it."""
    lens = cache_seqlens if cache_seqlens is not None else cache_seqlens_all
    scores = (softmax_scale, causal, window_left, window_right, softcap, None)
    call = _fa._kvcache_call(
        q, k_cache, v_cache, k, lens, cache_batch_idx, cache_leftpad, block_table, rotary_cos,
        rotary_sin, rotary_interleaved, scores, num_splits, learnable_sink, alibi_slopes,
    )
    return call.forward(q, k, v)


@kvcache_fwd.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlens_all,
      cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_left,
      window_right, softcap, rotary_interleaved, alibi_slopes, num_splits, learnable_sink=None):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.custom_op(f"{_OPS}::no_backward", mutates_args=())
def no_backward(out: Tensor, inputs: List[Tensor], what: str) -> Tensor:
    """A copy of `out` whose backward raises ``FlashAttnUnsupportedError`` (through
    ``flashattn::refuse_backward``, when it runs): ties the out of a call with no backward
    (``what``) to the `inputs` that require grad, so that tracing a model's backward works and
    only running it raises, as in eager."""
    return out.clone()


@no_backward.register_fake
def _(out, inputs, what):
    return out.new_empty(out.shape)


@torch.library.custom_op(f"{_OPS}::refuse_backward", mutates_args=())
def refuse_backward(dout: Tensor, inputs: List[Tensor], what: str) -> List[Tensor]:
    """Raises ``FlashAttnUnsupportedError``: `what` has no backward."""
    raise _fa.FlashAttnUnsupportedError(
        f"{what} has no backward (as in FlashAttention-2): its forward ran, but a gradient "
        "through it cannot be computed; compute this loss without it"
    )


@refuse_backward.register_fake
def _(dout, inputs, what):
    return [x.new_empty(x.shape) for x in inputs]


def _no_backward_setup(ctx, inputs, output):
    _, grads, what = inputs
    ctx.save_for_backward(*grads)
    ctx.what = what


def _no_backward_backward(ctx, dout):
    return None, list(refuse_backward(dout, list(ctx.saved_tensors), ctx.what)), None


no_backward.register_autograd(_no_backward_backward, setup_context=_no_backward_setup)


# ---- what the public functions call while torch.compile traces them ----


def _tensor(x, dtype):
    """An optional argument as a tensor (FlashAttention-2 code passes tensors; lists and
    NumPy arrays are converted)."""
    if x is None or isinstance(x, Tensor):
        return x
    return torch.as_tensor(x, dtype=dtype)


def _args(softmax_scale, causal, window_size):
    left, right = _fa._window(window_size)
    scale = None if softmax_scale is None else float(softmax_scale)
    return scale, bool(causal), left, right


def _sink_tensor(learnable_sink, q):
    """A learnable sink as the ops take it: a tensor (lists and NumPy arrays as float32 on
    q's device; a tensor as it is, its dtype and device the op's to judge)."""
    if learnable_sink is None or isinstance(learnable_sink, Tensor):
        return learnable_sink
    return torch.as_tensor(learnable_sink, dtype=torch.float32, device=q.device)


def dense(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
          learnable_sink=None):
    """``flash_attn_func``'s (out, lse) through ``flashattn::fwd``."""
    scale, causal, left, right = _args(softmax_scale, causal, window_size)
    slopes = _tensor(alibi_slopes, torch.float32)
    sink = _sink_tensor(learnable_sink, q)
    wants = [x for x in (q, k, v, sink) if x is not None]
    check = torch.is_grad_enabled() and any(x.requires_grad for x in wants)
    return fwd(q, k, v, scale, causal, left, right, float(softcap), slopes, bool(deterministic),
               check, sink)


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
           causal, window_size, softcap, alibi_slopes, deterministic, learnable_sink=None):
    """``flash_attn_varlen_func``'s (out, lse) through ``flashattn::varlen_fwd``."""
    scale, causal, left, right = _args(softmax_scale, causal, window_size)
    return varlen_fwd(
        q, k, v, _tensor(cu_seqlens_q, torch.int32), _tensor(cu_seqlens_k, torch.int32),
        int(max_seqlen_q), int(max_seqlen_k), scale, causal, left, right, float(softcap),
        _tensor(alibi_slopes, torch.float32), bool(deterministic),
        _sink_tensor(learnable_sink, q),
    )


def kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
            rotary_interleaved, alibi_slopes, num_splits, learnable_sink=None):
    """``flash_attn_with_kvcache``'s (out, lse) through ``flashattn::kvcache_fwd``, which
    writes the caches in place and so can carry no autograd formula: with gradients wanted it
    runs on detached q, k, v and its out goes through ``flashattn::no_backward``, whose
    backward raises when it runs, as in eager."""
    scale, causal, left, right = _args(softmax_scale, causal, window_size)
    if isinstance(cache_seqlens, int):
        lens, lens_all = None, cache_seqlens
    else:
        lens, lens_all = _tensor(cache_seqlens, torch.int32), None
    grads = [x for x in (q, k, v) if x is not None and x.requires_grad]
    if not torch.is_grad_enabled():
        grads = []
    q, k, v, rotary_cos, rotary_sin = (
        None if x is None else x.detach() for x in (q, k, v, rotary_cos, rotary_sin)
    )
    out, lse = kvcache_fwd(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lens, lens_all,
        _tensor(cache_batch_idx, torch.int32), _tensor(cache_leftpad, torch.int32),
        _tensor(block_table, torch.int32), scale, causal, left, right, float(softcap),
        bool(rotary_interleaved), _tensor(alibi_slopes, torch.float32), int(num_splits),
        None if learnable_sink is None else _sink_tensor(learnable_sink, q).detach(),
    )
    if grads:
        out = no_backward(out, grads, "flash_attn_with_kvcache")
    return out, lse
