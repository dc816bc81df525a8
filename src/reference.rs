//! The exact oracle: attention in f64 on the (already f16/bf16/f32-rounded) inputs.
//!
//! Every checker in the crate (CPU tests, the GPU `check` sweep, `flashattn run`) compares
//! against this. It materialises one row of scores at a time and one (batch, kv head) of K
//! and V in f64 (O(seqlen_k * head_dim) memory per rayon task), subtracts the row maximum
//! before exponentiating, and runs in parallel over (batch, kv head) and over rows.
//!
//! Semantics shared with every backend:
//! - the keys each row sees: [`AttnProblem::key_range`] (bottom-right causal and the sliding
//!   window); scores soft-capped and ALiBi-biased as [`crate::scores`] defines;
//! - a row that sees no key outputs `o = 0` and `lse = -inf`, never NaN (with a learnable
//!   sink, `lse = sink_h`: the sink joins every row's denominator, [`crate::scores`]);
//! - GQA: query head `h` reads kv head `h / (heads_q / heads_kv)`;
//! - NaN/Inf in the inputs propagate (IEEE arithmetic) into the rows that read them only.

use crate::dtype::Element;
use crate::error::Result;
use crate::shape::AttnProblem;
use rayon::prelude::*;

/// One exact row of [`attention_rows`]: dense `o` (`head_dim` values), `lse`, precision.
pub type ExactRow = (Vec<f64>, f64, RowPrecision);

/// The exact result of one attention call, in f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Output, dense `[batch, seqlen_q, heads_q, head_dim]` (whatever `o_strides` say).
    pub o: Vec<f64>,
    /// Natural-log logsumexp of the scaled scores (and the sink, if any), dense `[batch,
    /// heads_q, seqlen_q]`; `-inf` for rows that see no key (the sink's logit with a sink).
    pub lse: Vec<f64>,
    /// What limits the precision of each row in f32, dense `[batch, heads_q, seqlen_q]`.
    pub precision: Vec<RowPrecision>,
}

/// The sizes that f32 rounding of one query row grows with: every backend forms
/// `s_j = q . k_j * scale` in f32, whose error grows with `sum_c |q_c k_jc| * scale` (not with
/// `|s_j|`), and moves `o` by that error times the spread of the `v` rows
/// ([`crate::compare::Tolerance`] turns these into per-row allowances).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RowPrecision {
    /// `max_j (sum_c |q_c k_jc| * scale + |alibi bias_j|)` over the keys the row sees, and the
    /// sink's `|sink_h|` (0 when it sees none); non-finite products are skipped (NaN rows are
    /// judged by position).
    pub logits: f64,
    /// `max |v_jc|` over the keys the row sees (finite values; 0 when it sees none).
    pub v_max: f64,
    /// The widest channel range `max_c (max_j v_jc - min_j v_jc)` over the row's candidate
    /// keys: those whose score is within [`candidate_margin`] of the row's largest, i.e. every
    /// key that f32 rounding of the scores could give a weight that matters. Any answer f32
    /// arithmetic can produce is (up to negligible weights) a convex combination of their v
    /// rows, so it lies within this of the exact `o` in every channel: the cap on the
    /// row's allowance where the logits are so large that the per-score bound says nothing
    /// ([`crate::compare::allowances`]). A sink among the candidates counts as a v row of zeros.
    /// +inf when the row's scores are not all finite; 0 for a row that sees no key, or a row
    /// whose precision was not measured (no allowance).
    pub candidate_spread: f64,
}

/// f32 rounding steps, per unit of a row's logit size, that [`crate::compare::allowances`] forgives.
///
/// A score's f32 error grows like `sqrt(head_dim)` steps of `sum_c |q_c k_c| * scale` for
/// rounding errors of random sign (and at most `head_dim` steps); what the backends show is
/// smaller: the field report's GPU lse was 1.7 steps of its logits from the exact value (lse
/// ~ -5e4, two f32 steps of lse), the CPU's f32 `o` 2.5 steps at logits ~150. 4 covers both.
pub const PRECISION_STEPS: f64 = 4.0;

/// The f32 error bound of a score whose terms sum to `logits` in size:
/// `PRECISION_STEPS * 2^-24 * logits` (natural-log units).
pub fn score_error(logits: f64) -> f64 {
    PRECISION_STEPS * (f64::from(f32::EPSILON) / 2.0) * logits
}

