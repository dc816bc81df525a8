//! Error metrics, tolerances and seeded random inputs shared by every checker (CPU tests,
//! the GPU sweep, `flashattn run`), so that all of them judge results the same way.
//!
//! Rules of [`diff`]: NaN where the reference holds NaN (a NaN input reaches exactly the rows
//! that read it: the documented answer) is a match; NaN on one side only is a mismatch and
//! never passes; equal infinities (e.g. `lse = -inf` for a row that sees no key) are exact
//! matches; an infinity on one side only is a mismatch and never passes.
//!
//! Bounds follow the precision of the arithmetic: [`Tolerance`] holds the constant part for
//! the element type; before it applies, each row is forgiven the error that f32 rounding of
//! its own large logits explains ([`diff_reference`], [`allowances`]), so a row with ordinary
//! logits is held to the full tolerance whatever the other rows hold.

use crate::dtype::{DType, Element};
use crate::error::{AttnError, Result};
/// The f32 error model of a score, defined with the oracle that uses it to find candidates.
pub use crate::reference::{PRECISION_STEPS, score_error};
use crate::reference::{Reference, RowPrecision};
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
    /// Largest `|out - ref|` over finite pairs, less each element's allowance (see
    /// [`diff_within`]); +inf when an infinity is on one side only.
    pub max_abs: f64,
    /// Largest `|out - ref|` over finite pairs before any allowance (equal to `max_abs` when
    /// no allowance applies).
    pub raw_max_abs: f64,
    /// Index of the element with the largest error, if any pair differs.
    pub worst: Option<usize>,
    /// Largest `|ref|` over finite reference elements (the scale for [`Tolerance`]'s max-abs).
    pub ref_max_abs: f64,
    /// With row scales ([`diff_within`]): the largest error relative to its row's
    /// `max(1, max |ref|)`, so a row with small values is not judged by another row's size.
    pub max_row_rel: Option<f64>,
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
        // With allowances the two figures above are what is left beyond them: say so, and
        // give the raw error too.
        if self.raw_max_abs > self.max_abs {
            write!(
                f,
                " beyond the f32 allowance (raw max-abs {:.3e})",
                self.raw_max_abs
            )?;
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
    diff_within(out, reference, std::iter::repeat((0.0, 0.0)))
}

/// [`diff`] after forgiving each element the error its precision explains: `allowance`
/// (one `(allowance, row scale)` per reference element) is subtracted from `|out - ref|`
/// (down to 0) before the metrics, and the error over the row scale (`max(1, max |ref|)` of
/// the element's row; 0 for no row rule) feeds [`Diff::max_row_rel`]. See [`allowances`].
pub fn diff_within<I, A>(out: I, reference: &[f64], allowance: A) -> Diff
where
    I: IntoIterator<Item = f64>,
    A: IntoIterator<Item = (f64, f64)>,
{
    let mut d = Diff::default();
    let (mut err2, mut ref2) = (0.0f64, 0.0f64);
    let mut out = out.into_iter();
    let mut allowance = allowance.into_iter();
    for (i, &r) in reference.iter().enumerate() {
        let Some(o) = out.next() else {
            d.len_mismatch = reference.len() - i;
            break;
        };
        d.count += 1;
        let (allowed, row_scale) = allowance.next().unwrap_or((0.0, 0.0));
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
                d.raw_max_abs = f64::INFINITY;
                d.worst = Some(i);
            }
            continue;
        }
        d.raw_max_abs = d.raw_max_abs.max((o - r).abs());
        let e = ((o - r).abs() - allowed).max(0.0);
        if row_scale > 0.0 {
            d.max_row_rel = Some(d.max_row_rel.unwrap_or(0.0).max(e / row_scale));
        }
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
    crate::error::check_len("o", o.len(), required)?;
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

