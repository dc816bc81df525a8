//! FP8 (e4m3) attention on host buffers with a chosen backend: [`forward`].

use super::backend::{Backend, BackendChoice, Forward};
use crate::error::Result;
use crate::fp8::{E4m3, Fp8Descales};
use crate::shape::{AttnProblem, Strides};
use half::bf16;
use std::time::Instant;

/// Runs FP8 attention on host buffers: `q`, `k`, `v` e4m3 in the problem's layout, dequantised
/// by `descales`; returns `o` dense bf16 `[batch, seqlen_q, heads_q, head_dim]` (the problem's
/// `o_strides` are ignored) and `lse` f32. `Auto` runs the FP8 GPU kernel where it serves
/// (sm_90, head_dim 64 or 128, no mask or causal) and the CPU backend otherwise, saying why.
///
/// # Errors
/// [`crate::fp8::check_call`]'s (problem, descales, lengths); with `Cuda`, the GPU's refusals
/// ([`crate::cuda::fwd::wgmma_fp8::unsupported`], no usable GPU) and launch errors.
pub fn forward(
    choice: BackendChoice,
    problem: &AttnProblem,
    q: &[E4m3],
    k: &[E4m3],
    v: &[E4m3],
    descales: &Fp8Descales,
) -> Result<Forward<bf16>> {
    let s = problem.shape;
    let p = AttnProblem {
        o_strides: Strides::contiguous(s.seqlen_q, s.heads_q, s.head_dim),
        ..problem.clone()
    };
    crate::fp8::check_call(
        &p,
        descales,
        [q.len(), k.len(), v.len(), usize::MAX, usize::MAX],
    )?;
    let cpu = |reason: String| -> Result<Forward<bf16>> {
        let mut o = vec![bf16::ZERO; s.batch * s.seqlen_q * s.heads_q * s.head_dim];
        let mut lse = vec![0.0f32; s.lse_len()];
        let t = Instant::now();
        crate::fp8::cpu::forward(&p, q, k, v, descales, &mut o, &mut lse)?;
        Ok(Forward {
            o,
            lse,
            backend: Backend::Cpu {
                threads: rayon::current_num_threads(),
            },
            reason,
            seconds: t.elapsed().as_secs_f64(),
        })
    };
    let cuda = |reason: &str| -> Result<Forward<bf16>> {
        let gpu = crate::cuda::runtime::device::shared_gpu()?;
        let run = crate::cuda::fwd::wgmma_fp8::forward_host(gpu, &p, q, k, v, descales)?;
        Ok(Forward {
            o: run.o,
            lse: run.lse,
            backend: Backend::Cuda {
                device: gpu.info().name.clone(),
                kernel: "attn_wgmma_fp8".into(),
            },
            reason: reason.into(),
            seconds: run.seconds,
        })
    };
    match choice {
        BackendChoice::Cpu => cpu("asked for".into()),
        BackendChoice::Cuda => cuda("asked for"),
        BackendChoice::Auto => match cuda("the GPU is usable") {
            Ok(f) => Ok(f),
            Err(e) if e.is_unsupported() => {
                cpu(format!("CPU, because the GPU backend cannot run this: {e}"))
            }
            Err(e) => Err(e),
        },
    }
}
