//! The dequantisation factors of FP8 attention, FlashAttention-3's `q_descale`, `k_descale`
//! and `v_descale`: the real value of an e4m3 element `x` of q is `x * q_descale` (likewise k,
//! v). Each is one f32 for the whole tensor, or one per (batch, kv head) (FA3's shape
//! `[batch, heads_kv]`; query head `h` takes the factor of its kv head `h / (heads_q /
//! heads_kv)`).
//!
//! The GPU kernel folds `q_descale * k_descale` into `softmax_scale` and `v_descale` into the
//! output's final factor, so the descales cost one multiply per row, not per element.

use crate::error::{AttnError, Result};
use crate::shape::AttnShape;
use serde::Serialize;

/// One tensor's dequantisation factor(s).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Descale {
    /// One factor for the whole tensor.
    Tensor(f32),
    /// One factor per (batch, kv head), dense `[batch, heads_kv]`.
    PerBatchHeadKv(Vec<f32>),
}

impl Default for Descale {
    fn default() -> Self {
        Descale::Tensor(1.0)
    }
}

impl Descale {
    /// The factor of (batch `b`, kv head `hk`) in a problem with `heads_kv` kv heads.
    pub fn get(&self, b: usize, hk: usize, heads_kv: usize) -> f32 {
        match self {
            Descale::Tensor(x) => *x,
            Descale::PerBatchHeadKv(v) => v[b * heads_kv + hk],
        }
    }

    /// Builds a descale from a tensor as a binding sees it: its dtype name (`"f32"` or
    /// `"float32"`: FA3 takes `torch.float32`), its shape (`[]` or `[1]` for one factor,
    /// `[batch, heads_kv]` for one per (batch, kv head)) and its values; `name` is `q_descale`,
    /// `k_descale` or `v_descale`.
    ///
    /// # Errors
    /// [`AttnError::InvalidDescale`] for another dtype, another shape, a value count that does
    /// not match the shape, or a value that is not finite and positive.
    pub fn from_tensor(
        name: &'static str,
        dtype: &str,
        dims: &[usize],
        values: &[f32],
        shape: &AttnShape,
    ) -> Result<Self> {
        let bad = |what: String| AttnError::InvalidDescale { tensor: name, what };
        if !matches!(dtype, "f32" | "float32" | "torch.float32") {
            return Err(bad(format!(
                "dtype {dtype}: descales are f32 (pass a float32 tensor)"
            )));
        }
        let d = match dims {
            [] | [1] => Descale::Tensor(values.first().copied().unwrap_or(f32::NAN)),
            [b, h] if *b == shape.batch && *h == shape.heads_kv => {
                Descale::PerBatchHeadKv(values.to_vec())
            }
            _ => {
                return Err(bad(format!(
                    "shape {dims:?}: expected [] or [1] (one factor) or [batch, heads_kv] = [{}, {}]",
                    shape.batch, shape.heads_kv
                )));
            }
        };
        let count: usize = dims.iter().product();
        if values.len() != count {
            return Err(bad(format!(
                "shape {dims:?} holds {count} values, {} given",
                values.len()
            )));
        }
        d.validate(name, shape)?;
        Ok(d)
    }

    /// Checks the count (`batch * heads_kv` per (batch, kv head)) and that every factor is
    /// finite and above 0.
    ///
    /// # Errors
    /// [`AttnError::InvalidDescale`] naming `name`.
    pub fn validate(&self, name: &'static str, shape: &AttnShape) -> Result<()> {
        let bad = |what: String| AttnError::InvalidDescale { tensor: name, what };
        let values: &[f32] = match self {
            Descale::Tensor(x) => std::slice::from_ref(x),
            Descale::PerBatchHeadKv(v) => {
                let want = shape.batch * shape.heads_kv;
                if v.len() != want {
                    return Err(bad(format!(
                        "{} values per (batch, kv head), expected batch * heads_kv = {} * {} = {want}",
                        v.len(),
                        shape.batch,
                        shape.heads_kv
                    )));
                }
                v
            }
        };
        if let Some((i, x)) = values
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite() || **x <= 0.0)
        {
            return Err(bad(format!(
                "value {x} at index {i}: every factor must be finite and above 0"
            )));
        }
        Ok(())
    }
}

