//! Learnable-sink calls the GPU path must refuse with a typed error, before any launch: the
//! rungs that do not serve a sink (naive, simt: `UnsupportedFeature` naming it), logits of the
//! wrong count or not finite in a hand-built problem (`InvalidInput`), the backward's `d_sink`
//! given without a sink or too short, and FP8 calls with a sink. (The sink's results are
//! judged by the forward, varlen, KV-cache and backward sweeps, whose labels end in ` sink`.)

use cudarc::driver::CudaSlice;
use flashattn::cuda::backward::{BackwardOptions, backward_device};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{DevicePtrMut, Gpu, KernelKind, forward_device};
use flashattn::error::{AttnError, Result};
use flashattn::scores::ScoreMods;
use flashattn::shape::{AttnProblem, AttnShape};
use half::f16;

/// `(label, passed, message)` of every refusal.
///
/// # Errors
/// Allocation failures only.
pub fn refusals(gpu: &Gpu) -> Result<Vec<(String, bool, String)>> {
    let stream = gpu.stream();
    let plain = AttnProblem::new(AttnShape::new(1, 64, 4, 64))?;
    let sunk = plain.clone().with_scores(ScoreMods {
        sink: Some(vec![0.5, -1.0, 2.0, 0.0]),
        ..ScoreMods::default()
    })?;
    // Hand-built problems skip with_scores' checks: the launchers validate them again.
    let bad = |sink: Vec<f32>| AttnProblem {
        scores: ScoreMods {
            sink: Some(sink),
            ..ScoreMods::default()
        },
        ..plain.clone()
    };
    let n = 64 * 4 * 64;
    let alloc = |len: usize| -> Result<CudaSlice<f16>> {
        stream.alloc_zeros(len).map_err(cuda_err("allocating"))
    };
    let alloc32 = |len: usize| -> Result<CudaSlice<f32>> {
        stream.alloc_zeros(len).map_err(cuda_err("allocating"))
    };
    let (q, k, v, d_o) = (alloc(n)?, alloc(n)?, alloc(n)?, alloc(n)?);
    let (mut o, mut dq, mut dk, mut dv) = (alloc(n)?, alloc(n)?, alloc(n)?, alloc(n)?);
    let mut lse = alloc32(4 * 64)?;
    let (mut d_sink, mut d_sink_short) = (alloc32(4)?, alloc32(3)?);

    let mut out = Vec::new();
    let mut judge = |label: &str, got: Result<()>, want: fn(&AttnError) -> bool, says: &str| {
        let (passed, message) = match &got {
            Err(e) if want(e) && e.to_string().contains(says) => {
                (true, format!("typed error: {e}"))
            }
            Err(e) => (
                false,
                format!("wrong error: {e} (expected one naming '{says}')"),
            ),
            Ok(()) => (false, "accepted an invalid call".into()),
        };
        out.push((format!("sink: {label}"), passed, message));
    };
    for kernel in [KernelKind::Naive, KernelKind::Simt] {
        let got = forward_device(gpu, kernel, None, &sunk, &q, &k, &v, &mut o, &mut lse);
        judge(
            &format!("forward on {kernel}"),
            got.map(|_| ()),
            |e| matches!(e, AttnError::UnsupportedFeature { .. }),
            "learnable sink",
        );
    }
    for (label, p, says) in [
        ("3 logits for 4 heads", bad(vec![0.5; 3]), "expected 4"),
        (
            "a NaN logit",
            bad(vec![0.5, f32::NAN, 0.0, 0.0]),
            "learnable_sink[1]",
        ),
        (
            "an infinite logit",
            bad(vec![f32::INFINITY; 4]),
            "learnable_sink[0]",
        ),
    ] {
        for kernel in [KernelKind::Mma, KernelKind::Wgmma] {
            let got = forward_device(gpu, kernel, None, &p, &q, &k, &v, &mut o, &mut lse);
            judge(
                &format!("{label} on {kernel}"),
                got.map(|_| ()),
                |e| matches!(e, AttnError::InvalidInput { .. }),
                says,
            );
        }
    }
    let opts = BackwardOptions::default();
    let mut backward = |p: &AttnProblem, ds: &mut dyn DevicePtrMut<f32>| {
        backward_device(
            gpu,
            p,
            opts,
            &q,
            &k,
            &v,
            &o,
            &lse,
            &d_o,
            &mut dq,
            &mut dk,
            &mut dv,
            Some(ds),
        )
        .map(|_| ())
    };
    let got = backward(&plain, &mut d_sink);
    judge(
        "backward d_sink without a sink",
        got,
        |e| matches!(e, AttnError::InvalidInput { .. }),
        "no learnable sink",
    );
    let got = backward(&sunk, &mut d_sink_short);
    judge(
        "backward d_sink of 3 for 4 heads",
        got,
        |e| {
            matches!(
                e,
                AttnError::BufferTooShort {
                    tensor: "d_sink",
                    ..
                }
            )
        },
        "d_sink",
    );
    let e4 = vec![flashattn::fp8::E4m3::from_f32(0.5); n];
    let got = flashattn::forward_fp8(
        flashattn::BackendChoice::Cuda,
        &sunk,
        &e4,
        &e4,
        &e4,
        &flashattn::fp8::Fp8Descales::per_tensor(1.0, 1.0, 1.0),
    );
    judge(
        "FP8 forward",
        got.map(|_| ()),
        |e| matches!(e, AttnError::UnsupportedFeature { .. }),
        "learnable sink",
    );
    Ok(out)
}
