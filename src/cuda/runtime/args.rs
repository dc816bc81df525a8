//! The argument checks every device entry point runs before it launches (forward, packed
//! varlen, backward, decode): what the kernels need of the problem beyond its own validation,
//! that each buffer lives in the Gpu's context, and the 16-byte base-address rule. One place,
//! so that each rule and its message is written once.

use crate::cuda::runtime::device::Gpu;
use crate::cuda::runtime::launch::KernelKind;
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// Largest seqlen the kernels index with 32-bit row numbers (offsets are 64-bit).
pub const MAX_SEQLEN: usize = 1 << 30;

/// Checks everything the GPU kernels need beyond [`AttnProblem::validate`].
///
/// A head_dim that is not a multiple of 8 runs on padded copies ([`crate::cuda::runtime::pad`]), which
/// read and write any strides; the kernels themselves need the stride rule below.
///
/// # Errors
/// [`AttnError::UnsupportedFeature`] for a window, softcap, ALiBi or a sink on `naive` or `simt` (the
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
        (m.sink.is_some(), "a learnable sink"),
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

/// Every buffer (named, with the stream its slice was allocated on) must live in this Gpu's context (a pointer of another one would be read as if
/// it were ours).
pub(crate) fn check_streams<const N: usize>(
    gpu: &Gpu,
    buffers: [(&'static str, &Arc<CudaStream>); N],
) -> Result<()> {
    let ctx = gpu.context().cu_ctx();
    for (name, stream) in buffers {
        if stream.context().cu_ctx() != ctx {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "{name} lives on another device or context than this Gpu: allocate it from gpu.stream()"
                ),
            });
        }
    }
    Ok(())
}

/// [`check_streams`] over named device slices: `check_contexts!(gpu; "q" => q, "o" => o)`
/// checks each slice's stream (so each launcher names its buffers once, in one line).
macro_rules! check_contexts {
    ($gpu:expr; $($name:literal => $buf:expr),+ $(,)?) => {
        $crate::cuda::runtime::args::check_streams($gpu, [$(($name, $buf.stream())),+])
    };
}
pub(crate) use check_contexts;

/// Binds each buffer's device address on `stream`, and keeps its access guard alive to the end
/// of the enclosing block (the guards record the stream's use of the buffer when dropped, so they
/// must outlive the launch): `device_ptrs!(stream; qp = q, op = mut o)` is
/// `let (qp, _g) = q.device_ptr(stream); let (op, _g) = o.device_ptr_mut(stream);`.
/// One line per launcher instead of one `let` per buffer.
macro_rules! device_ptrs {
    ($stream:expr;) => {};
    ($stream:expr; $ptr:ident = mut $buf:ident $(, $($rest:tt)*)?) => {
        let ($ptr, _guard) = $buf.device_ptr_mut($stream);
        $crate::cuda::runtime::args::device_ptrs!($stream; $($($rest)*)?);
    };
    ($stream:expr; $ptr:ident = $buf:ident $(, $($rest:tt)*)?) => {
        let ($ptr, _guard) = $buf.device_ptr($stream);
        $crate::cuda::runtime::args::device_ptrs!($stream; $($($rest)*)?);
    };
}
pub(crate) use device_ptrs;

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

/// [`check_alignment`] for every named base address, in order (the first failure is the error).
pub(crate) fn check_aligned<const N: usize>(buffers: [(&'static str, u64); N]) -> Result<()> {
    buffers
        .into_iter()
        .try_for_each(|(name, ptr)| check_alignment(name, ptr))
}
