"""flashattn: exact attention with FlashAttention-2's interface, on a Rust core.

Code written for FlashAttention-2's ``flash_attn`` package runs unchanged: the same seven
functions (``flash_attn_func``, ``flash_attn_qkvpacked_func``, ``flash_attn_kvpacked_func``,
``flash_attn_varlen_func``, ``flash_attn_varlen_qkvpacked_func``,
``flash_attn_varlen_kvpacked_func``, ``flash_attn_with_kvcache``) with FlashAttention-2's
positional and keyword arguments, defaults and return values (v2.6-2.8).

Tensors come in through DLPack (``__dlpack__``; PyTorch CUDA tensors through their own
``data_ptr``/``shape``/``stride``, which costs less per call): NumPy arrays, PyTorch tensors and
other DLPack producers are read without a copy, and the output is allocated in the caller's
framework. CPU tensors run on the library's CPU backend (float16, bfloat16, float32); CUDA
tensors (float16, bfloat16) on its GPU kernels, compiled at run time by NVRTC (from the
``nvidia-cuda-nvrtc`` wheel, found without ``LD_LIBRARY_PATH``), enqueued on the caller's
current stream (PyTorch's or CuPy's) with no copy and no device synchronisation, so a call can
be captured in a CUDA graph (JAX GPU arrays are refused: JAX arrays are immutable). PyTorch
tensors that require grad get gradients through ``torch.autograd`` (``flash_attn_func`` and
the packed functions, every score modifier included). ``flash_attn_with_kvcache`` reads
its index arrays (``cache_seqlens``, ``block_table``, ``cache_batch_idx``, ``cache_leftpad``:
int32 tensors on q's device) on the device, without a copy or a synchronisation, so a decoding
step can be captured in a CUDA graph and replayed with new cache lengths (the kernels clamp
out-of-range values instead of validating them, as FlashAttention-2 does not validate them
either). The variable-length functions do the same with their offsets: ``cu_seqlens_*`` as
int32 tensors on q's CUDA device (FlashAttention-2's way) are read by the kernels there, not
copied, with ``max_seqlen_q``/``max_seqlen_k`` bounding the grid as in FlashAttention-2, so
the forward and the backward can be captured in a CUDA graph and replayed with new offsets
(the kernels clamp offsets that point outside the packed tensors, and cut a sequence longer
than the stated ``max_seqlen_*`` to it, instead of validating them; such calls run the packed
``attn_mma`` kernel). Offsets given on the host (lists, NumPy, CPU tensors) are checked there
and let the library pick its kernel per sequence (``attn_wgmma`` on sm_90 for up to 64
sequences of 2048 rows or more on average, where that is faster), without a synchronisation
but not inside a graph capture.

Semantics are FlashAttention-2's: ``[batch, seqlen, heads, head_dim]`` layout, causal
aligned bottom-right, ``window_size=(left, right)`` (a tuple, list or tensor of two ints)
with -1 unbounded, ``softcap`` > 0 caps scores as ``softcap * tanh(s / softcap)``,
``alibi_slopes`` ``[heads]`` or ``[batch, heads]`` (copied to the host: on CUDA that call
synchronises, but ``flash_attn_with_kvcache``'s, read on q's device); GQA/MQA when k and v have fewer heads than q; head dims that are not a
multiple of 8 run padded with zero channels on the GPU. ``softmax_scale`` must be finite and
above 0.

Attention sinks (gpt-oss): ``flash_attn_func``, its packed forms, the variable-length
functions and ``flash_attn_with_kvcache`` take ``learnable_sink`` (keyword only; ``s_aux``,
vLLM's name for it, is accepted as an alias), one logit per query head ``[heads_q]`` (float32, bfloat16 or float16; a PyTorch
tensor on q's device, or a host array) that joins every row's softmax denominator with no
value row: ``o = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))``, and
``softmax_lse`` includes it (a row that sees no key gets ``o = 0``, ``lse = sink_h``). A sink
that requires grad gets its gradient through autograd (``flash_attn_func``, the packed forms
and the variable-length functions, summed over every packed row):
``d sink_h = -sum_{b,i} exp(sink_h - lse_bhi) (dout_bhi . out_bhi)``. The logits are copied to
the host for the call (on CUDA a synchronisation, and not inside a graph capture), but
``flash_attn_with_kvcache`` reads a sink on q's CUDA device there (a decoding step with a sink
can be captured).

``return_attn_probs=True`` returns ``(out, softmax_lse, S_dmask)`` as FlashAttention-2 does:
``softmax_lse`` float32 ``[batch, heads, seqlen_q]`` (``[heads, total_q]`` for the
variable-length functions), and ``S_dmask`` an empty tensor (shape ``(0,)``, q's dtype and
device), which is what FlashAttention-2 returns there too when ``dropout_p`` is 0 (its
probabilities exist only with dropout, for testing). flashattn has no dropout.

``torch.compile`` (``fullgraph=True``) and ``torch.export`` trace models that call these
functions without a graph break: while a trace runs they call ``torch.library`` custom ops
(``flashattn::fwd``, ``flashattn::bwd``, ``flashattn::varlen_fwd``, ``flashattn::varlen_bwd``,
``flashattn::kvcache_fwd``; :mod:`flashattn._torch_ops`) with fake implementations and
autograd formulas, which run the eager path's own code. torch stays optional: importing
flashattn never imports it; the ops are registered when torch is imported (before or after
flashattn; torch 2.4 or later).

FP8 (FlashAttention-3's): ``flash_attn_func`` and its packed forms take PyTorch
``float8_e4m3fn`` q, k, v with ``q_descale``, ``k_descale``, ``v_descale`` and return bf16
(no backward; custom ops ``flashattn::fp8_fwd``, ``flashattn::fp8_fwd_descaled``):
:mod:`flashattn._fp8` says what runs where.

Errors: every call that flashattn refuses raises :class:`FlashAttnError` (a ``ValueError``),
at the call, before anything runs, with a message that says what is wrong and what to do.
What flashattn does not implement raises its subclass :class:`FlashAttnUnsupportedError`
(also a ``NotImplementedError``): ``dropout_p > 0``, ``block_table`` in
``flash_attn_varlen_func``, ``cache_batch_idx`` or ``cache_leftpad`` with a paged cache in
``flash_attn_with_kvcache`` (FlashAttention-2 refuses both), JAX GPU arrays, a head_dim above
256, and, on a GPU whose shared memory cannot hold the backward of a head_dim above 128, a
call whose gradients are wanted. One refusal waits for the backward, because FlashAttention-2 code calls
``flash_attn_with_kvcache`` on tensors that require grad without taking gradients: it has
no backward (as in FlashAttention-2), so its output is computed and a backward through it
raises ``FlashAttnUnsupportedError``. The variable-length functions have a backward.
"""

import numbers
import sys