/// How far below the row's largest score a key's exact score may sit and still be a
/// candidate: twice its f32 error bound `e` either way (the key's and the maximum's), plus
/// `ln(keys) + 12`, below which the keys' weights, even raised by the error, sum to less than
/// `exp(-12)` of the maximum's (6e-6, under every tolerance).
pub fn candidate_margin(score_error: f64, keys: usize) -> f64 {
    4.0 * score_error + (keys.max(1) as f64).ln() + 12.0
}

/// Exact attention in f64 on `q`, `k`, `v` laid out by `p`'s strides.
///
/// `s = (q . k) * softmax_scale` in f64 (the f32 scale widened exactly), then a stable
/// softmax (row max subtracted) and `o = sum p_j v_j / sum p_j`, `lse = max + ln(sum)`; a
/// sink's `exp(sink_h - max)` joins `sum` ([`crate::scores`]).
///
/// # Errors
/// Any error of [`AttnProblem::validate`], and [`crate::AttnError::BufferTooShort`] when
/// `q`, `k` or `v` is shorter than the problem's strides address.
pub fn attention<T: Element>(p: &AttnProblem, q: &[T], k: &[T], v: &[T]) -> Result<Reference> {
    p.validate()?;
    // o and lse are produced here, so only q, k, v lengths are checked.
    p.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    let s = p.shape;
    let (d, sq, hq, hkv) = (s.head_dim, s.seqlen_q, s.heads_q, s.heads_kv);
    let group = s.group_size();

    // One (batch, kv head) at a time per task: its K and V widened to f64 once
    // (O(seqlen_k * head_dim) memory per task), then every query row of its query heads.
    type Part = (Vec<f64>, Vec<(f64, RowPrecision)>);
    let parts: Vec<Part> = (0..s.batch * hkv)
        .into_par_iter()
        .map(|bk| {
            let (b, kvh) = (bk / hkv, bk % hkv);
            let kf = widen_rows(k, |j| p.k_strides.offset(b, j, kvh), s.seqlen_k, d);
            let vf = widen_rows(v, |j| p.v_strides.offset(b, j, kvh), s.seqlen_k, d);
            // Rows (h in the group, i), o [group, sq, d], lse [group, sq].
            let mut o = vec![0.0f64; group * sq * d];
            let mut lse = vec![(f64::NEG_INFINITY, RowPrecision::default()); group * sq];
            o.par_chunks_mut(d)
                .zip(lse.par_iter_mut())
                .enumerate()
                .for_each_init(
                    || (Vec::<f64>::new(), vec![0.0f64; d]),
                    |(scores, qrow), (r, (out, lse))| {
                        let (h, i) = (kvh * group + r / sq, r % sq);
                        let qo = p.q_strides.offset(b, i, h);
                        for (x, e) in qrow.iter_mut().zip(&q[qo..qo + d]) {
                            *x = e.to_f64();
                        }
                        let rule = RowRule::new(p, b, h, i);
                        *lse = row(&rule, qrow, &kf, &vf, scores, out);
                    },
                );
            (o, lse)
        })
        .collect();

    let mut o = vec![0.0f64; s.batch * sq * hq * d];
    let mut lse = vec![0.0f64; s.batch * hq * sq];
    let mut precision = vec![RowPrecision::default(); s.batch * hq * sq];
    for (bk, (po, pl)) in parts.iter().enumerate() {
        let (b, kvh) = (bk / hkv, bk % hkv);
        let h0 = kvh * group;
        let at = (b * hq + h0) * sq;
        for (n, &(l, pr)) in pl.iter().enumerate() {
            lse[at + n] = l;
            precision[at + n] = pr;
        }
        for (r, src) in po.chunks_exact(d).enumerate() {
            let (h, i) = (h0 + r / sq, r % sq);
            let at = ((b * sq + i) * hq + h) * d;
            o[at..at + d].copy_from_slice(src);
        }
    }
    Ok(Reference { o, lse, precision })
}

