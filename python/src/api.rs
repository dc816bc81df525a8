//! The native functions: each takes its tensors ([`crate::dlpack`]), checks them and builds
//! the library's problem ([`crate::rules`]), then runs it on the CPU backend or on the CUDA
//! device the tensors live on ([`crate::gpu`]), for their element type ([`Job`]).

use crate::dlpack::{Borrowed, handshake, placement, take_all};
use crate::error::err;
use crate::gpu;
use crate::gpu::Qkv;
use crate::rules::{
    CacheIndex, CacheSeqlens, Scores, Seqlens, bshd, bshd_problem, check_d_sink, check_disjoint,
    check_grads, check_varlen_grads, cuda_dtype, device_varlen_problem, host_index, kvcache_shape,
    new_rows, one_dtype, problem, rotary_tables, varlen_problem,
};
use flashattn::Element;
use flashattn::cuda::{GpuElement, KernelKind, forward_device};
use flashattn::kvcache::{KvCacheProblem, KvCacheShape, RotaryTables};
use flashattn::shape::{AttnProblem, Strides};
use flashattn::varlen::{DeviceVarlenProblem, VarlenProblem};
use half::{bf16, f16};
use pyo3::prelude::*;

/// One call's work, written once for every element type: on the CPU backend, or on CUDA
/// device `id`.
trait Job {
    /// # Safety
    /// Every tensor holds `T` (lse f32) on the CPU, with the layouts the rules checked.
    unsafe fn cpu<T: Element>(&self) -> PyResult<String>;
    /// # Safety
    /// As [`Self::cpu`], on device `id`, as [`crate::gpu`]'s entry points require.
    unsafe fn cuda<T: GpuElement>(&self, id: i32) -> PyResult<String>;
}