def _preload_nvrtc():
    """Loads NVRTC 13 from the ``nvidia-cuda-nvrtc`` wheel when it is installed, so that the
    library's ``dlopen("libnvrtc.so.13")`` finds it by its soname without ``LD_LIBRARY_PATH``
    (its builtins first: libnvrtc finds them by soname too). Silent when the wheel is absent:
    the system's NVRTC is then used, and without one CUDA calls raise an error that says so."""
    import ctypes
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return
    import glob

    for root in list(getattr(spec, "submodule_search_locations", None) or []):
        lib = os.path.join(root, "cu13", "lib")
        nvrtc = os.path.join(lib, "libnvrtc.so.13")
        if not os.path.exists(nvrtc):
            continue
        # The builtins' minor version follows the wheel's (13.0, 13.5, ...); some builds of
        # libnvrtc find them through $ORIGIN, others only by soname, so load them first.
        builtins = sorted(glob.glob(os.path.join(lib, "libnvrtc-builtins.so.13.*")))
        try:
            for path in [*builtins[-1:], nvrtc]:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return


_preload_nvrtc()

from . import _native  # noqa: E402
from . import _fp8  # noqa: E402


FlashAttnError = _native.FlashAttnError
FlashAttnUnsupportedError = _native.FlashAttnUnsupportedError

__all__ = [
    "FlashAttnError",
    "FlashAttnUnsupportedError",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]


def _framework(x):
    module = type(x).__module__.split(".")[0]
    if module == "torch":
        import torch

        return "torch", torch
    if module == "cupy":
        import cupy

        return "cupy", cupy
    if x.__dlpack_device__()[0] == 2:  # kDLCUDA, from a framework other than torch or cupy
        if module in ("jax", "jaxlib"):
            raise FlashAttnUnsupportedError(
                "JAX arrays on a GPU: JAX arrays are immutable, so flashattn cannot allocate its "
                "output in JAX; pass PyTorch or CuPy tensors (e.g. through DLPack), or JAX CPU arrays"
            )
        raise FlashAttnUnsupportedError(
            f"CUDA arrays of {module}: flashattn allocates its output and finds the current "
            "stream in PyTorch or CuPy; pass PyTorch or CuPy tensors (e.g. through DLPack)"
        )
    import numpy

    return "numpy", numpy


def _empty_like(x, shape, float32=False):
    """An empty tensor of `shape` in `x`'s framework and on its device (x's dtype, or f32)."""
    name, fw = _framework(x)
    if name == "torch":
        # new_empty: x's device and (unless given) dtype, without building a device object
        return x.new_empty(shape, dtype=fw.float32) if float32 else x.new_empty(shape)
    if name == "cupy":
        with x.device:
            return fw.empty(shape, dtype=fw.float32 if float32 else x.dtype)
    return fw.empty(shape, dtype=fw.float32 if float32 else x.dtype)


def _contiguous(x):
    """`x` in its framework, compact (a copy only where it is not)."""
    name, fw = _framework(x)
    if name == "torch":
        return x.contiguous()  # differentiable: gradients reach a packed input through it
    if name == "cupy":
        with x.device:
            return fw.ascontiguousarray(x)
    return fw.ascontiguousarray(x)


def _check_dropout(dropout_p):
    """FlashAttention-2's ``dropout_p``: a probability, and 0 here (flashattn computes exact
    attention without dropout)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not (
        0.0 <= dropout_p <= 1.0
    ):
        raise FlashAttnError(f"dropout_p={dropout_p!r}: expected a probability in [0, 1]")
    if dropout_p != 0.0:
        raise FlashAttnUnsupportedError(
            f"dropout_p={dropout_p}: flashattn computes exact attention without dropout; "
            "pass dropout_p=0.0 (as at inference)"
        )


def _with_probs(q, out, lse, return_attn_probs):
    """What FlashAttention-2's functions return: out, or with ``return_attn_probs``
    ``(out, softmax_lse, S_dmask)``, S_dmask being FlashAttention-2's own at ``dropout_p=0``:
    an empty tensor of q's dtype on q's device (its probabilities exist only with dropout)."""
    if return_attn_probs:
        return out, lse, _empty_like(q, (0,))
    return out


def _slopes(alibi_slopes):
    """ALiBi slopes as the native calls read them: a host float32 NumPy array (copied from
    the device: on CUDA the call synchronises). Its shape is the native call's to judge."""
    if alibi_slopes is None:
        return None
    if hasattr(alibi_slopes, "detach"):  # torch
        alibi_slopes = alibi_slopes.detach().cpu().float().numpy()
    import numpy

    return numpy.ascontiguousarray(alibi_slopes, dtype=numpy.float32)


def _sink_arg(learnable_sink, s_aux):
    """``learnable_sink``, or ``s_aux`` (vLLM's name for the same argument); not both."""
    if s_aux is None:
        return learnable_sink
    if learnable_sink is not None:
        raise FlashAttnError(
            "learnable_sink and s_aux were both given: s_aux is an alias of learnable_sink "
            "(vLLM's name for it); pass one"
        )
    return s_aux


_SINK_DTYPES = ("float32", "bfloat16", "float16")


def _sink(learnable_sink, q):
    """A learnable sink as the native calls read it: a host float32 NumPy array (copied from
    the device: on CUDA the call synchronises), after the checks only Python can make: a
    PyTorch sink lives on q's device (and q is a PyTorch tensor), its dtype is float32,
    bfloat16 or float16 (NumPy: float32 or float16; a list or tuple of numbers too). Its shape
    (``[heads_q]``) and values (finite) are the native call's to judge."""
    if learnable_sink is None:
        return None
    import numpy

    if _is_torch(learnable_sink):
        if not _is_torch(q):
            raise FlashAttnError(
                "learnable_sink is a PyTorch tensor but q is not: pass the sink in q's framework, "
                "or as a NumPy array"
            )
        if learnable_sink.device != q.device:
            raise FlashAttnError(
                f"learnable_sink is on {learnable_sink.device} but q is on {q.device}: pass the "
                "sink on q's device"
            )
        if learnable_sink.is_cuda:
            import torch

            if torch.cuda.is_current_stream_capturing():
                raise FlashAttnError(
                    "learnable_sink is copied to the host for the call, which a CUDA graph "
                    "capture cannot record: call with a sink outside the capture"
                )
        name = str(learnable_sink.dtype).replace("torch.", "")
        if name not in _SINK_DTYPES:
            raise FlashAttnError(
                f"learnable_sink is {name}: pass float32 (or bfloat16, float16) logits, one per "
                "query head"
            )
        return numpy.ascontiguousarray(
            learnable_sink.detach().float().cpu().numpy(), dtype=numpy.float32
        )
    if isinstance(learnable_sink, (list, tuple)):
        learnable_sink = numpy.asarray(learnable_sink, dtype=numpy.float32)
    if type(learnable_sink).__module__.split(".")[0] == "cupy":
        learnable_sink = learnable_sink.get()
    if not isinstance(learnable_sink, numpy.ndarray):
        raise FlashAttnError(
            f"learnable_sink: a {type(learnable_sink).__name__} is not a tensor of logits; pass "
            "a PyTorch tensor on q's device, a NumPy array or a list of floats"
        )
    if learnable_sink.dtype.name not in _SINK_DTYPES:
        raise FlashAttnError(
            f"learnable_sink is {learnable_sink.dtype.name}: pass float32 (or float16) logits, "
            "one per query head"
        )
    return numpy.ascontiguousarray(learnable_sink, dtype=numpy.float32)


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _on_device_float32(name, x, q):
    """A PyTorch tensor on q's CUDA device (ALiBi slopes, a sink's logits) as the CUDA KV-cache
    call reads it in place: float32 and contiguous, still on the device (a conversion there
    when needed; nothing copied to the host, no synchronisation). None for anything else,
    which takes the host path."""
    if not (_is_torch(x) and _is_torch(q) and x.is_cuda and x.device == q.device):
        return None
    dtype = str(x.dtype).replace("torch.", "")
    # (Slopes of any dtype are converted, as the host path's .float() does.)
    if name == "learnable_sink" and dtype not in _SINK_DTYPES:
        raise FlashAttnError(
            f"{name} is {dtype}: pass float32 (or bfloat16, float16) values"
        )
    import torch

    return x.detach().to(torch.float32).contiguous()


