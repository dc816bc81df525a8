//! The host-memory entry points into the CUDA backend for [`super::forward`],
//! [`super::varlen::forward`] and [`super::kvcache::forward`]: the process's shared GPU
//! ([`shared_gpu`], so kernels compile once), element-type dispatch from a generic `T` to the
//! kernels' f16/bf16, and the [`Backend`] that names what ran.

use super::backend::Backend;
use crate::cuda::fwd::attention::{HostRun, forward_host};
use crate::cuda::runtime::device::shared_gpu;
use crate::cuda::runtime::launch::KernelKind;
use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use half::{bf16, f16};
use std::any::TypeId;

/// Reinterprets `&[T]` as `&[U]` when `T` and `U` are the same type.
fn same<T: 'static, U: 'static>(x: &[T]) -> Option<&[U]> {
    (TypeId::of::<T>() == TypeId::of::<U>())
        // SAFETY: T and U are the same type, so layout and validity are identical.
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const U, x.len()) })
}

fn back<U: 'static, T: 'static>(x: Vec<U>) -> Vec<T> {
    assert_eq!(TypeId::of::<T>(), TypeId::of::<U>());
    let mut x = std::mem::ManuallyDrop::new(x);
    // SAFETY: same type (asserted), so the allocation's layout is unchanged.
    unsafe { Vec::from_raw_parts(x.as_mut_ptr() as *mut T, x.len(), x.capacity()) }
}

/// A run on element type `U`, seen as `T` (the same type: see [`back`]).
fn as_t<U: 'static, T: 'static>(r: HostRun<U>) -> HostRun<T> {
    HostRun {
        o: back(r.o),
        lse: r.lse,
        seconds: r.seconds,
        info: r.info,
    }
}

/// Runs the best GPU kernel on host buffers (`wgmma` where it serves, else `mma`): o comes back
/// dense, with lse, the backend description, the kernel time in seconds, and why that kernel ran.
///
/// # Errors
/// [`AttnError::BackendUnavailable`] without a usable GPU; [`AttnError::DTypeMismatch`] for
/// f32 (the GPU kernels take f16 and bf16); everything [`forward_host`] returns.
pub fn try_host_forward<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(HostRun<T>, Backend)> {
    let gpu = shared_gpu()?;
    let kernel = KernelKind::Wgmma;
    // The backend names the kernel that ran (wgmma hands calls it cannot serve to mma).
    let with_backend = |r: HostRun<T>| {
        let b = Backend::Cuda {
            device: gpu.info().name.clone(),
            kernel: format!("attn_{}", r.info.kernel),
        };
        (r, b)
    };
    if let (Some(q), Some(k), Some(v)) = (same::<T, f16>(q), same::<T, f16>(k), same::<T, f16>(v)) {
        return Ok(with_backend(as_t(forward_host(gpu, kernel, p, q, k, v)?)));
    }
    if let (Some(q), Some(k), Some(v)) =
        (same::<T, bf16>(q), same::<T, bf16>(k), same::<T, bf16>(v))
    {
        return Ok(with_backend(as_t(forward_host(gpu, kernel, p, q, k, v)?)));
    }
    Err(AttnError::DTypeMismatch {
        what: format!(
            "the CUDA kernels take f16 or bf16 inputs, got {}: convert the inputs or use the CPU backend",
            T::DTYPE
        ),
    })
}

/// Runs a packed variable-length batch on the GPU in one launch ([`crate::cuda::fwd::varlen`]): `o`
/// packed, `lse` `[heads_q, total_q]`, the backend description and why that kernel ran.
///
/// # Errors
/// As [`try_host_forward`], and those of [`crate::cuda::fwd::varlen::forward_host`].
pub fn try_host_varlen<T: Element>(
    p: &crate::problem::varlen::VarlenProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(Vec<T>, Vec<f32>, Backend, String)> {
    let gpu = shared_gpu()?;
    let kernel = KernelKind::Wgmma;
    let with_backend =
        |(o, lse, info): (Vec<T>, Vec<f32>, crate::cuda::runtime::launch::LaunchInfo)| {
            let b = Backend::Cuda {
                device: gpu.info().name.clone(),
                kernel: format!("attn_{}", info.kernel),
            };
            (o, lse, b, info.why)
        };
    if let (Some(q), Some(k), Some(v)) = (same::<T, f16>(q), same::<T, f16>(k), same::<T, f16>(v)) {
        let (o, lse, info) = crate::cuda::fwd::varlen::forward_host(gpu, kernel, p, q, k, v)?;
        return Ok(with_backend((back(o), lse, info)));
    }
    if let (Some(q), Some(k), Some(v)) =
        (same::<T, bf16>(q), same::<T, bf16>(k), same::<T, bf16>(v))
    {
        let (o, lse, info) = crate::cuda::fwd::varlen::forward_host(gpu, kernel, p, q, k, v)?;
        return Ok(with_backend((back(o), lse, info)));
    }
    Err(AttnError::DTypeMismatch {
        what: format!(
            "the CUDA kernels take f16 or bf16 inputs, got {}: convert the inputs or use the CPU backend",
            T::DTYPE
        ),
    })
}

/// Mutable twin of [`same`].
fn same_mut<T: 'static, U: 'static>(x: &mut [T]) -> Option<&mut [U]> {
    (TypeId::of::<T>() == TypeId::of::<U>())
        // SAFETY: T and U are the same type, so layout and validity are identical.
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut U, x.len()) })
}

