//! Attention on device buffers: validation, then dispatch to the rung's launcher
//! (naive, simt, mma, wgmma); and the host-memory convenience around it.

use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{GpuElement, KernelKind, Launch, LaunchInfo, launch_context};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, sys};

/// Largest seqlen the kernels index with 32-bit row numbers (offsets are 64-bit).
pub const MAX_SEQLEN: usize = 1 << 30;

/// Checks everything the GPU kernels need beyond [`AttnProblem::validate`].
///
/// A head_dim that is not a multiple of 8 runs on padded copies ([`crate::cuda::fwd::pad`]), which
/// read and write any strides; the kernels themselves need the stride rule below.
///
/// # Errors
/// [`AttnError::UnsupportedFeature`] for a window, softcap or ALiBi on `naive` or `simt` (the
/// `mma` and `wgmma` kernels have them: attn_common.cuh);
/// [`AttnError::InvalidStrides`] (head_dim a multiple of 8 and a stride not a multiple of 8
/// elements: rows are moved in 16-byte pieces), [`AttnError::TooLarge`] (seqlen over 2^30,
/// or more than 2^31-1 blocks).
pub fn check_gpu_problem(p: &AttnProblem, kernel: KernelKind) -> Result<()> {
    p.validate()?;
    let s = &p.shape;
    let m = &p.scores;
    let features = [
        (!m.window.is_unbounded(), "a sliding window"),
        (m.softcap.is_some(), "softcap"),
        (m.alibi.is_some(), "ALiBi"),
    ];
    if !kernel.has_score_mods()
        && let Some((_, f)) = features.iter().find(|(on, _)| *on)
    {
        return Err(AttnError::UnsupportedFeature {
            feature: (*f).into(),
            backend: format!("the {kernel} kernel"),
            hint: "use --kernel mma or wgmma (or auto), or the CPU backend".into(),
        });
    }
    let padded = !s.head_dim.is_multiple_of(8);
    for (name, st, _, _) in p.tensors().into_iter().filter(|_| !padded) {
        for (axis, v) in [("batch", st.batch), ("seq", st.seq), ("head", st.head)] {
            if !v.is_multiple_of(8) {
                return Err(AttnError::InvalidStrides {
                    tensor: name,
                    reason: format!(
                        "{axis} stride {v} is not a multiple of 8 elements; the GPU kernels load rows in 16-byte pieces: copy the tensor to a dense layout first"
                    ),
                });
            }
        }
    }
    if s.seqlen_q > MAX_SEQLEN || s.seqlen_k > MAX_SEQLEN {
        return Err(AttnError::TooLarge {
            kernel: "cuda",
            reason: format!(
                "seqlen over 2^30 (seqlen_q {}, seqlen_k {}): split the sequence",
                s.seqlen_q, s.seqlen_k
            ),
        });
    }
    let blocks = (s.seqlen_q.div_ceil(16) as u128) * s.batch as u128 * s.heads_q as u128;
    if blocks > i32::MAX as u128 {
        return Err(AttnError::TooLarge {
            kernel: "cuda",
            reason: "more than 2^31-1 thread blocks: split the batch".into(),
        });
    }
    Ok(())
}

/// Every buffer must live in this Gpu's context (a pointer of another one would be read as if
/// it were ours).
pub(crate) fn check_contexts<const N: usize>(
    gpu: &Gpu,
    buffers: [(&'static str, sys::CUcontext); N],
) -> Result<()> {
    let ctx = gpu.context().cu_ctx();
    for (name, c) in buffers {
        if c != ctx {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "{name} lives on another device or context than this Gpu: allocate it from gpu.stream()"
                ),
            });
        }
    }
    Ok(())
}

/// The base address rule of the kernels (they load 16-byte pieces).
pub(crate) fn check_alignment(name: &'static str, ptr: u64) -> Result<()> {
    if !ptr.is_multiple_of(16) {
        return Err(AttnError::InvalidStrides {
            tensor: name,
            reason: format!(
                "device address {ptr:#x} is not 16-byte aligned; the kernels load 16-byte pieces: pass a buffer (or view) that starts on a 16-byte boundary"
            ),
        });
    }
    Ok(())
}

