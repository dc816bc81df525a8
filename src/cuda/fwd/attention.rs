//! Attention on device buffers: validation, then dispatch to the rung's launcher
//! (naive, simt, mma, wgmma); and the host-memory convenience around it.

use crate::cuda::runtime::args::{check_aligned, check_contexts, device_ptrs};
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    GpuElement, KernelKind, Launch, LaunchInfo, ScoreBuffers, launch_context,
};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::AttnProblem;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits, sys};

pub use crate::cuda::runtime::args::{MAX_SEQLEN, check_gpu_problem};

/// Runs attention on device buffers: `q`, `k`, `v` in the problem's layout, `o` written through
/// `o_strides`, `lse` dense `[batch, heads_q, seqlen_q]` f32. Asynchronous on `gpu.stream()`.
///
/// `tile` overrides the `mma` tile (benchmarks); `None` takes [`crate::cuda::fwd::mma::MmaTile::default_for`].
/// [`KernelKind::Wgmma`] runs attn_mma for a call it cannot serve; the returned
/// [`LaunchInfo`] names the kernel that ran and why.
///
/// # Errors
/// Every validation error of [`check_gpu_problem`]; [`crate::AttnError::BufferTooShort`];
/// [`crate::AttnError::InvalidStrides`] for a base address not 16-byte aligned (head_dim a
/// multiple of 8; other head dims go through padded copies, see [`crate::cuda::runtime::pad`]);
/// [`crate::AttnError::ShapeMismatch`] for a buffer of another device/context;
/// [`crate::AttnError::Compile`]/[`crate::AttnError::Cuda`] with the kernel name and shape.
#[allow(clippy::too_many_arguments)]
pub fn forward_device<T, Q, K, V, O, L>(
    gpu: &Gpu,
    kernel: KernelKind,
    tile: Option<crate::cuda::fwd::mma::MmaTile>,
    p: &AttnProblem,
    q: &Q,
    k: &K,
    v: &V,
    o: &mut O,
    lse: &mut L,
) -> Result<LaunchInfo>
where
    T: GpuElement,
    Q: DevicePtr<T>,
    K: DevicePtr<T>,
    V: DevicePtr<T>,
    O: DevicePtrMut<T>,
    L: DevicePtrMut<f32>,
{
    check_gpu_problem(p, kernel)?;
    p.check_lengths(q.len(), k.len(), v.len(), o.len(), lse.len())?;
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse)?;
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = mut o);
    if !p.shape.head_dim.is_multiple_of(8) {
        let b = crate::cuda::runtime::pad::Buffers {
            q: qp,
            k: kp,
            v: vp,
            o: op,
        };
        return crate::cuda::runtime::pad::forward_padded::<T, _>(
            gpu,
            p,
            &b,
            |pp, q2, k2, v2, o2| forward_device(gpu, kernel, tile, pp, q2, k2, v2, o2, lse),
        );
    }
    let (lp, _gl) = lse.device_ptr_mut(stream);
    check_aligned([("q", qp), ("k", kp), ("v", vp), ("o", op)])?;
    let mods = ScoreBuffers::upload(gpu, &p.scores)?;
    let ([alibi, sink], _guards) = mods.ptrs(stream);
    let launch = Launch {
        alibi,
        sink,
        ..Launch::dense(p, T::DTYPE, [qp, kp, vp, op, lp])
    };
    match kernel {
        KernelKind::Wgmma => crate::cuda::fwd::wgmma::launch(gpu, &launch),
        KernelKind::Mma => crate::cuda::fwd::mma::launch(gpu, &launch, tile),
        KernelKind::Simt => crate::cuda::fwd::simt::launch(gpu, &launch),
        KernelKind::Naive => crate::cuda::fwd::naive::launch(gpu, &launch),
    }
}

/// Compiles and loads the module a launch of `kernel` on this problem will use, so that a
/// timed launch afterwards measures the kernel, not NVRTC. (Launches compile on first use
/// anyway; this only moves the cost.)
///
/// # Errors
/// [`crate::AttnError::Compile`] or [`crate::AttnError::Cuda`] from loading the module.
pub fn prepare(
    gpu: &Gpu,
    kernel: KernelKind,
    tile: Option<crate::cuda::fwd::mma::MmaTile>,
    p: &AttnProblem,
    dtype: DType,
) -> Result<()> {
    if !p.shape.head_dim.is_multiple_of(8) {
        gpu.kernel(KernelSource::PadRows, "pad_rows", &[])?;
        return prepare(
            gpu,
            kernel,
            tile,
            &crate::cuda::runtime::pad::padded_problem(p)?,
            dtype,
        );
    }
    // The same specialisation the launch will ask for, from the same functions.
    let flash = match kernel {
        KernelKind::Wgmma => {
            if crate::cuda::fwd::wgmma::prepare(gpu, p, dtype)? {
                return Ok(());
            }
            crate::cuda::fwd::mma::mma_kernel(gpu, dtype, p, None, false)
        }
        KernelKind::Mma => crate::cuda::fwd::mma::mma_kernel(gpu, dtype, p, tile, false),
        KernelKind::Simt => crate::cuda::fwd::simt::flash_kernel(dtype, p),
        KernelKind::Naive => {
            let defines =
                crate::cuda::fwd::naive::defines(dtype, p.shape.head_dim, p.mask.is_causal());
            gpu.kernel(KernelSource::AttnNaive, "attn_naive_scores", &defines)?;
            return Ok(());
        }
    };
    gpu.kernel(flash.source, flash.function, &flash.defines)?;
    Ok(())
}

