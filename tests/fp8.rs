//! FP8 attention on the CPU: the backend against the oracle, and the FP8 tolerance tested
//! both ways: an emulation of the GPU kernel's arithmetic (P quantised to e4m3 per key tile
//! against a lazily moved running maximum, row sums of the quantised P, o rounded to bf16)
//! passes it on every shape, and the faults a kernel could have (a wrong permutation of P's
//! register fragment, a missing descale, o never written) fail it.

use flashattn::error::AttnError;
use flashattn::fp8::{self, Descale, E4m3, Fp8Descales, judge};
use flashattn::{AttnProblem, AttnShape, Mask};
use half::bf16;

/// A problem and its descales (q, k, v drawn so that the dequantised values are ~N(0, 1)).
struct Case {
    p: AttnProblem,
    d: Fp8Descales,
    q: Vec<E4m3>,
    k: Vec<E4m3>,
    v: Vec<E4m3>,
}

fn case(sizes: [usize; 6], causal: bool, per_head: bool, seed: u64) -> Case {
    let p = AttnProblem::new(AttnShape::from_sizes(sizes))
        .unwrap()
        .with_mask(if causal { Mask::Causal } else { Mask::None });
    let s = p.shape;
    let nkv = s.batch * s.heads_kv;
    let d = if per_head {
        let f = |base: f32| {
            Descale::PerBatchHeadKv((0..nkv).map(|i| base * (1.0 + 0.25 * i as f32)).collect())
        };
        Fp8Descales {
            q: f(0.05),
            k: f(0.1),
            v: f(0.02),
        }
    } else {
        Fp8Descales::per_tensor(0.05, 0.1, 0.02)
    };
    let n = |seqlen: usize, heads: usize| s.batch * seqlen * heads * s.head_dim;
    // Scaled by the first factor: the values stay within e4m3's range for every head.
    let q = fp8::random_e4m3(n(s.seqlen_q, s.heads_q), seed, d.q.get(0, 0, 1));
    let k = fp8::random_e4m3(n(s.seqlen_k, s.heads_kv), seed + 1, d.k.get(0, 0, 1));
    let v = fp8::random_e4m3(n(s.seqlen_k, s.heads_kv), seed + 2, d.v.get(0, 0, 1));
    Case { p, d, q, k, v }
}

/// What the emulation may get wrong on purpose.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// P's register fragment packed in the accumulator's order instead of the permuted one
    /// (keys 2t+1 and 8+2t of each 16 swapped, as a kernel would without V's permutation).
    Permutation,
    /// v_descale not applied to o.
    NoVDescale,
    /// q_descale * k_descale not folded into the scale.
    NoQkDescale,
}