/// Exact `o` and `lse` of selected query rows only, for problems too large for
/// [`attention`] (e.g. seqlen 65537 squared): `rows` lists `(batch, query index, query head)`;
/// the result holds, for each, the dense `o` row (`head_dim` values), `lse` and the row's
/// [`RowPrecision`].
///
/// K and V of each (batch, kv head) that the rows need are widened to f64 once.
///
/// # Errors
/// As [`attention`], plus [`crate::AttnError::ShapeMismatch`] for a row out of range.
pub fn attention_rows<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    rows: &[(usize, usize, usize)],
) -> Result<Vec<ExactRow>> {
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    let s = p.shape;
    if let Some(&(b, i, h)) = rows
        .iter()
        .find(|&&(b, i, h)| b >= s.batch || i >= s.seqlen_q || h >= s.heads_q)
    {
        return Err(crate::AttnError::ShapeMismatch {
            what: format!("row (batch {b}, query {i}, head {h}) is outside the problem {s:?}"),
        });
    }
    let d = s.head_dim;
    let group = s.group_size();
    let mut kv_needed: Vec<(usize, usize)> = rows.iter().map(|&(b, _, h)| (b, h / group)).collect();
    kv_needed.sort_unstable();
    kv_needed.dedup();
    let mut out = vec![(Vec::new(), 0.0f64, RowPrecision::default()); rows.len()];
    for (b, kvh) in kv_needed {
        let kf = widen_rows(k, |j| p.k_strides.offset(b, j, kvh), s.seqlen_k, d);
        let vf = widen_rows(v, |j| p.v_strides.offset(b, j, kvh), s.seqlen_k, d);
        out.par_iter_mut()
            .zip(rows.par_iter())
            .filter(|(_, r)| r.0 == b && r.2 / group == kvh)
            .for_each(|(slot, &(_, i, h))| {
                let qo = p.q_strides.offset(b, i, h);
                let qrow: Vec<f64> = q[qo..qo + d].iter().map(|e| e.to_f64()).collect();
                let mut o = vec![0.0f64; d];
                let rule = RowRule::new(p, b, h, i);
                let (lse, pr) = row(&rule, &qrow, &kf, &vf, &mut Vec::new(), &mut o);
                *slot = (o, lse, pr);
            });
    }
    Ok(out)
}

/// Rows `0..n` of one (batch, head) of a bshd tensor, widened to dense f64 `[n, d]`.
fn widen_rows<T: Element>(
    x: &[T],
    offset: impl Fn(usize) -> usize,
    n: usize,
    d: usize,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n * d);
    for j in 0..n {
        let o = offset(j);
        out.extend(x[o..o + d].iter().map(|e| e.to_f64()));
    }
    out
}

/// How one query row scores its keys: the keys it sees, the scale, and the modifiers.
pub(crate) struct RowRule<'a> {
    /// The keys the row sees.
    pub keys: std::ops::Range<usize>,
    scale: f64,
    slope: f64,
    /// The learnable sink's logit of the row's head (`None` without a sink).
    pub sink: Option<f64>,
    i: usize,
    sq: usize,
    sk: usize,
    mods: &'a crate::scores::ScoreMods,
}

impl<'a> RowRule<'a> {
    /// The rule of query row `i` of (batch `b`, query head `h`).
    pub fn new(p: &'a AttnProblem, b: usize, h: usize, i: usize) -> Self {
        let s = p.shape;
        RowRule {
            keys: p.key_range(i),
            scale: f64::from(p.softmax_scale),
            slope: p
                .scores
                .alibi
                .as_ref()
                .map_or(0.0, |a| f64::from(a.slope(b, h, s.heads_q))),
            sink: p.scores.sink_of(h),
            i,
            sq: s.seqlen_q,
            sk: s.seqlen_k,
            mods: &p.scores,
        }
    }

    /// The scaled dot product `q . k_j * scale` of key `j`.
    pub fn scaled(&self, dot: f64) -> f64 {
        dot * self.scale
    }

    /// The score of key `j` from its scaled dot product (soft-capped, ALiBi-biased).
    pub fn score(&self, scaled: f64, j: usize) -> f64 {
        self.mods
            .score(scaled, self.slope, self.i, j, self.sq, self.sk)
    }

    /// d score / d scaled dot product.
    pub fn score_grad(&self, scaled: f64) -> f64 {
        self.mods.score_grad(scaled)
    }

    /// The row's `lse` from the largest of its key scores `m` and `sum = sum_j exp(s_j - m)`,
    /// with the sink's term added: `(max, sum)` re-based on `max(m, sink)`, and the factor
    /// `exp(m - max)` that re-bases `o`'s numerator. Without a sink, `(m, sum, 1)`.
    pub fn with_sink(&self, m: f64, sum: f64) -> (f64, f64, f64) {
        match self.sink {
            None => (m, sum, 1.0),
            Some(sink) => {
                // f64::max skips a NaN m; a NaN sum still propagates.
                let top = m.max(sink);
                let alpha = if m == f64::NEG_INFINITY {
                    0.0
                } else {
                    (m - top).exp()
                };
                (top, sum * alpha + (sink - top).exp(), alpha)
            }
        }
    }

