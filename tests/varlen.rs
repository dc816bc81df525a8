//! Variable-length batches (issue 12): the packed layout against dense batches of equal
//! lengths, ragged batches (zero-length q and k, seqlen_q = 1 with GQA 8:1, one long
//! sequence, odd lengths, causal, window, softcap, per-sequence ALiBi) on the CPU against the
//! oracle, and invalid offsets refused.

use flashattn::compare::{Tolerance, random_seed, random_vec};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::varlen::{VarlenProblem, diff_reference, forward, reference};
use flashattn::{AttnError, AttnProblem, AttnShape, BackendChoice, Element, Mask};
use half::{bf16, f16};

fn cu(lens: &[i32]) -> Vec<i32> {
    let mut out = vec![0];
    for l in lens {
        out.push(out.last().unwrap() + l);
    }
    out
}

fn run<T: Element>(p: &VarlenProblem, label: &str) {
    let seed = random_seed();
    let q: Vec<T> = random_vec(p.total_q() * p.heads_q * p.head_dim, seed);
    let k: Vec<T> = random_vec(p.total_k() * p.heads_kv * p.head_dim, seed ^ 1);
    let v: Vec<T> = random_vec(p.total_k() * p.heads_kv * p.head_dim, seed ^ 2);
    let out = forward(BackendChoice::Cpu, p, &q, &k, &v).unwrap();
    let r = reference(p, &q, &k, &v).unwrap();
    let (od, ld) = diff_reference(p, &out, &r);
    Tolerance::for_dtype(T::DTYPE)
        .check(&format!("{label} {} seed={seed}", T::DTYPE), &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Equal lengths packed are a dense batch: the same o (same layout) and lse (transposed).
#[test]
fn equal_lengths_are_a_dense_batch() {
    let (b, s, hq, hkv, d) = (3, 37, 4, 2, 16);
    for mask in [Mask::None, Mask::Causal] {
        let vp = VarlenProblem::new(cu(&[s as i32; 3]), cu(&[s as i32; 3]), hq, hkv, d)
            .unwrap()
            .with_mask(mask);
        let dense = AttnProblem::new(AttnShape {
            heads_kv: hkv,
            ..AttnShape::new(b, s, hq, d)
        })
        .unwrap()
        .with_mask(mask);
        let q: Vec<f16> = random_vec(b * s * hq * d, 1);
        let k: Vec<f16> = random_vec(b * s * hkv * d, 2);
        let v: Vec<f16> = random_vec(b * s * hkv * d, 3);
        let packed = forward(BackendChoice::Cpu, &vp, &q, &k, &v).unwrap();
        let want = flashattn::forward(BackendChoice::Cpu, &dense, &q, &k, &v).unwrap();
        assert_eq!(packed.o, want.o);
        for bb in 0..b {
            for h in 0..hq {
                for i in 0..s {
                    assert_eq!(
                        packed.lse[h * b * s + bb * s + i].to_bits(),
                        want.lse[(bb * hq + h) * s + i].to_bits()
                    );
                }
            }
        }
    }
}

#[test]
fn ragged_batches_match_the_oracle() {
    // (q lengths, k lengths, heads_q, heads_kv, head_dim)
    type Batch<'a> = (&'a [i32], &'a [i32], usize, usize, usize);
    let batches: [Batch; 4] = [
        (&[0, 5, 17, 0, 3], &[4, 0, 17, 9, 30], 2, 1, 24),
        (&[1, 1, 1, 1], &[300, 7, 1, 129], 8, 1, 64),
        (&[9, 700, 13], &[9, 700, 40], 4, 2, 32),
        (&[63, 1, 65], &[129, 255, 1], 6, 3, 40),
    ];
    for (lq, lk, hq, hkv, d) in batches {
        for mask in [Mask::None, Mask::Causal] {
            let base = VarlenProblem::new(cu(lq), cu(lk), hq, hkv, d)
                .unwrap()
                .with_mask(mask);
            let label = format!("q {lq:?} k {lk:?} h {hq}/{hkv} d{d} {mask:?}");
            run::<f16>(&base, &label);
            run::<bf16>(&base, &label);
            run::<f32>(&base, &label);
            let slopes: Vec<f32> = (0..lq.len() * hq)
                .map(|x| 0.02 * (x % 7 + 1) as f32)
                .collect();
            let modded = base
                .clone()
                .with_scores(ScoreMods {
                    window: Window::from_fa(24, 3).unwrap(),
                    softcap: Some(30.0),
                    alibi: Some(Alibi {
                        slopes,
                        per_batch: true,
                    }),
                    sink: None,
                })
                .unwrap();
            run::<f16>(&modded, &format!("{label} window+softcap+alibi"));
        }
    }
}

/// Zero-length sequences: a query with no key gives o = 0 and lse = -inf; sequences without
/// queries produce nothing.
#[test]
fn empty_sequences() {
    let p = VarlenProblem::new(cu(&[2, 0, 3]), cu(&[0, 5, 4]), 1, 1, 8).unwrap();
    let q: Vec<f32> = random_vec(5 * 8, 1);
    let kv: Vec<f32> = random_vec(9 * 8, 2);
    let out = forward(BackendChoice::Cpu, &p, &q, &kv, &kv).unwrap();
    assert!(out.o[..16].iter().all(|&x| x == 0.0));
    assert!(out.lse[..2].iter().all(|&x| x == f32::NEG_INFINITY));
    assert!(out.lse[2..].iter().all(|x| x.is_finite()));
    assert_eq!((p.max_seqlen_q(), p.max_seqlen_k()), (3, 5));
}

#[test]
fn invalid_offsets_are_typed_errors() {
    let bad = |q: Vec<i32>, k: Vec<i32>| VarlenProblem::new(q, k, 2, 1, 8).unwrap_err();
    for e in [
        bad(vec![0], vec![0]),
        bad(vec![1, 3], vec![0, 3]),
        bad(vec![0, 4, 2], vec![0, 1, 2]),
        bad(vec![0, 4], vec![0, 1, 2]),
    ] {
        assert!(matches!(e, AttnError::InvalidInput { .. }), "{e}");
    }
    assert!(matches!(
        VarlenProblem::new(vec![0, 3], vec![0, 3], 3, 2, 8).unwrap_err(),
        AttnError::HeadsNotMultiple { .. }
    ));
    let p = VarlenProblem::new(cu(&[3, 2]), cu(&[4, 4]), 2, 1, 8).unwrap();
    let x = vec![f16::ONE; 5 * 2 * 8];
    let e = forward(BackendChoice::Cpu, &p, &x[..79], &x, &x).unwrap_err();
    assert!(
        matches!(e, AttnError::BufferTooShort { tensor: "q", .. }),
        "{e}"
    );
    // Sizes whose element count does not fit (new-user trial: it wrapped and then panicked).
    let huge = VarlenProblem::new(
        vec![0, 1, 1 << 30],
        vec![0, 1, 1 << 30],
        1 << 34,
        1 << 34,
        1,
    )
    .unwrap();
    let z = vec![0f32; 10];
    let e = forward(BackendChoice::Cpu, &huge, &z, &z, &z).unwrap_err();
    assert!(matches!(e, AttnError::Overflow { .. }), "{e}");
    assert!(matches!(
        reference(&huge, &z, &z, &z).unwrap_err(),
        AttnError::Overflow { .. }
    ));
    let slopes = ScoreMods {
        alibi: Some(Alibi {
            slopes: vec![0.5; 3],
            per_batch: true,
        }),
        ..ScoreMods::default()
    };
    assert!(p.with_scores(slopes).is_err());
}

/// Each sequence is its own problem: per-sequence ALiBi rows and the bottom-right diagonal of
/// its own lengths, built here by hand as dense batch-1 problems.
#[test]
fn each_sequence_is_its_own_problem() {
    let (lq, lk, hq, d) = ([3, 6], [5, 2], 2, 8);
    let slopes = vec![0.1, 0.2, 0.3, 0.4];
    let mods = |slopes: Vec<f32>, per_batch| ScoreMods {
        window: Window::from_fa(2, -1).unwrap(),
        softcap: None,
        alibi: Some(Alibi { slopes, per_batch }),
        sink: None,
    };
    let p = VarlenProblem::new(cu(&lq), cu(&lk), hq, hq, d)
        .unwrap()
        .with_mask(Mask::Causal)
        .with_scores(mods(slopes.clone(), true))
        .unwrap();
    let q: Vec<f32> = random_vec(9 * hq * d, 4);
    let k: Vec<f32> = random_vec(7 * hq * d, 5);
    let v: Vec<f32> = random_vec(7 * hq * d, 6);
    let packed = forward(BackendChoice::Cpu, &p, &q, &k, &v).unwrap();
    let (mut q0, mut k0) = (0, 0);
    for b in 0..2 {
        let (sq, sk) = (lq[b] as usize, lk[b] as usize);
        let one = AttnProblem::new(AttnShape {
            batch: 1,
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: hq,
            heads_kv: hq,
            head_dim: d,
        })
        .unwrap()
        .with_mask(Mask::Causal)
        .with_scores(mods(slopes[b * hq..(b + 1) * hq].to_vec(), false))
        .unwrap();
        let row = hq * d;
        let f = flashattn::forward(
            BackendChoice::Cpu,
            &one,
            &q[q0 * row..(q0 + sq) * row],
            &k[k0 * row..(k0 + sk) * row],
            &v[k0 * row..(k0 + sk) * row],
        )
        .unwrap();
        assert_eq!(&packed.o[q0 * row..(q0 + sq) * row], &f.o[..]);
        for h in 0..hq {
            assert_eq!(
                &packed.lse[h * 9 + q0..h * 9 + q0 + sq],
                &f.lse[h * sq..(h + 1) * sq]
            );
        }
        (q0, k0) = (q0 + sq, k0 + sk);
    }
}