def _on_cuda(x):
    """Whether `x` lives on a CUDA device."""
    if _is_torch(x):
        return x.is_cuda
    device = getattr(x, "__dlpack_device__", None)
    return device is not None and device()[0] == 2  # kDLCUDA


def _stream(x):
    """Where a call on `x` runs, as the native call's ``stream`` and ``current``: on a CUDA
    tensor its framework's current stream on x's device (PyTorch, CuPy; current=True, so the
    DLPack handshake needs no synchronisation), or the legacy default stream for other
    producers (0, current=False); on the CPU (None, False)."""
    if _is_torch(x):  # (PyTorch's __dlpack_device__ is Python code: ask the tensor itself)
        if not x.is_cuda:
            return None, False
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the cheap form, if there
        if raw is not None:
            return raw(x.get_device()), True
        return torch.cuda.current_stream(x.device).cuda_stream, True
    device = getattr(x, "__dlpack_device__", None)
    if device is None or device()[0] != 2:  # kDLCUDA
        return None, False
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        with x.device:  # the current stream of the array's device
            return cupy.cuda.get_current_stream().ptr, True
    return 0, False


def _one_framework(**named):
    """On CUDA every tensor of a call comes from q's framework: the call runs on that
    framework's current stream, and only its own tensors are ordered on it."""
    items = [(n, x) for n, x in named.items() if x is not None]
    _, first = items[0]
    fw = type(first).__module__.split(".")[0]
    if all(type(x).__module__.split(".")[0] == fw for _, x in items[1:]):
        return
    device = getattr(first, "__dlpack_device__", None)
    if device is None or device()[0] != 2:
        return
    for name, x in items[1:]:
        other = type(x).__module__.split(".")[0]
        if other != fw:
            raise FlashAttnError(
                f"{items[0][0]} is a {fw} tensor but {name} is a {other} one: on CUDA pass every "
                f"tensor of a call from one framework (convert with {fw}'s from_dlpack)"
            )


def _dl(x):
    """What the native call reads: a PyTorch tensor detached (DLPack refuses tensors that
    require grad; autograd is handled here), anything else as it is."""
    return x.detach() if _is_torch(x) and x.requires_grad else x


_torch = None  # the torch module, once imported (see _register_torch_ops)


def _torch_module():
    """torch if the process imported it, else None. Read from a module global once torch is
    imported: code that Dynamo traces must not read ``sys.modules``, which Dynamo guards on by
    iterating it while inductor's compile threads import modules ("dictionary changed size
    during iteration", seen on the first inductor compile of a CUDA process)."""
    return _torch if _torch is not None else sys.modules.get("torch")


def _wants_grad(*tensors):
    """Whether a call's output needs a backward: grad mode on and a PyTorch tensor among
    `tensors` (None entries skipped) that requires grad."""
    torch = _torch_module()
    if torch is None or not torch.is_grad_enabled():
        return False
    return any(_is_torch(t) and t.requires_grad for t in tensors if t is not None)


def _tensors(optional=(), **named):
    """Every tensor of a call (None only where `optional` names it) is a DLPack tensor, and
    on CUDA all come from one framework."""
    missing = [name for name, x in named.items() if x is None and name not in optional]
    if missing:
        required = ", ".join(n for n in named if n not in optional)
        raise FlashAttnError(f"{', '.join(missing)} is None: {required} are required tensors")
    for name, x in named.items():
        if x is not None and not hasattr(x, "__dlpack__"):
            raise FlashAttnError(
                f"{name}: a {type(x).__name__} is not a DLPack tensor; pass a NumPy array, "
                "a PyTorch tensor or another object with __dlpack__"
            )
    _one_framework(**named)


def _int(name, x, lo, hi):
    """An integer argument (NumPy integers too, not bools) within [lo, hi]."""
    if type(x) is int and lo <= x <= hi:  # the common case, without the ABC check
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise FlashAttnError(f"{name} = {x!r}: expected an integer")
    if not lo <= int(x) <= hi:
        raise FlashAttnError(f"{name} = {x}: expected {lo} to {hi}")
    return int(x)


_I64 = (-(2**63), 2**63 - 1)


def _window(window_size):
    """``window_size`` as its two sides: a tuple or list of two ints, or (as FlashAttention-2,
    which indexes it) a tensor or array of two integers; 0-d tensors as sides too."""
    pair = window_size
    if not isinstance(pair, (tuple, list)) and hasattr(pair, "tolist"):
        pair = pair.tolist()  # a torch tensor (a CUDA one synchronises), NumPy or CuPy array
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise FlashAttnError(
            f"window_size = {window_size!r}: expected a pair (left, right) of key counts, "
            "-1 for unbounded: (-1, -1) is no window"
        )
    left, right = (x.tolist() if hasattr(x, "tolist") else x for x in pair)
    return (
        _int("window_size[0] (-1 = unbounded)", left, *_I64),
        _int("window_size[1] (-1 = unbounded)", right, *_I64),
    )


def _scores(softmax_scale, causal, window_size, softcap, alibi_slopes):
    """FlashAttention-2's score arguments as every native call takes them, in its order:
    (softmax_scale or None, causal, window_left, window_right, softcap, alibi_slopes). Only
    their Python types are checked here; their values (scale and softcap finite and above 0,
    window sides >= -1, the slopes' shape) are the native call's and the library's to judge."""
    return (
        None if softmax_scale is None else float(softmax_scale),
        bool(causal),
        *_window(window_size),
        float(softcap),
        _slopes(alibi_slopes),
    )


def _outputs(q, rank, lse_axes):
    """out (like q) and lse (float32, q's sizes at `lse_axes`) in q's framework; when q has
    not the `rank` of the call, an lse of no elements: the native call refuses q's shape."""
    shape = tuple(q.shape)
    lse = tuple(shape[i] for i in lse_axes) if len(shape) == rank else (0,)
    return _empty_like(q, shape), _empty_like(q, lse, float32=True)


def _run_forward(q, k, v, scores, check_backward=False, sink=None):
    """out, lse of a dense call; `sink` the host float32 logits of :func:`_sink` (or None)."""
    out, lse = _outputs(q, 4, (0, 2, 1))
    stream, current = _stream(q)
    _native.forward(
        _dl(q), _dl(k), _dl(v), out, lse, *scores, stream, current, torch=_is_torch(q),
        check_backward=check_backward, learnable_sink=sink,
    )
    return out, lse


def _run_backward(saved, dout, scores, deterministic, sink=None, sink_grad=False):
    """dq, dk, dv and d_sink (float32 ``[heads_q]`` on q's device when `sink_grad`, else
    None) of the dense call that wrote out and lse (`saved`: q, k, v, out, lse); `sink` the host
    float32 logits the forward took."""
    q, k, v, out, lse = saved
    import torch

    # The library reads dout through out's strides (out is contiguous: allocated here).
    dout = dout.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    d_sink = None
    if sink_grad:
        d_sink = torch.empty((q.shape[2],), dtype=torch.float32, device=q.device)
    stream, current = _stream(q)
    _native.backward(
        _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dout), dq, dk, dv,
        *scores, deterministic, stream, current, torch=True, learnable_sink=sink, d_sink=d_sink,
    )
    return dq, dk, dv, d_sink


