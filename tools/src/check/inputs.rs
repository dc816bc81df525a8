//! Inputs of a check case, its oracle, and the row-by-row verdict.
//!
//! Rules (also the documented behaviour of every backend for non-finite inputs):
//! - a row whose exact result is finite must match it within [`Tolerance`];
//! - a row whose exact result is NaN (it reads a NaN/Inf) must come out non-finite too:
//!   non-finite inputs propagate, they are never silently dropped;
//! - one documented exception on the GPU: an Inf/NaN in `v` at key j also reaches rows of the
//!   same query block that are masked from key j on the causal diagonal (the Tensor Core
//!   product multiplies their zero probability by Inf: 0 * Inf = NaN). Rows whose last visible
//!   key is more than [`V_SPILL_KEYS`] keys before j are never affected;
//! - with [`Inputs::Constant`] inputs `o` must equal `v` exactly.

use super::cases::{Case, Inputs, Tensor};
use flashattn::compare::{Diff, Tolerance, diff, diff_rows, random_inputs};
use flashattn::dtype::Element;
use flashattn::error::Result;
use flashattn::reference::{self, RowPrecision};
use flashattn::shape::AttnProblem;

/// How far (in keys) below a poisoned `v` key the GPU exception above can reach: one query
/// block of the largest tile.
pub const V_SPILL_KEYS: usize = 256;

/// q, k, v for a case.
pub fn make_inputs<T: Element>(case: &Case, seed: u64) -> (Vec<T>, Vec<T>, Vec<T>) {
    let p = &case.problem;
    let (mut q, mut k, mut v) = random_inputs::<T>(p, seed);
    match case.inputs {
        Inputs::Random => {}
        Inputs::Constant(c) => {
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *x = T::from_f32(c);
            }
        }
        Inputs::NonFinite { tensor, pos, value } => {
            let s = p.shape;
            let (buf, st, heads) = match tensor {
                Tensor::Q => (&mut q, p.q_strides, s.heads_q),
                Tensor::K => (&mut k, p.k_strides, s.heads_kv),
                Tensor::V => (&mut v, p.v_strides, s.heads_kv),
            };
            for b in 0..s.batch {
                for h in 0..heads {
                    let at = st.offset(b, pos, h);
                    buf[at..at + s.head_dim].fill(T::from_f32(value));
                }
            }
        }
        Inputs::Field(f) => f.fill(p, &mut q, &mut k, &mut v),
        Inputs::Scaled(factor) => {
            for x in q.iter_mut().chain(k.iter_mut()) {
                *x = T::from_f32(x.to_f32() * factor);
            }
        }
    }
    (q, k, v)
}

/// One exact row: `(batch, query, head)`, its `o` (head_dim values), `lse` and precision.
pub type ExactRow = ((usize, usize, usize), Vec<f64>, f64, RowPrecision);

/// The exact rows a case compares.
pub struct Oracle {
    /// Rows in comparison order.
    pub rows: Vec<ExactRow>,
}

/// Computes the oracle for the case's rows (all rows, or the sample of a long case).
///
/// # Errors
/// Those of [`reference::attention`].
pub fn oracle<T: Element>(case: &Case, q: &[T], k: &[T], v: &[T]) -> Result<Oracle> {
    let p = &case.problem;
    let s = p.shape;
    let d = s.head_dim;
    let mut rows = Vec::new();
    match &case.rows {
        None => {
            let r = reference::attention(p, q, k, v)?;
            for b in 0..s.batch {
                for i in 0..s.seqlen_q {
                    for h in 0..s.heads_q {
                        let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                        let k = (b * s.heads_q + h) * s.seqlen_q + i;
                        rows.push((
                            (b, i, h),
                            r.o[at..at + d].to_vec(),
                            r.lse[k],
                            r.precision[k],
                        ));
                    }
                }
            }
        }
        Some(sample) => {
            let keys: Vec<_> = (0..s.batch)
                .flat_map(|b| {
                    sample
                        .iter()
                        .flat_map(move |&i| (0..s.heads_q).map(move |h| (b, i, h)))
                })
                .collect();
            let r = reference::attention_rows(p, q, k, v, &keys)?;
            rows.extend(
                keys.into_iter()
                    .zip(r)
                    .map(|(key, (o, lse, pr))| (key, o, lse, pr)),
            );
        }
    }
    Ok(Oracle { rows })
}

/// The verdict on one kernel's output.
pub struct Verdict {
    /// Errors over the rows whose exact result is finite.
    pub o: Diff,
    /// Errors of lse over the same rows.
    pub lse: Diff,
    /// Broken rules, empty when the output passes.
    pub problems: Vec<String>,
    /// Remarks that do not fail the case (the documented GPU exception).
    pub notes: Vec<String>,
}

