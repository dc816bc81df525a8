//! The FP8 oracle: exact attention (f64) of the dequantised inputs (`x * descale`, exact in
//! f64), with what the GPU kernel's e4m3 arithmetic may move each result by.
//!
//! # The FP8 tolerance, derived
//!
//! The inputs are the oracle's own (dequantised exactly), so only the kernel's arithmetic
//! counts. Its error sources, per query row with exact weights `p_j = exp(s_j - max)` (the
//! row's largest key has `p = 1`), `P = sum p_j`, `o = sum p_j v_j / P`:
//!
//! 1. **P quantised to e4m3** for the P V product (the Tensor Cores take e4m3 A operands). The
//!    kernel rounds each `p_j` (relative to a running maximum at most the final one, so its
//!    values are at least these) to e4m3 by RNE: the error is at most `b_j` = half an e4m3 ulp
//!    at `p_j`, i.e. `2^(floor(log2 p_j) - 4)` (at most `p_j / 16`) for `p_j >= 2^-6`, and
//!    `min(p_j, 2^-10)` below (subnormal half-step, or a flush to 0).
//! 2. **S = Q K^T** on e4m3 operands: every product is exact, the sums run in the Tensor
//!    Cores' accumulator, which keeps fewer bits than f32 for FP8 (DeepSeek-V3's report: about
//!    14 on H800). Bound taken: `2^-12` (4x that) of the row's logit size `sum_c |q_c k_jc| *
//!    scale` per key, a relative error `c_j = p_j * 2^-12 * logits_j` of `p_j`.
//! 3. **The row sum** comes from the same quantised P (the kernel sums P on the Tensor Cores:
//!    a column of ones beside V), so `o~ = sum p~_j v_j / sum p~_j` stays a convex combination,
//!    and exactly `o~_c - o_c = sum_j (p~_j - p_j)(v_jc - o_c) / sum p~_j`.
//! 4. **o rounded to bf16**: `2^-8 |o_c|` (half an ulp of 8 significant bits).
//!
//! Hence, with `B = sum_j (b_j + c_j)` (always below `P`: the largest key alone has `b = 1/16`
//! of its `p = 1`, unless a row spreads its weight over many keys flushed to 0, where the bound
//! honestly grows):
//! - **o, every element** (worst case, every rounding against us):
//!   `|o~_c - o_c| <= sum_j (b_j + c_j) |v_jc - o_c| / (P - B) + 2^-8 |o_c|` ([`Fp8Reference::o_allow`]).
//!   Rigorous, but loose for diffuse rows (it can exceed `|o|` itself), so it catches large local
//!   errors only; hence also:
//! - **o, statistically**: RNE errors are spread uniformly over `[-b_j, b_j]` (variance at most
//!   `b_j^2 / 3`) and independent across keys, so element c has an rms error of at most
//!   `n_c = sqrt(sum_j b_j^2 (v_jc - o_c)^2 / 3) / P` (plus the bf16 term, `2^-8 |o_c| /
//!   sqrt(3)`; [`Fp8Reference::o_noise`]). The check requires `||o~ - o||_2 <= 2 ||n||_2`
//!   ([`NOISE_RATIO_MAX`]): an emulation of the kernel's arithmetic measures 0.7-0.85 (its
//!   errors are below the bound), while a wrong permutation of P's fragment measures 27-106,
//!   a missing descale 90-5000, a zero output over 5 (tests/fp8.rs injects each).
//! - **lse = max + ln(sum p~_j)**: `|lse~ - lse| <= -ln(1 - B / P)` plus the f32 part of the
//!   16-bit kernels' bound, 2e-3 ([`Fp8Reference::lse_allow`]).
//!
//! For typical rows (scores ~ N(0, 1), thousands of keys) the rel-L2 error of o is about
//! 1.5-2.5 % (the emulation's, at 200-513 keys): FP8 attention is that coarse, which is why the check is stated in units of the
//! rounding noise rather than as one rel-L2 number.