class _Dense:
    """A dense call (``flash_attn_func`` and the packed forms) for autograd: its forward
    refuses on CUDA what the GPU backward would refuse, so that no refusal waits for it. With a
    learnable sink, `sink` holds its host logits and `sink_tensor` the PyTorch tensor the
    caller passed (the fourth tensor of the autograd call, whose gradient is d_sink), if any."""

    def __init__(self, scores, deterministic, sink=None, sink_tensor=None):
        self.scores, self.deterministic = scores, bool(deterministic)
        self.sink, self.sink_tensor = sink, sink_tensor

    def tensors(self, q, k, v):
        """The tensors autograd differentiates: q, k, v and the sink when it is a tensor."""
        return (q, k, v) if self.sink_tensor is None else (q, k, v, self.sink_tensor)

    def forward(self, q, k, v, *_sink):
        return _run_forward(q, k, v, self.scores, check_backward=True, sink=self.sink)

    def backward(self, saved, dout):
        if self.sink_tensor is None:
            return _run_backward(saved, dout, self.scores, self.deterministic)[:3]
        q, k, v, sink, out, lse = saved
        dq, dk, dv, d_sink = _run_backward(
            (q, k, v, out, lse), dout, self.scores, self.deterministic, self.sink,
            sink_grad=sink.requires_grad,
        )
        return dq, dk, dv, None if d_sink is None else d_sink.to(sink.dtype)


_autograd = None


def _function():
    """The ``torch.autograd.Function`` of every call whose output needs a backward (built on
    first use: torch is imported only by callers that pass torch tensors). It runs
    ``call.forward(*tensors)`` -> (out, lse), saves the tensors, out and lse, and hands
    ``call.backward(saved, dout)`` the gradient of out (lse is not differentiable)."""
    global _autograd
    if _autograd is None:
        import torch

        class FlashAttnFunction(torch.autograd.Function):
            @staticmethod
            def forward(ctx, call, *tensors):
                out, lse = call.forward(*tensors)
                ctx.save_for_backward(*tensors, out, lse)
                ctx.call = call
                ctx.mark_non_differentiable(lse)
                return out, lse

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, dout, _dlse):
                return (None, *ctx.call.backward(ctx.saved_tensors, dout))

        _autograd = FlashAttnFunction
    return _autograd


def _plain_torch_cuda(q, k, v):
    """PyTorch when q, k, v are plain PyTorch CUDA tensors of 4 dimensions that need no
    gradient (the common inference call, which takes the short path), else None."""
    torch = _torch_module()
    if torch is None:
        return None
    t = torch.Tensor
    if type(q) is not t or type(k) is not t or type(v) is not t or not q.is_cuda:
        return None
    if (q.requires_grad or k.requires_grad or v.requires_grad) and torch.is_grad_enabled():
        return None
    return torch if q.dim() == 4 else None


def _compiling():
    """Whether torch.compile (Dynamo) or torch.export is tracing this call: the calls then go
    through the custom ops of :mod:`flashattn._torch_ops` (Dynamo cannot trace the native
    extension)."""
    torch = _torch_module()
    if torch is None:
        return False
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return is_compiling is not None and is_compiling()


def _ops():
    """:mod:`flashattn._torch_ops`, registered when torch was imported (a trace cannot
    import it: see :class:`_AfterTorch`)."""
    ops = _torch_ops_module or sys.modules.get(__name__ + "._torch_ops")
    if ops is None:
        raise FlashAttnUnsupportedError(
            "torch.compile: flashattn's custom ops are not registered "
            f"({_torch_ops_error or 'torch was imported before flashattn was, through a route no import hook sees'}); "
            "torch.compile needs torch 2.4 or later; import flashattn after torch"
        )
    return ops


def _forward(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
             deterministic=False, learnable_sink=None):
    if _compiling():
        return _ops().dense(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            learnable_sink,
        )
    scores = _scores(softmax_scale, causal, window_size, softcap, alibi_slopes)
    torch = _plain_torch_cuda(q, k, v)
    if torch is not None and learnable_sink is None:
        # The short path: what the general one does for these tensors, with fewer steps
        # (checks of shapes, dtypes and devices are the native call's, as there).
        b, sq, hq, _ = q.shape
        out = q.new_empty(q.shape)
        lse = q.new_empty((b, hq, sq), dtype=torch.float32)
        stream, current = _stream(q)
        _native.forward(
            _dl(q), _dl(k), _dl(v), out, lse, *scores, stream, current, torch=True
        )
        return out, lse
    _tensors(q=q, k=k, v=v)
    sink = _sink(learnable_sink, q)
    if _wants_grad(q, k, v, learnable_sink):
        sink_tensor = learnable_sink if _is_torch(learnable_sink) else None
        call = _Dense(scores, deterministic, sink, sink_tensor)
        return _function().apply(call, *call.tensors(q, k, v))
    return _run_forward(q, k, v, scores, sink=sink)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    *,
    learnable_sink=None,
    s_aux=None,
):
    """Attention of q ``[batch, seqlen_q, heads_q, head_dim]`` to k, v ``[batch, seqlen_k,
    heads_kv, head_dim]``; returns out like q, or with ``return_attn_probs``
    ``(out, softmax_lse, S_dmask)``: softmax_lse float32 ``[batch, heads_q, seqlen_q]``,
    S_dmask an empty tensor (FlashAttention-2's own at ``dropout_p=0``; see the package's
    docstring). ``softmax_scale`` defaults to ``1/sqrt(head_dim)``; ``dropout_p`` must be 0
    (else :class:`FlashAttnUnsupportedError`). With PyTorch tensors that require grad,
    gradients flow to q, k, v; ``deterministic=True`` then makes the GPU backward's dq the
    same bytes run to run (the forward and the CPU backward always are).
    ``learnable_sink`` (keyword only; alias ``s_aux``): gpt-oss's attention sink, one logit
    per query head ``[heads_q]`` joining every row's softmax denominator (see the package's
    docstring); a PyTorch sink that requires grad gets its gradient.

    FP8 (FlashAttention-3's): q, k, v all ``torch.float8_e4m3fn`` with ``q_descale``,
    ``k_descale``, ``v_descale`` (pass them by keyword): float32 tensors of shape
    ``(batch, heads_kv)``, or one factor each (a 0-d or 1-element float32 tensor, or a Python
    float); None is 1. The value of an element x of q is ``x * q_descale`` (likewise k, v);
    out is bfloat16, accumulation f32. CPU tensors run on the FP8 CPU backend (every
    modifier); CUDA tensors need sm_90 (Hopper), head_dim 64 or 128, no window, softcap or
    ALiBi (else :class:`FlashAttnUnsupportedError`); no learnable sink (refused with
    :class:`FlashAttnUnsupportedError`). No backward: a backward through an FP8 output raises
    :class:`FlashAttnUnsupportedError`. See :mod:`flashattn._fp8`."""
    _check_dropout(dropout_p)
    sink = _sink_arg(learnable_sink, s_aux)
    if (q_descale is not None or k_descale is not None or v_descale is not None
            or _fp8.one_byte(q, k, v)):
        if sink is not None:
            raise FlashAttnUnsupportedError(
                "learnable_sink with FP8 inputs (float8_e4m3fn q, k, v or descale factors) is "
                "not supported: call with bfloat16/float16 inputs for a sink, or without the sink"
            )
        out, lse = _fp8.forward(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, q_descale,
            k_descale, v_descale,
        )
    else:
        out, lse = _forward(
            q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            sink,
        )
    return _with_probs(q, out, lse, return_attn_probs)


