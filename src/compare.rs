//! Error metrics, tolerances and seeded random inputs shared by every checker (CPU tests,
//! the GPU sweep, `flashattn run`), so that all of them judge results the same way.
//!
//! Rules of [`diff`]: NaN where the reference holds NaN (a NaN input reaches exactly the rows
//! that read it: the documented answer) is a match; NaN on one side only is a mismatch and
//! never passes; equal infinities (e.g. `lse = -inf` for a row that sees no key) are exact
//! matches; an infinity on one side only is a mismatch and never passes.
//!
//! Bounds ([`Tolerance`]) follow the precision of the arithmetic: a constant part for the
//! element type, plus a part that grows with the size of the logits (f32 scores carry an
//! error proportional to them), see [`Tolerance::with_logits`].

use crate::dtype::{DType, Element};
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::fmt;

/// How far an output is from a reference.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Diff {
    /// Element pairs compared (the shorter of the two lengths).
    pub count: usize,
    /// `||out - ref||_2 / ||ref||_2` over finite pairs (0 when both are all zero, +inf when
    /// only the reference is all zero).
    pub rel_l2: f64,
    /// Largest `|out - ref|` over finite pairs; +inf when an infinity is on one side only.
    pub max_abs: f64,
    /// Index of the element with the largest error, if any pair differs.
    pub worst: Option<usize>,
    /// Largest `|ref|` over finite reference elements (the scale for [`Tolerance`]'s max-abs).
    pub ref_max_abs: f64,
    /// Pairs where exactly one side is NaN (a NaN that should not be there, or a number
    /// where NaN is the answer).
    pub nan_mismatch: usize,
    /// Pairs where both sides are NaN (matches, not counted in the metrics).
    pub nan_matched: usize,
    /// Pairs where one side is infinite and the other is not the same infinity.
    pub inf_mismatch: usize,
    /// `|len(out) - len(ref)|`: elements present on one side only.
    pub len_mismatch: usize,
}

impl Diff {
    /// `true` when there is no lone NaN, no lone infinity and no length mismatch.
    pub fn is_clean(&self) -> bool {
        self.nan_mismatch == 0 && self.inf_mismatch == 0 && self.len_mismatch == 0
    }
}

impl fmt::Display for Diff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rel-L2 {:.3e}, max-abs {:.3e}",
            self.rel_l2, self.max_abs
        )?;
        if let Some(w) = self.worst {
            write!(f, " (at {w})")?;
        }
        if self.nan_mismatch > 0 {
            write!(f, ", {} NaN mismatches", self.nan_mismatch)?;
        }
        if self.nan_matched > 0 {
            write!(f, ", {} NaN as expected", self.nan_matched)?;
        }
        if self.inf_mismatch > 0 {
            write!(f, ", {} inf mismatches", self.inf_mismatch)?;
        }
        if self.len_mismatch > 0 {
            write!(f, ", lengths differ by {}", self.len_mismatch)?;
        }
        Ok(())
    }
}

/// Compares `out` with `reference` element by element (see the module docs for NaN/Inf).
///
/// Extra elements on either side are counted in [`Diff::len_mismatch`].
pub fn diff<I: IntoIterator<Item = f64>>(out: I, reference: &[f64]) -> Diff {
    let mut d = Diff::default();
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    let mut out = out.into_iter();
    for (i, &r) in reference.iter().enumerate() {
        let Some(o) = out.next() else {
            d.len_mismatch = reference.len() - i;
            break;
        };
        d.count += 1;
        if o.is_nan() && r.is_nan() {
            d.nan_matched += 1;
            continue;
        }
        if o.is_nan() || r.is_nan() {
            d.nan_mismatch += 1;
            d.worst = Some(i);
            continue;
        }
        if o.is_infinite() || r.is_infinite() {
            if o != r {
                d.inf_mismatch += 1;
                d.max_abs = f64::INFINITY;
                d.worst = Some(i);
            }
            continue;
        }
        let e = (o - r).abs();
        err2 += e * e;
        ref2 += r * r;
        d.ref_max_abs = d.ref_max_abs.max(r.abs());
        if e > d.max_abs {
            d.max_abs = e;
            d.worst = Some(i);
        }
    }
    d.len_mismatch += out.count();
    d.rel_l2 = if ref2 > 0.0 {
        (err2 / ref2).sqrt()
    } else if err2 == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    d
}