use super::Fp8Descales;
use super::e4m3::E4m3;
use crate::error::Result;
use crate::reference::RowRule;
use crate::shape::AttnProblem;
use rayon::prelude::*;

/// The relative accuracy of one S = Q K^T score per unit of its logit size (item 2 above).
pub const S_ERROR: f64 = 1.0 / 4096.0;
/// The f32 part of the lse bound (as the 16-bit kernels' [`crate::compare::Tolerance`]).
pub const LSE_F32: f64 = 2e-3;
/// bf16's half-ulp, relative (item 4 above).
pub const BF16_HALF_ULP: f64 = 1.0 / 256.0;
/// The largest `||o~ - o||_2 / ||n||_2` a correct kernel may show (see the module docs).
pub const NOISE_RATIO_MAX: f64 = 2.0;

/// The exact result of one FP8 call and its per-element bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Reference {
    /// `o`, dense `[batch, seqlen_q, heads_q, head_dim]`.
    pub o: Vec<f64>,
    /// `lse`, `[batch, heads_q, seqlen_q]`; `-inf` for rows that see no key.
    pub lse: Vec<f64>,
    /// Worst-case error of each `o` element (same layout as `o`; +inf where unbounded).
    pub o_allow: Vec<f64>,
    /// rms rounding noise of each `o` element (same layout as `o`).
    pub o_noise: Vec<f64>,
    /// Worst-case error of each `lse` (same layout as `lse`).
    pub lse_allow: Vec<f64>,
}

/// One row's results: o, allowances, noise (each `d` values), lse, lse allowance.
type Row = (Vec<f64>, Vec<f64>, Vec<f64>, f64, f64);

