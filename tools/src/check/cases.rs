//! The problems of the GPU sweep: the regular grid (dtype x head_dim x mask x length), shape
//! variants (seqlen_q != seqlen_k, GQA/MQA, batch, strided views, scale), and the edge cases
//! attention kernels have failed on in the field (decoding, 2^16 boundaries, huge logits,
//! non-finite inputs).

use flashattn::dtype::DType;
use flashattn::mask::Mask;
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::shape::{AttnProblem, AttnShape, Strides};
use serde::Serialize;

/// Which input tensor a special value goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Tensor {
    /// q.
    Q,
    /// k.
    K,
    /// v.
    V,
}

/// How a case's inputs are made.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Inputs {
    /// Seeded normal values, never zero.
    Random,
    /// q = k = v = this value everywhere: scores are huge and all equal, so o must equal v
    /// exactly (no overflow, no NaN).
    Constant(f32),
    /// Random, then every channel of sequence position `pos` of `tensor` (all batches and
    /// heads) set to `value` (NaN or Inf): checks the documented propagation rule.
    NonFinite {
        /// Which tensor.
        tensor: Tensor,
        /// Sequence position.
        pos: usize,
        /// NaN or +-Inf.
        value: f32,
    },
    /// Random v; q and k as a field report built them ([`super::field`]).
    Field(super::field::FieldInput),
    /// Random, with q and k multiplied by this factor: scaled logits reach about
    /// `4 * factor^2` (soft-capping cases with logits near +-1e4).
    Scaled(f32),
}

/// One problem of the sweep (run by every selected kernel).
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Short description: dtype, shape, mask, layout, inputs.
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The problem.
    pub problem: AttnProblem,
    /// How inputs are made.
    pub inputs: Inputs,
    /// Query positions compared with the oracle (all batches and heads); `None` = all rows.
    /// Long sequences compare a sample, on both sides of 2^16 and at the end.
    pub rows: Option<Vec<usize>>,
}

fn problem(shape: AttnShape, mask: Mask) -> AttnProblem {
    AttnProblem::new(shape)
        .map(|p| p.with_mask(mask))
        .expect("sweep shapes are valid")
}

/// A shape from its six sizes, in the order of [`AttnShape`]'s fields.
pub(crate) fn shape(
    batch: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    heads_q: usize,
    heads_kv: usize,
    head_dim: usize,
) -> AttnShape {
    AttnShape {
        batch,
        seqlen_q,
        seqlen_k,
        heads_q,
        heads_kv,
        head_dim,
    }
}

/// Collects cases with a uniform label.
struct Sweep(Vec<Case>);

impl Sweep {
    fn push_with(
        &mut self,
        dtype: DType,
        p: AttnProblem,
        what: &str,
        inputs: Inputs,
        rows: Option<Vec<usize>>,
    ) {
        let label = format!(
            "{dtype} {} {}{}{}",
            p.shape,
            p.mask.name(),
            describe_scores(&p.scores),
            what
        );
        self.0.push(Case {
            label,
            dtype,
            problem: p,
            inputs,
            rows,
        });
    }

    fn push(&mut self, dtype: DType, p: AttnProblem, what: &str) {
        self.push_with(dtype, p, what, Inputs::Random, None);
    }
}

