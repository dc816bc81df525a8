//! The CPU backward pass: dq, dk, dv from q, k, v, the forward's o and lse, and do.
//!
//! FlashAttention-2's algorithm (Dao 2023, arXiv 2307.08691, Algorithm 2) without the tiling:
//! P is recomputed from q, k and the saved lse (never stored), `D_i = do_i . o_i`, and for
//! every visible key `ds_ij = p_ij (do_i . v_j - D_i)`; `dv_j += p_ij do_i`,
//! `dk_j += scale ds_ij q_i`, `dq_i += scale ds_ij k_j`, all in f32. One rayon task per
//! (batch, kv head) owns that head's dk and dv and the dq rows of its query heads, in a fixed
//! order, so the result is the same bytes run to run and for any thread count. The visible
//! keys, soft-capping and ALiBi follow [`AttnProblem::key_range`] and [`crate::scores`], the
//! forward's rules (a softcap multiplies `ds` by `1 - tanh^2`).
//!
//! A learnable sink needs nothing here beyond the forward's `lse` (which includes it: the keys'
//! `p_ij = exp(s_ij - lse_i)` and `D_i` are then exactly the sink-aware ones,
//! [`crate::reference_grad`] derives it); its own gradient is [`sink_grad`].

use crate::dtype::Element;
use crate::error::{AttnError, Result};
use crate::reference::RowRule;
use crate::shape::AttnProblem;
use rayon::prelude::*;

/// The length checks of every backward (CPU and GPU): `[q, k, v, o, lse, do]` through the
/// problem's layout (`do` through `o`'s strides, and named `do` in the error), `[dq, dk, dv]`
/// against their dense sizes.
///
/// # Errors
/// [`AttnError::BufferTooShort`] naming the first buffer that is too short.
pub(crate) fn check_buffers(p: &AttnProblem, inputs: [usize; 6], grads: [usize; 3]) -> Result<()> {
    let [q, k, v, o, lse, d_o] = inputs;
    p.check_lengths(q, k, v, o, lse)?;
    p.check_lengths(q, k, v, d_o, lse).map_err(|e| match e {
        AttnError::BufferTooShort {
            tensor: "o",
            len,
            required,
        } => AttnError::BufferTooShort {
            tensor: "do",
            len,
            required,
        },
        other => other,
    })?;
    let s = p.shape;
    let n_q = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let n_k = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
    for ((name, len), required) in ["dq", "dk", "dv"]
        .into_iter()
        .zip(grads)
        .zip([n_q, n_k, n_k])
    {
        crate::error::check_len(name, len, required)?;
    }
    Ok(())
}