/// The ALiBi slopes on the device, for one call (stream-ordered: the copy precedes the launch,
/// and the buffer's free follows it on the same stream); `None` without ALiBi.
pub(crate) fn upload_slopes(
    gpu: &Gpu,
    scores: &crate::scores::ScoreMods,
) -> Result<Option<CudaSlice<f32>>> {
    scores
        .alibi
        .as_ref()
        .map(|a| {
            if gpu.capturing() {
                return Err(AttnError::InvalidInput {
                    what: "ALiBi slopes are copied from host memory, which a CUDA graph capture cannot record: call with ALiBi outside the capture".into(),
                });
            }
            gpu.stream()
                .clone_htod(&a.slopes)
                .map_err(cuda_err("copying the ALiBi slopes to the device"))
        })
        .transpose()
}

/// Runs attention on device buffers: `q`, `k`, `v` in the problem's layout, `o` written through
/// `o_strides`, `lse` dense `[batch, heads_q, seqlen_q]` f32. Asynchronous on `gpu.stream()`.
///
/// `tile` overrides the `mma` tile (benchmarks); `None` takes [`crate::cuda::fwd::mma::MmaTile::default_for`].
/// [`KernelKind::Wgmma`] runs attn_mma for a call it cannot serve; the returned
/// [`LaunchInfo`] names the kernel that ran and why.
///
/// # Errors
/// Every validation error of [`check_gpu_problem`]; [`AttnError::BufferTooShort`];
/// [`AttnError::InvalidStrides`] for a base address not 16-byte aligned (head_dim a
/// multiple of 8; other head dims go through padded copies, see [`crate::cuda::fwd::pad`]);
/// [`AttnError::ShapeMismatch`] for a buffer of another device/context;
/// [`AttnError::Compile`]/[`AttnError::Cuda`] with the kernel name and shape.
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
    check_contexts(
        gpu,
        [
            ("q", q.stream().context().cu_ctx()),
            ("k", k.stream().context().cu_ctx()),
            ("v", v.stream().context().cu_ctx()),
            ("o", o.stream().context().cu_ctx()),
            ("lse", lse.stream().context().cu_ctx()),
        ],
    )?;
    let stream = gpu.stream();
    let (qp, _gq) = q.device_ptr(stream);
    let (kp, _gk) = k.device_ptr(stream);
    let (vp, _gv) = v.device_ptr(stream);
    let (op, _go) = o.device_ptr_mut(stream);
    if !p.shape.head_dim.is_multiple_of(8) {
        let b = crate::cuda::fwd::pad::Buffers {
            q: qp,
            k: kp,
            v: vp,
            o: op,
        };
        return crate::cuda::fwd::pad::forward_padded::<T, L>(gpu, kernel, tile, p, &b, lse);
    }
    let (lp, _gl) = lse.device_ptr_mut(stream);
    for (name, ptr) in [("q", qp), ("k", kp), ("v", vp), ("o", op)] {
        check_alignment(name, ptr)?;
    }
    let slopes = upload_slopes(gpu, &p.scores)?;
    let alibi = slopes.as_ref().map(|d| d.device_ptr(stream));
    let launch = Launch {
        problem: p,
        dtype: T::DTYPE,
        q: qp,
        k: kp,
        v: vp,
        o: op,
        lse: lp,
        alibi: alibi.as_ref().map_or(0, |(ptr, _)| *ptr),
        varlen: None,
        lse_head_stride: None,
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
/// [`AttnError::Compile`] or [`AttnError::Cuda`] from loading the module.
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
            &crate::cuda::fwd::pad::padded_problem(p)?,
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
/// As [`forward_device`], plus allocation/copy failures as [`AttnError::Cuda`].
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
    let stream = gpu.stream();
    let up = |x: &[T], what: &str| {
        stream
            .clone_htod(x)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (dq, dk, dv) = (up(q, "q")?, up(k, "k")?, up(v, "v")?);
    let o_len = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let mut d_o: CudaSlice<T> = stream
        .alloc_zeros(o_len)
        .map_err(cuda_err("allocating o"))?;
    let mut d_lse: CudaSlice<f32> = stream
        .alloc_zeros(s.lse_len())
        .map_err(cuda_err("allocating lse"))?;
    prepare(gpu, kernel, None, &dense, T::DTYPE)?;
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
    let info = forward_device(
        gpu, kernel, None, &dense, &dq, &dk, &dv, &mut d_o, &mut d_lse,
    )?;
    end.record(stream).map_err(cuda_err("recording an event"))?;
    let what = launch_context(kernel.name(), p);
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
        seconds: ms as f64 / 1e3,
        info,
    })
}