/// What f32 arithmetic cannot avoid in one row (see [`RowPrecision`]): the allowance of each
/// of its `o` elements and of its `lse`. With `u = 2^-24` and `e = PRECISION_STEPS * u *
/// logits` (the error of a score, hence the relative error of its probability): `o` moves by
/// at most `e * |v_j - o|` summed with weights `p_j`, so `2 e v_max`, and never further than
/// the spread of the keys f32 cannot tell from the maximum
/// ([`RowPrecision::candidate_spread`]: at logits near 1e8 and beyond `2 e v_max` exceeds
/// any error, and a check with it alone would pass any answer); `lse` moves by `e` and is
/// itself an f32 of size `|lse|` (`PRECISION_STEPS * u * |lse|`).
pub fn allowances(pr: &RowPrecision, lse_ref: f64) -> (f64, f64) {
    let u = f64::from(f32::EPSILON) / 2.0;
    let e = score_error(pr.logits);
    let lse_size = if lse_ref.is_finite() {
        lse_ref.abs()
    } else {
        0.0
    };
    (
        (2.0 * e * pr.v_max).min(pr.candidate_spread),
        e + PRECISION_STEPS * u * lse_size,
    )
}

/// Diffs of `o` (dense `[batch, seqlen_q, heads_q, head_dim]`) and `lse` (`[batch, heads_q,
/// seqlen_q]`) against the oracle, each row forgiven what its own precision explains
/// ([`allowances`]): a row with ordinary logits is held to the full [`Tolerance`], whatever
/// the other rows hold.
pub fn diff_reference<O, L>(p: &AttnProblem, o: O, lse: L, r: &Reference) -> (Diff, Diff)
where
    O: IntoIterator<Item = f64>,
    L: IntoIterator<Item = f64>,
{
    let s = p.shape;
    let (sq, hq, d) = (s.seqlen_q, s.heads_q, s.head_dim.max(1));
    // o element n is row (b, i, h) = (n / d / hq / sq, (n / d / hq) % sq, (n / d) % hq).
    let row_of = |n: usize| {
        let r = n / d;
        let (h, i, b) = (r % hq, (r / hq) % sq, r / hq / sq);
        (b * hq + h) * sq + i
    };
    diff_rows(o, lse, r, d, row_of)
}

/// `max(1, max |x|)` over a row's finite values: the scale its max-abs error is judged on.
pub fn row_scale(row: &[f64]) -> f64 {
    row.iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |a, x| a.max(x.abs()))
}

/// The diffs of [`diff_reference`] for any layout: `o` rows of `d` consecutive elements,
/// `row_of(n)` the lse (and precision) index of `o` element `n`.
pub fn diff_rows<O, L>(
    o: O,
    lse: L,
    r: &Reference,
    d: usize,
    row_of: impl Fn(usize) -> usize,
) -> (Diff, Diff)
where
    O: IntoIterator<Item = f64>,
    L: IntoIterator<Item = f64>,
{
    let d = d.max(1);
    let allow = |k: usize| {
        r.precision
            .get(k)
            .map(|pr| allowances(pr, r.lse[k]))
            .unwrap_or((0.0, 0.0))
    };
    let scales: Vec<f64> = r.o.chunks(d).map(row_scale).collect();
    let od = diff_within(
        o,
        &r.o,
        (0..r.o.len()).map(|n| (allow(row_of(n)).0, scales[n / d])),
    );
    let ld = diff_within(lse, &r.lse, (0..r.lse.len()).map(|k| (allow(k).1, 0.0)));
    (od, ld)
}

/// Pass/fail thresholds for one element type.
///
/// `o` passes when `rel_l2 <= o_rel_l2` and `max_abs <= o_max_abs * max(1, ref_max_abs)`, or
/// with row scales, each error within `o_max_abs` of its own row's `max(1, max |ref|)`;
/// `lse` passes when `max_abs <= lse_max_abs`. Neither passes with a lone NaN, a lone infinity
/// or a length mismatch. Errors that the f32 precision of a row's large logits explains are
/// forgiven row by row before these bounds apply ([`diff_reference`], [`allowances`]).
///
/// Why these numbers (the oracle runs on the same rounded inputs, so only the backend's own
/// arithmetic and the rounding of `o` count):
/// - **f16**: rounding `o` to f16 alone costs a half-ulp of 2^-11 ≈ 4.9e-4 per element
///   (≈ 3e-4 rel-L2); GPU kernels also round `P` to f16 before `P V`. With f32 accumulation
///   results land near 1e-3 rel-L2, so 2e-3 leaves 2x headroom.
/// - **bf16**: 7 stored mantissa bits instead of 10, so 2^3 = 8x looser for `o`.
/// - **f32** (CPU only): f32 accumulation and a 1.7e-7 exp polynomial; 1e-5 rel-L2.
/// - **lse** is never rounded to the element type (f32 from f32 scores): 2e-3 absolute for
///   f16/bf16 covers approximate `exp2`/`log2` on GPUs and ordinary logits; 1e-4 for f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Largest rel-L2 of `o`.
    pub o_rel_l2: f64,
    /// Largest max-abs of `o`, relative to `max(1, max |ref|)`.
    pub o_max_abs: f64,
    /// Largest absolute error of `lse` (natural log units).
    pub lse_max_abs: f64,
}