/// Exact FP8 attention of `q`, `k`, `v` (laid out by `p`'s strides) dequantised by `descales`.
///
/// # Errors
/// Those of [`crate::fp8::check_call`] (a learnable sink among them).
pub fn attention(
    p: &AttnProblem,
    q: &[E4m3],
    k: &[E4m3],
    v: &[E4m3],
    descales: &Fp8Descales,
) -> Result<Fp8Reference> {
    crate::fp8::check_call(
        p,
        descales,
        [q.len(), k.len(), v.len(), usize::MAX, usize::MAX],
    )?;
    let s = p.shape;
    let (d, sq, hq, hkv) = (s.head_dim, s.seqlen_q, s.heads_q, s.heads_kv);
    let group = s.group_size();
    let rows: Vec<Row> = (0..s.batch * hkv)
        .into_par_iter()
        .flat_map_iter(|bk| {
            let (b, kvh) = (bk / hkv, bk % hkv);
            let [dq, dk, dv] = descales.at(b, kvh, hkv).map(f64::from);
            let widen = |x: &[E4m3], st: crate::shape::Strides, scale: f64| {
                let mut out = Vec::with_capacity(s.seqlen_k * d);
                for j in 0..s.seqlen_k {
                    let o = st.offset(b, j, kvh);
                    out.extend(x[o..o + d].iter().map(|e| f64::from(e.to_f32()) * scale));
                }
                out
            };
            let kf = widen(k, p.k_strides, dk);
            let vf = widen(v, p.v_strides, dv);
            (0..group * sq)
                .map(|r| {
                    let (h, i) = (kvh * group + r / sq, r % sq);
                    let qo = p.q_strides.offset(b, i, h);
                    let qrow: Vec<f64> = q[qo..qo + d]
                        .iter()
                        .map(|e| f64::from(e.to_f32()) * dq)
                        .collect();
                    ((b, h, i), row(&RowRule::new(p, b, h, i), &qrow, &kf, &vf))
                })
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .into_iter()
        .fold(
            vec![(Vec::new(), Vec::new(), Vec::new(), 0.0, 0.0); s.batch * sq * hq],
            |mut acc, ((b, h, i), r)| {
                acc[(b * sq + i) * hq + h] = r;
                acc
            },
        );
    let mut out = Fp8Reference {
        o: Vec::with_capacity(rows.len() * d),
        lse: vec![0.0; s.lse_len()],
        o_allow: Vec::with_capacity(rows.len() * d),
        o_noise: Vec::with_capacity(rows.len() * d),
        lse_allow: vec![0.0; s.lse_len()],
    };
    for (n, (o, allow, noise, lse, lse_allow)) in rows.into_iter().enumerate() {
        let (h, i, b) = (n % hq, (n / hq) % sq, n / hq / sq);
        out.o.extend(o);
        out.o_allow.extend(allow);
        out.o_noise.extend(noise);
        out.lse[(b * hq + h) * sq + i] = lse;
        out.lse_allow[(b * hq + h) * sq + i] = lse_allow;
    }
    Ok(out)
}

/// One query row: exact o and lse with their bounds (see the module docs).
fn row(rule: &RowRule, qrow: &[f64], kf: &[f64], vf: &[f64]) -> Row {
    let d = qrow.len();
    let keys = rule.keys.clone();
    if keys.is_empty() {
        return (
            vec![0.0; d],
            vec![0.0; d],
            vec![0.0; d],
            f64::NEG_INFINITY,
            0.0,
        );
    }
    let mut s = Vec::with_capacity(keys.len());
    let mut logits = Vec::with_capacity(keys.len());
    for j in keys.clone() {
        let kr = &kf[j * d..(j + 1) * d];
        let dot: f64 = qrow.iter().zip(kr).map(|(a, b)| a * b).sum();
        s.push(rule.score(rule.scaled(dot), j));
        let size: f64 = qrow.iter().zip(kr).map(|(a, b)| (a * b).abs()).sum();
        logits.push(rule.scaled(size));
    }
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let pj: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let big_p: f64 = pj.iter().sum();
    // b_j (quantisation) and c_j (S accumulation) of each key.
    let bj: Vec<f64> = pj
        .iter()
        .map(|&x| {
            if x >= f64::from(E4m3::MIN_NORMAL) {
                E4m3::half_ulp(x)
            } else {
                x.min(2f64.powi(-10))
            }
        })
        .collect();
    let cj: Vec<f64> = pj
        .iter()
        .zip(&logits)
        .map(|(x, l)| x * S_ERROR * l)
        .collect();
    let big_b: f64 = bj.iter().zip(&cj).map(|(b, c)| b + c).sum();
    let v_rows = &vf[keys.start * d..keys.end * d];
    let mut o = vec![0.0f64; d];
    for (&w, vr) in pj.iter().zip(v_rows.chunks_exact(d)) {
        o.iter_mut().zip(vr).for_each(|(acc, x)| *acc += w * x);
    }
    o.iter_mut().for_each(|x| *x /= big_p);
    let mut worst = vec![0.0f64; d];
    let mut var = vec![0.0f64; d];
    for ((&b, &c), vr) in bj.iter().zip(&cj).zip(v_rows.chunks_exact(d)) {
        for ch in 0..d {
            let dv = (vr[ch] - o[ch]).abs();
            worst[ch] += (b + c) * dv;
            var[ch] += b * b * dv * dv;
        }
    }
    let room = big_p - big_b;
    let allow: Vec<f64> = (0..d)
        .map(|ch| {
            let bf16 = BF16_HALF_ULP * o[ch].abs();
            if room > 0.0 {
                worst[ch] / room + bf16
            } else {
                f64::INFINITY
            }
        })
        .collect();
    let noise: Vec<f64> = (0..d)
        .map(|ch| {
            let bf16 = BF16_HALF_ULP * o[ch].abs();
            ((var[ch] / (big_p * big_p) + bf16 * bf16) / 3.0).sqrt()
        })
        .collect();
    let lse_allow = if room > 0.0 {
        -(1.0 - big_b / big_p).ln() + LSE_F32
    } else {
        f64::INFINITY
    };
    (o, allow, noise, m + big_p.ln(), lse_allow)
}