/// Judges `o` (dense f64 `[batch, seqlen_q, heads_q, head_dim]`) and `lse` (`[batch, heads_q,
/// seqlen_q]`) of a kernel against the oracle, by the rules of the module docs.
pub fn judge(case: &Case, oracle: &Oracle, o: &[f64], lse: &[f32], tol: &Tolerance) -> Verdict {
    let p: &AttnProblem = &case.problem;
    let s = p.shape;
    let d = s.head_dim;
    let (mut got_o, mut got_l) = (Vec::new(), Vec::new());
    // The compared rows of the oracle, with each row's precision (compare::diff_rows).
    let mut exact = reference::Reference {
        o: Vec::new(),
        lse: Vec::new(),
        precision: Vec::new(),
    };
    let mut problems = Vec::new();
    let mut missing_nan = 0usize;
    let mut spilled = 0usize;
    for ((b, i, h), exact_o, exact_l, precision) in &oracle.rows {
        let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
        let row = &o[at..at + d];
        let l = lse[(b * s.heads_q + h) * s.seqlen_q + i] as f64;
        if exact_o.iter().any(|x| x.is_nan()) || exact_l.is_nan() {
            if row.iter().all(|x| x.is_finite()) {
                missing_nan += 1;
            }
            continue;
        }
        if let Inputs::NonFinite {
            tensor: Tensor::V,
            pos,
            ..
        } = case.inputs
        {
            let last_visible = p.mask.visible_keys(*i, s.seqlen_q, s.seqlen_k);
            if row.iter().any(|x| !x.is_finite())
                && last_visible <= pos
                && last_visible + V_SPILL_KEYS > pos
            {
                spilled += 1; // the documented GPU exception
                continue;
            }
        }
        got_o.extend_from_slice(row);
        got_l.push(l);
        exact.o.extend_from_slice(exact_o);
        exact.lse.push(*exact_l);
        exact.precision.push(*precision);
    }
    if missing_nan > 0 {
        problems.push(format!("{missing_nan} rows that read a non-finite input came out finite (a NaN/Inf was dropped)"));
    }
    let (ref_o, ref_l) = (&exact.o, &exact.lse);
    let (od, ld) = if let Inputs::Constant(_) = case.inputs {
        // Judged exactly below: no precision allowance (its logits are ~1e11).
        (
            diff(got_o.iter().copied(), ref_o),
            diff(got_l.iter().copied(), ref_l),
        )
    } else {
        diff_rows(
            got_o.iter().copied(),
            got_l.iter().copied(),
            &exact,
            d,
            |n| n / d.max(1),
        )
    };
    if let Inputs::Constant(_) = case.inputs {
        // Scores near 1e11 are rounded to f32 (ulp ~ 1e4), so lse is judged relative to its
        // size; o must be v exactly.
        if od.max_abs != 0.0 || !od.is_clean() {
            problems.push(format!(
                "o differs from v ({od}); with equal inputs it must equal v exactly"
            ));
        }
        let worst_rel = got_l
            .iter()
            .zip(ref_l)
            .map(|(g, r)| ((g - r) / r).abs())
            .fold(0.0f64, f64::max);
        if !ld.is_clean() || worst_rel.is_nan() || worst_rel > 1e-6 {
            problems.push(format!("lse {ld}, relative error {worst_rel:e} > 1e-6"));
        }
    } else if let Err(e) = tol.check(&case.label, &od, &ld) {
        problems.push(e.to_string());
    }
    let mut notes = Vec::new();
    if spilled > 0 {
        notes.push(format!("{spilled} rows masked from the Inf key but in its query block are non-finite (documented GPU exception)"));
    }
    Verdict {
        o: od,
        lse: ld,
        problems,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::cases::cases;
    use flashattn::dtype::DType;
    use half::f16;

    /// The verdict on the exact answer passes, on a perturbed one fails, for ordinary inputs
    /// and for the constant huge-logit inputs (whose o must equal v exactly: no precision
    /// allowance may hide an error there).
    #[test]
    fn judge_catches_errors() {
        let all = cases(true);
        let pick = |f: &dyn Fn(&Case) -> bool| {
            all.iter()
                .find(|c| c.dtype == DType::F16 && f(c))
                .expect("case")
                .clone()
        };
        let random =
            pick(&|c| matches!(c.inputs, Inputs::Random) && c.problem.shape.seqlen_q == 17);
        let constant =
            pick(&|c| matches!(c.inputs, Inputs::Constant(_)) && c.problem.shape.seqlen_q > 1);
        for case in [random, constant] {
            let (q, k, v) = make_inputs::<f16>(&case, 3);
            let or = oracle(&case, &q, &k, &v).unwrap();
            let s = case.problem.shape;
            let d = s.head_dim;
            let mut o = vec![0.0f64; s.batch * s.seqlen_q * s.heads_q * d];
            let mut lse = vec![0.0f32; s.lse_len()];
            for ((b, i, h), eo, el, _) in &or.rows {
                let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                o[at..at + d].copy_from_slice(eo);
                lse[(b * s.heads_q + h) * s.seqlen_q + i] = *el as f32;
            }
            let tol = Tolerance::for_dtype(case.dtype);
            let ok = judge(&case, &or, &o, &lse, &tol);
            assert!(ok.problems.is_empty(), "{}: {:?}", case.label, ok.problems);
            let mut off = o.clone();
            off[d + 1] += 0.05 * off[d + 1].abs().max(1.0);
            let bad = judge(&case, &or, &off, &lse, &tol);
            assert!(
                !bad.problems.is_empty(),
                "{}: an error of 5 % passed",
                case.label
            );
        }
    }
}