/// [`diff`] for outputs `o` (dense `[batch, seqlen_q, heads_q, head_dim]`).
pub fn diff_o<I: IntoIterator<Item = f64>>(out: I, reference: &[f64]) -> Diff {
    diff(out, reference)
}

/// [`diff`] for `lse` (`[batch, heads_q, seqlen_q]`): `-inf == -inf` is exact.
pub fn diff_lse<I: IntoIterator<Item = f64>>(out: I, reference: &[f64]) -> Diff {
    diff(out, reference)
}

/// Widens a slice of elements to f64 for [`diff`].
pub fn widen<T: Element>(xs: &[T]) -> impl Iterator<Item = f64> + '_ {
    xs.iter().map(|x| x.to_f64())
}

/// Reads `o` through `p.o_strides` into a dense f64 `[batch, seqlen_q, heads_q, head_dim]`.
///
/// # Errors
/// [`AttnError::BufferTooShort`] when `o` is shorter than its strides address.
pub fn dense_o<T: Element>(p: &AttnProblem, o: &[T]) -> Result<Vec<f64>> {
    let s = p.shape;
    let required = p
        .o_strides
        .required_len("o", s.batch, s.seqlen_q, s.heads_q, s.head_dim)?;
    if o.len() < required {
        return Err(AttnError::BufferTooShort {
            tensor: "o",
            len: o.len(),
            required,
        });
    }
    let mut out = Vec::with_capacity(s.batch * s.seqlen_q * s.heads_q * s.head_dim);
    for b in 0..s.batch {
        for i in 0..s.seqlen_q {
            for h in 0..s.heads_q {
                let off = p.o_strides.offset(b, i, h);
                out.extend(widen(&o[off..off + s.head_dim]));
            }
        }
    }
    Ok(out)
}

/// Pass/fail thresholds for one element type, optionally widened for large logits.
///
/// With `e = LOGIT_ULPS * 2^-24 * logits` (zero unless [`Self::with_logits`] set `logits`):
/// `o` passes when `rel_l2 <= o_rel_l2 + e` and `max_abs <= (o_max_abs + e) * max(1,
/// max |ref|)`; `lse` passes when `max_abs <= lse_max_abs + LOGIT_ULPS * 2^-24 * (logits +
/// max |ref lse|)`. Neither passes with a lone NaN, a lone infinity or a length mismatch.
///
/// Why these numbers (the oracle runs on the same rounded inputs, so only the backend's own
/// arithmetic and the rounding of `o` count):
/// - **f16**: rounding `o` to f16 alone costs a half-ulp of 2^-11 ≈ 4.9e-4 per element
///   (≈ 3e-4 rel-L2); GPU kernels also round `P` to f16 before `P V`. With f32 accumulation
///   results land near 1e-3 rel-L2, so 2e-3 leaves 2x headroom.
/// - **bf16**: 7 stored mantissa bits instead of 10, so 2^3 = 8x looser for `o`.
/// - **f32** (CPU only): f32 accumulation and a 1.7e-7 exp polynomial; 1e-5 rel-L2.
/// - **lse** is never rounded to the element type (f32 from f32 scores): 2e-3 absolute for
///   f16/bf16 covers approximate `exp2`/`log2` on GPUs; 1e-4 for f32.
/// - **large logits**: every backend forms `s = q.k * scale` in f32, whose rounding error
///   grows with `sum |q_i k_i| * scale` (at most `head_dim * 2^-24` times it, about
///   `sqrt(head_dim) * 2^-24` for rounding errors of random sign), and `lse` itself is an f32
///   of size `|lse|` (one step is `|lse| * 2^-23`). An error `e` in a score is a relative
///   error `e` in its probability, so `o` moves by about `e` times `|v|`, and `lse` by `e`.
///   `logits` is an upper bound of `sum |q_i k_i| * scale` ([`logit_bound`]); `LOGIT_ULPS` =
///   16 is `sqrt(256)`, the typical growth for the largest head_dim. For ordinary inputs
///   (`|q|, |k| ~ sqrt(head_dim)`, logits ~ 10) this adds about 1e-5; at logits near 1e5
///   (lse ~ -5e4 in the field report, where one f32 step is 3.9e-3) it allows ~0.1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Largest rel-L2 of `o`.
    pub o_rel_l2: f64,
    /// Largest max-abs of `o`, relative to `max(1, max |ref|)`.
    pub o_max_abs: f64,
    /// Largest absolute error of `lse` (natural log units).
    pub lse_max_abs: f64,
    /// Upper bound of `sum |q_i k_i| * softmax_scale` over the inputs (0: not widened).
    pub logits: f64,
}

