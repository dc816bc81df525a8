//! Score modifiers beyond the causal mask, written once for every host-side backend (the
//! oracle, the CPU forward, the gradients): sliding window, logit soft-capping and ALiBi, with
//! FlashAttention-2's semantics (its `window_size`, `softcap` and `alibi_slopes` arguments).
//!
//! For query `i` and key `j` of a sequence with `seqlen_q` queries and `seqlen_k` keys, with
//! `diag = seqlen_k - seqlen_q` (bottom-right alignment, as the causal mask):
//! - **window** `(left, right)`: `j` is visible iff `i + diag - left <= j <= i + diag + right`
//!   (`None` = unbounded on that side); causal is `(None, Some(0))` and combines with a window
//!   by taking the tighter right edge. A row that sees no key gives `o = 0`, `lse = -inf`.
//! - **softcap** `c > 0`: the scaled score `s = q.k * softmax_scale` becomes `c * tanh(s / c)`.
//! - **ALiBi**: `-slope * |i + diag - j|` is added after soft-capping; slopes per query head,
//!   or per (batch, query head).
//! - **learnable sink** (gpt-oss; FlashAttention's `learnable_sink`, vLLM's `s_aux`): one logit
//!   `sink_h` per query head joins every row's softmax denominator, with no value row:
//!   `o_i = sum_j exp(s_ij - m) v_j / (sum_j exp(s_ij - m) + exp(sink_h - m))` and
//!   `lse_i = ln(sum_j exp(s_ij) + exp(sink_h))`. A row that sees no key then gives `o = 0` and
//!   `lse = sink_h` (not `-inf`). Its gradient: [`crate::cpu_backward::sink_grad`].

use crate::error::{AttnError, Result};
use crate::mask::Mask;
use serde::Serialize;
use std::ops::Range;

/// A sliding window around the diagonal (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Window {
    /// Keys visible before the diagonal (`None`: all).
    pub left: Option<usize>,
    /// Keys visible after the diagonal (`None`: all).
    pub right: Option<usize>,
}

impl Window {
    /// FlashAttention's `window_size=(left, right)`, `-1` meaning unbounded.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] for a value below -1.
    pub fn from_fa(left: i64, right: i64) -> Result<Self> {
        let side = |x: i64, name: &str| match x {
            -1 => Ok(None),
            x if x >= 0 => Ok(Some(x as usize)),
            _ => Err(AttnError::InvalidInput {
                what: format!(
                    "window {name} = {x}: a window side is a key count >= 0, or -1 for unbounded"
                ),
            }),
        };
        Ok(Window {
            left: side(left, "left")?,
            right: side(right, "right")?,
        })
    }

    /// `true` when neither side is bounded.
    pub fn is_unbounded(&self) -> bool {
        self.left.is_none() && self.right.is_none()
    }
}

/// ALiBi slopes (f32): `[heads_q]`, or `[batch, heads_q]` when `per_batch`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alibi {
    /// The slopes, row-major.
    pub slopes: Vec<f32>,
    /// One row of `heads_q` slopes per batch entry.
    pub per_batch: bool,
}

impl Alibi {
    /// The standard geometric slopes of Press et al. (2022) for `heads` heads: `2^(-8 k / n)`
    /// for `k = 1..=n` when `n = heads` is a power of two; otherwise those of the power of two
    /// below, then every other slope of the next power of two (the reference implementation).
    /// No heads, no slopes.
    pub fn geometric(heads: usize) -> Self {
        fn pow2(n: usize) -> Vec<f32> {
            (1..=n)
                .map(|k| 2f64.powf(-8.0 * k as f64 / n as f64) as f32)
                .collect()
        }
        let slopes = if heads == 0 {
            Vec::new()
        } else if heads.is_power_of_two() {
            pow2(heads)
        } else {
            let low = 1usize << (usize::BITS - 1 - heads.leading_zeros());
            let mut s = pow2(low);
            s.extend(pow2(2 * low).into_iter().step_by(2).take(heads - low));
            s
        };
        Alibi {
            slopes,
            per_batch: false,
        }
    }

    /// The slope of (batch `b`, query head `h`).
    pub fn slope(&self, b: usize, h: usize, heads_q: usize) -> f32 {
        if self.per_batch {
            self.slopes[b * heads_q + h]
        } else {
            self.slopes[h]
        }
    }
}