def _unpack(name, x, n, layout):
    """The `n` tensors packed along the third axis of `x`, as strided views (read in place)."""
    _tensors(**{name: x})
    if len(x.shape) != 5 or x.shape[2] != n:
        raise FlashAttnError(f"{name} has shape {tuple(x.shape)}; expected {layout}")
    return [x[:, :, i] for i in range(n)]


def _takes_the_rest_of_flash_attn_func(fn, tensors):
    """Gives `fn` (tensors, *args, **kwargs) the signature it forwards: its own tensors, then
    flash_attn_func's arguments after q, k, v (for help() and introspection)."""
    import inspect

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    rest = list(inspect.signature(flash_attn_func).parameters.values())[3:]
    fn.__signature__ = inspect.Signature([inspect.Parameter(t, kind) for t in tensors] + rest)
    return fn


def flash_attn_qkvpacked_func(qkv, *args, **kwargs):
    """As :func:`flash_attn_func` (the same arguments after the tensors, the same returns)
    with ``qkv`` ``[batch, seqlen, 3, heads, head_dim]`` (the three slices are read in place,
    as strided views)."""
    q, k, v = _unpack("qkv", qkv, 3, "[batch, seqlen, 3, heads, head_dim]")
    return flash_attn_func(q, k, v, *args, **kwargs)


def flash_attn_kvpacked_func(q, kv, *args, **kwargs):
    """As :func:`flash_attn_func` (the same arguments after the tensors, the same returns)
    with ``kv`` ``[batch, seqlen_k, 2, heads_kv, head_dim]``."""
    k, v = _unpack("kv", kv, 2, "[batch, seqlen_k, 2, heads_kv, head_dim]")
    return flash_attn_func(q, k, v, *args, **kwargs)


_takes_the_rest_of_flash_attn_func(flash_attn_qkvpacked_func, ["qkv"])
_takes_the_rest_of_flash_attn_func(flash_attn_kvpacked_func, ["q", "kv"])


def _host_ints(name, x, ndim, what):
    """An integer array (NumPy, PyTorch on any device, a list) of `ndim` dimensions copied to
    the host: its values as a flat list of ints within int32 (the native calls' type), and
    its shape. What the values must be is the library's to judge."""
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get") and type(x).__module__.split(".")[0] == "cupy":
        x = x.get()
    import numpy

    a = numpy.asarray(x)
    if a.ndim != ndim or a.dtype.kind not in "iu":
        raise FlashAttnError(
            f"{name} must be a {ndim}-D integer array {what}, got {a.dtype} {a.shape}"
        )
    if a.size and (int(a.min()) < -(2**31) or int(a.max()) >= 2**31):
        raise FlashAttnError(f"{name} holds values outside int32")
    return [int(v) for v in a.reshape(-1)], a.shape


def _varlen_backward(saved, dout, call, sink_grad=False):
    """The backward of the variable-length functions (autograd and the
    ``flashattn::varlen_bwd`` op): `saved` is (q, k, v, out, lse) as the forward took and wrote
    them (packed, compact; lse ``[heads_q, total_q]``), `call` the :class:`_Varlen` (its
    `scores`, `cu_seqlens_q`, `cu_seqlens_k`, `deterministic`); returns dq, dk, dv (dk, dv
    summed over the query heads of each kv head) and d_sink (float32 ``[heads_q]`` on q's
    device when `sink_grad`, the call having a sink; else None). On CUDA one launch per kernel
    over every sequence; the offsets are those the forward took (host lists, or int32 tensors
    on the device with the stated ``max_seqlen_*``)."""
    q, k, v, out, lse = saved
    import torch

    dout = dout.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    d_sink = None
    if sink_grad:
        d_sink = torch.empty((q.shape[1],), dtype=torch.float32, device=q.device)
    stream, current = _stream(q)
    _native.varlen_backward(
        _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dout), dq, dk, dv,
        call.cu_seqlens_q, call.cu_seqlens_k, *call.scores, call.deterministic,
        stream, current, torch=True, **call.stated(), learnable_sink=call.sink, d_sink=d_sink,
    )
    return dq, dk, dv, d_sink


class _Varlen:
    """A packed variable-length call (offsets and score arguments checked) for
    :func:`_function` or for a direct run; the offsets host lists, or int32 tensors on q's
    device with `max_seqlen` the caller's ``(max_seqlen_q, max_seqlen_k)`` (None with host
    lists); `sink` the host logits of a learnable sink (or None), `sink_tensor` the PyTorch
    tensor the caller passed for it, if any (autograd's fourth tensor)."""

    def __init__(self, scores, cu_seqlens_q, cu_seqlens_k, deterministic, sink=None,
                 sink_tensor=None, max_seqlen=None):
        self.scores, self.deterministic = scores, bool(deterministic)
        self.cu_seqlens_q, self.cu_seqlens_k = cu_seqlens_q, cu_seqlens_k
        self.sink, self.sink_tensor = sink, sink_tensor
        self.max_seqlen = max_seqlen

    def stated(self):
        """The native calls' ``max_seqlen_q``/``max_seqlen_k`` keywords (offsets on the device
        only: the kernels' grid, as FlashAttention-2's)."""
        if self.max_seqlen is None:
            return {}
        return {"max_seqlen_q": self.max_seqlen[0], "max_seqlen_k": self.max_seqlen[1]}

    def tensors(self, q, k, v):
        """The tensors autograd differentiates: q, k, v and the sink when it is a tensor."""
        return (q, k, v) if self.sink_tensor is None else (q, k, v, self.sink_tensor)

    def forward(self, q, k, v, *_sink):
        d = q.shape[-1]
        if (len(q.shape) == 3 and d % 8 != 0 and d < 256 and _on_cuda(q)
                and all(len(x.shape) == 3 and x.shape[-1] == d for x in (k, v))):
            # The packed CUDA forward takes head dims that are multiples of 8: run on copies
            # padded with zero channels, the default scale kept at the true head_dim's, out
            # cut back (the backward pads its own copies).
            width = d + (-d) % 8
            scale, *rest = self.scores
            scores = (_default_scale(d) if scale is None else scale, *rest)
            padded = [_pad_channels(_dl(x), width) for x in (q, k, v)]
            out, lse = self._run(*padded, scores)
            return _contiguous(out[..., :d]), lse
        return self._run(q, k, v, self.scores)

    def _run(self, q, k, v, scores):
        out, lse = _outputs(q, 3, (1, 0))
        stream, current = _stream(q)
        _native.varlen_forward(
            _dl(q), _dl(k), _dl(v), out, lse, self.cu_seqlens_q, self.cu_seqlens_k,
            *scores, stream, current, torch=_is_torch(q), learnable_sink=self.sink,
            **self.stated(),
        )
        return out, lse

    def backward(self, saved, dout):
        if self.sink_tensor is None:
            return _varlen_backward(saved, dout, self)[:3]
        q, k, v, sink, out, lse = saved
        dq, dk, dv, d_sink = _varlen_backward(
            (q, k, v, out, lse), dout, self, sink_grad=sink.requires_grad
        )
        return dq, dk, dv, None if d_sink is None else d_sink.to(sink.dtype)