/// f32 rounding steps per unit of logit magnitude that [`Tolerance`] allows (see there).
pub const LOGIT_ULPS: f64 = 16.0;

impl Tolerance {
    /// f16 inputs and output, f32 accumulation.
    pub const F16: Tolerance = Tolerance {
        o_rel_l2: 2e-3,
        o_max_abs: 1e-2,
        lse_max_abs: 2e-3,
        logits: 0.0,
    };
    /// bf16 inputs and output, f32 accumulation: 8x looser `o` than f16.
    pub const BF16: Tolerance = Tolerance {
        o_rel_l2: 1.6e-2,
        o_max_abs: 8e-2,
        lse_max_abs: 2e-3,
        logits: 0.0,
    };
    /// f32 inputs and output (CPU backend).
    pub const F32: Tolerance = Tolerance {
        o_rel_l2: 1e-5,
        o_max_abs: 1e-4,
        lse_max_abs: 1e-4,
        logits: 0.0,
    };

    /// The tolerance for an element type.
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F16 => Self::F16,
            DType::BF16 => Self::BF16,
            DType::F32 => Self::F32,
        }
    }

    /// The tolerance for an element type and these inputs: [`Self::for_dtype`] widened by
    /// [`logit_bound`] of `q` and `k` (what every checker should use).
    pub fn for_inputs<T: Element>(p: &AttnProblem, q: &[T], k: &[T]) -> Self {
        Self::for_dtype(T::DTYPE).with_logits(logit_bound(p, q, k))
    }

    /// Widened for scores whose `sum |q_i k_i| * scale` reaches `logits` (see the type's docs).
    pub fn with_logits(self, logits: f64) -> Self {
        Tolerance {
            logits: if logits.is_finite() {
                logits.max(0.0)
            } else {
                0.0
            },
            ..self
        }
    }

    fn logit_part(&self, extra: f64) -> f64 {
        LOGIT_ULPS * f64::from(f32::EPSILON) / 2.0 * (self.logits + extra)
    }

    /// The rel-L2 bound of `o`.
    pub fn o_rel_l2_bound(&self) -> f64 {
        self.o_rel_l2 + self.logit_part(0.0)
    }

    /// The max-abs bound of `o` for a reference whose largest magnitude is `ref_max_abs`.
    pub fn o_max_abs_bound(&self, ref_max_abs: f64) -> f64 {
        (self.o_max_abs + self.logit_part(0.0)) * ref_max_abs.max(1.0)
    }

    /// The max-abs bound of `lse` for a reference whose largest magnitude is `ref_max_abs`.
    pub fn lse_bound(&self, ref_max_abs: f64) -> f64 {
        self.lse_max_abs + self.logit_part(ref_max_abs)
    }

    /// `true` when `o`'s diff is within tolerance.
    pub fn o_ok(&self, d: &Diff) -> bool {
        d.is_clean()
            && d.rel_l2 <= self.o_rel_l2_bound()
            && d.max_abs <= self.o_max_abs_bound(d.ref_max_abs)
    }

    /// `true` when `lse`'s diff is within tolerance.
    pub fn lse_ok(&self, d: &Diff) -> bool {
        d.is_clean() && d.max_abs <= self.lse_bound(d.ref_max_abs)
    }

    /// `Ok` when both pass.
    ///
    /// # Errors
    /// [`AttnError::CheckFailed`] naming `what`, both diffs and the bounds applied.
    pub fn check(&self, what: &str, o: &Diff, lse: &Diff) -> Result<()> {
        if self.o_ok(o) && self.lse_ok(lse) {
            return Ok(());
        }
        Err(AttnError::CheckFailed {
            what: format!(
                "{what}: o {o}; lse {lse}; tolerance o rel-L2 <= {:.3e}, o max-abs <= {:.3e}, lse max-abs <= {:.3e} (logits up to {:.3e})",
                self.o_rel_l2_bound(),
                self.o_max_abs_bound(o.ref_max_abs),
                self.lse_bound(lse.ref_max_abs),
                self.logits
            ),
        })
    }
}

