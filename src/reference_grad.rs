//! The exact oracle of the backward pass: gradients of attention in f64.
//!
//! With `x_ij = softmax_scale * q_i . k_j`, the score `s_ij = f(x_ij)` (soft-capped and
//! ALiBi-biased, [`crate::scores`]) over the keys row `i` sees ([`AttnProblem::key_range`],
//! the rule the forward uses), `p_ij = exp(s_ij - lse_i)` and `o_i = sum_j p_ij v_j`, the
//! gradients of a loss with `dL/do_i = do_i` are (FlashAttention-2, Dao 2023, arXiv
//! 2307.08691, Algorithm 2, computed here directly, with no tiling):
//! - `dv_j = sum_i p_ij do_i`,
//! - `dp_ij = do_i . v_j`, `D_i = do_i . o_i` (= `sum_j p_ij dp_ij`),
//! - `ds_ij = p_ij (dp_ij - D_i) f'(x_ij)` (`f' = 1 - tanh^2(x / c)` with a softcap, else 1),
//! - `dq_i = scale * sum_j ds_ij k_j`, `dk_j = scale * sum_i ds_ij q_i`.
//!
//! With a learnable sink ([`crate::scores`]) `lse_i` includes `exp(sink_h)`, so the sink's
//! probability is `p_i,sink = exp(sink_h - lse_i)` and the keys' `p_ij` sum to `1 - p_i,sink`.
//! The formulas above still hold: `ds_ij = p_ij (dp_ij - sum_k p_ik dp_ik)` differentiates the
//! softmax over keys and sink alike (the sink has no value row, so `dp_i,sink = 0`), and
//! `sum_k p_ik dp_ik = do_i . o_i = D_i` with the sink-normalised `o_i`. The sink's own
//! gradient is `dsink_h = sum_{b, i} p_i,sink (dp_i,sink - D_i) = -sum_{b, i} exp(sink_h -
//! lse_i) D_i` over every batch entry and row of head `h` (a row that sees no key has `o = 0`,
//! so `D_i = 0`: it adds nothing).
//!
//! GQA/MQA: `dk` and `dv` of a kv head sum over the query heads that read it. A row that sees
//! no key has `o = 0` whatever the inputs, so it contributes nothing. The gradients of the
//! oracle are themselves checked against central finite differences of [`forward_f64`]
//! (tests/reference_grad.rs).

use crate::dtype::Element;
use crate::error::Result;
use crate::reference::RowRule;
use crate::shape::{AttnProblem, Strides};
use rayon::prelude::*;

/// Exact gradients, dense: `dq` `[batch, seqlen_q, heads_q, head_dim]`, `dk` and `dv`
/// `[batch, seqlen_k, heads_kv, head_dim]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// Gradient of q.
    pub dq: Vec<f64>,
    /// Gradient of k (summed over the query heads of each kv head).
    pub dk: Vec<f64>,
    /// Gradient of v (summed over the query heads of each kv head).
    pub dv: Vec<f64>,
    /// Gradient of the learnable sink, `[heads_q]` (summed over batch and rows); `None` without
    /// a sink.
    pub d_sink: Option<Vec<f64>>,
}

/// Exact gradients of attention on `q`, `k`, `v` laid out by `p`'s strides, for the output
/// gradient `d_o` (dense `[batch, seqlen_q, heads_q, head_dim]`, the layout `o` comes back in).
///
/// # Errors
/// Any error of [`AttnProblem::validate`]; [`crate::AttnError::BufferTooShort`] when `q`, `k`, `v`
/// or `d_o` is shorter than the problem addresses.
pub fn backward<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
) -> Result<Gradients> {
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len(), usize::MAX, usize::MAX)?;
    let s = p.shape;
    let n_o = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    crate::error::check_len("do", d_o.len(), n_o)?;
    let dense = |x: &[T], st: Strides, seqlen: usize, heads: usize| {
        let mut out = Vec::with_capacity(s.batch * seqlen * heads * s.head_dim);
        for b in 0..s.batch {
            for i in 0..seqlen {
                for h in 0..heads {
                    let at = st.offset(b, i, h);
                    out.extend(x[at..at + s.head_dim].iter().map(|e| e.to_f64()));
                }
            }
        }
        out
    };
    let qd = dense(q, p.q_strides, s.seqlen_q, s.heads_q);
    let kd = dense(k, p.k_strides, s.seqlen_k, s.heads_kv);
    let vd = dense(v, p.v_strides, s.seqlen_k, s.heads_kv);
    let dod: Vec<f64> = d_o[..n_o].iter().map(|e| e.to_f64()).collect();
    Ok(backward_f64(p, &qd, &kd, &vd, &dod))
}