def _device_offsets(q, cu_seqlens_q, cu_seqlens_k):
    """The offsets of a CUDA call as the native call reads them on the device: both CUDA
    tensors (PyTorch's other integer types converted to int32 there, as a device operation:
    no synchronisation), or None when either is not on a CUDA device (host offsets)."""
    if not (_on_cuda(q) and _on_cuda(cu_seqlens_q) and _on_cuda(cu_seqlens_k)):
        return None

    def int32(x):
        if _is_torch(x):
            import torch

            if x.dtype != torch.int32 and not x.dtype.is_floating_point and x.dtype != torch.bool:
                x = x.to(torch.int32)
            return x.contiguous()
        return x

    return int32(cu_seqlens_q), int32(cu_seqlens_k)


def _varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scores,
                 deterministic, learnable_sink=None):
    """A checked variable-length call, q, k, v made compact, a learnable sink checked and
    copied to the host. Offsets on q's CUDA device stay there (the kernels read them, bounded
    by ``max_seqlen_*``: no copy, no synchronisation); others are copied to the host and
    checked against ``max_seqlen_*``. Returns (call, q, k, v)."""
    _tensors(q=q, k=k, v=v)
    sink = _sink(learnable_sink, q)
    sink_tensor = learnable_sink if _is_torch(learnable_sink) else None
    # The varlen kernels read compact tensors; FlashAttention-2 takes row strides (views of
    # packed qkv): those are copied here (with PyTorch the copy passes gradients back).
    q, k, v = (_contiguous(x) for x in (q, k, v))
    max_seqlen_q = _int("max_seqlen_q", max_seqlen_q, 0, 2**31 - 1)
    max_seqlen_k = _int("max_seqlen_k", max_seqlen_k, 0, 2**31 - 1)
    device = _device_offsets(q, cu_seqlens_q, cu_seqlens_k)
    if device is not None:
        call = _Varlen(scores, *device, deterministic, sink, sink_tensor,
                       max_seqlen=(max_seqlen_q, max_seqlen_k))
        return call, q, k, v
    cq, _ = _host_ints("cu_seqlens_q", cu_seqlens_q, 1, "[batch + 1]")
    ck, _ = _host_ints("cu_seqlens_k", cu_seqlens_k, 1, "[batch + 1]")
    # max_seqlen_*: FlashAttention-2's grid sizes; with host offsets the library plans from
    # the offsets themselves, and checks the bound.
    for name, cu, bound in (("q", cq, max_seqlen_q), ("k", ck, max_seqlen_k)):
        steps = [b - a for a, b in zip(cu, cu[1:])]
        longest = max(steps, default=0)
        # Offsets that decrease are the library's to report (it names the entry).
        if min(steps, default=0) >= 0 and longest > int(bound):
            raise FlashAttnError(
                f"max_seqlen_{name} = {bound} but the longest sequence has {longest} rows"
            )
    return _Varlen(scores, cq, ck, deterministic, sink, sink_tensor), q, k, v


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            block_table=None, learnable_sink=None):
    """flash_attn_varlen_func's work: (out, lse)."""
    _check_dropout(dropout_p)
    if block_table is not None:
        raise FlashAttnUnsupportedError(
            "block_table in flash_attn_varlen_func (paged K/V): not supported by flashattn; "
            "pass k, v packed [total_k, heads_kv, head_dim] and block_table=None, or decode "
            "against a paged cache with flash_attn_with_kvcache"
        )
    if _compiling():
        return _ops().varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_size, softcap, alibi_slopes, deterministic, learnable_sink,
        )
    scores = _scores(softmax_scale, causal, window_size, softcap, alibi_slopes)
    call, q, k, v = _varlen_call(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scores, deterministic,
        learnable_sink,
    )
    if _wants_grad(q, k, v, learnable_sink):
        return _function().apply(call, *call.tensors(q, k, v))
    return call.forward(q, k, v)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    learnable_sink=None,
    s_aux=None,
):
    """Packed variable-length batch: q ``[total_q, heads_q, head_dim]``, k, v ``[total_k,
    heads_kv, head_dim]`` (any strides; the kernels read compact tensors, so a tensor that is
    not compact, such as a slice of packed qkv, is copied compact first),
    ``cu_seqlens_q``/``cu_seqlens_k`` int32 ``[batch + 1]``; returns out like
    q, or with ``return_attn_probs`` ``(out, softmax_lse, S_dmask)``: softmax_lse float32
    ``[heads_q, total_q]``, S_dmask an empty tensor (as FlashAttention-2 at ``dropout_p=0``).
    ``max_seqlen_q``/``max_seqlen_k`` must be at least the longest sequence (FA2 sizes its
    grid with them). Offsets on q's CUDA device are read there, never copied (a CUDA graph can
    capture the call and replay it with new offsets): ``max_seqlen_*`` size the grid, and a
    longer sequence is cut to them. Offsets on the host are checked against them.
    ``block_table`` (paged K/V) must be None, else
    :class:`FlashAttnUnsupportedError`. ``learnable_sink`` (keyword only; alias ``s_aux``) as
    :func:`flash_attn_func`'s. Differentiable in q, k, v and a learnable sink (PyTorch
    autograd): the backward runs on the same backend as the forward (on CUDA one launch per
    kernel over every sequence, ``attn_bwd``, and one for the sink's gradient, or with host
    offsets for at most 64 sequences of 2048+ rows on average and no sink gradient one
    ``attn_bwd_wgmma`` backward per sequence; every score argument; ``deterministic=True``
    gives dq the same bytes run to run)."""
    out, lse = _varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, block_table,
        _sink_arg(learnable_sink, s_aux),
    )
    return _with_probs(q, out, lse, return_attn_probs)


def _unpack_varlen(name, x, n, layout):
    """The `n` tensors packed along the second axis of `x`, as strided views (which
    :func:`_varlen` copies compact)."""
    _tensors(**{name: x})
    if len(x.shape) != 4 or x.shape[1] != n:
        raise FlashAttnError(f"{name} has shape {tuple(x.shape)}; expected {layout}")
    return [x[:, i] for i in range(n)]


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    s_aux=None,
):
    """As :func:`flash_attn_varlen_func` (the same returns) with ``qkv`` ``[total, 3, heads,
    head_dim]``, one ``cu_seqlens`` int32 ``[batch + 1]`` and one ``max_seqlen`` for queries
    and keys. q, k and v are copied out of qkv compact (a copy of qkv in all)."""
    _check_dropout(dropout_p)
    q, k, v = _unpack_varlen("qkv", qkv, 3, "[total, 3, heads, head_dim]")
    out, lse = _varlen(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic,
        learnable_sink=_sink_arg(learnable_sink, s_aux),
    )
    return _with_probs(qkv, out, lse, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    learnable_sink=None,
    s_aux=None,
):
    """As :func:`flash_attn_varlen_func` (the same returns) with ``kv`` ``[total_k, 2,
    heads_kv, head_dim]``. k and v are copied out of kv compact (a copy of kv in all)."""
    _check_dropout(dropout_p)
    k, v = _unpack_varlen("kv", kv, 2, "[total_k, 2, heads_kv, head_dim]")
    out, lse = _varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        learnable_sink=_sink_arg(learnable_sink, s_aux),
    )
    return _with_probs(q, out, lse, return_attn_probs)