/// An upper bound of `sum_i |q_i k_i| * softmax_scale` over every (query, key) pair of `p`
/// that shares a (batch, kv head): `scale * max |q row|_2 * max |k row|_2` per (batch, kv
/// head) (Cauchy-Schwarz), the size that rounding of f32 scores grows with. Non-finite
/// entries are skipped (the rows that read them are judged by NaN position). O(size of q
/// and k); 0 for an invalid problem or too-short buffers.
pub fn logit_bound<T: Element>(p: &AttnProblem, q: &[T], k: &[T]) -> f64 {
    let s = p.shape;
    if p.check_lengths(q.len(), k.len(), usize::MAX, usize::MAX, usize::MAX)
        .is_err()
        || p.validate().is_err()
    {
        return 0.0;
    }
    let d = s.head_dim;
    let norm = |x: &[T], off: usize| {
        x[off..off + d]
            .iter()
            .map(|e| e.to_f64())
            .filter(|v| v.is_finite())
            .map(|v| v * v)
            .sum::<f64>()
            .sqrt()
    };
    let group = s.group_size();
    let mut best = 0.0f64;
    for b in 0..s.batch {
        for kvh in 0..s.heads_kv {
            let qmax = (0..s.seqlen_q)
                .flat_map(|i| (kvh * group..(kvh + 1) * group).map(move |h| (i, h)))
                .map(|(i, h)| norm(q, p.q_strides.offset(b, i, h)))
                .fold(0.0f64, f64::max);
            let kmax = (0..s.seqlen_k)
                .map(|j| norm(k, p.k_strides.offset(b, j, kvh)))
                .fold(0.0f64, f64::max);
            best = best.max(qmax * kmax);
        }
    }
    best * f64::from(p.softmax_scale)
}

/// A fresh seed for random inputs: `FLASHATTN_SEED` from the environment when set (to
/// replay a failure), else derived from the clock. Callers print it.
pub fn random_seed() -> u64 {
    if let Some(s) = std::env::var("FLASHATTN_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return s;
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed);
    splitmix(t)
}

/// Seeded random q, k, v for `p`: standard-normal values with magnitude at least 1/64 (never
/// zero, also after rounding to `T`), each buffer as long as `p`'s strides require (elements
/// between addressed ones are filled too).
///
/// Deterministic for a given `(p, seed)` regardless of the number of threads.
///
/// # Panics
/// Never for a problem that passes [`AttnProblem::validate`]; an invalid problem gets empty
/// buffers for the tensors whose length cannot be computed.
pub fn random_inputs<T: Element>(p: &AttnProblem, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
    let s = p.shape;
    let len = |name: &'static str, st: crate::shape::Strides, seqlen: usize, heads: usize| {
        st.required_len(
            name,
            s.batch.max(1),
            seqlen.max(1),
            heads.max(1),
            s.head_dim,
        )
        .unwrap_or(0)
    };
    let q = random_vec(
        len("q", p.q_strides, s.seqlen_q, s.heads_q),
        splitmix(seed ^ 0x51),
    );
    let k = random_vec(
        len("k", p.k_strides, s.seqlen_k, s.heads_kv),
        splitmix(seed ^ 0x4b),
    );
    let v = random_vec(
        len("v", p.v_strides, s.seqlen_k, s.heads_kv),
        splitmix(seed ^ 0x56),
    );
    (q, k, v)
}

/// `n` seeded normal-ish values (see [`random_inputs`]), generated in parallel chunks.
pub fn random_vec<T: Element>(n: usize, seed: u64) -> Vec<T> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![T::default(); n];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut rng = StdRng::seed_from_u64(splitmix(seed.wrapping_add(c as u64)));
            for x in chunk.iter_mut() {
                // Box-Muller, one value per draw (simple; speed is ample).
                let u1: f64 = 1.0 - rng.r#gen::<f64>(); // (0, 1]
                let u2: f64 = rng.r#gen::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let z = if z.abs() < 1.0 / 64.0 {
                    (1.0 / 64.0f64).copysign(z)
                } else {
                    z
                };
                *x = T::from_f32(z as f32);
            }
        });
    out
}