/// Query positions sampled from a long sequence: the start, both sides of 2^15 and 2^16,
/// and the end.
fn sample_rows(seqlen_q: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = [0, 1, 2, 63, 64, 127, 128]
        .into_iter()
        .chain((1usize << 15) - 2..(1 << 15) + 2)
        .chain((1usize << 16) - 3..(1 << 16) + 2)
        .chain(seqlen_q.saturating_sub(5)..seqlen_q)
        .filter(|&i| i < seqlen_q)
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// The sweep. `quick` keeps it small enough for compute-sanitizer.
pub fn cases(quick: bool) -> Vec<Case> {
    let mut sw = Sweep(Vec::new());
    let masks = [Mask::None, Mask::Causal];
    let (head_dims, lengths): (&[usize], &[usize]) = if quick {
        (&[64, 128], &[1, 17, 64, 65, 129])
    } else {
        (
            &[32, 40, 56, 64, 72, 80, 96, 112, 120, 128, 160, 192, 256],
            &[1, 17, 63, 64, 65, 127, 129, 200, 512, 1000, 4096],
        )
    };
    for dtype in [DType::F16, DType::BF16] {
        for &d in head_dims {
            for mask in masks {
                for &l in lengths {
                    // Long sequences only where the oracle stays cheap.
                    if l >= 4096 && !(d == 64 || d == 128) {
                        continue;
                    }
                    sw.push(dtype, problem(AttnShape::new(1, l, 2, d), mask), "");
                }
            }
        }
        let pairs: &[(usize, usize)] = if quick {
            &[(5, 2), (2, 5), (1, 8), (65, 200)]
        } else {
            &[
                (5, 2),
                (2, 5),
                (1, 8),
                (1, 1000),
                (64, 200),
                (200, 64),
                (129, 1000),
                (1000, 129),
                (17, 4096),
            ]
        };
        for &(sq, sk) in pairs {
            for mask in masks {
                sw.push(dtype, problem(shape(1, sq, sk, 2, 2, 64), mask), "");
            }
        }
        for mask in masks {
            // GQA 4:1, 8:1 at 64 query heads, MQA, batch 3 (distinct data per batch).
            sw.push(dtype, problem(shape(2, 200, 200, 8, 2, 64), mask), " gqa");
            if !quick {
                sw.push(dtype, problem(shape(1, 256, 256, 64, 8, 128), mask), " gqa");
            }
            sw.push(dtype, problem(shape(1, 129, 129, 4, 1, 128), mask), " mqa");
            sw.push(
                dtype,
                problem(AttnShape::new(3, 100, 2, 64), mask),
                " batch",
            );
            // Memory [b, h, s, d] seen as bshd (a transposed view), and a non-default scale.
            let st = Strides {
                batch: 3 * 77 * 64,
                seq: 64,
                head: 77 * 64,
            };
            let p = problem(AttnShape::new(2, 77, 3, 64), mask)
                .with_strides(st, st, st, st)
                .and_then(|p| p.with_scale(0.3))
                .expect("valid strides");
            sw.push(dtype, p, " bhsd-view scale0.3");
            // Broadcast k/v (PyTorch's expand over batch and kv heads: strides 0) with GQA,
            // key lengths that end inside a tile.
            let bcast: &[(usize, usize)] = if quick {
                &[(77, 64)]
            } else {
                &[(77, 64), (200, 128), (1000, 64), (333, 256)]
            };
            for &(sk, d) in bcast {
                let st = Strides {
                    batch: 0,
                    seq: d,
                    head: 0,
                };
                let p = problem(shape(2, 65, sk, 4, 2, d), mask);
                let (qs, os) = (p.q_strides, p.o_strides);
                let p = p
                    .with_strides(qs, st, st, os)
                    .expect("broadcast inputs are valid");
                sw.push(dtype, p, " broadcast-kv");
            }
        }
        // Head dims that are not a multiple of 8 run on padded copies: every one from 1 to
        // 255 (odd ones too), half in each dtype, masks alternating.
        let odd_dims: Vec<usize> = if quick {
            vec![1, 4, 6, 36, 100, 255]
        } else {
            (1..256)
                .filter(|d| d % 8 != 0 && (d % 2 == 1) == (dtype == DType::F16))
                .collect()
        };
        for d in odd_dims {
            let mask = if (d / 8) % 2 == 0 {
                Mask::None
            } else {
                Mask::Causal
            };
            sw.push(dtype, problem(shape(1, 37, 45, 2, 1, d), mask), " padded-d");
        }
        tile_edges(&mut sw, dtype, quick);
        edge_cases(&mut sw, dtype, quick);
        score_mod_cases(&mut sw, dtype, quick);
        sink_cases(&mut sw, dtype, quick);
    }
    sw.0
}

/// Sink logits of `heads` query heads: `mild` ones near the scores (each row gives the sink a
/// share), `strong` ones that take most of every row, and one per head in between.
pub fn sink_logits(heads: usize, kind: &str) -> Vec<f32> {
    (0..heads)
        .map(|h| match kind {
            "strong" => 6.0 + h as f32,
            _ => 1.0 - 0.75 * h as f32,
        })
        .collect()
}

/// A learnable sink (gpt-oss) on the kernels that claim it (mma, wgmma): mild and strong
/// sinks; no mask, causal with seqlen_q above seqlen_k (rows that see no key: o = 0 and lse =
/// the sink) and below; a window, and with softcap and ALiBi; GQA and MQA, decoding with GQA
/// 8:1; head dims 64, 96, 128, 256 and 77 (padded copies); odd lengths. Labels end in ` sink`.
fn sink_cases(sw: &mut Sweep, dtype: DType, quick: bool) {
    let w = |l: i64, r: i64| Window::from_fa(l, r).expect("valid window");
    let sunk = |heads, kind| ScoreMods {
        sink: Some(sink_logits(heads, kind)),
        ..ScoreMods::default()
    };
    use Mask::{Causal, None as Full};
    let mut list: Vec<(AttnShape, Mask, ScoreMods)> = vec![
        (shape(2, 257, 257, 4, 2, 64), Full, sunk(4, "mild")),
        (shape(1, 300, 1000, 4, 1, 128), Causal, sunk(4, "strong")),
        (shape(1, 1000, 300, 2, 2, 64), Causal, sunk(2, "mild")),
        (shape(2, 129, 200, 6, 2, 96), Full, sunk(6, "strong")),
        (shape(1, 1, 1000, 8, 1, 128), Causal, sunk(8, "mild")),
        (shape(1, 199, 211, 2, 2, 256), Causal, sunk(2, "mild")),
        (
            shape(1, 97, 97, 2, 2, 77),
            Causal,
            ScoreMods {
                window: w(20, -1),
                ..sunk(2, "mild")
            },
        ),
        (
            shape(1, 333, 333, 4, 2, 128),
            Full,
            ScoreMods {
                window: w(64, 64),
                softcap: Some(30.0),
                alibi: Some(Alibi::geometric(4)),
                ..sunk(4, "mild")
            },
        ),
    ];
    if !quick {
        list.push((shape(1, 2055, 2055, 2, 2, 64), Causal, sunk(2, "strong")));
        list.push((
            shape(1, 1500, 1500, 2, 1, 128),
            Full,
            ScoreMods {
                window: w(300, 300),
                ..sunk(2, "mild")
            },
        ));
    }
    for (sh, mask, mods) in list {
        let p = problem(sh, mask)
            .with_scores(mods)
            .expect("sweep sinks are valid");
        sw.push(dtype, p, "");
    }
}

/// Lengths on both sides of the tile and TMA box edges (wgmma: 128 or 192 query rows per
/// block, 64 per consumer, 64-192 keys per tile; mma: 64-128 rows, 32-64 keys) and key-tile counts
/// below, at and past the K/V pipeline depth (2 stages), for each padded head_dim of wgmma.
fn tile_edges(sw: &mut Sweep, dtype: DType, quick: bool) {
    let dims: &[usize] = if quick {
        &[64, 128]
    } else {
        &[64, 96, 128, 192, 256]
    };
    let pairs: &[(usize, usize)] = if quick {
        &[(128, 128), (129, 255), (64, 385)]
    } else {
        &[
            (128, 128),
            (127, 129),
            (129, 255),
            (191, 193),
            (192, 256),
            (255, 257),
            (256, 384),
            (383, 640),
            (64, 385),
            (640, 383),
        ]
    };
    for &d in dims {
        for &(sq, sk) in pairs {
            for mask in [Mask::None, Mask::Causal] {
                sw.push(dtype, problem(shape(2, sq, sk, 3, 1, d), mask), " edge");
            }
        }
    }
}

/// The score modifiers of a label: ` window(L,R)`, ` softcapC`, ` alibi`, ` sink` (empty when
/// plain).
pub fn describe_scores(m: &ScoreMods) -> String {
    let mut out = String::new();
    if !m.window.is_unbounded() {
        let side = |x: Option<usize>| x.map_or("-1".to_string(), |w| w.to_string());
        out += &format!(" window({},{})", side(m.window.left), side(m.window.right));
    }
    if let Some(c) = m.softcap {
        out += &format!(" softcap{c}");
    }
    if let Some(a) = &m.alibi {
        out += if a.per_batch { " alibi[b,h]" } else { " alibi" };
    }
    if m.sink.is_some() {
        out += " sink";
    }
    out
}

/// Sliding windows, soft-capping and ALiBi, alone and together, on the kernels that claim them
/// (mma, wgmma): window 0; windows ending inside a key tile and on its edges (Bc 32-128);
/// seqlen_q != seqlen_k with rows that see no key; softcap 30 and 50 with logits near +-1e4;
/// ALiBi with causal seqlen_q != seqlen_k, per (batch, head), and inside a window; GQA/MQA,
/// decoding with GQA 8:1; head dims 64 to 256; odd lengths.
fn score_mod_cases(sw: &mut Sweep, dtype: DType, quick: bool) {
    let w = |l: i64, r: i64| Window::from_fa(l, r).expect("valid window");
    let plain = ScoreMods::default();
    let windowed = |l, r| ScoreMods {
        window: w(l, r),
        ..ScoreMods::default()
    };
    let geometric = |heads| Some(Alibi::geometric(heads));
    use Mask::{Causal, None as Full};
    // (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, mask, modifiers, inputs)
    let mut list: Vec<(AttnShape, Mask, ScoreMods, Inputs)> = vec![
        (
            shape(1, 65, 65, 2, 2, 64),
            Full,
            windowed(0, 0),
            Inputs::Random,
        ),
        (
            shape(1, 300, 300, 4, 2, 64),
            Causal,
            windowed(63, -1),
            Inputs::Random,
        ),
        (
            shape(1, 300, 300, 4, 2, 128),
            Causal,
            windowed(128, -1),
            Inputs::Random,
        ),
        (
            shape(2, 257, 257, 2, 1, 64),
            Full,
            windowed(64, 64),
            Inputs::Random,
        ),
        (
            shape(1, 300, 1000, 2, 2, 128),
            Full,
            windowed(127, 5),
            Inputs::Random,
        ),
        (
            shape(1, 300, 100, 2, 2, 64),
            Full,
            windowed(10, 10),
            Inputs::Random,
        ),
        (
            shape(1, 1000, 300, 2, 2, 64),
            Causal,
            windowed(100, -1),
            Inputs::Random,
        ),
        (
            shape(1, 333, 333, 2, 1, 256),
            Full,
            windowed(-1, 17),
            Inputs::Random,
        ),
        (
            shape(1, 1, 1000, 8, 1, 128),
            Causal,
            windowed(256, -1),
            Inputs::Random,
        ),
        (
            shape(1, 257, 257, 2, 2, 64),
            Full,
            ScoreMods {
                softcap: Some(30.0),
                ..plain.clone()
            },
            Inputs::Scaled(50.0),
        ),
        (
            shape(1, 257, 257, 2, 2, 128),
            Causal,
            ScoreMods {
                softcap: Some(50.0),
                ..plain.clone()
            },
            Inputs::Scaled(50.0),
        ),
        (
            shape(1, 129, 129, 2, 1, 64),
            Causal,
            ScoreMods {
                softcap: Some(50.0),
                ..plain.clone()
            },
            Inputs::Random,
        ),
        (
            shape(1, 200, 333, 4, 2, 64),
            Causal,
            ScoreMods {
                alibi: geometric(4),
                ..plain.clone()
            },
            Inputs::Random,
        ),
        (
            shape(1, 333, 200, 4, 2, 128),
            Causal,
            ScoreMods {
                alibi: geometric(4),
                ..plain.clone()
            },
            Inputs::Random,
        ),
        (
            shape(2, 150, 150, 3, 1, 96),
            Full,
            ScoreMods {
                alibi: Some(Alibi {
                    slopes: vec![0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625],
                    per_batch: true,
                }),
                ..plain.clone()
            },
            Inputs::Random,
        ),
        (
            shape(1, 129, 129, 8, 8, 64),
            Causal,
            ScoreMods {
                window: w(50, -1),
                alibi: geometric(8),
                ..plain.clone()
            },
            Inputs::Random,
        ),
        (
            shape(1, 301, 301, 4, 1, 128),
            Full,
            ScoreMods {
                window: w(100, 20),
                softcap: Some(30.0),
                alibi: geometric(4),
                sink: None,
            },
            Inputs::Scaled(20.0),
        ),
        (
            shape(1, 199, 211, 2, 2, 256),
            Causal,
            ScoreMods {
                window: w(70, -1),
                softcap: Some(50.0),
                alibi: geometric(2),
                sink: None,
            },
            Inputs::Random,
        ),
    ];
    if !quick {
        // Many key tiles skipped on both sides of the window; odd head_dim (padded copies).
        list.push((
            shape(1, 2055, 2055, 2, 2, 64),
            Causal,
            windowed(255, -1),
            Inputs::Random,
        ));
        list.push((
            shape(1, 1500, 1500, 2, 1, 128),
            Full,
            windowed(300, 300),
            Inputs::Random,
        ));
        list.push((
            shape(1, 97, 97, 2, 2, 77),
            Causal,
            ScoreMods {
                window: w(20, -1),
                softcap: Some(30.0),
                alibi: geometric(2),
                sink: None,
            },
            Inputs::Random,
        ));
        for (l, r) in [(31, 0), (32, 0), (127, 0), (128, 0)] {
            list.push((
                shape(1, 333, 333, 2, 2, 64),
                Causal,
                windowed(l, r),
                Inputs::Random,
            ));
        }
    }
    for (sh, mask, mods, inputs) in list {
        let p = problem(sh, mask)
            .with_scores(mods)
            .expect("sweep modifiers are valid");
        sw.push_with(dtype, p, "", inputs, None);
    }
}

/// Inputs that broke attention kernels in the field.
fn edge_cases(sw: &mut Sweep, dtype: DType, quick: bool) {
    let big = if dtype == DType::BF16 {
        133120.0
    } else {
        60000.0
    };
    for mask in [Mask::None, Mask::Causal] {
        // Decoding: one query sees every key (bottom-right alignment).
        let decode: &[usize] = if quick { &[8, 1000] } else { &[8, 1000, 65537] };
        for &sk in decode {
            sw.push(dtype, problem(shape(1, 1, sk, 8, 2, 128), mask), " decode");
        }
        // Huge equal logits: o must equal v exactly, one key and several.
        for l in [1, 37] {
            sw.push_with(
                dtype,
                problem(shape(1, l, l, 1, 1, 64), mask),
                &format!(" all={big}"),
                Inputs::Constant(big),
                None,
            );
        }
        // Non-finite inputs stay in the rows that read them (see the module docs of check).
        for (tensor, value) in [
            (Tensor::Q, f32::NAN),
            (Tensor::K, f32::NAN),
            (Tensor::V, f32::INFINITY),
        ] {
            let inputs = Inputs::NonFinite {
                tensor,
                pos: 150,
                value,
            };
            sw.push_with(
                dtype,
                problem(shape(1, 300, 300, 2, 2, 64), mask),
                &format!(" {tensor:?}[150]={value}"),
                inputs,
                None,
            );
        }
        // Field reports: logits large enough that f32 rounding of scores and lse shows.
        for f in super::field::FieldInput::ALL {
            let p = f.problem().with_mask(mask);
            sw.push_with(dtype, p, &format!(" {}", f.name()), Inputs::Field(f), None);
        }
        if !quick {
            // Both sides of 2^16, and 2^17 keys with one head: sampled rows against the oracle.
            for l in [65536, 65537] {
                let p = problem(shape(1, l, l, 1, 1, 64), mask);
                sw.push_with(dtype, p, " long", Inputs::Random, Some(sample_rows(l)));
            }
            let p = problem(shape(1, 131072, 131072, 1, 1, 128), mask);
            sw.push_with(dtype, p, " long", Inputs::Random, Some(sample_rows(131072)));
            sw.push(
                dtype,
                problem(shape(1, 300, 131072, 1, 1, 64), mask),
                " long-k",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_covers_the_field_reports() {
        for quick in [true, false] {
            let cs = cases(quick);
            assert!(cs.iter().all(|c| c.problem.validate().is_ok()));
            let field = cs
                .iter()
                .filter(|c| matches!(c.inputs, Inputs::Field(_)))
                .count();
            // Every report, both masks, both dtypes.
            assert_eq!(field, 4 * 2 * 2, "quick {quick}");
            let bcast: Vec<&Case> = cs
                .iter()
                .filter(|c| c.label.contains("broadcast-kv"))
                .collect();
            assert!(!bcast.is_empty());
            assert!(bcast.iter().all(|c| c.problem.k_strides.batch == 0
                && c.problem.k_strides.head == 0
                && c.problem.shape.seqlen_k % 64 != 0));
        }
        // Every head_dim from 1 to 255 that is not a multiple of 8, in one dtype or the other.
        let cs = cases(false);
        let mut padded: Vec<usize> = cs
            .iter()
            .filter(|c| c.label.contains("padded-d"))
            .map(|c| c.problem.shape.head_dim)
            .collect();
        padded.sort_unstable();
        let want: Vec<usize> = (1..256).filter(|d| d % 8 != 0).collect();
        assert_eq!(padded, want);
    }
}