def _pad_channels(x, width):
    """A compact copy of `x` (in its framework) with its last axis padded with zeros to
    `width`."""
    name, fw = _framework(x)
    extra = width - x.shape[-1]
    if name == "torch":
        return fw.nn.functional.pad(x, (0, extra)).contiguous()
    pad = [(0, 0)] * (len(x.shape) - 1) + [(0, extra)]
    if name == "cupy":
        with x.device:
            return fw.pad(x, pad)
    return fw.pad(x, pad)


def _assign(dst, src):
    """dst[...] = src in place, in dst's framework (no autograd record)."""
    name, fw = _framework(dst)
    if name == "torch":
        with fw.no_grad():
            dst.copy_(src)
    elif name == "cupy":
        with dst.device:
            dst[...] = src
    else:
        dst[...] = src


def _decode_pads(q):
    """Whether :func:`flash_attn_with_kvcache` runs q's head_dim padded: on CUDA, whose decode
    kernels take head dims that are multiples of 8 (up to 256); the CPU takes every one."""
    return len(q.shape) == 4 and q.shape[-1] % 8 != 0 and q.shape[-1] < 256 and _on_cuda(q)


def _default_scale(head_dim):
    """1/sqrt(head_dim) in float32, as the library computes its default."""
    import numpy

    return float(numpy.float32(1.0) / numpy.sqrt(numpy.float32(head_dim)))


class _KvCache:
    """A KV-cache call (arguments checked) for :func:`_function` or for a direct run:
    `forward(q, k, v)` with the caches, index arrays and rotary tables held here."""

    def __init__(self, k_cache, v_cache, index, rotary, scores, num_splits, sink=None):
        self.k_cache, self.v_cache = k_cache, v_cache
        self.index, self.rotary = index, rotary
        self.scores, self.num_splits = scores, num_splits
        self.sink = sink

    def forward(self, q, k, v):
        caches = (self.k_cache, self.v_cache)
        if _decode_pads(q) and all(
            x is None or (len(x.shape) == 4 and x.shape[-1] == q.shape[-1])
            for x in (*caches, k, v)
        ):
            return self._padded(q, k, v)
        return self._run(q, *caches, k, v, self.scores)

    def _run(self, q, k_cache, v_cache, k, v, scores):
        out, lse = _outputs(q, 4, (0, 2, 1))
        stream, current = _stream(q)
        new = [None if x is None else _dl(x) for x in (k, v)]
        cos, sin, interleaved = self.rotary
        workspace = None
        if stream is not None:  # CUDA: the split-KV partials, in q's framework and stream
            def workspace(n):
                return _empty_like(q, (n,), float32=True)
        _native.kvcache_forward(
            _dl(q), _dl(k_cache), _dl(v_cache), *new, out, lse, *self.index,
            None if cos is None else _dl(cos), None if sin is None else _dl(sin), interleaved,
            *scores, self.num_splits, workspace, stream, current, learnable_sink=self.sink,
        )
        return out, lse

    def _padded(self, q, k, v):
        """The call with q, the caches and the new rows padded with zero channels to the next
        multiple of 8 (copies, the caches whole, as FlashAttention-2 does), the default scale
        kept at the true head_dim's, out cut back and the new rows copied back into the
        caller's caches. (Rotary tables cover the first rotary_dim <= head_dim channels: the
        padding is not rotated.)"""
        d = q.shape[-1]
        width = d + (-d) % 8
        scale, *rest = self.scores
        scores = (_default_scale(d) if scale is None else scale, *rest)
        padded = [None if x is None else _pad_channels(_dl(x), width)
                  for x in (q, self.k_cache, self.v_cache, k, v)]
        out, lse = self._run(*padded, scores)
        if k is not None:
            _assign(self.k_cache, padded[1][..., :d])
            _assign(self.v_cache, padded[2][..., :d])
        return _contiguous(out[..., :d]), lse

    def backward(self, saved, dout):
        raise FlashAttnUnsupportedError(
            "flash_attn_with_kvcache has no backward (as in FlashAttention-2): its forward "
            "ran, but a gradient through it cannot be computed; compute this loss without it"
        )


def _index_tensor(name, x, ndim, what, cuda):
    """An index argument of :func:`flash_attn_with_kvcache` as the native call takes it: on
    CUDA the caller's tensor itself (int32 on q's device, which the native call checks and
    reads there, without a copy); on the CPU a compact int32 NumPy array of the caller's
    integers (any integer array or list within int32)."""
    if x is None:
        return None
    if cuda:
        if not hasattr(x, "__dlpack__"):
            raise FlashAttnError(
                f"{name} is a {type(x).__name__}: a CUDA call takes an int32 tensor {what} on "
                "q's device (read there, without a copy)"
            )
        return x
    import numpy

    values, shape = _host_ints(name, x, ndim, what)
    return numpy.asarray(values, dtype=numpy.int32).reshape(shape)


def _capacity(k_cache, k, block_table):
    """The rows a sequence's cache holds minus the new rows (FlashAttention-2's cache_seqlens
    when none is given: the caches are full), from the shapes alone; 0 for shapes the native
    call will refuse."""
    try:
        rows = int(k_cache.shape[1])
        if block_table is not None:
            rows *= int(block_table.shape[1])
        return max(rows - (0 if k is None else int(k.shape[1])), 0)
    except (AttributeError, IndexError, TypeError):
        return 0


def _device_lens(q, value):
    """One cache length for every sequence as an int32 tensor ``[batch]`` on q's device: a
    fill on q's framework's current stream (no copy from the host: a graph capture records
    it)."""
    name, fw = _framework(q)
    batch = int(q.shape[0]) if len(q.shape) else 0
    if name == "torch":
        return fw.full((batch,), value, dtype=fw.int32, device=q.device)
    with q.device:  # CuPy
        return fw.full((batch,), value, dtype=fw.int32)


