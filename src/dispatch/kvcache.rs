//! Where a decoding call runs ([`crate::problem::kvcache`] describes it): the GPU's decode
//! kernels when asked for, or for `Auto` when a GPU is usable and takes the call, else the CPU.

use super::backend::BackendChoice;
use crate::dtype::Element;
use crate::error::Result;
use crate::problem::kvcache::{KvCacheOutput, KvCacheProblem, RotaryTables, forward_cpu};

/// What [`forward`] returns: the output and which backend ran it, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheRun<T> {
    /// o and lse.
    pub out: KvCacheOutput<T>,
    /// The backend and kernels that ran, and why.
    pub ran: String,
}

/// A decoding call on the backend `choice` picks ([`BackendChoice`]): the GPU kernels
/// ([`crate::cuda::decode`]) for `Cuda`, and for `Auto` where a GPU is usable and takes the
/// call (f16/bf16, head_dim a multiple of 8 up to 256); else [`forward_cpu`]. The caches are
/// updated in place (the new rows appended, rotated with a rotary embedding: pass its tables,
/// or [`RotaryTables::none`]). `splits`: `None` for the heuristic (the CPU backend then runs
/// one split).
///
/// # Errors
/// Validation and buffer errors before anything is written; with `Cuda`, why the GPU cannot
/// run it; the GPU's launch and copy errors.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Element>(
    choice: BackendChoice,
    p: &KvCacheProblem,
    q: &[T],
    k_cache: &mut [T],
    v_cache: &mut [T],
    k_new: &[T],
    v_new: &[T],
    rotary: RotaryTables<'_, T>,
    splits: Option<usize>,
) -> Result<KvCacheRun<T>> {
    p.validate()?;
    p.check_call(
        q.len(),
        [k_cache.len(), v_cache.len()],
        [k_new.len(), v_new.len()],
        rotary.lens(),
    )?;
    let mut why = "asked for".to_string();
    if choice != BackendChoice::Cpu {
        match super::gpu::try_host_kvcache(p, q, k_cache, v_cache, k_new, v_new, rotary, splits) {
            Ok((out, backend, why)) => {
                return Ok(KvCacheRun {
                    out,
                    ran: format!("{backend}: {why}"),
                });
            }
            Err(e) if e.is_unsupported() && choice == BackendChoice::Auto => {
                why = format!("the GPU cannot run this: {e}");
            }
            Err(e) => return Err(e),
        }
    }
    let splits = splits.unwrap_or(1);
    let out = forward_cpu(p, q, k_cache, v_cache, k_new, v_new, rotary, splits)?;
    Ok(KvCacheRun {
        out,
        ran: format!(
            "CPU ({splits} split{}; {why})",
            if splits == 1 { "" } else { "s" }
        ),
    })
}