/// One (batch, query head, row) of the dense forward: `(j, p_j, x_j)` over the keys its rule
/// lets it see (`x_j` the scaled dot product), and `lse` (with the sink's term;
/// [`RowRule::empty_lse`] when it sees none).
fn probabilities(
    rule: &RowRule,
    qi: &[f64],
    kh: &[f64],
    stride: usize,
) -> (Vec<(usize, f64, f64)>, f64) {
    let d = qi.len();
    if rule.keys.is_empty() {
        return (Vec::new(), rule.empty_lse());
    }
    let x: Vec<(usize, f64)> = rule
        .keys
        .clone()
        .map(|j| (j, rule.scaled(dot(qi, &kh[j * stride..j * stride + d]))))
        .collect();
    let s: Vec<f64> = x.iter().map(|&(j, xj)| rule.score(xj, j)).collect();
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = s.iter().map(|v| (v - m).exp()).sum();
    let (top, sum, _) = rule.with_sink(m, sum);
    let lse = top + sum.ln();
    let pr = x
        .iter()
        .zip(&s)
        .map(|(&(j, xj), sj)| (j, (sj - lse).exp(), xj))
        .collect();
    (pr, lse)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Exact attention in f64 on dense inputs (`q` `[batch, seqlen_q, heads_q, head_dim]`, `k`
/// and `v` `[batch, seqlen_k, heads_kv, head_dim]`; `p`'s strides are ignored): dense `o` and
/// `lse` `[batch, heads_q, seqlen_q]`, as [`crate::reference::attention`] computes them. The
/// forward the finite-difference tests differentiate.
///
/// # Panics
/// When a buffer is shorter than the dense sizes of `p`.
pub fn forward_f64(p: &AttnProblem, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let s = p.shape;
    let (d, sq, sk, hq, hkv) = (s.head_dim, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv);
    let group = s.group_size();
    let mut o = vec![0.0; s.batch * sq * hq * d];
    let mut lse = vec![0.0; s.batch * hq * sq];
    for b in 0..s.batch {
        for h in 0..hq {
            let kh = &k[(b * sk * hkv + h / group) * d..];
            let vh = &v[(b * sk * hkv + h / group) * d..];
            for i in 0..sq {
                let at = ((b * sq + i) * hq + h) * d;
                let rule = RowRule::new(p, b, h, i);
                let (pr, l) = probabilities(&rule, &q[at..at + d], kh, hkv * d);
                lse[(b * hq + h) * sq + i] = l;
                for &(j, pj, _) in &pr {
                    for c in 0..d {
                        o[at + c] += pj * vh[j * hkv * d + c];
                    }
                }
            }
        }
    }
    (o, lse)
}

/// [`backward`] on dense f64 inputs (layouts as [`forward_f64`]; `p`'s strides are ignored).
///
/// # Panics
/// When a buffer is shorter than the dense sizes of `p`.
pub fn backward_f64(p: &AttnProblem, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> Gradients {
    let s = p.shape;
    let (d, sq, sk, hq, hkv) = (s.head_dim, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv);
    let group = s.group_size();
    let scale = f64::from(p.softmax_scale);
    // One task per (batch, kv head): its dk and dv rows, dq of its query heads, and their
    // sink gradients.
    type Part = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);
    let parts: Vec<Part> = (0..s.batch * hkv)
        .into_par_iter()
        .map(|bk| {
            let (b, kvh) = (bk / hkv, bk % hkv);
            let kh = &k[(b * sk * hkv + kvh) * d..];
            let vh = &v[(b * sk * hkv + kvh) * d..];
            let row = |j: usize| j * hkv * d;
            let mut dk = vec![0.0; sk * d];
            let mut dv = vec![0.0; sk * d];
            let mut dq = vec![0.0; group * sq * d];
            let mut dsink = vec![0.0; group];
            for g in 0..group {
                let h = kvh * group + g;
                for i in 0..sq {
                    let at = ((b * sq + i) * hq + h) * d;
                    let (qi, doi) = (&q[at..at + d], &d_o[at..at + d]);
                    let rule = RowRule::new(p, b, h, i);
                    let (pr, lse) = probabilities(&rule, qi, kh, hkv * d);
                    // o_i, then D_i = do_i . o_i.
                    let mut oi = vec![0.0; d];
                    for &(j, pj, _) in &pr {
                        oi.iter_mut()
                            .zip(&vh[row(j)..row(j) + d])
                            .for_each(|(a, x)| *a += pj * x);
                    }
                    let di = dot(doi, &oi);
                    if let Some(sink) = rule.sink {
                        dsink[g] -= (sink - lse).exp() * di;
                    }
                    let dqi = &mut dq[(g * sq + i) * d..(g * sq + i + 1) * d];
                    for &(j, pj, xj) in &pr {
                        let (kj, vj) = (&kh[row(j)..row(j) + d], &vh[row(j)..row(j) + d]);
                        let ds = pj * (dot(doi, vj) - di) * rule.score_grad(xj);
                        for c in 0..d {
                            dv[j * d + c] += pj * doi[c];
                            dk[j * d + c] += scale * ds * qi[c];
                            dqi[c] += scale * ds * kj[c];
                        }
                    }
                }
            }
            (dq, dk, dv, dsink)
        })
        .collect();
    let mut out = Gradients {
        dq: vec![0.0; s.batch * sq * hq * d],
        dk: vec![0.0; s.batch * sk * hkv * d],
        dv: vec![0.0; s.batch * sk * hkv * d],
        d_sink: p.scores.sink.as_ref().map(|_| vec![0.0; hq]),
    };
    for (bk, (dq, dk, dv, dsink)) in parts.into_iter().enumerate() {
        let (b, kvh) = (bk / hkv, bk % hkv);
        if let Some(ds) = out.d_sink.as_mut() {
            for (g, x) in dsink.iter().enumerate() {
                ds[kvh * group + g] += x;
            }
        }
        for j in 0..sk {
            let at = ((b * sk + j) * hkv + kvh) * d;
            out.dk[at..at + d].copy_from_slice(&dk[j * d..(j + 1) * d]);
            out.dv[at..at + d].copy_from_slice(&dv[j * d..(j + 1) * d]);
        }
        for g in 0..group {
            for i in 0..sq {
                let at = ((b * sq + i) * hq + kvh * group + g) * d;
                out.dq[at..at + d].copy_from_slice(&dq[(g * sq + i) * d..(g * sq + i + 1) * d]);
            }
        }
    }
    out
}
