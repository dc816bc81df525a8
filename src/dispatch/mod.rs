//! The dispatch layer, above [`crate::cpu`] and [`crate::cuda`]: for host-memory calls it
//! decides which backend runs (CPU, CUDA, or the best usable one) and says why. Dense
//! attention is [`forward`] here, packed batches [`varlen::forward`], decoding
//! [`kvcache::forward`]; the GPU side of each is in `gpu` (element-type dispatch onto the
//! kernels' f16/bf16). Nothing below this layer imports from it.

mod backend;
pub mod fp8;
mod gpu;
pub mod kvcache;
pub mod varlen;

pub use backend::{Backend, BackendChoice, Forward};

use crate::dtype::Element;
use crate::error::Result;
use crate::shape::{AttnProblem, Strides};
use std::time::Instant;

/// Runs attention on host buffers with the chosen backend. Output `o` is dense.
///
/// `problem.o_strides` is ignored: `o` comes back dense `[batch, seqlen_q, heads_q,
/// head_dim]`. `Auto` uses the GPU when the CUDA backend is built in and usable, else the
/// CPU, and says why in [`Forward::reason`].
///
/// # Errors
/// Validation errors of [`AttnProblem`], buffer length errors, and
/// [`crate::AttnError::BackendUnavailable`] when `Cuda` is asked for and no GPU is usable.
pub fn forward<T: Element>(
    choice: BackendChoice,
    problem: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<Forward<T>> {
    // o comes back dense, so the caller's o_strides are replaced before validation.
    let s = problem.shape;
    let dense = Strides::contiguous(s.seqlen_q, s.heads_q, s.head_dim);
    let p = AttnProblem {
        o_strides: dense,
        ..problem.clone()
    };
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    match choice {
        BackendChoice::Cpu => run_cpu(&p, q, k, v, "asked for".into()),
        // Auto falls back to the CPU, saying why, only when the GPU cannot take the problem
        // (no GPU, f32, a head_dim, stride or score modifier the kernels lack); a kernel or launch failure is
        // an error, never hidden behind a silent fallback.
        BackendChoice::Auto => match run_cuda(&p, q, k, v, "the GPU is usable") {
            Ok(f) => Ok(f),
            Err(e) if e.is_unsupported() => run_cpu(
                &p,
                q,
                k,
                v,
                format!("CPU, because the GPU backend cannot run this: {e}"),
            ),
            Err(e) => Err(e),
        },
        // CUDA-HOOK: an unusable GPU is an error here.
        BackendChoice::Cuda => run_cuda(&p, q, k, v, "asked for"),
    }
}

/// Runs [`gpu::try_host_forward`] (o comes back dense).
fn run_cuda<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    reason: &str,
) -> Result<Forward<T>> {
    let (run, backend) = gpu::try_host_forward(p, q, k, v)?;
    Ok(Forward {
        o: run.o,
        lse: run.lse,
        backend,
        reason: format!("{reason}; kernel: {}", run.info.why),
        seconds: run.seconds,
    })
}

/// Runs [`crate::cpu::forward`] into fresh dense buffers and times it.
fn run_cpu<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    reason: String,
) -> Result<Forward<T>> {
    let s = p.shape;
    let mut o = vec![T::default(); s.batch * s.seqlen_q * s.heads_q * s.head_dim];
    let mut lse = vec![0.0f32; s.lse_len()];
    let t = Instant::now();
    crate::cpu::forward(p, q, k, v, &mut o, &mut lse)?;
    let seconds = t.elapsed().as_secs_f64();
    Ok(Forward {
        o,
        lse,
        backend: Backend::Cpu {
            threads: rayon::current_num_threads(),
        },
        reason,
        seconds,
    })
}
