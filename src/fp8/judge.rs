//! Judging an FP8 result against [`Fp8Reference`]: the per-element worst-case bound, the
//! noise ratio and the lse bound derived in [`crate::fp8::reference`].

use super::reference::{Fp8Reference, NOISE_RATIO_MAX};

/// What one FP8 result comes to.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fp8Verdict {
    /// `||o~ - o||_2 / ||o||_2` (for reading: FP8's is a few percent).
    pub o_rel_l2: f64,
    /// `||o~ - o||_2 / ||n||_2`, the error in units of the rounding noise (at most
    /// [`NOISE_RATIO_MAX`]).
    pub noise_ratio: f64,
    /// The largest `|o~_c - o_c| / allowance_c` (at most 1).
    pub o_allow_used: f64,
    /// The dense index of the `o` element that used most of its allowance.
    pub worst: Option<usize>,
    /// The largest `|lse~ - lse|` over rows that see keys.
    pub lse_max_abs: f64,
    /// The largest `|lse~ - lse| / allowance` (at most 1).
    pub lse_allow_used: f64,
    /// The rules broken (empty: passed).
    pub problems: Vec<String>,
}

impl Fp8Verdict {
    /// `true` when no rule is broken.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

impl std::fmt::Display for Fp8Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "o rel-L2 {:.2e}, noise ratio {:.2} (<= {NOISE_RATIO_MAX}), o allowance used {:.2}, lse max-abs {:.2e} (allowance used {:.2})",
            self.o_rel_l2,
            self.noise_ratio,
            self.o_allow_used,
            self.lse_max_abs,
            self.lse_allow_used
        )?;
        if !self.problems.is_empty() {
            write!(f, ": {}", self.problems.join("; "))?;
        }
        Ok(())
    }
}

/// Judges `o` (dense `[batch, seqlen_q, heads_q, head_dim]`, widened) and `lse` against `r`.
/// NaN or an infinity on one side only, or a length mismatch, fails.
pub fn judge(r: &Fp8Reference, o: &[f64], lse: &[f32]) -> Fp8Verdict {
    let mut v = Fp8Verdict::default();
    if o.len() != r.o.len() || lse.len() != r.lse.len() {
        v.problems.push(format!(
            "lengths differ: o {} vs {}, lse {} vs {}",
            o.len(),
            r.o.len(),
            lse.len(),
            r.lse.len()
        ));
        return v;
    }
    let (mut err2, mut ref2, mut noise2) = (0.0f64, 0.0f64, 0.0f64);
    let mut bad = 0usize;
    for (n, (&x, &e)) in o.iter().zip(&r.o).enumerate() {
        if !x.is_finite() || !e.is_finite() {
            if !(x.is_nan() && e.is_nan()) && x != e {
                bad += 1;
                v.worst.get_or_insert(n);
            }
            continue;
        }
        let err = (x - e).abs();
        err2 += err * err;
        ref2 += e * e;
        noise2 += r.o_noise[n] * r.o_noise[n];
        let used = if r.o_allow[n] > 0.0 {
            err / r.o_allow[n]
        } else if err > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        if used > v.o_allow_used {
            v.o_allow_used = used;
            v.worst = Some(n);
        }
    }
    v.o_rel_l2 = if ref2 > 0.0 {
        (err2 / ref2).sqrt()
    } else if err2 == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    v.noise_ratio = if noise2 > 0.0 {
        (err2 / noise2).sqrt()
    } else if err2 == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    if bad > 0 {
        v.problems
            .push(format!("{bad} o elements non-finite on one side only"));
    }
    if v.o_allow_used > 1.0 {
        let w = v.worst.unwrap_or(0);
        v.problems.push(format!(
            "o element {w} is {:.3e} from the exact {:.4e}, past its worst-case FP8 bound {:.3e}",
            (o[w] - r.o[w]).abs(),
            r.o[w],
            r.o_allow[w]
        ));
    }
    if v.noise_ratio > NOISE_RATIO_MAX {
        v.problems.push(format!(
            "o's error is {:.2}x its e4m3 rounding noise (at most {NOISE_RATIO_MAX})",
            v.noise_ratio
        ));
    }
    let mut lse_bad = 0usize;
    for (k, (&x, &e)) in lse.iter().zip(&r.lse).enumerate() {
        let x = f64::from(x);
        if !e.is_finite() {
            if x != e && !(x.is_nan() && e.is_nan()) {
                lse_bad += 1;
            }
            continue;
        }
        if !x.is_finite() {
            lse_bad += 1;
            continue;
        }
        let err = (x - e).abs();
        v.lse_max_abs = v.lse_max_abs.max(err);
        let used = err / r.lse_allow[k];
        if used > v.lse_allow_used {
            v.lse_allow_used = used;
        }
    }
    if lse_bad > 0 {
        v.problems
            .push(format!("{lse_bad} lse values non-finite on one side only"));
    }
    if v.lse_allow_used > 1.0 {
        v.problems.push(format!(
            "lse off by {:.3e}, {:.2}x its FP8 bound",
            v.lse_max_abs, v.lse_allow_used
        ));
    }
    v
}
