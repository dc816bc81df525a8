//! Invalid calls on the GPU path: each must return its typed error before any launch, and the
//! context must stay usable afterwards.

use super::outcome::CaseResult;
use cudarc::driver::{CudaContext, CudaSlice};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, KernelKind, forward_device};
use flashattn::error::{AttnError, Result};
use flashattn::shape::{AttnProblem, AttnShape, Strides};
use half::f16;

/// An invalid call: what it is, what came back, and which error kind it must be.
type Refusal<'a> = (&'a str, Result<()>, fn(&AttnError) -> bool);

fn result(label: &str, passed: bool, message: String) -> CaseResult {
    CaseResult {
        label: label.into(),
        kernel: "all".into(),
        ran: String::new(),
        o_rel_l2: 0.0,
        o_max_abs: 0.0,
        lse_max_abs: 0.0,
        guard_overwritten: 0,
        passed,
        message,
    }
}

/// Runs every invalid call against every kernel and checks the error's kind.
///
/// # Errors
/// Allocation failures only.
pub fn run(gpu: &Gpu) -> Result<Vec<CaseResult>> {
    let stream = gpu.stream();
    let p = AttnProblem::new(AttnShape::new(1, 64, 2, 64))?;
    let n = 64 * 2 * 64;
    let alloc = |len: usize| -> Result<CudaSlice<f16>> {
        stream.alloc_zeros(len).map_err(cuda_err("allocating"))
    };
    let (q, k, v) = (alloc(n + 8)?, alloc(n)?, alloc(n)?);
    let mut o = alloc(n)?;
    let mut o_short = alloc(n - 1)?;
    let mut lse: CudaSlice<f32> = stream.alloc_zeros(128).map_err(cuda_err("allocating"))?;
    let mut lse_short: CudaSlice<f32> = stream.alloc_zeros(127).map_err(cuda_err("allocating"))?;
    let odd = Strides {
        batch: 64 * 132,
        seq: 132,
        head: 64,
    };
    let p_odd = p
        .clone()
        .with_strides(odd, p.k_strides, p.v_strides, p.o_strides)?;
    // head_dim 36 runs on padded copies: a buffer too short for it is still refused first.
    let p_d36 = AttnProblem::new(AttnShape::new(1, 64, 2, 36))?;
    let k_d36_short = alloc(64 * 2 * 36 - 1)?;
    // A buffer from a second (non-primary) context on the same device.
    let other = CudaContext::new_non_primary(gpu.context().ordinal(), 0)
        .map_err(cuda_err("creating a second context"))?;
    let foreign: CudaSlice<f16> = other
        .default_stream()
        .alloc_zeros(n)
        .map_err(cuda_err("allocating in the second context"))?;
    gpu.context()
        .bind_to_thread()
        .map_err(cuda_err("binding the context"))?;

    let mut out = Vec::new();
    for kernel in KernelKind::ALL {
        let q_mis = q.slice(1..n + 1);
        let cases: Vec<Refusal> = vec![
            (
                "o one element too short",
                forward_device(gpu, kernel, None, &p, &q, &k, &v, &mut o_short, &mut lse)
                    .map(|_| ()),
                |e| matches!(e, AttnError::BufferTooShort { tensor: "o", .. }),
            ),
            (
                "lse one element too short",
                forward_device(gpu, kernel, None, &p, &q, &k, &v, &mut o, &mut lse_short)
                    .map(|_| ()),
                |e| matches!(e, AttnError::BufferTooShort { tensor: "lse", .. }),
            ),
            (
                "q view not 16-byte aligned",
                forward_device(gpu, kernel, None, &p, &q_mis, &k, &v, &mut o, &mut lse).map(|_| ()),
                |e| matches!(e, AttnError::InvalidStrides { tensor: "q", .. }),
            ),
            (
                "q seq stride 132 (not a multiple of 8)",
                forward_device(gpu, kernel, None, &p_odd, &q, &k, &v, &mut o, &mut lse).map(|_| ()),
                |e| matches!(e, AttnError::InvalidStrides { tensor: "q", .. }),
            ),
            (
                "head_dim 36 (padded), k one element too short",
                forward_device(
                    gpu,
                    kernel,
                    None,
                    &p_d36,
                    &q,
                    &k_d36_short,
                    &v,
                    &mut o,
                    &mut lse,
                )
                .map(|_| ()),
                |e| matches!(e, AttnError::BufferTooShort { tensor: "k", .. }),
            ),
            (
                "k from another context",
                forward_device(gpu, kernel, None, &p, &q, &foreign, &v, &mut o, &mut lse)
                    .map(|_| ()),
                |e| matches!(e, AttnError::ShapeMismatch { .. }),
            ),
        ];
        for (label, got, expected) in cases {
            let (passed, message) = match &got {
                Err(e) if expected(e) => (true, format!("typed error: {e}")),
                Err(e) => (false, format!("wrong error: {e}")),
                Ok(()) => (false, "accepted an invalid call".into()),
            };
            out.push(CaseResult {
                kernel: kernel.name().into(),
                ..result(label, passed, message)
            });
        }
        // The context is still usable after the refusals.
        let ok = forward_device(gpu, kernel, None, &p, &q, &k, &v, &mut o, &mut lse)
            .and_then(|_| stream.synchronize().map_err(cuda_err("synchronizing")));
        let msg = ok.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
        out.push(CaseResult {
            kernel: kernel.name().into(),
            ..result("valid call after the refusals", ok.is_ok(), msg)
        });
    }
    Ok(out)
}