def _kvcache_call(q, k_cache, v_cache, k, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, rotary_cos, rotary_sin, rotary_interleaved, scores, num_splits,
                  learnable_sink=None, alibi_slopes=None):
    """A KV-cache call with its index arguments in the form the native call takes (see
    :func:`_index_tensor`); `scores` without the slopes, which come as `alibi_slopes`. On
    CUDA nothing is read from the device: the slopes and a learnable sink's logits as PyTorch
    tensors on q's device stay there (:func:`_on_device_float32`); others are copied to the
    host (:func:`_slopes`, :func:`_sink`)."""
    cuda = _on_cuda(q)
    sink = _on_device_float32("learnable_sink", learnable_sink, q) if cuda else None
    if sink is None:
        sink = _sink(learnable_sink, q)
    slopes = _on_device_float32("alibi_slopes", alibi_slopes, q) if cuda else None
    scores = (*scores[:-1], _slopes(alibi_slopes) if slopes is None else slopes)
    if isinstance(cache_seqlens, (numbers.Integral, bool)):
        lens = _int("cache_seqlens", cache_seqlens, -(2**31), 2**31 - 1)  # every sequence's
        if cuda:
            lens = _device_lens(q, lens)
    elif cache_seqlens is None:
        lens = _device_lens(q, _capacity(k_cache, k, block_table)) if cuda else None
    else:
        lens = _index_tensor("cache_seqlens", cache_seqlens, 1, "[batch]", cuda)
    index = (
        lens,
        _index_tensor("block_table", block_table, 2, "[batch, max_blocks]", cuda),
        _index_tensor("cache_batch_idx", cache_batch_idx, 1, "[batch]", cuda),
        _index_tensor("cache_leftpad", cache_leftpad, 1, "[batch]", cuda),
    )
    # 0: the library picks (the native calls take no negative count).
    num_splits = _int("num_splits", num_splits, 0, 2**63 - 1)
    rotary = (rotary_cos, rotary_sin, bool(rotary_interleaved))
    return _KvCache(k_cache, v_cache, index, rotary, scores, num_splits, sink)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    learnable_sink=None,
    s_aux=None,
):
    """Decoding against a KV cache: q ``[batch, seqlen_q, heads_q, head_dim]``; ``k_cache``,
    ``v_cache`` ``[batch_cache, seqlen_cache, heads_kv, head_dim]`` or, with ``block_table``
    int32 ``[batch, max_blocks]``, paged ``[num_blocks, page_size, heads_kv, head_dim]``
    (pages a multiple of 16 keys); new rows ``k``, ``v`` ``[batch, seqlen_new, heads_kv,
    head_dim]`` are written into the caches at rows ``cache_seqlens[b]..`` in place before
    attending; every tensor compact (this version). Returns out (and lse ``[batch, heads_q,
    seqlen_q]`` with ``return_softmax_lse``). ``num_splits`` > 0 sets the split-KV count (0:
    one on the CPU, the library's heuristic on the GPU).

    As FlashAttention-2:

    - ``cache_seqlens``: an int, or int32 ``[batch]``: each sequence's cache length before
      the call (None: the caches are full).
    - ``cache_batch_idx`` int32 ``[batch]``: batch entry b uses cache sequence
      ``cache_batch_idx[b]`` of a contiguous cache of any batch (default b). With new rows,
      entries must differ.
    - ``cache_leftpad`` int32 ``[batch]``: sequence b's keys start at cache row
      ``cache_leftpad[b]`` (contiguous caches); causal, windows and ALiBi count keys from there.
    - ``rotary_cos``, ``rotary_sin`` ``[seqlen_ro, rotary_dim / 2]`` (q's dtype, seqlen_ro at
      least the cache's capacity, rotary_dim even and at most head_dim; they need new rows):
      the first rotary_dim channels of the new keys are rotated at positions
      ``cache_seqlens[b] + t`` before they are written, and q's at ``cache_seqlens[b] + i``
      (causal or a local window) or ``cache_seqlens[b]`` (otherwise); pairs ``(2k, 2k + 1)``
      with ``rotary_interleaved`` (the default), else ``(k, k + rotary_dim / 2)``.
    - ``cache_batch_idx`` and ``cache_leftpad`` with a paged cache raise
      :class:`FlashAttnUnsupportedError` (FlashAttention-2 refuses them too).

    On CUDA the index arrays (``cache_seqlens``, ``block_table``, ``cache_batch_idx``,
    ``cache_leftpad``) must be int32 tensors on q's device (an int ``cache_seqlens`` is filled
    into one there): they are read on the device, never copied to the host, and the call does
    not synchronise, so a decoding step can be captured in a CUDA graph (after one call of the
    same configuration outside the capture, which compiles its kernels) and replayed with new
    values written into those tensors. Their values are not validated there (neither are
    they by FlashAttention-2): the kernels clamp what they read (a length to the capacity
    minus the new rows, a first row to the length, a cache sequence and a page to the cache),
    so that no value reads or writes outside the tensors, and a call with out-of-range values
    computes the call with the clamped ones. On the CPU every value is checked.
    ``learnable_sink`` (keyword only; alias ``s_aux``): one logit per query head, as
    :func:`flash_attn_func`'s (it joins every row's softmax denominator, lse included; a row
    that sees no key gets ``o = 0``, ``lse = sink_h``). On CUDA, ALiBi slopes and the sink as
    PyTorch tensors on q's device are read there too (converted to float32 there when they
    are not): a step with them can be captured and replayed with new values written into
    them. Given any other way (NumPy, lists, another device) they are copied to the host, and
    that call synchronises and cannot be captured.

    Every head_dim up to 256 runs. On CUDA, a head_dim that is not a multiple of 8 runs as
    FlashAttention-2 runs it: q, the caches and the new rows are copied padded with zero
    channels to the next multiple of 8 (the caches whole: a copy of both caches per call), and
    the new rows copied back into the caller's caches after the call; the default scale stays
    ``1/sqrt(head_dim)`` of the true head_dim. Multiples of 8 copy nothing.

    No backward (FlashAttention-2 has none either): tensors that require grad are fine, but a
    backward through the output raises :class:`FlashAttnUnsupportedError`."""
    sink = _sink_arg(learnable_sink, s_aux)
    if _compiling():
        out, lse = _ops().kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
            rotary_interleaved, alibi_slopes, num_splits, sink,
        )
        return (out, lse) if return_softmax_lse else out
    scores = _scores(softmax_scale, causal, window_size, softcap, None)
    _tensors(("k", "v", "rotary_cos", "rotary_sin"), q=q, k_cache=k_cache, v_cache=v_cache,
             k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin)
    call = _kvcache_call(
        q, k_cache, v_cache, k, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
        rotary_cos, rotary_sin, rotary_interleaved, scores, num_splits, sink, alibi_slopes,
    )
    if _wants_grad(q, k, v):
        out, lse = _function().apply(call, q, k, v)
    else:
        out, lse = call.forward(q, k, v)
    return (out, lse) if return_softmax_lse else out


class _AfterTorch:
    """A one-shot import hook (on ``sys.meta_path``) for a process that imports torch after
    flashattn (``import flashattn`` sorts before ``import torch``): right after torch's own
    module has run, it registers the custom ops, which a trace cannot import later. It finds
    nothing itself; it only wraps the loader that the other finders give for ``torch``."""

    def __init__(self):
        self.finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.finding:
            return None
        import importlib.util

        self.finding = True  # the finders after this one
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _register_torch_ops()

        loader.exec_module = exec_module
        return spec


_torch_ops_error = None
_torch_ops_module = None
_fp8_ops_module = None


def _register_torch_ops():
    """Registers torch.compile's custom ops (:mod:`flashattn._torch_ops`); a failure (a torch
    without ``torch.library.custom_op``, before 2.4) is kept for :func:`_ops` to report
    and never fails an import."""
    global _torch_ops_error, _torch_ops_module, _fp8_ops_module, _torch
    _torch = sys.modules.get("torch")
    try:
        from . import _torch_ops
        from . import _fp8_ops  # noqa: F401

        _torch_ops_module = _torch_ops
        _fp8_ops_module = _fp8_ops
    except Exception as e:  # reported where a compiled call needs the ops
        _torch_ops_error = e


if "torch" in sys.modules:
    _register_torch_ops()
else:
    sys.meta_path.insert(0, _AfterTorch())