/// Gradients on host buffers. `q`, `k`, `v` are read through the problem's strides, `o` and
/// `d_o` through `o_strides` (`do` has `o`'s layout); `lse` is the forward's, dense
/// `[batch, heads_q, seqlen_q]` f32 natural log. `dq` is written dense `[batch, seqlen_q,
/// heads_q, head_dim]`, `dk` and `dv` dense `[batch, seqlen_k, heads_kv, head_dim]` (summed
/// over the query heads of each kv head), in the element type.
///
/// # Errors
/// Any error of [`AttnProblem::validate`] and [`AttnProblem::check_lengths`] (also for `d_o`
/// against `o`'s strides); [`AttnError::BufferTooShort`] for `dq`, `dk` or `dv` shorter than
/// their dense sizes. Nothing is written when one is returned.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_o: &[T],
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) -> Result<()> {
    p.validate()?;
    check_buffers(
        p,
        [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len()],
        [dq.len(), dk.len(), dv.len()],
    )?;
    let s = p.shape;
    let (d, sq, sk, hq, hkv) = (s.head_dim, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv);
    let group = s.group_size();
    let scale = p.softmax_scale;
    let plain = p.scores.softcap.is_none() && p.scores.alibi.is_none();
    let row =
        |x: &[T], at: usize| -> Vec<f32> { x[at..at + d].iter().map(|e| e.to_f32()).collect() };
    // Per (batch, kv head): dk, dv [sk, d] and dq [group, sq, d], in f32.
    let parts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..s.batch * hkv)
        .into_par_iter()
        .map(|bk| {
            let (b, kvh) = (bk / hkv, bk % hkv);
            let kf: Vec<Vec<f32>> = (0..sk)
                .map(|j| row(k, p.k_strides.offset(b, j, kvh)))
                .collect();
            let vf: Vec<Vec<f32>> = (0..sk)
                .map(|j| row(v, p.v_strides.offset(b, j, kvh)))
                .collect();
            let (mut dkf, mut dvf) = (vec![0.0f32; sk * d], vec![0.0f32; sk * d]);
            let mut dqf = vec![0.0f32; group * sq * d];
            for g in 0..group {
                let h = kvh * group + g;
                for i in 0..sq {
                    let rule = RowRule::new(p, b, h, i);
                    if rule.keys.is_empty() {
                        continue; // o = 0 whatever the inputs: no gradient
                    }
                    let qi = row(q, p.q_strides.offset(b, i, h));
                    let oi = row(o, p.o_strides.offset(b, i, h));
                    let doi = row(d_o, p.o_strides.offset(b, i, h));
                    let l = lse[(b * hq + h) * sq + i];
                    let di: f32 = doi.iter().zip(&oi).map(|(a, b)| a * b).sum();
                    let dqi = &mut dqf[(g * sq + i) * d..(g * sq + i + 1) * d];
                    for j in rule.keys.clone() {
                        let (kj, vj) = (&kf[j], &vf[j]);
                        let x = scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>();
                        let sc = if plain {
                            x
                        } else {
                            rule.score(f64::from(x), j) as f32
                        };
                        let pj = (sc - l).exp();
                        let dp: f32 = doi.iter().zip(vj).map(|(a, b)| a * b).sum();
                        let grad = if plain {
                            1.0
                        } else {
                            rule.score_grad(f64::from(x)) as f32
                        };
                        let ds = scale * pj * (dp - di) * grad;
                        let (dkj, dvj) =
                            (&mut dkf[j * d..(j + 1) * d], &mut dvf[j * d..(j + 1) * d]);
                        for c in 0..d {
                            dvj[c] += pj * doi[c];
                            dkj[c] += ds * qi[c];
                            dqi[c] += ds * kj[c];
                        }
                    }
                }
            }
            (dqf, dkf, dvf)
        })
        .collect();
    for (bk, (dqf, dkf, dvf)) in parts.into_iter().enumerate() {
        let (b, kvh) = (bk / hkv, bk % hkv);
        for j in 0..sk {
            let at = ((b * sk + j) * hkv + kvh) * d;
            for c in 0..d {
                dk[at + c] = T::from_f32(dkf[j * d + c]);
                dv[at + c] = T::from_f32(dvf[j * d + c]);
            }
        }
        for g in 0..group {
            for i in 0..sq {
                let at = ((b * sq + i) * hq + kvh * group + g) * d;
                for c in 0..d {
                    dq[at + c] = T::from_f32(dqf[(g * sq + i) * d + c]);
                }
            }
        }
    }
    Ok(())
}

/// The gradient of a learnable sink ([`crate::scores::ScoreMods::sink`]), from the forward's
/// `o` and `lse` and the output gradient `d_o`: `d_sink[h] = -sum_{b, i} exp(sink_h -
/// lse_bhi) D_bhi` with `D_bhi = do_bhi . o_bhi` ([`crate::reference_grad`] derives it). `o` and
/// `d_o` are read through `o_strides`, `lse` is dense `[batch, heads_q, seqlen_q]` (the forward's,
/// which includes the sink). `D` in f32 per row, the sum over rows in f64, in row order: the
/// same bytes run to run. `d_sink` is written (`heads_q` values), not added to.
///
/// # Errors
/// [`AttnError::InvalidInput`] when the problem has no sink; the errors of
/// [`AttnProblem::validate`] and [`AttnProblem::check_lengths`] (`do` named as such);
/// [`AttnError::BufferTooShort`] for `d_sink` shorter than `heads_q`. Nothing is written when
/// one is returned.
pub fn sink_grad<T: Element>(
    p: &AttnProblem,
    o: &[T],
    lse: &[f32],
    d_o: &[T],
    d_sink: &mut [f32],
) -> Result<()> {
    p.validate()?;
    let Some(sink) = p.scores.sink.as_ref() else {
        return Err(AttnError::InvalidInput {
            what: "sink_grad: the problem has no learnable sink".into(),
        });
    };
    let s = p.shape;
    // q, k, v are not read: their lengths are not checked.
    check_buffers(
        p,
        [
            usize::MAX,
            usize::MAX,
            usize::MAX,
            o.len(),
            lse.len(),
            d_o.len(),
        ],
        [usize::MAX; 3],
    )?;
    crate::error::check_len("d_sink", d_sink.len(), s.heads_q)?;
    let d = s.head_dim;
    let grads: Vec<f32> = (0..s.heads_q)
        .into_par_iter()
        .map(|h| {
            let mut acc = 0.0f64;
            for b in 0..s.batch {
                for i in 0..s.seqlen_q {
                    let at = p.o_strides.offset(b, i, h);
                    let di: f32 = o[at..at + d]
                        .iter()
                        .zip(&d_o[at..at + d])
                        .map(|(x, y)| x.to_f32() * y.to_f32())
                        .sum();
                    let l = lse[(b * s.heads_q + h) * s.seqlen_q + i];
                    acc -= f64::from((sink[h] - l).exp() * di);
                }
            }
            acc as f32
        })
        .collect();
    d_sink[..s.heads_q].copy_from_slice(&grads);
    Ok(())
}