/// The score modifiers of a problem (all off by default).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ScoreMods {
    /// Sliding window.
    pub window: Window,
    /// Logit soft-cap `c > 0` (`None`: off).
    pub softcap: Option<f32>,
    /// ALiBi slopes (`None`: off).
    pub alibi: Option<Alibi>,
    /// Learnable attention sink: one logit per query head (`[heads_q]`, f32, natural-log units
    /// of the scaled score; `None`: off). See the module docs.
    pub sink: Option<Vec<f32>>,
}

impl ScoreMods {
    /// `true` when nothing is modified (a plain, possibly causal, attention).
    pub fn is_plain(&self) -> bool {
        self.scores_unmodified() && self.sink.is_none()
    }

    /// `true` when no (query, key) score is modified or hidden beyond the mask: no window,
    /// softcap or ALiBi. A sink may be set: it changes only each row's denominator (the
    /// kernels' epilogue), so the tile choices of plain problems hold.
    pub fn scores_unmodified(&self) -> bool {
        self.window.is_unbounded() && self.softcap.is_none() && self.alibi.is_none()
    }

    /// The sink logit of query head `h` in f64 (`None` without a sink).
    pub fn sink_of(&self, h: usize) -> Option<f64> {
        self.sink.as_ref().map(|s| f64::from(s[h]))
    }