/// SplitMix64 finaliser: decorrelates nearby seeds.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinities_and_nan() {
        let r = [f64::NEG_INFINITY, 1.0, 2.0];
        let d = diff([f64::NEG_INFINITY, 1.0, 2.0], &r);
        assert!(d.is_clean() && d.max_abs == 0.0 && d.rel_l2 == 0.0);
        let d = diff([f64::NEG_INFINITY, f64::NAN, 2.0], &r);
        assert_eq!(d.nan_mismatch, 1);
        assert!(!Tolerance::F16.lse_ok(&d));
        let d = diff([0.0, 1.0, 2.0], &r);
        assert_eq!(d.inf_mismatch, 1);
        assert!(!Tolerance::BF16.lse_ok(&d));
        let d = diff([1.0, 2.0], &r);
        assert_eq!(d.len_mismatch, 1);
        let d = diff([1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.0]);
        assert_eq!(d.len_mismatch, 1);
    }

    /// Field report (turn 2, 6): NaN where the reference holds NaN is the documented answer.
    #[test]
    fn nan_positions_are_compared() {
        let r = [f64::NAN, 1.0, f64::NAN];
        let d = diff([f64::NAN, 1.0, f64::NAN], &r);
        assert!(d.is_clean() && d.nan_matched == 2 && Tolerance::F16.lse_ok(&d));
        // A NaN where a number is expected, and a number where NaN is expected.
        assert_eq!(diff([f64::NAN, f64::NAN, f64::NAN], &r).nan_mismatch, 1);
        assert_eq!(diff([1.0, 1.0, f64::NAN], &r).nan_mismatch, 1);
        assert!(!diff([1.0, 1.0, f64::NAN], &r).is_clean());
    }

    /// Field report (turn 2, 1 and 2): bounds follow the f32 precision of large logits, and
    /// still catch errors far above it.
    #[test]
    fn bounds_scale_with_the_logits() {
        // lse near -5e4 (logits up to 6.5e4): two f32 steps (2 x 3.9e-3) from the exact value.
        let exact = -50_000.123_456_789_f64;
        let two_steps = {
            let x = exact as f32;
            f32::from_bits(x.to_bits() + 2)
        };
        let d = diff([f64::from(two_steps)], &[exact]);
        assert!(d.max_abs > 5e-3);
        // Beyond the constant part (2e-3), within the part that follows |lse| itself.
        assert!(d.max_abs > Tolerance::BF16.lse_max_abs);
        assert!(Tolerance::BF16.lse_ok(&d));
        assert!(Tolerance::BF16.with_logits(6.5e4).lse_ok(&d));
        let off = diff([exact + 1.0], &[exact]);
        assert!(
            !Tolerance::BF16.with_logits(6.5e4).lse_ok(&off),
            "an error of 1 is a bug"
        );
        // f32 o with logits near 150: 2.29e-5 relative (sequential f32 sums do that).
        let r: Vec<f64> = (0..64).map(|i| 0.5 + f64::from(i) / 64.0).collect();
        let near: Vec<f64> = r.iter().map(|x| x * (1.0 + 2.29e-5)).collect();
        let d = diff(near.iter().copied(), &r);
        assert!(!Tolerance::F32.o_ok(&d));
        assert!(Tolerance::F32.with_logits(150.0).o_ok(&d));
        let far: Vec<f64> = r.iter().map(|x| x * (1.0 + 1e-3)).collect();
        assert!(!Tolerance::F32.with_logits(150.0).o_ok(&diff(far, &r)));
        // Ordinary inputs (logits ~ 10) barely move the bounds; non-finite logits are ignored.
        let t = Tolerance::F16.with_logits(10.0);
        assert!(t.o_rel_l2_bound() < 2.01e-3 && t.lse_bound(5.0) < 2.02e-3);
        assert_eq!(Tolerance::F16.with_logits(f64::NAN), Tolerance::F16);
    }

    #[test]
    fn metrics() {
        let d = diff([1.0, 2.0, 2.0], &[1.0, 2.0, 4.0]);
        assert_eq!(d.max_abs, 2.0);
        assert_eq!(d.worst, Some(2));
        assert!((d.rel_l2 - 2.0 / 21f64.sqrt()).abs() < 1e-15);
        assert_eq!(diff([1.0], &[0.0]).rel_l2, f64::INFINITY);
    }

    #[test]
    fn random_is_seeded_and_nonzero() {
        let a: Vec<half::f16> = random_vec(100_000, 7);
        let b: Vec<half::f16> = random_vec(100_000, 7);
        assert_eq!(a, b);
        assert!(
            a.iter()
                .all(|x| x.to_f32() != 0.0 && x.to_f32().is_finite())
        );
        let c: Vec<half::f16> = random_vec(100_000, 8);
        assert_ne!(a, c);
    }
}
