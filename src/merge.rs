//! The exact merge of partial attention results over disjoint key sets, through their
//! log-sum-exp: what split-KV decoding's combine step and ring attention need.
//!
//! If part `s` saw keys `K_s` and returned `o_s = sum_{j in K_s} p_j v_j / l_s` and
//! `lse_s = ln l_s` (with `l_s = sum_{j in K_s} exp(score_j)`), then over all keys
//! `lse = ln sum_s exp(lse_s)` and `o = sum_s exp(lse_s - lse) o_s`. A part that saw no key
//! (`lse_s = -inf`) contributes nothing; when no part saw a key, `o = 0` and `lse = -inf`.
//! A learnable sink ([`crate::scores`]) merges as one more part: `lse_s = sink_h`, `o_s = 0`.

/// Merges the partial results of one query row: `parts` yields each part's `o` (`out.len()`
/// values) and `lse`; writes the merged `o` into `out` and returns the merged `lse`. In f32,
/// with the largest `lse` subtracted before exponentiating (no overflow for any finite lse).
/// A NaN in a part's `lse` or `o` propagates (the row read a NaN).
pub fn merge_row<'a>(
    parts: impl Iterator<Item = (&'a [f32], f32)> + Clone,
    out: &mut [f32],
) -> f32 {
    let m = parts
        .clone()
        .map(|(_, l)| l)
        .fold(f32::NEG_INFINITY, |a, l| {
            if l.is_nan() || a.is_nan() {
                f32::NAN
            } else {
                a.max(l)
            }
        });
    out.fill(0.0);
    if m == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    if m.is_nan() || m == f32::INFINITY {
        out.fill(f32::NAN);
        return f32::NAN;
    }
    let sum: f32 = parts.clone().map(|(_, l)| (l - m).exp()).sum();
    // Weights from the max, not from the merged lse: at |lse| ~ 1e30 the sum's ln would be
    // lost in lse's rounding, and exp(lse_s - lse) would no longer add up to 1.
    for (o, l) in parts {
        let w = (l - m).exp() / sum;
        if w == 0.0 {
            continue; // a part with no keys (or a negligible one): 0 * o, even when o is 0
        }
        for (x, y) in out.iter_mut().zip(o) {
            *x += w * y;
        }
    }
    m + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_halves_equals_the_whole() {
        // Scores 0, 1, 2, 3 on values 10, 20, 30, 40 (one channel): whole vs halves.
        let s = [0.0f32, 1.0, 2.0, 3.0];
        let v = [10.0f32, 20.0, 30.0, 40.0];
        let part = |r: std::ops::Range<usize>| {
            let l: f32 = s[r.clone()].iter().map(|x| x.exp()).sum();
            let o: f32 = r.clone().map(|j| s[j].exp() * v[j]).sum::<f32>() / l;
            (vec![o], l.ln())
        };
        let (whole_o, whole_l) = part(0..4);
        let (a, b) = (part(0..1), part(1..4));
        let mut out = [0.0f32];
        let l = merge_row([(&a.0[..], a.1), (&b.0[..], b.1)].into_iter(), &mut out);
        assert!((l - whole_l).abs() < 1e-6 && (out[0] - whole_o[0]).abs() < 1e-4);
        // An empty part changes nothing; all empty gives 0 and -inf.
        let empty = (vec![0.0f32], f32::NEG_INFINITY);
        let l2 = merge_row(
            [(&empty.0[..], empty.1), (&a.0[..], a.1), (&b.0[..], b.1)].into_iter(),
            &mut out,
        );
        assert_eq!(l2, l);
        let l3 = merge_row([(&empty.0[..], empty.1)].into_iter(), &mut out);
        assert!(l3 == f32::NEG_INFINITY && out[0] == 0.0);
        // Huge lse values do not overflow.
        let big = (vec![1.0f32], 1e30f32);
        let l4 = merge_row(
            [(&big.0[..], big.1), (&big.0[..], big.1)].into_iter(),
            &mut out,
        );
        assert!(l4.is_finite() && (out[0] - 1.0).abs() < 1e-6);
    }
}