    /// The `lse` of a row that sees no key: the sink's logit, or `-inf` without one.
    pub fn empty_lse(&self) -> f64 {
        self.sink.unwrap_or(f64::NEG_INFINITY)
    }
}

/// One query row against the keys its rule lets it see: writes `out` (`o`, zero when it sees
/// none) and returns `lse` ([`RowRule::empty_lse`] when it sees none) with the row's precision.
fn row(
    rule: &RowRule,
    qrow: &[f64],
    kf: &[f64],
    vf: &[f64],
    scores: &mut Vec<f64>,
    out: &mut [f64],
) -> (f64, RowPrecision) {
    let d = qrow.len();
    let keys = rule.keys.clone();
    if keys.is_empty() {
        return (rule.empty_lse(), RowPrecision::default()); // o stays 0
    }
    scores.clear();
    scores.extend(keys.clone().map(|j| {
        let kr = &kf[j * d..(j + 1) * d];
        rule.score(rule.scaled(dot(qrow, kr)), j)
    }));
    let finite_max = |acc: f64, x: f64| if x.is_finite() { acc.max(x) } else { acc };
    // f64::max skips NaN, but a NaN score still turns exp(s - m) into NaN below.
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let logits = keys
        .clone()
        .map(|j| {
            let kr = &kf[j * d..(j + 1) * d];
            let a: f64 = qrow
                .iter()
                .zip(kr)
                .map(|(x, y)| (x * y).abs())
                .filter(|x| x.is_finite())
                .sum();
            // Plus the ALiBi bias (score of 0): a kernel rounds their sum in f32.
            rule.scaled(a) + rule.score(0.0, j).abs()
        })
        .fold(rule.sink.map_or(0.0, f64::abs), finite_max);
    let v_rows = &vf[keys.start * d..keys.end * d];
    let precision = RowPrecision {
        logits,
        v_max: v_rows.iter().map(|x| x.abs()).fold(0.0, finite_max),
        candidate_spread: candidate_spread(scores, m, rule.sink, v_rows, d, logits),
    };
    let mut sum = 0.0f64;
    for sc in scores.iter_mut() {
        *sc = (*sc - m).exp();
        sum += *sc;
    }
    for (&pj, vr) in scores.iter().zip(v_rows.chunks_exact(d)) {
        out.iter_mut().zip(vr).for_each(|(acc, x)| *acc += pj * x);
    }
    let (top, sum, alpha) = rule.with_sink(m, sum);
    out.iter_mut().for_each(|x| *x = *x * alpha / sum);
    (top + sum.ln(), precision)
}

/// [`RowPrecision::candidate_spread`] of a row: its `scores` (max `m`) against the keys' `v`
/// rows (`d` values each), for the row's `logits` size; a `sink` within the margin is a
/// candidate whose v row is all zeros.
fn candidate_spread(
    scores: &[f64],
    m: f64,
    sink: Option<f64>,
    v: &[f64],
    d: usize,
    logits: f64,
) -> f64 {
    if !m.is_finite() || !scores.iter().all(|x| x.is_finite()) {
        return f64::INFINITY;
    }
    let m = sink.map_or(m, |s| m.max(s));
    let floor = m - candidate_margin(
        score_error(logits),
        scores.len() + usize::from(sink.is_some()),
    );
    let zero_in = sink.is_some_and(|s| s >= floor);
    let mut lo = vec![if zero_in { 0.0 } else { f64::INFINITY }; d];
    let mut hi = vec![if zero_in { 0.0 } else { f64::NEG_INFINITY }; d];
    for (&sc, vr) in scores.iter().zip(v.chunks_exact(d)) {
        if sc >= floor {
            for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(vr) {
                *l = l.min(x);
                *h = h.max(x);
            }
        }
    }
    // An infinite v value leaves its channel unbounded (NaN values, which min and max skip,
    // are judged by position).
    lo.iter()
        .zip(&hi)
        .map(|(l, h)| {
            if l.is_finite() && h.is_finite() {
                h - l
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// Dot product with four independent partial sums (vectorises).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}
