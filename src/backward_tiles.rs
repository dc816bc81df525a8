//! A CPU model of `kernels/bwd/attn_bwd.cu`'s tiling: which query rows a block of keys visits,
//! which (row, key) pairs its mask keeps, and where P and dS are rounded to the element type.
//! The kernel computes the same formulas on the GPU; here they run on host buffers so that the
//! unit tests can hold them against the exact gradients ([`crate::reference_grad`]) without a
//! GPU (the fragment layouts the kernel relies on are the probe's business: `flashattn-tools`'
//! `probe` module).

use crate::dtype::Element;
use crate::shape::AttnProblem;

/// The block geometries attn_bwd is built with (`crate::cuda::backward::BwdTile`): (keys per
/// block, query rows per step): 4 or 8 warps of 16 keys or 4 of 32; 32 or 64 rows.
pub const TILINGS: [(usize, usize); 4] = [(64, 32), (64, 64), (128, 32), (128, 64)];

/// An unbounded window side, as the kernel takes it (2^30 keys).
const UNBOUNDED: i64 = 1 << 30;

fn clamp(x: i64, lo: i64, hi: i64) -> i64 {
    x.max(lo).min(hi)
}

/// The key range's sides as the kernel takes them: whether there is a window, the keys
/// visible before the diagonal (`left`) and after it (`right`: 0 when causal), each unbounded
/// side as 2^30.
fn sides(p: &AttnProblem) -> (bool, i64, i64) {
    let w = p.scores.window;
    let side = |x: Option<usize>| x.map_or(UNBOUNDED, |v| (v as i64).min(UNBOUNDED));
    let right = if p.mask.is_causal() { 0 } else { side(w.right) };
    (!w.is_unbounded(), side(w.left), right)
}

/// The query rows `[begin, end)` whose key range meets keys `[key0, key0 + bc)`: row i sees
/// keys `[i + diag - left, i + diag + right]` (right = 0 when causal), both ends
/// non-decreasing in i (attn_bwd.cu, before the step loop).
pub fn query_range(p: &AttnProblem, key0: usize, bc: usize) -> (usize, usize) {
    let s = p.shape;
    let (sq, diag) = (s.seqlen_q as i64, s.seqlen_k as i64 - s.seqlen_q as i64);
    let (local, left, right) = sides(p);
    let mut begin = 0;
    let mut end = sq;
    if p.mask.is_causal() || local {
        begin = clamp(key0 as i64 - diag - right, 0, sq);
    }
    if local {
        end = clamp(key0 as i64 + bc as i64 - diag + left, 0, sq);
    }
    (begin as usize, end.max(begin) as usize)
}

/// The rows that see key `j`, `[min, max]`, as offsets from `row0` (the kernel's `rmin`,
/// `rmax`), clamped to `[-2^30, 2^30]`; a key past `seqlen_k` is seen by none, a row past
/// `seqlen_q` sees nothing (its lse and D are read as zeros, so the mask must drop it).
pub fn rows_of_key(p: &AttnProblem, j: usize, row0: usize) -> (i64, i64) {
    let s = p.shape;
    let diag = s.seqlen_k as i64 - s.seqlen_q as i64;
    // Without a window both sides are unbounded (2^30), as the kernel takes them.
    let (local, left, right) = sides(p);
    let (j, row0) = (j as i64, row0 as i64);
    let lo = if j >= s.seqlen_k as i64 {
        UNBOUNDED
    } else {
        j - diag - right - row0
    };
    let last = s.seqlen_q as i64 - 1;
    let hi = if local {
        (j - diag + left).min(last) - row0
    } else {
        last - row0
    };
    (
        clamp(lo, -UNBOUNDED, UNBOUNDED),
        clamp(hi, -UNBOUNDED, UNBOUNDED),
    )
}

