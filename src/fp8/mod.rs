//! FP8 (e4m3) attention, FlashAttention-3 style: q, k and v in [`E4m3`] with per-tensor (or
//! per (batch, kv head)) dequantisation factors `q_descale`, `k_descale`, `v_descale`
//! ([`Fp8Descales`]), f32 accumulation, `o` in bf16 and `lse` in f32.
//!
//! - [`e4m3`]: the element type and its conversions (PTX `cvt.rn.satfinite` semantics);
//! - [`descale`]: the factors and their validation;
//! - [`reference`]: the f64 oracle of the dequantised inputs and the FP8 tolerance, derived
//!   from e4m3's precision (the GPU quantises P to e4m3 for P V); [`judge`] applies it;
//! - [`cpu`]: the CPU backend.
//!
//! The GPU kernel (Hopper, sm_90a) is `crate::cuda::fwd::wgmma_fp8`; the host entry point that
//! picks a backend is `crate::dispatch::fp8::forward` (re-exported as `crate::forward_fp8`).

pub mod cpu;
pub mod descale;
pub mod e4m3;
pub mod judge;
pub mod reference;

pub use descale::{Descale, Fp8Descales};
pub use e4m3::E4m3;
pub use judge::{Fp8Verdict, judge};
pub use reference::Fp8Reference;

use crate::error::Result;
use crate::shape::{AttnProblem, Strides};

/// The checks every FP8 entry point runs before any work: the problem, the descales against
/// its shape, and the buffer lengths `[q, k, v, o, lse]` in elements.
///
/// # Errors
/// Those of [`AttnProblem::validate`], [`Fp8Descales::validate`] and
/// [`AttnProblem::check_lengths`]; [`crate::AttnError::UnsupportedFeature`] for a learnable
/// sink (neither the FP8 kernel nor its oracle and tolerance have one).
pub fn check_call(p: &AttnProblem, descales: &Fp8Descales, lens: [usize; 5]) -> Result<()> {
    p.validate()?;
    if p.scores.sink.is_some() {
        return Err(crate::AttnError::UnsupportedFeature {
            feature: "a learnable sink".into(),
            backend: "FP8 attention (every backend)".into(),
            hint: "run it with 16-bit inputs (flashattn::forward), which take a sink".into(),
        });
    }
    descales.validate(&p.shape)?;
    let [q, k, v, o, lse] = lens;
    p.check_lengths(q, k, v, o, lse)
}

/// `x` (a bshd tensor with strides `st`) dequantised to f32: element `(b, s, h, c)` times
/// `scale(b, h)`, in a buffer of the same length and layout (elements the strides do not
/// address stay 0).
pub fn dequantise(
    x: &[E4m3],
    st: Strides,
    seqlen: usize,
    heads: usize,
    head_dim: usize,
    batch: usize,
    scale: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            let f = scale(b, h);
            for s in 0..seqlen {
                let at = st.offset(b, s, h);
                for (dst, src) in out[at..at + head_dim].iter_mut().zip(&x[at..]) {
                    *dst = src.to_f32() * f;
                }
            }
        }
    }
    out
}

/// Seeded random e4m3 values for tests and checks: standard normal values scaled by
/// `1 / descale` (so that the dequantised values are about N(0, 1)), rounded to e4m3, never 0.
pub fn random_e4m3(n: usize, seed: u64, descale: f32) -> Vec<E4m3> {
    let x: Vec<f32> = crate::compare::random_vec(n, seed);
    x.into_iter()
        .map(|v| {
            let e = E4m3::from_f32(v / descale);
            if e.to_f32() == 0.0 {
                E4m3::from_f32(E4m3::MIN_NORMAL.copysign(v))
            } else {
                e
            }
        })
        .collect()
}