/// What [`forward_host`] returns.
#[derive(Debug, Clone)]
pub struct HostRun<T> {
    /// `[batch, seqlen_q, heads_q, head_dim]`, dense.
    pub o: Vec<T>,
    /// `[batch, heads_q, seqlen_q]`, natural log.
    pub lse: Vec<f32>,
    /// Kernel time in seconds (CUDA events around the launch only).
    pub seconds: f64,
    /// The kernel that ran, and why.
    pub info: LaunchInfo,
}

/// Host-memory convenience: copies inputs to the device, runs, copies o (dense) and lse back.
///
/// # Errors
/// As [`forward_device`], plus allocation/copy failures as [`crate::AttnError::Cuda`].
pub fn forward_host<T: GpuElement>(
    gpu: &Gpu,
    kernel: KernelKind,
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<HostRun<T>> {
    let s = &p.shape;
    // Output is written dense regardless of the caller's o_strides.
    let dense = AttnProblem {
        o_strides: crate::shape::Strides::contiguous(s.seqlen_q, s.heads_q, s.head_dim),
        ..p.clone()
    };
    check_gpu_problem(&dense, kernel)?;
    dense.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    prepare(gpu, kernel, None, &dense, T::DTYPE)?;
    host_round_trip(
        gpu,
        kernel.name(),
        p,
        [q, k, v],
        |dq, dk, dv, d_o, d_lse| forward_device(gpu, kernel, None, &dense, dq, dk, dv, d_o, d_lse),
    )
}

/// The host-memory round trip of [`forward_host`] and
/// [`crate::cuda::fwd::wgmma_fp8::forward_host`], once the problem is validated (with `o`
/// dense) and its modules loaded: copies `q`, `k`, `v` to the device, allocates `o`
/// (`batch * seqlen_q * heads_q * head_dim`) and `lse` zeroed, runs `launch` on them between two
/// CUDA events on `gpu.stream()` (its time is [`HostRun::seconds`]), and copies `o` and `lse`
/// back. `kernel` and `p` name the launch in copy errors.
///
/// # Errors
/// `launch`'s, and allocation/copy/event failures as [`crate::AttnError::Cuda`].
pub(crate) fn host_round_trip<I, O>(
    gpu: &Gpu,
    kernel: &str,
    p: &AttnProblem,
    [q, k, v]: [&[I]; 3],
    launch: impl FnOnce(
        &CudaSlice<I>,
        &CudaSlice<I>,
        &CudaSlice<I>,
        &mut CudaSlice<O>,
        &mut CudaSlice<f32>,
    ) -> Result<LaunchInfo>,
) -> Result<HostRun<O>>
where
    I: DeviceRepr,
    O: DeviceRepr + ValidAsZeroBits,
{
    let s = &p.shape;
    let stream = gpu.stream();
    let up = |x: &[I], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (dq, dk, dv) = (up(q, "q")?, up(k, "k")?, up(v, "v")?);
    let o_len = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let mut d_o: CudaSlice<O> = stream
        .alloc_zeros(o_len)
        .map_err(cuda_err("allocating o"))?;
    let mut d_lse: CudaSlice<f32> = stream
        .alloc_zeros(s.lse_len())
        .map_err(cuda_err("allocating lse"))?;
    let ctx = gpu.context();
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx
        .new_event(timing)
        .map_err(cuda_err("creating an event"))?;
    let end = ctx
        .new_event(timing)
        .map_err(cuda_err("creating an event"))?;
    start
        .record(stream)
        .map_err(cuda_err("recording an event"))?;
    let info = launch(&dq, &dk, &dv, &mut d_o, &mut d_lse)?;
    end.record(stream).map_err(cuda_err("recording an event"))?;
    let what = launch_context(kernel, p);
    let o = stream
        .clone_dtoh(&d_o)
        .map_err(cuda_err(format!("{what}: copying o back")))?;
    let lse = stream
        .clone_dtoh(&d_lse)
        .map_err(cuda_err(format!("{what}: copying lse back")))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(cuda_err("reading event time"))?;
    Ok(HostRun {
        o,
        lse,
        seconds: f64::from(ms) / 1e3,
        info,
    })
}