/// Runs a decoding call on the GPU ([`crate::cuda::decode::forward_host`]), the caches updated in
/// place: the output, the backend description and why those kernels ran.
///
/// # Errors
/// As [`try_host_forward`], and those of [`crate::cuda::decode::forward_host`].
#[allow(clippy::too_many_arguments)]
pub fn try_host_kvcache<T: Element>(
    p: &crate::problem::kvcache::KvCacheProblem,
    q: &[T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
    rotary: crate::problem::kvcache::RotaryTables<'_, T>,
    splits: Option<usize>,
) -> Result<(crate::problem::kvcache::KvCacheOutput<T>, Backend, String)> {
    let gpu = shared_gpu()?;
    let backend = |info: &crate::cuda::runtime::launch::LaunchInfo| Backend::Cuda {
        device: gpu.info().name.clone(),
        kernel: format!("attn_decode ({})", info.config.as_deref().unwrap_or("")),
    };
    macro_rules! typed {
        ($u:ty) => {
            if let (Some(q), Some(kc), Some(vc), Some(kn), Some(vn), Some(cos), Some(sin)) = (
                same::<T, $u>(q),
                same_mut::<T, $u>(k_cache),
                same_mut::<T, $u>(v_cache),
                same::<T, $u>(k_new),
                same::<T, $u>(v_new),
                same::<T, $u>(rotary.cos),
                same::<T, $u>(rotary.sin),
            ) {
                let tables = crate::problem::kvcache::RotaryTables { cos, sin };
                let (out, info) =
                    crate::cuda::decode::forward_host(gpu, p, q, kc, vc, kn, vn, tables, splits)?;
                let out = crate::problem::kvcache::KvCacheOutput {
                    o: back(out.o),
                    lse: out.lse,
                };
                return Ok((out, backend(&info), info.why));
            }
        };
    }
    typed!(f16);
    typed!(bf16);
    Err(AttnError::DTypeMismatch {
        what: format!(
            "the CUDA kernels take f16 or bf16 inputs, got {}: convert the inputs or use the CPU backend",
            T::DTYPE
        ),
    })
}

/// Runs the backward of a packed variable-length batch on the GPU in one launch per kernel
/// ([`crate::cuda::bwd::varlen::backward_host`]): `dq`, `dk`, `dv` packed, the backend
/// description and what ran.
///
/// # Errors
/// As [`try_host_forward`], and those of [`crate::cuda::bwd::varlen::backward_host`].
#[allow(clippy::too_many_arguments)]
pub fn try_host_varlen_backward<T: Element>(
    p: &crate::problem::varlen::VarlenProblem,
    opts: crate::cuda::bwd::backward::BackwardOptions,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_o: &[T],
) -> Result<(crate::problem::varlen::VarlenGrads<T>, Backend)> {
    let gpu = shared_gpu()?;
    let backend = |kernel: &str| Backend::Cuda {
        device: gpu.info().name.clone(),
        kernel: kernel.to_string(),
    };
    macro_rules! typed {
        ($u:ty) => {
            if let (Some(q), Some(k), Some(v), Some(o), Some(d_o)) = (
                same::<T, $u>(q),
                same::<T, $u>(k),
                same::<T, $u>(v),
                same::<T, $u>(o),
                same::<T, $u>(d_o),
            ) {
                let g =
                    crate::cuda::bwd::varlen::backward_host(gpu, p, opts, q, k, v, o, lse, d_o)?;
                let mut ran = format!("one launch per kernel ({} blocks)", g.info.blocks);
                if let Some(dp) = g.info.padded_head_dim {
                    ran.push_str(&format!(", head_dim padded to {dp}"));
                }
                if g.info.deterministic {
                    ran.push_str(", deterministic");
                }
                let grads = crate::problem::varlen::VarlenGrads {
                    dq: back(g.dq),
                    dk: back(g.dk),
                    dv: back(g.dv),
                    d_sink: g.d_sink,
                    ran,
                };
                return Ok((grads, backend(g.info.kernel)));
            }
        };
    }
    typed!(f16);
    typed!(bf16);
    Err(AttnError::DTypeMismatch {
        what: format!(
            "the CUDA kernels take f16 or bf16 inputs, got {}: convert the inputs or use the CPU backend",
            T::DTYPE
        ),
    })
}