impl Tolerance {
    /// f16 inputs and output, f32 accumulation.
    pub const F16: Tolerance = Tolerance {
        o_rel_l2: 2e-3,
        o_max_abs: 1e-2,
        lse_max_abs: 2e-3,
    };
    /// bf16 inputs and output, f32 accumulation: 8x looser `o` than f16.
    pub const BF16: Tolerance = Tolerance {
        o_rel_l2: 1.6e-2,
        o_max_abs: 8e-2,
        lse_max_abs: 2e-3,
    };
    /// f32 inputs and output (CPU backend).
    pub const F32: Tolerance = Tolerance {
        o_rel_l2: 1e-5,
        o_max_abs: 1e-4,
        lse_max_abs: 1e-4,
    };

    /// The tolerance for an element type.
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F16 => Self::F16,
            DType::BF16 => Self::BF16,
            DType::F32 => Self::F32,
        }
    }

    /// `true` when `o`'s diff is within tolerance.
    pub fn o_ok(&self, d: &Diff) -> bool {
        let max_ok = match d.max_row_rel {
            Some(rel) => rel <= self.o_max_abs,
            None => d.max_abs <= self.o_max_abs * d.ref_max_abs.max(1.0),
        };
        d.is_clean() && d.rel_l2 <= self.o_rel_l2 && max_ok
    }

    /// `true` when `lse`'s diff is within tolerance.
    pub fn lse_ok(&self, d: &Diff) -> bool {
        d.is_clean() && d.max_abs <= self.lse_max_abs
    }

    /// `Ok` when both pass.
    ///
    /// # Errors
    /// [`AttnError::CheckFailed`] naming `what`, both diffs and the tolerance.
    pub fn check(&self, what: &str, o: &Diff, lse: &Diff) -> Result<()> {
        if self.o_ok(o) && self.lse_ok(lse) {
            return Ok(());
        }
        Err(AttnError::CheckFailed {
            what: format!(
                "{what}: o {o}; lse {lse}; tolerance o rel-L2 <= {:e}, o max-abs <= {:e} x max(1, |ref|), lse max-abs <= {:e} (after each row's f32-precision allowance)",
                self.o_rel_l2, self.o_max_abs, self.lse_max_abs
            ),
        })
    }
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

    /// Field report (turn 2, 1 and 2): each row is forgiven the error its own logits explain,
    /// and no more; a row with ordinary logits keeps the full tolerance.
    #[test]
    fn allowances_follow_each_rows_precision() {
        let p = crate::AttnProblem::new(crate::AttnShape::new(1, 1, 2, 2)).unwrap();
        // Two heads (one row each, d = 2): head 0 with logits ~7.7e4 and lse ~-5e4, head 1
        // ordinary.
        let big = RowPrecision {
            logits: 7.7e4,
            v_max: 3.0,
            candidate_spread: f64::INFINITY,
        };
        let small = RowPrecision {
            logits: 4.0,
            v_max: 3.0,
            candidate_spread: f64::INFINITY,
        };
        let exact_lse = -50_000.123_456_789_f64;
        let r = Reference {
            o: vec![0.5, -0.25, 0.5, -0.25],
            lse: vec![exact_lse, 2.5],
            precision: vec![big, small],
        };
        let two_steps = f64::from(f32::from_bits((exact_lse as f32).to_bits() + 2));
        let run = |o: [f64; 4], lse: [f64; 2]| {
            let (od, ld) = diff_reference(&p, o, lse, &r);
            Tolerance::BF16.check("t", &od, &ld)
        };
        // Two f32 steps of lse at -5e4 (7.8e-3): what f32 cannot avoid.
        assert!((two_steps - exact_lse).abs() > 5e-3);
        assert!(run([0.5, -0.25, 0.5, -0.25], [two_steps, 2.5]).is_ok());
        // An lse error of 0.5 there, and 0.09 in the ordinary row, are bugs.
        assert!(run([0.5, -0.25, 0.5, -0.25], [exact_lse + 0.5, 2.5]).is_err());
        assert!(run([0.5, -0.25, 0.5, -0.25], [exact_lse, 2.59]).is_err());
        // o off by 3 % in the ordinary row fails even beside the large-logit row (bf16 bound
        // 1.6e-2 rel-L2 over both rows).
        assert!(run([0.5, -0.25, 0.5 * 1.06, -0.25 * 1.06], [exact_lse, 2.5]).is_err());
        // The large-logit row's o allowance: 2 * 4 * 2^-24 * 7.7e4 * 3 = 0.11 absolute.
        let (a_o, a_lse) = allowances(&big, exact_lse);
        assert!(
            (a_o - 0.110).abs() < 1e-3 && a_lse > 0.03 && a_lse < 0.04,
            "{a_o} {a_lse}"
        );
        // Ordinary rows (logits ~10, |v| ~ 3) are forgiven ~1.4e-5: a thirtieth of f16's half-step.
        let (a_o, a_lse) = allowances(
            &RowPrecision {
                logits: 10.0,
                v_max: 3.0,
                candidate_spread: f64::INFINITY,
            },
            2.0,
        );
        assert!(a_o < 1.5e-5 && a_lse < 3e-6);
        // A row with small values is judged on its own scale: halving row 1 while row 0 is
        // 1000x larger fails the max-abs rule (global rel-L2 alone would not see it).
        let p2 = crate::AttnProblem::new(crate::AttnShape::new(1, 1, 2, 2)).unwrap();
        let r2 = Reference {
            o: vec![1000.0, -900.0, 0.8, -0.6],
            lse: vec![1.0, 1.0],
            precision: vec![small, small],
        };
        let (od, _) = diff_reference(&p2, [1000.0, -900.0, 0.4, -0.3], [1.0, 1.0], &r2);
        assert!(
            od.rel_l2 < Tolerance::F16.o_rel_l2 && !Tolerance::F16.o_ok(&od),
            "{od:?}"
        );
        // A NaN or infinite lse reference is given no size.
        assert_eq!(
            allowances(&small, f64::NEG_INFINITY).1,
            allowances(&small, 0.0).1
        );
    }

    /// Review report: at logits near 1e8 and beyond, `2 e v_max` exceeds any error, so the
    /// check passed an all-zero o. The candidate spread caps it: the zero o fails at every
    /// scale, and the CPU backend's real f32 answer still passes.
    #[test]
    fn huge_logits_still_judge_o() {
        for scale in [0.25f32, 1e3, 1e5, 1e8, 1e30] {
            let p = crate::AttnProblem::new(crate::AttnShape::new(1, 16, 2, 16))
                .unwrap()
                .with_scale(scale)
                .unwrap();
            let (q, k, v) = random_inputs::<f32>(&p, 7);
            let r = crate::reference::attention(&p, &q, &k, &v).unwrap();
            let tol = Tolerance::for_dtype(DType::F32);
            let zeros = vec![0.0f64; r.o.len()];
            let (od, ld) = diff_reference(&p, zeros, r.lse.clone(), &r);
            assert!(tol.check("zeros", &od, &ld).is_err(), "scale {scale}: {od}");
            let mut o = vec![0.0f32; q.len()];
            let mut lse = vec![0.0f32; r.lse.len()];
            crate::cpu::forward(&p, &q, &k, &v, &mut o, &mut lse).unwrap();
            let (od, ld) = diff_reference(&p, widen(&o), widen(&lse), &r);
            assert!(
                tol.check("cpu", &od, &ld).is_ok(),
                "scale {scale}: {od}; {ld}"
            );
        }
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