/// The GPU kernel's arithmetic on the CPU (kernels/fwd/attn_wgmma_fp8.cu): per key tile of
/// 128, S in f32 from the raw e4m3 values, the running maximum moved only past a slack of 8
/// (log2 units), p = 2^(s * scale_log2 - m) rounded to e4m3, the row sum of those quantised
/// p, o = acc * v_descale / l rounded to bf16; returns dense o and lse.
fn emulate(c: &Case, fault: Fault) -> (Vec<f64>, Vec<f32>) {
    let p = &c.p;
    let s = p.shape;
    let d = s.head_dim;
    let group = s.group_size();
    let mut o = vec![0.0f64; s.batch * s.seqlen_q * s.heads_q * d];
    let mut lse = vec![0.0f32; s.lse_len()];
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let hk = h / group;
            let [qd, kd, vd] = c.d.at(b, hk, s.heads_kv);
            let scale_log2 = if fault == Fault::NoQkDescale {
                p.softmax_scale * std::f32::consts::LOG2_E
            } else {
                p.softmax_scale * qd * kd * std::f32::consts::LOG2_E
            };
            for i in 0..s.seqlen_q {
                let keys = p.key_range(i);
                let qo = p.q_strides.offset(b, i, h);
                let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
                let mut acc = vec![0.0f32; d];
                let mut j0 = 0;
                while j0 < keys.end {
                    let j1 = (j0 + 128).min(s.seqlen_k);
                    let mut sc = vec![f32::NEG_INFINITY; j1 - j0];
                    for j in j0..j1 {
                        if keys.contains(&j) {
                            let ko = p.k_strides.offset(b, j, hk);
                            sc[j - j0] = (0..d)
                                .map(|x| c.q[qo + x].to_f32() * c.k[ko + x].to_f32())
                                .sum();
                        }
                    }
                    let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let cand = mx * scale_log2;
                    let m_new = if cand > m + 8.0 { cand } else { m };
                    let m_use = if m_new == f32::NEG_INFINITY {
                        0.0
                    } else {
                        m_new
                    };
                    let alpha = (m - m_use).exp2();
                    m = m_new;
                    let mut pq: Vec<f32> = sc
                        .iter()
                        .map(|&x| E4m3::from_f32((x * scale_log2 - m_use).exp2()).to_f32())
                        .collect();
                    if fault == Fault::Permutation {
                        for g in (0..pq.len()).step_by(16) {
                            for t in 0..4 {
                                let (a, z) = (g + 2 * t + 1, g + 8 + 2 * t);
                                if z < pq.len() {
                                    pq.swap(a, z);
                                }
                            }
                        }
                    }
                    l = l * alpha + pq.iter().sum::<f32>();
                    acc.iter_mut().for_each(|x| *x *= alpha);
                    for (j, &pj) in (j0..j1).zip(&pq) {
                        let vo = p.v_strides.offset(b, j, hk);
                        for (a, x) in acc.iter_mut().zip(&c.v[vo..vo + d]) {
                            *a += pj * x.to_f32();
                        }
                    }
                    j0 = j1;
                }
                let f = if l > 0.0 {
                    if fault == Fault::NoVDescale {
                        1.0 / l
                    } else {
                        vd / l
                    }
                } else {
                    0.0
                };
                let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                for x in 0..d {
                    o[at + x] = f64::from(bf16::from_f32(acc[x] * f).to_f32());
                }
                lse[(b * s.heads_q + h) * s.seqlen_q + i] = if l > 0.0 {
                    (m + l.log2()) * std::f32::consts::LN_2
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
    }
    (o, lse)
}

fn shapes() -> Vec<([usize; 6], bool, bool)> {
    vec![
        ([1, 200, 200, 2, 2, 64], false, false),
        ([2, 130, 300, 4, 2, 128], true, true),
        ([1, 300, 77, 2, 1, 128], true, false),
        ([1, 1, 513, 1, 1, 64], false, true),
        ([1, 257, 257, 1, 1, 128], true, false),
    ]
}

#[test]
fn cpu_backend_meets_the_oracle() {
    for (n, (sizes, causal, per_head)) in shapes().into_iter().enumerate() {
        let c = case(sizes, causal, per_head, 10 + n as u64);
        let r = fp8::reference::attention(&c.p, &c.q, &c.k, &c.v, &c.d).unwrap();
        let s = c.p.shape;
        let mut o = vec![bf16::ZERO; s.batch * s.seqlen_q * s.heads_q * s.head_dim];
        let mut lse = vec![0.0f32; s.lse_len()];
        fp8::cpu::forward(&c.p, &c.q, &c.k, &c.v, &c.d, &mut o, &mut lse).unwrap();
        let of: Vec<f64> = o.iter().map(|x| f64::from(x.to_f32())).collect();
        let v = judge(&r, &of, &lse);
        // No P quantisation: only bf16's rounding of o, far inside the FP8 bounds.
        assert!(
            v.passed() && v.o_rel_l2 < 4e-3 && v.lse_max_abs < 1e-4,
            "{sizes:?}: {v}"
        );
    }
}

#[test]
fn the_kernels_arithmetic_passes_and_its_faults_fail() {
    for (n, (sizes, causal, per_head)) in shapes().into_iter().enumerate() {
        let c = case(sizes, causal, per_head, 20 + n as u64);
        let r = fp8::reference::attention(&c.p, &c.q, &c.k, &c.v, &c.d).unwrap();
        let (o, lse) = emulate(&c, Fault::None);
        let v = judge(&r, &o, &lse);
        assert!(v.passed(), "{sizes:?}: {v}");
        assert!(v.noise_ratio < 1.2, "{sizes:?}: {v}");
        // FP8's error is real: percents, not the 16-bit kernels' 1e-3.
        if sizes[2] > 64 {
            assert!(v.o_rel_l2 > 5e-3, "{sizes:?}: {v}");
        }
        for fault in [Fault::Permutation, Fault::NoVDescale, Fault::NoQkDescale] {
            let (o, lse) = emulate(&c, fault);
            let v = judge(&r, &o, &lse);
            assert!(!v.passed(), "{sizes:?}: a fault passed: {v}");
        }
        let zeros = vec![0.0f64; r.o.len()];
        let v = judge(&r, &zeros, &lse);
        assert!(!v.passed() && v.noise_ratio > 5.0, "{sizes:?}: {v}");
    }
}

#[test]
fn bad_descales_and_buffers_are_refused() {
    let c = case([2, 16, 16, 4, 2, 64], false, false, 3);
    let s = c.p.shape;
    let mut o = vec![bf16::ZERO; s.batch * s.seqlen_q * s.heads_q * s.head_dim];
    let mut lse = vec![0.0f32; s.lse_len()];
    let wrong = Fp8Descales {
        v: Descale::PerBatchHeadKv(vec![1.0; 3]),
        ..c.d.clone()
    };
    let e = fp8::cpu::forward(&c.p, &c.q, &c.k, &c.v, &wrong, &mut o, &mut lse).unwrap_err();
    assert!(
        matches!(
            e,
            AttnError::InvalidDescale {
                tensor: "v_descale",
                ..
            }
        ),
        "{e}"
    );
    let zero = Fp8Descales::per_tensor(0.0, 1.0, 1.0);
    assert!(fp8::cpu::forward(&c.p, &c.q, &c.k, &c.v, &zero, &mut o, &mut lse).is_err());
    let e = fp8::cpu::forward(&c.p, &c.q[1..], &c.k, &c.v, &c.d, &mut o, &mut lse).unwrap_err();
    assert!(
        matches!(e, AttnError::BufferTooShort { tensor: "q", .. }),
        "{e}"
    );
}