/// The three descales of one FP8 call (all 1 by default).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Fp8Descales {
    /// `q_descale`.
    pub q: Descale,
    /// `k_descale`.
    pub k: Descale,
    /// `v_descale`.
    pub v: Descale,
}

impl Fp8Descales {
    /// One factor per tensor.
    pub fn per_tensor(q: f32, k: f32, v: f32) -> Self {
        Fp8Descales {
            q: Descale::Tensor(q),
            k: Descale::Tensor(k),
            v: Descale::Tensor(v),
        }
    }

    /// Validates all three against the shape.
    ///
    /// # Errors
    /// [`AttnError::InvalidDescale`] naming the first bad one.
    pub fn validate(&self, shape: &AttnShape) -> Result<()> {
        self.q.validate("q_descale", shape)?;
        self.k.validate("k_descale", shape)?;
        self.v.validate("v_descale", shape)
    }

    /// `true` when any of the three is given per (batch, kv head).
    pub fn per_head(&self) -> bool {
        [&self.q, &self.k, &self.v]
            .iter()
            .any(|d| matches!(d, Descale::PerBatchHeadKv(_)))
    }

    /// The three factors of (batch `b`, kv head `hk`): `[q, k, v]`.
    pub fn at(&self, b: usize, hk: usize, heads_kv: usize) -> [f32; 3] {
        [
            self.q.get(b, hk, heads_kv),
            self.k.get(b, hk, heads_kv),
            self.v.get(b, hk, heads_kv),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_dtypes_and_values_are_checked() {
        let s = AttnShape::from_sizes([2, 8, 8, 4, 2, 64]);
        let ok = Descale::from_tensor("q_descale", "float32", &[2, 2], &[1.0, 2.0, 3.0, 4.0], &s)
            .unwrap();
        assert_eq!(ok.get(1, 0, 2), 3.0);
        assert_eq!(
            Descale::from_tensor("k_descale", "f32", &[], &[0.5], &s).unwrap(),
            Descale::Tensor(0.5)
        );
        let err = |r: Result<Descale>| match r {
            Err(AttnError::InvalidDescale { tensor, what }) => format!("{tensor}: {what}"),
            other => panic!("{other:?}"),
        };
        assert!(
            err(Descale::from_tensor(
                "q_descale",
                "bfloat16",
                &[1],
                &[1.0],
                &s
            ))
            .contains("dtype")
        );
        assert!(
            err(Descale::from_tensor(
                "v_descale",
                "f32",
                &[4, 2],
                &[1.0; 8],
                &s
            ))
            .contains("[batch, heads_kv] = [2, 2]")
        );
        assert!(
            err(Descale::from_tensor(
                "v_descale",
                "f32",
                &[2, 2],
                &[1.0; 3],
                &s
            ))
            .contains("3 given")
        );
        assert!(
            err(Descale::from_tensor("q_descale", "f32", &[1], &[0.0], &s)).contains("above 0")
        );
        assert!(
            err(Descale::from_tensor(
                "q_descale",
                "f32",
                &[1],
                &[f32::NAN],
                &s
            ))
            .contains("finite")
        );
        let d = Fp8Descales {
            k: Descale::PerBatchHeadKv(vec![1.0; 3]),
            ..Default::default()
        };
        assert!(matches!(
            d.validate(&s),
            Err(AttnError::InvalidDescale {
                tensor: "k_descale",
                ..
            })
        ));
        assert!(Fp8Descales::per_tensor(0.5, 2.0, 1.5).validate(&s).is_ok());
    }
}
