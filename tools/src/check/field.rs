//! Inputs restated from field reports of other attention kernels (issue "field reports, turn
//! 2"), built exactly so that the CPU tests and the GPU `check` sweep run the same values.
//! Every value is a small integer or a multiple of 1/8, exact in f16 and bf16, except the
//! d4 rows (0.1 and 0.3, rounded to the element type like any input).

use flashattn::dtype::Element;
use flashattn::shape::{AttnProblem, AttnShape};
use serde::Serialize;

/// Which report an input reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FieldInput {
    /// 3 queries, 130 keys, heads 8 q / 2 kv, d128, scale 1/16: logits between -51200 and
    /// -76800 (heads 3 and 7: about -38400), so lse is near -5e4 where one f32 step is 3.9e-3.
    LseNear5e4,
    /// d6, q = k with entries of magnitude 110..112: the unscaled q.k reaches ~74000, above
    /// the f16 maximum (65504), and lse ~ 3e4.
    QEqualsKNear110,
    /// 33 tokens, heads 6 q / 2 kv, d128, default scale: scaled logits about 150 +- 5.
    Logits150,
    /// d4 (not a multiple of 8: padded on the GPU), 4 tokens, 1 head, q = k = v with
    /// constant rows 0.1, 0.1, 0.3, 0.1.
    D4ConstantRows,
}

impl FieldInput {
    /// Every report.
    pub const ALL: [FieldInput; 4] = [
        FieldInput::LseNear5e4,
        FieldInput::QEqualsKNear110,
        FieldInput::Logits150,
        FieldInput::D4ConstantRows,
    ];

    /// A short name for labels.
    pub fn name(self) -> &'static str {
        match self {
            FieldInput::LseNear5e4 => "lse~-5e4",
            FieldInput::QEqualsKNear110 => "q=k~110",
            FieldInput::Logits150 => "logits~150",
            FieldInput::D4ConstantRows => "d4-rows",
        }
    }

    /// The problem of the report (mask none; callers may set one).
    pub fn problem(self) -> AttnProblem {
        let (b, sq, sk, hq, hkv, d) = match self {
            FieldInput::LseNear5e4 => (1, 3, 130, 8, 2, 128),
            FieldInput::QEqualsKNear110 => (1, 4, 4, 1, 1, 6),
            FieldInput::Logits150 => (1, 33, 33, 6, 2, 128),
            FieldInput::D4ConstantRows => (1, 4, 4, 1, 1, 4),
        };
        let shape = AttnShape::from_sizes([b, sq, sk, hq, hkv, d]);
        let p = AttnProblem::new(shape).expect("field shapes are valid");
        match self {
            FieldInput::LseNear5e4 => p.with_scale(1.0 / 16.0).expect("valid scale"),
            _ => p,
        }
    }

    /// Overwrites `q` and `k` (laid out by `p`'s strides) with the report's values, and `v`
    /// where the report gives it (else it is left as the caller made it: random).
    pub fn fill<T: Element>(self, p: &AttnProblem, q: &mut [T], k: &mut [T], v: &mut [T]) {
        let s = p.shape;
        let d = s.head_dim;
        for b in 0..s.batch {
            for i in 0..s.seqlen_q {
                for h in 0..s.heads_q {
                    let at = p.q_strides.offset(b, i, h);
                    for c in 0..d {
                        q[at + c] = T::from_f32(self.q_value(i, h, c));
                    }
                }
            }
            for j in 0..s.seqlen_k {
                for h in 0..s.heads_kv {
                    let at = p.k_strides.offset(b, j, h);
                    for c in 0..d {
                        k[at + c] = T::from_f32(self.k_value(j, h, c));
                    }
                    if self == FieldInput::D4ConstantRows {
                        let at = p.v_strides.offset(b, j, h);
                        v[at..at + d].fill(T::from_f32(Self::ROWS[j]));
                    }
                }
            }
        }
    }

    fn q_value(self, i: usize, h: usize, c: usize) -> f32 {
        match self {
            // 80 (48 for heads 3 and 7) against keys of -80..-120: q.k / 16 between -51200
            // and -76800 (-38400 .. -46080).
            FieldInput::LseNear5e4 => {
                if h == 3 || h == 7 {
                    48.0
                } else {
                    80.0 + ((i + c) % 2) as f32
                }
            }
            FieldInput::QEqualsKNear110 => Self::near110(i, c),
            FieldInput::Logits150 => 3.625 + 0.125 * (((i + c + h) % 3) as f32 - 1.0),
            FieldInput::D4ConstantRows => Self::ROWS[i],
        }
    }

    /// The rows of [`FieldInput::D4ConstantRows`].
    pub const ROWS: [f32; 4] = [0.1, 0.1, 0.3, 0.1];

    fn k_value(self, j: usize, _h: usize, c: usize) -> f32 {
        match self {
            FieldInput::LseNear5e4 => -80.0 - ((j * 13 + c) % 41) as f32,
            FieldInput::QEqualsKNear110 => Self::near110(j, c),
            FieldInput::Logits150 => 3.625 + 0.125 * (((j * 2 + c) % 3) as f32 - 1.0),
            FieldInput::D4ConstantRows => Self::ROWS[j],
        }
    }

    /// +-(110..112): the sign flips on every third channel (shifted by the row), so rows
    /// differ and q.k of different rows is far smaller than q.q.
    fn near110(row: usize, c: usize) -> f32 {
        let m = 110.0 + ((row + c) % 3) as f32;
        if (row + c).is_multiple_of(3) { -m } else { m }
    }
}