/// The steps of `br` rows key block `n` (of `bc` keys) visits, `[m_begin, m_end)`
/// (attn_bwd.cu `step_range`): `query_range` in steps, empty ranges at their start.
pub fn step_range(p: &AttnProblem, n: usize, (bc, br): (usize, usize)) -> (usize, usize) {
    let (begin, end) = query_range(p, n * bc, bc);
    let m_begin = begin / br;
    (
        m_begin,
        if end > begin {
            end.div_ceil(br)
        } else {
            m_begin
        },
    )
}

/// The last key block that visits step `m`, searched upward from block `n` (which visits
/// it), as warp 0 of the deterministic mode does before adding its dQ tile (attn_bwd.cu
/// `add_dq_tile`): block `n` waits until `last - n` blocks have added theirs.
pub fn last_visitor(p: &AttnProblem, tiling: (usize, usize), n: usize, m: usize) -> usize {
    let blocks = p.shape.seqlen_k.div_ceil(tiling.0);
    let (mut lo, mut hi) = (n, blocks - 1);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let (mb, me) = step_range(p, mid, tiling);
        if mb <= m && me > m {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Gradients in f32, dense: `dq [batch, seqlen_q, heads_q, head_dim]`, `dk` and `dv`
/// `[batch, seqlen_k, heads_kv, head_dim]`.
#[derive(Debug, Clone)]
pub struct Grads {
    /// Gradient of q.
    pub dq: Vec<f32>,
    /// Gradient of k.
    pub dk: Vec<f32>,
    /// Gradient of v.
    pub dv: Vec<f32>,
}

/// The kernel's algorithm on host buffers, block by block and step by step as attn_bwd.cu
/// visits them, with P and dS rounded to `T` where the kernel packs them. Inputs dense
/// (`q`, `o`, `d_o` `[batch, seqlen_q, heads_q, head_dim]`, `k`, `v` `[batch, seqlen_k,
/// heads_kv, head_dim]`, `lse` `[batch, heads_q, seqlen_q]`). Softcap and ALiBi as the kernel
/// applies them: S becomes tanh(S softmax_scale / c) in units of c, the bias is subtracted in
/// S's units, and dS is formed from P (1 - tanh^2) rounded to `T` once. `bc` keys per block and
/// `br` rows per step, as one of [`TILINGS`]. A model for tests: slow on purpose (no tiling of
/// the arithmetic).
#[allow(clippy::too_many_arguments)]
pub fn emulate<T: Element>(
    p: &AttnProblem,
    (bc, br): (usize, usize),
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[f32],
    d_o: &[T],
) -> Grads {
    let s = p.shape;
    let (d, sq, sk, hq, hkv) = (s.head_dim, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv);
    let group = hq / hkv;
    let scale = p.softmax_scale;
    let log2e = std::f32::consts::LOG2_E;
    // The kernel's factor from S to log2 units (src/cuda/runtime/launch.rs FlashParams::new):
    // with a softcap c, S is tanh(q.k scale / c) and the score c S.
    let softcap = p.scores.softcap;
    let scale_log2 = softcap.map_or(scale, |c| c) * log2e;
    let row = |x: &[T], b: usize, i: usize, h: usize, heads: usize, len: usize| -> Vec<f32> {
        let at = ((b * len + i) * heads + h) * d;
        x[at..at + d].iter().map(|e| e.to_f32()).collect()
    };
    let round = |x: f32| T::from_f32(x).to_f32();
    let mut g = Grads {
        dq: vec![0.0; s.batch * sq * hq * d],
        dk: vec![0.0; s.batch * sk * hkv * d],
        dv: vec![0.0; s.batch * sk * hkv * d],
    };
    for b in 0..s.batch {
        // D = rowsum(do o), attn_bwd_dsum.
        let dsum = |h: usize, i: usize| -> f32 {
            let (dr, or) = (row(d_o, b, i, h, hq, sq), row(o, b, i, h, hq, sq));
            dr.iter()
                .zip(&or)
                .fold(0.0f32, |a, (x, y)| x.mul_add(*y, a))
        };
        for hk in 0..hkv {
            for key0 in (0..sk).step_by(bc) {
                let (m_begin, m_end) = step_range(p, key0 / bc, (bc, br));
                for gi in 0..group {
                    let h = hk * group + gi;
                    // ALiBi in S's units (attn_common.cuh alibi_coef): slope log2(e) / scale_log2.
                    let coef = p
                        .scores
                        .alibi
                        .as_ref()
                        .map_or(0.0, |a| a.slope(b, h, hq) * log2e / scale_log2);
                    for m in m_begin..m_end {
                        let row0 = m * br;
                        for j in key0..(key0 + bc).min(sk) {
                            let (rmin, rmax) = rows_of_key(p, j, row0);
                            let (kr, vr) = (row(k, b, j, hk, hkv, sk), row(v, b, j, hk, hkv, sk));
                            for i in row0..row0 + br {
                                let rl = (i - row0) as i64;
                                if rl < rmin || rl > rmax {
                                    continue;
                                }
                                let (qr, dr) = (row(q, b, i, h, hq, sq), row(d_o, b, i, h, hq, sq));
                                let mut s_ij: f32 = qr.iter().zip(&kr).map(|(x, y)| x * y).sum();
                                // The softcap's derivative, 1 - tanh^2 (1 without it).
                                let mut grad = 1.0f32;
                                if let Some(c) = softcap {
                                    let t = (s_ij * scale / c).tanh();
                                    s_ij = t;
                                    grad = 1.0 - t * t;
                                }
                                if coef != 0.0 {
                                    let dist = (i as i64 + sk as i64 - sq as i64 - j as i64).abs();
                                    s_ij -= coef * dist as f32;
                                }
                                let l = lse[(b * hq + h) * sq + i] * log2e;
                                let p32 = (s_ij * scale_log2 - l).exp2();
                                let p16 = round(p32);
                                let pg16 = if softcap.is_some() {
                                    round(p32 * grad)
                                } else {
                                    p16
                                };
                                let dp: f32 = vr.iter().zip(&dr).map(|(x, y)| x * y).sum();
                                let ds16 = round(pg16 * (dp - dsum(h, i)));
                                let kv_at = ((b * sk + j) * hkv + hk) * d;
                                let q_at = ((b * sq + i) * hq + h) * d;
                                for c in 0..d {
                                    g.dv[kv_at + c] += p16 * dr[c];
                                    g.dk[kv_at + c] += ds16 * qr[c];
                                    g.dq[q_at + c] += scale * ds16 * kr[c];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for x in &mut g.dk {
        *x *= scale;
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{Tolerance, diff, random_inputs, random_vec};
    use crate::mask::Mask;
    use crate::scores::{ScoreMods, Window};
    use crate::shape::AttnShape;
    use crate::{cpu, reference_grad};
    use half::{bf16, f16};

    fn problem(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttnProblem {
        let mut shape = AttnShape::new(b, sq, hq, d);
        shape.seqlen_k = sk;
        shape.heads_kv = hkv;
        AttnProblem::new(shape).unwrap()
    }

    fn check<T: Element>(p: &AttnProblem, label: &str) {
        let s = p.shape;
        let (q, k, v) = random_inputs::<T>(p, 7);
        let n_o = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
        let mut o = vec![T::default(); n_o];
        let mut lse = vec![0.0f32; s.lse_len()];
        cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
        let d_o: Vec<T> = random_vec(n_o, 0xd0);
        let exact = reference_grad::backward(p, &q, &k, &v, &d_o).unwrap();
        // The bound check/backward.rs holds the GPU to.
        let bound = 2.0 * Tolerance::for_dtype(T::DTYPE).o_rel_l2;
        for tiling in TILINGS {
            let got = emulate(p, tiling, &q, &k, &v, &o, &lse, &d_o);
            for (name, g, want) in [
                ("dq", &got.dq, &exact.dq),
                ("dk", &got.dk, &exact.dk),
                ("dv", &got.dv, &exact.dv),
            ] {
                let dd = diff(g.iter().map(|&x| x as f64), want);
                assert!(
                    dd.is_clean() && dd.rel_l2 <= bound,
                    "{label} {} {name} tiling {tiling:?}: {dd} (bound {bound:e})",
                    T::DTYPE
                );
            }
        }
    }

    #[test]
    fn the_kernel_tiling_gives_the_exact_gradients() {
        let window = |l, r| ScoreMods {
            window: Window::from_fa(l, r).unwrap(),
            ..ScoreMods::default()
        };
        // (batch, sq, sk, hq, hkv, d): GQA/MQA, sq below, equal to and above sk, lengths
        // that are not multiples of the block (64 keys) or the step (32 rows).
        for (b, sq, sk, hq, hkv, d) in [
            (1, 17, 17, 2, 2, 16),
            (2, 33, 65, 4, 1, 8),
            (1, 65, 20, 4, 2, 8),
            (1, 1, 129, 4, 1, 16),
            (1, 100, 130, 2, 1, 8),
            (1, 150, 70, 2, 2, 8),
        ] {
            let base = problem(b, sq, sk, hq, hkv, d);
            let variants = [
                ("none", base.clone()),
                ("causal", base.clone().with_mask(Mask::Causal)),
                (
                    "window(20,5)",
                    base.clone().with_scores(window(20, 5)).unwrap(),
                ),
                (
                    "window(0,0)",
                    base.clone().with_scores(window(0, 0)).unwrap(),
                ),
                (
                    "causal+window(40,-1)",
                    base.clone()
                        .with_mask(Mask::Causal)
                        .with_scores(window(40, -1))
                        .unwrap(),
                ),
            ];
            for (name, p) in variants {
                let label = format!("{} {name}", p.shape);
                check::<f16>(&p, &label);
                check::<bf16>(&p, &label);
            }
        }
    }

    #[test]
    fn softcap_and_alibi_as_the_kernel_applies_them_give_the_exact_gradients() {
        use crate::scores::Alibi;
        // Softcaps that bend the random scores (2, 5) and FlashAttention's usual 30; slopes
        // per head (steep: 0.5 for the first of 2 heads) and per (batch, head); alone and with
        // causal, a window and GQA; sq above sk (rows that see no key).
        let per_batch = Alibi {
            slopes: vec![0.5, 0.25, 0.125, 0.0625],
            per_batch: true,
        };
        for (b, sq, sk, hq, hkv, d, causal, window, softcap, alibi) in [
            (1, 40, 40, 2, 1, 16, false, None, Some(2.0), None),
            (
                1,
                70,
                33,
                2,
                2,
                8,
                true,
                None,
                None,
                Some(Alibi::geometric(2)),
            ),
            (2, 33, 65, 2, 1, 8, true, None, Some(5.0), Some(per_batch)),
            (
                1,
                65,
                100,
                4,
                2,
                8,
                false,
                Some((20, 5)),
                Some(30.0),
                Some(Alibi::geometric(4)),
            ),
        ] {
            let mods = ScoreMods {
                window: window.map_or(Window::default(), |(l, r)| Window::from_fa(l, r).unwrap()),
                softcap,
                alibi,
                sink: None,
            };
            let mut p = problem(b, sq, sk, hq, hkv, d).with_scores(mods).unwrap();
            if causal {
                p = p.with_mask(Mask::Causal);
            }
            let label = format!("{} causal {causal} {:?}", p.shape, p.scores);
            check::<f16>(&p, &label);
            check::<bf16>(&p, &label);
        }
    }

    /// A learnable sink changes nothing in the kernel: the forward's lse includes it, and P and
    /// dS recomputed from that lse are the sink-aware ones. Sinks that take a little of each
    /// row (0.5), most of it (8), and rows that see no key (causal, sq > sk).
    #[test]
    fn a_sink_needs_only_the_forwards_lse() {
        for (b, sq, sk, hq, hkv, d, causal, softcap, sink) in [
            (1, 70, 33, 2, 2, 8, true, None, vec![1.5, -0.5]),
            (
                2,
                33,
                65,
                4,
                1,
                8,
                false,
                Some(5.0),
                vec![3.0, 0.0, -2.0, 8.0],
            ),
            (1, 40, 40, 2, 1, 16, true, Some(30.0), vec![0.5, 0.5]),
        ] {
            let mods = ScoreMods {
                softcap,
                alibi: (hq == 4).then(|| crate::scores::Alibi::geometric(4)),
                sink: Some(sink),
                ..ScoreMods::default()
            };
            let mut p = problem(b, sq, sk, hq, hkv, d).with_scores(mods).unwrap();
            if causal {
                p = p.with_mask(Mask::Causal);
            }
            let label = format!("{} causal {causal} {:?}", p.shape, p.scores);
            check::<f16>(&p, &label);
            check::<bf16>(&p, &label);
        }
    }

    #[test]
    fn the_key_blocks_visiting_a_step_are_one_run_that_the_deterministic_search_finds() {
        // The deterministic mode's wait count is right only if, for every step m, the key
        // blocks that visit it are contiguous and the search from any of them finds the last.
        let window = |l, r| ScoreMods {
            window: Window::from_fa(l, r).unwrap(),
            ..ScoreMods::default()
        };
        for (sq, sk) in [(300, 257), (1, 700), (700, 130), (513, 513), (65, 20)] {
            let base = problem(1, sq, sk, 1, 1, 8);
            let masks = [
                base.clone(),
                base.clone().with_mask(Mask::Causal),
                base.clone().with_scores(window(40, 8)).unwrap(),
                base.clone().with_scores(window(0, 0)).unwrap(),
                base.clone().with_scores(window(-1, 100)).unwrap(),
                base.clone()
                    .with_mask(Mask::Causal)
                    .with_scores(window(200, -1))
                    .unwrap(),
            ];
            for p in &masks {
                for tiling in TILINGS {
                    let blocks = sk.div_ceil(tiling.0);
                    for m in 0..sq.div_ceil(tiling.1) {
                        let visitors: Vec<usize> = (0..blocks)
                            .filter(|&n| {
                                let (mb, me) = step_range(p, n, tiling);
                                mb <= m && m < me
                            })
                            .collect();
                        if let (Some(&first), Some(&last)) = (visitors.first(), visitors.last()) {
                            assert_eq!(visitors.len(), last - first + 1, "sq {sq} sk {sk} m {m}");
                            for &n in &visitors {
                                assert_eq!(last_visitor(p, tiling, n, m), last, "n {n} m {m}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn query_ranges_cover_every_row_that_sees_a_key_of_the_block() {
        let p = problem(1, 300, 257, 1, 1, 8)
            .with_scores(ScoreMods {
                window: Window::from_fa(40, 8).unwrap(),
                ..ScoreMods::default()
            })
            .unwrap();
        for (key0, bc) in TILINGS
            .iter()
            .flat_map(|&(bc, _)| (0..257).step_by(bc).map(move |k| (k, bc)))
        {
            let (begin, end) = query_range(&p, key0, bc);
            for i in 0..300 {
                let r = p.key_range(i);
                let meets = r.start < r.end && r.start < (key0 + bc).min(257) && r.end > key0;
                // Every row that sees a key of the block is visited (the range may also hold
                // rows whose keys start past seqlen_k: the mask drops them).
                assert!(
                    !meets || (begin..end).contains(&i),
                    "key block {key0}, row {i}: keys {r:?}, visited {begin}..{end}"
                );
            }
            assert!(begin < end, "key block {key0} visits no row");
        }
    }
}