    /// Checks the values against the problem's batch and heads.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`]: softcap not finite or `<= 0`; slopes not `heads_q` (or
    /// `batch * heads_q`) long, or not finite; a sink not `heads_q` long, or not finite.
    pub fn validate(&self, batch: usize, heads_q: usize) -> Result<()> {
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(AttnError::InvalidInput {
                what: format!("softcap = {c}: it must be a finite number above 0 (or off)"),
            });
        }
        if let Some(a) = &self.alibi {
            let want = if a.per_batch {
                batch * heads_q
            } else {
                heads_q
            };
            if a.slopes.len() != want {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "alibi_slopes has {} values; expected {want} ({})",
                        a.slopes.len(),
                        if a.per_batch {
                            "batch x heads_q"
                        } else {
                            "heads_q"
                        }
                    ),
                });
            }
            if let Some(x) = a.slopes.iter().find(|x| !x.is_finite()) {
                return Err(AttnError::InvalidInput {
                    what: format!("alibi_slopes holds {x}: every slope must be finite"),
                });
            }
        }
        if let Some(sink) = &self.sink {
            if sink.len() != heads_q {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "learnable_sink has {} values; expected {heads_q} (one per query head)",
                        sink.len()
                    ),
                });
            }
            if let Some((h, x)) = sink.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "learnable_sink[{h}] = {x}: every sink logit must be finite (a sink of -inf is no sink: pass none)"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The keys query `i` sees under `mask` and the window: a range of `0..seqlen_k`
    /// (empty when none). Exact for any sizes.
    pub fn key_range(
        &self,
        mask: Mask,
        i: usize,
        seqlen_q: usize,
        seqlen_k: usize,
    ) -> Range<usize> {
        // Positions in i128: i + diag may be negative.
        let center = i as i128 + seqlen_k as i128 - seqlen_q as i128;
        let mut hi = seqlen_k as i128; // exclusive
        if let Some(r) = self.window.right {
            hi = hi.min(center + r as i128 + 1);
        }
        if mask.is_causal() {
            hi = hi.min(center + 1);
        }
        let lo = match self.window.left {
            Some(l) => (center - l as i128).max(0),
            None => 0,
        };
        let (lo, hi) = (lo.clamp(0, seqlen_k as i128), hi.clamp(0, seqlen_k as i128));
        if lo >= hi {
            0..0
        } else {
            lo as usize..hi as usize
        }
    }

    /// The score of (query `i`, key `j`) from the scaled dot product `s`, in f64: soft-capped,
    /// then the ALiBi bias added. `slope` is [`Alibi::slope`] of the row's (batch, head), 0 when
    /// off.
    pub fn score(
        &self,
        s: f64,
        slope: f64,
        i: usize,
        j: usize,
        seqlen_q: usize,
        seqlen_k: usize,
    ) -> f64 {
        let s = match self.softcap {
            Some(c) => f64::from(c) * (s / f64::from(c)).tanh(),
            None => s,
        };
        if slope == 0.0 {
            return s;
        }
        let dist = (i as f64 + seqlen_k as f64 - seqlen_q as f64 - j as f64).abs();
        s - slope * dist
    }

    /// [`Self::score`]'s derivative with respect to the scaled dot product `s` (the bias is
    /// constant): `1 - tanh^2(s / c)` with a softcap, else 1.
    pub fn score_grad(&self, s: f64) -> f64 {
        match self.softcap {
            Some(c) => {
                let t = (s / f64::from(c)).tanh();
                1.0 - t * t
            }
            None => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_flash_attention() {
        let w = |l: i64, r: i64| ScoreMods {
            window: Window::from_fa(l, r).unwrap(),
            ..ScoreMods::default()
        };
        // sq = sk = 6: window (1, 0) sees the key itself and the one before.
        let r: Vec<_> = (0..6)
            .map(|i| w(1, 0).key_range(Mask::None, i, 6, 6))
            .collect();
        assert_eq!(r, [0..1, 0..2, 1..3, 2..4, 3..5, 4..6]);
        // Window 0 on both sides: the diagonal only. (-1, 0) is causal.
        assert_eq!(w(0, 0).key_range(Mask::None, 3, 6, 6), 3..4);
        for i in 0..6 {
            assert_eq!(
                w(-1, 0).key_range(Mask::None, i, 6, 9),
                0..Mask::Causal.visible_keys(i, 6, 9)
            );
        }
        // sq > sk, bottom-right: the first rows see nothing under causal; a right window
        // combines with causal by the tighter edge.
        assert_eq!(w(-1, -1).key_range(Mask::Causal, 0, 5, 2), 0..0);
        assert_eq!(w(-1, 3).key_range(Mask::Causal, 4, 5, 2), 0..2);
        assert_eq!(w(2, 1).key_range(Mask::None, 0, 2, 9), 5..9);
        // Unbounded is everything.
        assert_eq!(ScoreMods::default().key_range(Mask::None, 0, 3, 7), 0..7);
        assert!(Window::from_fa(-2, 0).is_err());
    }

    #[test]
    fn scores_and_validation() {
        let m = ScoreMods {
            softcap: Some(30.0),
            ..ScoreMods::default()
        };
        assert!((m.score(1e4, 0.0, 0, 0, 1, 1) - 30.0).abs() < 1e-12);
        assert!((m.score(3.0, 0.0, 0, 0, 1, 1) - 30.0 * (0.1f64).tanh()).abs() < 1e-12);
        // ALiBi: distance to the bottom-right diagonal.
        let a = ScoreMods::default();
        assert_eq!(a.score(1.0, 0.5, 0, 0, 2, 5), 1.0 - 0.5 * 3.0);
        let g = Alibi::geometric(8).slopes;
        assert_eq!(g[0], 0.5);
        assert_eq!(g[7], 2f32.powi(-8));
        assert_eq!(Alibi::geometric(12).slopes.len(), 12);
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let m = ScoreMods {
                softcap: Some(bad),
                ..ScoreMods::default()
            };
            assert!(m.validate(1, 4).is_err());
        }
        let al = |n: usize, per_batch: bool| ScoreMods {
            alibi: Some(Alibi {
                slopes: vec![0.5; n],
                per_batch,
            }),
            ..ScoreMods::default()
        };
        assert!(al(4, false).validate(2, 4).is_ok());
        assert!(al(8, true).validate(2, 4).is_ok());
        assert!(al(3, false).validate(2, 4).is_err());
        assert!(al(4, true).validate(2, 4).is_err());
        let sink = |v: Vec<f32>| ScoreMods {
            sink: Some(v),
            ..ScoreMods::default()
        };
        assert!(sink(vec![0.5, -1.0, 3.0, 0.0]).validate(2, 4).is_ok());
        assert!(!sink(vec![0.5; 4]).is_plain());
        assert_eq!(sink(vec![0.5, -1.0, 3.0, 0.0]).sink_of(1), Some(-1.0));
        let e = sink(vec![0.5; 3]).validate(2, 4).unwrap_err().to_string();
        assert!(e.contains("3 values") && e.contains("expected 4"), "{e}");
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = sink(vec![0.5, bad, 0.0, 0.0]).validate(2, 4).unwrap_err();
            assert!(e.to_string().contains("learnable_sink[1]"), "{e}");
        }
    }
}