/// Runs `job` where the tensors live (`place`: `None` the CPU, `Some(id)` a CUDA device) for
/// their element type; returns where it ran.
///
/// # Safety
/// As [`Job::cpu`] and [`Job::cuda`]: `place` and `dtype` are the tensors' own.
unsafe fn run(place: Option<i32>, dtype: &str, job: &impl Job) -> PyResult<String> {
    // SAFETY: forwarded to the caller.
    unsafe {
        match (place, dtype) {
            (None, "float16") => job.cpu::<f16>(),
            (None, "bfloat16") => job.cpu::<bf16>(),
            (None, _) => job.cpu::<f32>(),
            (Some(id), "float16") => job.cuda::<f16>(id),
            (Some(id), "bfloat16") => job.cuda::<bf16>(id),
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// Where a CPU call ran, as the native functions return it: `cpu (N threads)`.
pub(crate) fn cpu_threads() -> String {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("cpu ({n} threads)")
}

/// Copies a CPU result into the caller's `out` and `lse`.
///
/// # Safety
/// `o` holds `T` and `lse` f32 on the CPU, compact, with the result's sizes.
unsafe fn write_out<T: Element>(
    (o, lse): (&Borrowed, &Borrowed),
    ro: &[T],
    rlse: &[f32],
) -> PyResult<()> {
    // SAFETY: forwarded to the caller; out and lse are the caller's writable buffers.
    unsafe {
        o.slice_mut::<T>()?.copy_from_slice(ro);
        lse.slice_mut::<f32>()?.copy_from_slice(rlse);
    }
    Ok(())
}

/// A forward call on q, k, v, out, lse: the dense problem or the packed one.
struct Fwd<'a, P> {
    p: P,
    t: [&'a Borrowed; 5],
    stream: usize,
    /// Refuse on CUDA, before the launch, what the GPU backward would refuse
    /// ([`gpu::backward_check`]; the dense problem only).
    check_backward: bool,
}

impl Job for Fwd<'_, AttnProblem> {
    unsafe fn cpu<T: Element>(&self) -> PyResult<String> {
        let [q, k, v, o, lse] = self.t;
        // SAFETY: the caller's contract; out and lse are distinct writable buffers.
        unsafe {
            let (q, k, v) = (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?);
            let (o, lse) = (o.slice_mut::<T>()?, lse.slice_mut::<f32>()?);
            flashattn::cpu::forward(&self.p, q, k, v, o, lse).map_err(err)?;
        }
        Ok(cpu_threads())
    }

    unsafe fn cuda<T: GpuElement>(&self, id: i32) -> PyResult<String> {
        // SAFETY: the caller's contract.
        unsafe {
            gpu::on_device(id, self.stream, |g| {
                if self.check_backward {
                    gpu::backward_check::<T>(g, &self.p)?;
                }
                gpu::forward(g, self.t, None, |[q, k, v]: &Qkv<T>, o, l| {
                    forward_device(g, KernelKind::Wgmma, None, &self.p, q, k, v, o, l)
                })
            })
        }
    }
}

/// A packed batch's offsets as the caller passed them: host lists (the library reads and
/// checks them), or int32 tensors on the device with the caller's `max_seqlen_q` and
/// `max_seqlen_k` (read by the kernels only: no copy, so the call can be captured in a CUDA
/// graph).
enum Offsets {
    Host(Vec<i32>, Vec<i32>),
    Device([Borrowed; 2], (usize, usize)),
}

impl Offsets {
    /// Lists are host offsets; anything else is taken as a tensor (DLPack, with the stream
    /// handshake `hs`), which needs both `max_seqlen`s.
    fn take(
        [cq, ck]: [&Bound<'_, PyAny>; 2],
        max: (Option<usize>, Option<usize>),
        hs: Option<i64>,
    ) -> PyResult<Self> {
        use pyo3::types::PyList;
        match (cq.is_instance_of::<PyList>(), ck.is_instance_of::<PyList>()) {
            (true, true) => Ok(Offsets::Host(cq.extract()?, ck.extract()?)),
            (false, false) => {
                let (Some(mq), Some(mk)) = max else {
                    return Err(crate::error::FlashAttnError::new_err(
                        "offsets on the device need max_seqlen_q and max_seqlen_k (the kernels' grid: the offsets are not read on the host)",
                    ));
                };
                let t = |x, name| Borrowed::take_on(x, name, hs);
                Ok(Offsets::Device(
                    [t(cq, "cu_seqlens_q")?, t(ck, "cu_seqlens_k")?],
                    (mq, mk),
                ))
            }
            _ => Err(crate::error::FlashAttnError::new_err(
                "cu_seqlens_q and cu_seqlens_k: pass both as lists of host offsets, or both as int32 tensors on q's device",
            )),
        }
    }

    /// The packed problem of tensors `t` (q, k, v, out, lse) with these offsets.
    fn problem(self, t: [&Borrowed; 5], scores: &Scores) -> PyResult<Packed> {
        Ok(match self {
            Offsets::Host(cq, ck) => Packed::Host(varlen_problem(t, cq, ck, scores)?),
            Offsets::Device(cu, max) => {
                let place = t[0].place()?;
                let p = device_varlen_problem(t, [&cu[0], &cu[1]], max, scores, place)?;
                Packed::Device(p, cu)
            }
        })
    }
}

/// A packed batch's problem: its offsets on the host, or on the device (the tensors kept to
/// launch on).
enum Packed {
    Host(VarlenProblem),
    Device(DeviceVarlenProblem, [Borrowed; 2]),
}

/// The error of offsets on the device with tensors on the CPU (placement refuses it first).
fn device_offsets_on_cpu() -> PyErr {
    crate::error::FlashAttnError::new_err(
        "cu_seqlens given as tensors are read on the device, but q is on the CPU: a CPU call takes the offsets as lists (flashattn's Python functions copy them so)",
    )
}

impl Job for Fwd<'_, Packed> {
    unsafe fn cpu<T: Element>(&self) -> PyResult<String> {
        let Packed::Host(p) = &self.p else {
            return Err(device_offsets_on_cpu());
        };
        let [q, k, v, o, lse] = self.t;
        // SAFETY: the caller's contract.
        let (q, k, v) = unsafe { (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?) };
        let cpu = flashattn::BackendChoice::Cpu;
        let r = flashattn::varlen::forward(cpu, p, q, k, v).map_err(err)?;
        // SAFETY: as above.
        unsafe { write_out::<T>((o, lse), &r.o, &r.lse)? };
        Ok(r.ran)
    }

    unsafe fn cuda<T: GpuElement>(&self, id: i32) -> PyResult<String> {
        // SAFETY: the caller's contract.
        unsafe {
            gpu::on_device(id, self.stream, |g| match &self.p {
                Packed::Host(p) => {
                    let what = Some("flash_attn_varlen_func");
                    gpu::forward(g, self.t, what, |[q, k, v]: &Qkv<T>, o, l| {
                        flashattn::cuda::varlen::forward_device(
                            g,
                            KernelKind::Wgmma,
                            p,
                            q,
                            k,
                            v,
                            o,
                            l,
                        )
                    })
                }
                Packed::Device(p, [cq, ck]) => {
                    let (cq, ck) = (gpu::foreign::<i32>(cq, g)?, gpu::foreign::<i32>(ck, g)?);
                    gpu::forward(g, self.t, None, |[q, k, v]: &Qkv<T>, o, l| {
                        flashattn::cuda::varlen::forward_device_offsets(
                            g, p, &cq, &ck, q, k, v, o, l,
                        )
                    })
                }
            })
        }
    }
}

/// A forward call on q, k, v, out, lse (`stream`, `current`, `torch`, `check_backward` as
/// [`forward`] takes them): takes the tensors, checks their devices, element types and
/// memory, builds the problem with `problem` (which checks their layouts) and runs it.
fn forward_call<P>(
    named: [(&Bound<'_, PyAny>, &'static str); 5],
    (stream, current, torch, check_backward): (Option<usize>, bool, bool, bool),
    problem: impl FnOnce([&Borrowed; 5]) -> PyResult<P>,
) -> PyResult<String>
where
    for<'a> Fwd<'a, P>: Job,
{
    let [tq, tk, tv, to, tl] = take_all(named, handshake(stream, current), torch)?;
    let t = [&tq, &tk, &tv, &to, &tl];
    let place = placement(&t)?;
    let dtype = one_dtype(&t)?;
    check_disjoint(&[&to, &tl], &[&tq, &tk, &tv])?;
    let p = problem(t)?;
    let stream = stream.unwrap_or(0);
    let job = Fwd {
        p,
        t,
        stream,
        check_backward,
    };
    // SAFETY: devices and dtypes checked above; the problem checked the layouts, so the slices
    // cover what the strides address; a CUDA tensor's stream is the one its framework hands
    // out as current.
    unsafe { run(place, dtype, &job) }
}

/// Runs attention: `q` `[batch, seqlen_q, heads_q, head_dim]`, `k`/`v` `[batch, seqlen_k,
/// heads_kv, head_dim]`, written into `out` (q's shape, any strides with head_dim contiguous)
/// and `lse` (f32 `[batch, heads_q, seqlen_q]`, contiguous). CPU tensors run on the CPU
/// backend (f16, bf16, f32); CUDA tensors (f16, bf16) on the GPU kernels, enqueued on
/// `stream` (a raw `CUstream` handle; `None` or 0: the legacy default stream; `current`: it
/// is the tensors' producer's current stream, see [`handshake`]). `softmax_scale` `None`:
/// `1/sqrt(head_dim)`; `softcap` 0: off; `alibi_slopes` a host float32 array `[heads_q]` or
/// `[batch, heads_q]`. `check_backward`: the gradients of this call will be wanted, so on
/// CUDA what the GPU backward would refuse is refused now, before the launch
/// ([`gpu::backward_check`]). `learnable_sink`: a host float32 array `[heads_q]`, one logit
/// per query head joining every row's softmax denominator (gpt-oss). Returns where it ran.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false, torch=false, check_backward=false, learnable_sink=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    stream: Option<usize>,
    current: bool,
    torch: bool,
    check_backward: bool,
    learnable_sink: Option<Bound<'py, PyAny>>,
) -> PyResult<String> {
    let window = (window_left, window_right);
    let scores =
        Scores::new(softmax_scale, causal, window, softcap, alibi_slopes).with_sink(learnable_sink);
    let named = [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")];
    forward_call(named, (stream, current, torch, check_backward), |t| {
        bshd_problem(t, &scores)
    })
}

/// The tensors of a backward call taken, in its order: q, k, v, out, lse, dout, dq, dk, dv.
fn take_backward(
    t: [&Bound<'_, PyAny>; 9],
    handshake: Option<i64>,
    torch: bool,
) -> PyResult<[Borrowed; 9]> {
    const NAMES: [&str; 9] = ["q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"];
    take_all(std::array::from_fn(|i| (t[i], NAMES[i])), handshake, torch)
}

struct Backward<'a> {
    p: AttnProblem,
    ins: [&'a Borrowed; 6],
    grads: [&'a Borrowed; 3],
    /// The learnable sink's gradient, float32 `[heads_q]`, when wanted.
    d_sink: Option<&'a Borrowed>,
    deterministic: bool,
    stream: usize,
}

impl Job for Backward<'_> {
    unsafe fn cpu<T: Element>(&self) -> PyResult<String> {
        let [q, k, v, o, lse, d_o] = self.ins;
        let [dq, dk, dv] = self.grads;
        // SAFETY: the caller's contract; the gradients are distinct writable buffers.
        unsafe {
            flashattn::cpu_backward::backward(
                &self.p,
                q.slice::<T>()?,
                k.slice::<T>()?,
                v.slice::<T>()?,
                o.slice::<T>()?,
                lse.slice::<f32>()?,
                d_o.slice::<T>()?,
                dq.slice_mut::<T>()?,
                dk.slice_mut::<T>()?,
                dv.slice_mut::<T>()?,
            )
            .map_err(err)?;
            if let Some(ds) = self.d_sink {
                flashattn::cpu_backward::sink_grad(
                    &self.p,
                    o.slice::<T>()?,
                    lse.slice::<f32>()?,
                    d_o.slice::<T>()?,
                    ds.slice_mut::<f32>()?,
                )
                .map_err(err)?;
            }
        }
        Ok(cpu_threads())
    }

    unsafe fn cuda<T: GpuElement>(&self, id: i32) -> PyResult<String> {
        let (p, det) = (&self.p, self.deterministic);
        // SAFETY: the caller's contract.
        unsafe {
            gpu::on_device(id, self.stream, |g| {
                gpu::backward::<T>(g, p, det, self.ins, self.grads, self.d_sink)
            })
        }
    }
}

/// Gradients of attention: `q`, `k`, `v`, `out`, `lse` as [`forward`] took and wrote them,
/// `dout` with `out`'s shape and strides; writes `dq` (q's shape), `dk`, `dv` (k's shape), all
/// three contiguous (dk, dv summed over the query heads of each kv head). CPU tensors run on
/// the CPU backward, CUDA tensors on the GPU backward (every score modifier), enqueued on
/// `stream`. `deterministic`: dq the same bytes run to run (GPU; the CPU always is).
/// `learnable_sink` as [`forward`] took it; `d_sink` (float32 `[heads_q]`, on the tensors'
/// device) receives its gradient, `-sum_{b,i} exp(sink_h - lse) (dout . out)`.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic, stream=None, current=false, torch=false, learnable_sink=None, d_sink=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    dout: &Bound<'py, PyAny>,
    dq: &Bound<'py, PyAny>,
    dk: &Bound<'py, PyAny>,
    dv: &Bound<'py, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    deterministic: bool,
    stream: Option<usize>,
    current: bool,
    torch: bool,
    learnable_sink: Option<Bound<'py, PyAny>>,
    d_sink: Option<Bound<'py, PyAny>>,
) -> PyResult<String> {
    let [tq, tk, tv, to, tl, tdo, tdq, tdk, tdv] = take_backward(
        [q, k, v, out, lse, dout, dq, dk, dv],
        handshake(stream, current),
        torch,
    )?;
    let tds = match &d_sink {
        Some(x) => {
            let [t] = take_all([(x, "d_sink")], handshake(stream, current), torch)?;
            Some(t)
        }
        None => None,
    };
    let all = [&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv];
    let placed: Vec<&Borrowed> = all.iter().copied().chain(tds.as_ref()).collect();
    let place = placement(&placed)?;
    let dtype = one_dtype(&all)?;
    let (ins, grads) = ([&tq, &tk, &tv, &to, &tl, &tdo], [&tdq, &tdk, &tdv]);
    let written: Vec<&Borrowed> = grads.iter().copied().chain(tds.as_ref()).collect();
    check_disjoint(&written, &ins)?;
    let window = (window_left, window_right);
    let scores =
        Scores::new(softmax_scale, causal, window, softcap, alibi_slopes).with_sink(learnable_sink);
    let p = bshd_problem([&tq, &tk, &tv, &to, &tl], &scores)?;
    check_grads([&tq, &tk, &to, &tdo], grads)?;
    if let Some(t) = &tds {
        check_d_sink(t, &p.scores, p.shape.heads_q)?;
    }
    let (stream, deterministic) = (stream.unwrap_or(0), deterministic);
    let job = Backward {
        p,
        ins,
        grads,
        d_sink: tds.as_ref(),
        deterministic,
        stream,
    };
    // SAFETY: devices, dtypes, shapes and strides checked above.
    unsafe { run(place, dtype, &job) }
}

/// The exact f64 oracle on CPU tensors (q, k, v as for `forward`): returns `(o, lse)` as flat
/// f64 lists (o dense `[batch, seqlen_q, heads_q, head_dim]`, lse `[batch, heads_q, seqlen_q]`),
/// for tests.
#[pyfunction]
#[pyo3(signature = (q, k, v, softmax_scale, causal))]
pub(crate) fn reference(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
) -> PyResult<(Vec<f64>, Vec<f64>)> {
    let [tq, tk, tv] = take_all([(q, "q"), (k, "k"), (v, "v")], None, false)?;
    let t = [&tq, &tk, &tv];
    for x in t {
        x.check_cpu()?;
    }
    let dtype = one_dtype(&t)?;
    let ([b, sq, hq, d], qs) = bshd(&tq)?;
    let ([_, sk, hkv, _], ks) = bshd(&tk)?;
    let (_, vs) = bshd(&tv)?;
    let dense = Strides::contiguous(sq, hq, d);
    let scores = Scores::plain(softmax_scale, causal);
    let p = problem([b, sq, sk, hq, hkv, d], [qs, ks, vs, dense], &scores)?;
    /// # Safety
    /// q, k, v hold `T` on the CPU.
    unsafe fn oracle<T: Element>(
        p: &AttnProblem,
        [q, k, v]: [&Borrowed; 3],
    ) -> PyResult<(Vec<f64>, Vec<f64>)> {
        // SAFETY: forwarded to the caller.
        let (q, k, v) = unsafe { (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?) };
        let r = flashattn::reference::attention(p, q, k, v).map_err(err)?;
        Ok((r.o, r.lse))
    }
    // SAFETY: dtype and device checked.
    unsafe {
        match dtype {
            "float16" => oracle::<f16>(&p, t),
            "bfloat16" => oracle::<bf16>(&p, t),
            _ => oracle::<f32>(&p, t),
        }
    }
}

/// Runs a packed variable-length batch (FlashAttention-2's varlen layout): `q` `[total_q,
/// heads_q, head_dim]`, `k`/`v` `[total_k, heads_kv, head_dim]`, all contiguous, written into
/// `out` (like q) and `lse` (f32 `[heads_q, total_q]`); the other arguments (`learnable_sink`
/// too) as [`forward`]'s.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false, torch=false, learnable_sink=None, max_seqlen_q=None, max_seqlen_k=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn varlen_forward<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    cu_seqlens_q: &Bound<'py, PyAny>,
    cu_seqlens_k: &Bound<'py, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    stream: Option<usize>,
    current: bool,
    torch: bool,
    learnable_sink: Option<Bound<'py, PyAny>>,
    max_seqlen_q: Option<usize>,
    max_seqlen_k: Option<usize>,
) -> PyResult<String> {
    let window = (window_left, window_right);
    let scores =
        Scores::new(softmax_scale, causal, window, softcap, alibi_slopes).with_sink(learnable_sink);
    let offsets = Offsets::take(
        [cu_seqlens_q, cu_seqlens_k],
        (max_seqlen_q, max_seqlen_k),
        handshake(stream, current),
    )?;
    let named = [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")];
    forward_call(named, (stream, current, torch, false), |t| {
        offsets.problem(t, &scores)
    })
}

struct VarlenBackward<'a> {
    p: Packed,
    ins: [&'a Borrowed; 6],
    grads: [&'a Borrowed; 3],
    /// The learnable sink's gradient, float32 `[heads_q]`, when wanted.
    d_sink: Option<&'a Borrowed>,
    deterministic: bool,
    stream: usize,
}

impl Job for VarlenBackward<'_> {
    unsafe fn cpu<T: Element>(&self) -> PyResult<String> {
        let Packed::Host(p) = &self.p else {
            return Err(device_offsets_on_cpu());
        };
        let [q, k, v, o, lse, d_o] = self.ins;
        let [dq, dk, dv] = self.grads;
        let opts = flashattn::cuda::backward::BackwardOptions {
            deterministic: self.deterministic,
            ..Default::default()
        };
        // SAFETY: the caller's contract; the gradients are distinct writable buffers.
        unsafe {
            let g = flashattn::varlen::backward(
                flashattn::BackendChoice::Cpu,
                p,
                q.slice::<T>()?,
                k.slice::<T>()?,
                v.slice::<T>()?,
                o.slice::<T>()?,
                lse.slice::<f32>()?,
                d_o.slice::<T>()?,
                opts,
            )
            .map_err(err)?;
            dq.slice_mut::<T>()?.copy_from_slice(&g.dq);
            dk.slice_mut::<T>()?.copy_from_slice(&g.dk);
            dv.slice_mut::<T>()?.copy_from_slice(&g.dv);
            if let (Some(ds), Some(got)) = (self.d_sink, &g.d_sink) {
                ds.slice_mut::<f32>()?.copy_from_slice(got);
            }
            Ok(g.ran)
        }
    }

    unsafe fn cuda<T: GpuElement>(&self, id: i32) -> PyResult<String> {
        let det = self.deterministic;
        // SAFETY: the caller's contract.
        unsafe {
            gpu::on_device(id, self.stream, |g| {
                let grads = (self.grads, self.d_sink);
                let call = match &self.p {
                    Packed::Host(p) => gpu::PackedCall::Host(p),
                    Packed::Device(p, cu) => gpu::PackedCall::Device(p, cu),
                };
                gpu::varlen_backward::<T>(g, call, det, self.ins, grads)
            })
        }
    }
}

/// Gradients of a packed variable-length batch: `q`, `k`, `v`, `out`, `lse`, `cu_seqlens_q`,
/// `cu_seqlens_k` and the score arguments as [`varlen_forward`] took and wrote them, `dout`
/// like `out`; writes `dq` (like q), `dk`, `dv` (like k; summed over the query heads of each
/// kv head), every tensor compact `[total, heads, head_dim]`. Rows that see no key get dq = 0,
/// keys no query sees dk = dv = 0. CPU tensors run sequence by sequence on the CPU backward,
/// CUDA tensors in one launch per kernel over every sequence (`attn_bwd`; offsets as lists
/// are host arrays, copied, so not inside a CUDA graph capture; as int32 tensors on the device
/// with `max_seqlen_q`/`max_seqlen_k` they are read there). `deterministic`: dq the same bytes
/// run to run. `learnable_sink` as [`varlen_forward`] took it; `d_sink` (float32 `[heads_q]`,
/// on the tensors' device) receives its gradient, summed over every packed row.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic, stream=None, current=false, torch=false, max_seqlen_q=None, max_seqlen_k=None, learnable_sink=None, d_sink=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn varlen_backward<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    dout: &Bound<'py, PyAny>,
    dq: &Bound<'py, PyAny>,
    dk: &Bound<'py, PyAny>,
    dv: &Bound<'py, PyAny>,
    cu_seqlens_q: &Bound<'py, PyAny>,
    cu_seqlens_k: &Bound<'py, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    deterministic: bool,
    stream: Option<usize>,
    current: bool,
    torch: bool,
    max_seqlen_q: Option<usize>,
    max_seqlen_k: Option<usize>,
    learnable_sink: Option<Bound<'py, PyAny>>,
    d_sink: Option<Bound<'py, PyAny>>,
) -> PyResult<String> {
    let offsets = Offsets::take(
        [cu_seqlens_q, cu_seqlens_k],
        (max_seqlen_q, max_seqlen_k),
        handshake(stream, current),
    )?;
    let [tq, tk, tv, to, tl, tdo, tdq, tdk, tdv] = take_backward(
        [q, k, v, out, lse, dout, dq, dk, dv],
        handshake(stream, current),
        torch,
    )?;
    let tds = match &d_sink {
        Some(x) => {
            let [t] = take_all([(x, "d_sink")], handshake(stream, current), torch)?;
            Some(t)
        }
        None => None,
    };
    let all = [&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv];
    let placed: Vec<&Borrowed> = all.iter().copied().chain(tds.as_ref()).collect();
    let place = placement(&placed)?;
    let dtype = one_dtype(&all)?;
    let (ins, grads) = ([&tq, &tk, &tv, &to, &tl, &tdo], [&tdq, &tdk, &tdv]);
    let written: Vec<&Borrowed> = grads.iter().copied().chain(tds.as_ref()).collect();
    check_disjoint(&written, &ins)?;
    let window = (window_left, window_right);
    let scores =
        Scores::new(softmax_scale, causal, window, softcap, alibi_slopes).with_sink(learnable_sink);
    let t = [&tq, &tk, &tv, &to, &tl];
    let p = offsets.problem(t, &scores)?;
    check_varlen_grads([&tq, &tk, &tdo], grads)?;
    if let Some(t) = &tds {
        let (mods, hq) = match &p {
            Packed::Host(p) => (&p.scores, p.heads_q),
            Packed::Device(p, _) => (&p.scores, p.heads_q),
        };
        check_d_sink(t, mods, hq)?;
    }
    let job = VarlenBackward {
        p,
        ins,
        grads,
        d_sink: tds.as_ref(),
        deterministic,
        stream: stream.unwrap_or(0),
    };
    // SAFETY: devices, dtypes, shapes and layouts checked above.
    unsafe { run(place, dtype, &job) }
}

struct KvCache<'a, 'py> {
    shape: KvCacheShape,
    /// ALiBi slopes and sink logits on the device (CUDA), read there.
    values: (Option<&'a Borrowed>, Option<&'a Borrowed>),
    index: &'a CacheIndex,
    /// q, k_cache, v_cache, out, lse.
    t: [&'a Borrowed; 5],
    new: Option<&'a (Borrowed, Borrowed)>,
    /// rotary_cos, rotary_sin.
    rotary: Option<&'a (Borrowed, Borrowed)>,
    /// `num_splits` (0: one on the CPU, the library's heuristic on the GPU).
    num_splits: usize,
    /// Python's allocator of the split-KV workspace (CUDA).
    workspace: Option<&'a Bound<'py, PyAny>>,
    stream: usize,
    handshake: Option<i64>,
}

impl Job for KvCache<'_, '_> {
    unsafe fn cpu<T: Element>(&self) -> PyResult<String> {
        let ([q, kc, vc, o, lse], splits) = (self.t, self.num_splits.max(1));
        let p = KvCacheProblem::from_shape(&self.shape, host_index(&self.shape, self.index)?)
            .map_err(err)?;
        // SAFETY: the caller's contract; the caches are written in place.
        let r = unsafe {
            let (kn, vn): (&[T], &[T]) = match self.new {
                Some((k, v)) => (k.slice::<T>()?, v.slice::<T>()?),
                None => (&[], &[]),
            };
            let tables = match self.rotary {
                Some((c, s)) => RotaryTables {
                    cos: c.slice::<T>()?,
                    sin: s.slice::<T>()?,
                },
                None => RotaryTables::none(),
            };
            let (q, kc, vc) = (q.slice::<T>()?, kc.slice_mut::<T>()?, vc.slice_mut()?);
            flashattn::kvcache::forward_cpu(&p, q, kc, vc, kn, vn, tables, splits).map_err(err)?
        };
        // SAFETY: as above.
        unsafe { write_out::<T>((o, lse), &r.o, &r.lse)? };
        Ok(format!("cpu ({splits} split(s))"))
    }

    unsafe fn cuda<T: GpuElement>(&self, id: i32) -> PyResult<String> {
        let call = gpu::KvCall {
            shape: &self.shape,
            index: self.index,
            t: self.t,
            new: self.new,
            rotary: self.rotary,
            splits: (self.num_splits > 0).then_some(self.num_splits),
            workspace: self.workspace,
            handshake: self.handshake,
            values: self.values,
        };
        // SAFETY: the caller's contract.
        unsafe { gpu::on_device(id, self.stream, |g| gpu::kvcache::<T>(g, &call)) }
    }
}

/// Decoding against a KV cache (FlashAttention-2's `flash_attn_with_kvcache`): `q` `[batch,
/// seqlen_q, heads_q, head_dim]`; caches contiguous `[cache_batch, seqlen_cache, heads_kv,
/// head_dim]`, or paged `[num_blocks, page_size, heads_kv, head_dim]` with `block_table`
/// (int32 `[batch, max_blocks]`); optional new rows `k_new`/`v_new` `[batch, seqlen_new,
/// heads_kv, head_dim]` appended to the caches in place (k rotated with `rotary_cos`,
/// `rotary_sin` `[seqlen_ro, rotary_dim / 2]` of q's dtype, and q with it); `cache_seqlens`
/// one length or an int32 tensor `[batch]` (`None`: the caches are full), `cache_batch_idx`
/// and `cache_leftpad` int32 `[batch]`; all compact, the index tensors on q's device (read
/// there, never copied, on CUDA). Writes `out` (like q) and `lse` (f32 `[batch, heads_q,
/// seqlen_q]`). `num_splits`: 0 for one on the CPU and the library's heuristic on the GPU.
/// `workspace`: on CUDA, a callable that returns a float32 tensor of `n` elements on q's
/// device (the split-KV partials), called when the call has more than one split.
/// `learnable_sink`: float32 `[heads_q]`, as [`forward`] takes it; on CUDA, it and
/// `alibi_slopes` may be float32 tensors on q's device, read there (no copy, no
/// synchronisation: a call with them can be captured in a CUDA graph; their values are not
/// checked there, where host ones are refused when not finite).
#[pyfunction]
#[pyo3(signature = (q, k_cache, v_cache, k_new, v_new, out, lse, cache_seqlens, block_table, cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_interleaved, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, num_splits, workspace=None, stream=None, current=false, learnable_sink=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn kvcache_forward<'py>(
    q: &Bound<'py, PyAny>,
    k_cache: &Bound<'py, PyAny>,
    v_cache: &Bound<'py, PyAny>,
    k_new: Option<&Bound<'py, PyAny>>,
    v_new: Option<&Bound<'py, PyAny>>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    cache_seqlens: Option<CacheSeqlens<'py>>,
    block_table: Option<&Bound<'py, PyAny>>,
    cache_batch_idx: Option<&Bound<'py, PyAny>>,
    cache_leftpad: Option<&Bound<'py, PyAny>>,
    rotary_cos: Option<&Bound<'py, PyAny>>,
    rotary_sin: Option<&Bound<'py, PyAny>>,
    rotary_interleaved: bool,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Bound<'py, PyAny>>,
    num_splits: usize,
    workspace: Option<Bound<'py, PyAny>>,
    stream: Option<usize>,
    current: bool,
    learnable_sink: Option<Bound<'py, PyAny>>,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let named = [
        (q, "q"),
        (k_cache, "k_cache"),
        (v_cache, "v_cache"),
        (out, "out"),
        (lse, "lse"),
    ];
    let [tq, tkc, tvc, to, tl] = take_all(named, hs, false)?;
    let pair = |x: Option<(&Bound<'py, PyAny>, &Bound<'py, PyAny>)>, names: [&'static str; 2]| {
        x.map(|(a, b)| take_all([(a, names[0]), (b, names[1])], hs, false).map(|[a, b]| (a, b)))
            .transpose()
    };
    let new = pair(new_rows(k_new, v_new)?, ["k", "v"])?;
    let rotary = pair(
        rotary_tables(rotary_cos, rotary_sin)?,
        ["rotary_cos", "rotary_sin"],
    )?;
    let one =
        |x: Option<&Bound<'py, PyAny>>, name| x.map(|x| Borrowed::take_on(x, name, hs)).transpose();
    let index = CacheIndex {
        cache_seqlens: match cache_seqlens {
            Some(CacheSeqlens::All(len)) => Seqlens::All(len),
            Some(CacheSeqlens::Each(t)) => {
                Seqlens::Each(Borrowed::take_on(&t, "cache_seqlens", hs)?)
            }
            None => Seqlens::Full,
        },
        block_table: one(block_table, "block_table")?,
        cache_batch_idx: one(cache_batch_idx, "cache_batch_idx")?,
        cache_leftpad: one(cache_leftpad, "cache_leftpad")?,
    };
    let mut all = vec![&tq, &tkc, &tvc, &to, &tl];
    let mut read = vec![&tq];
    for (a, b) in new.iter().chain(&rotary) {
        all.extend([a, b]);
        read.extend([a, b]);
    }
    read.extend(index.tensors());
    let place = placement(&all)?;
    let dtype = one_dtype(&all)?;
    let window = (window_left, window_right);
    // On CUDA, slopes and sink logits on the device are read there (nothing copied: a decoding
    // step with them can be captured in a CUDA graph); on q's device only.
    let device_value = |x: &Option<Bound<'py, PyAny>>, name| -> PyResult<Option<Borrowed>> {
        let Some(x) = x.as_ref().filter(|_| place.is_some()) else {
            return Ok(None);
        };
        let t = Borrowed::take_on(x, name, hs)?;
        match t.place()? {
            None => Ok(None),
            d if d == place => Ok(Some(t)),
            d => Err(crate::error::FlashAttnError::new_err(format!(
                "{name} is on CUDA device {} but q is on CUDA device {}: pass it on q's device",
                d.unwrap_or(-1),
                place.unwrap_or(-1)
            ))),
        }
    };
    let values = [
        device_value(&alibi_slopes, "alibi_slopes")?,
        device_value(&learnable_sink, "learnable_sink")?,
    ];
    let scores = Scores::new(softmax_scale, causal, window, softcap, alibi_slopes)
        .with_sink(learnable_sink)
        .with_device_values(values);
    let shape = kvcache_shape(
        [&tq, &tkc, &tvc, &to, &tl],
        new.as_ref(),
        &index,
        rotary.as_ref().map(|r| (r, rotary_interleaved)),
        (&scores, place),
    )?;
    // The caches (new rows appended in place), out and lse are written; the device slopes and
    // sink logits are read with the rest.
    read.extend(scores.device.iter().flatten());
    check_disjoint(&[&tkc, &tvc, &to, &tl], &read)?;
    let job = KvCache {
        shape,
        values: (scores.device[0].as_ref(), scores.device[1].as_ref()),
        index: &index,
        t: [&tq, &tkc, &tvc, &to, &tl],
        new: new.as_ref(),
        rotary: rotary.as_ref(),
        num_splits,
        workspace: workspace.as_ref(),
        stream: stream.unwrap_or(0),
        handshake: hs,
    };
    // SAFETY: dtypes, devices and sizes checked; the caches are the caller's writable buffers.
    unsafe { run(place, dtype, &job) }
}

/// NVRTC's version `(major, minor)` as the library loads it (from the `nvidia-cuda-nvrtc`
/// wheel that `flashattn/__init__.py` preloads, or the system's); raises when none loads.
#[pyfunction]
pub(crate) fn nvrtc_version() -> PyResult<(i32, i32)> {
    flashattn::cuda::nvrtc::nvrtc_version().map_err(err)
}
