//! The backward of packed variable-length batches (issue 38) on the CPU: ragged batches
//! (lengths 0, 1, 17, 128 and 300 in one batch, seqlen_q != seqlen_k per sequence, sequences
//! without queries or without keys, GQA, causal and not, a window, softcap and per-sequence
//! ALiBi, a learnable sink and its gradient) against the exact f64 gradients per sequence;
//! equal lengths packed give the dense batch's bytes; bad calls get typed errors.

use flashattn::compare::{Tolerance, diff, random_seed, random_vec, widen};
use flashattn::cuda::backward::BackwardOptions;
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::varlen::{VarlenProblem, backward, forward, offsets, reference_backward};
use flashattn::{AttnError, AttnProblem, AttnShape, BackendChoice, Element, Mask};
use half::{bf16, f16};

/// Inputs of a batch: q, k, v random, o and lse from the CPU forward, do random.
struct Inputs<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    o: Vec<T>,
    lse: Vec<f32>,
    d_o: Vec<T>,
}

fn inputs<T: Element>(p: &VarlenProblem, seed: u64) -> Inputs<T> {
    let (nq, nk) = p.packed_lens().unwrap();
    let q: Vec<T> = random_vec(nq, seed);
    let k: Vec<T> = random_vec(nk, seed ^ 1);
    let v: Vec<T> = random_vec(nk, seed ^ 2);
    let f = forward(BackendChoice::Cpu, p, &q, &k, &v).unwrap();
    let d_o = random_vec(nq, seed ^ 3);
    Inputs {
        q,
        k,
        v,
        o: f.o,
        lse: f.lse,
        d_o,
    }
}

fn check<T: Element>(p: &VarlenProblem, label: &str) {
    let seed = random_seed();
    let x = inputs::<T>(p, seed);
    let opts = BackwardOptions::default();
    let g = backward(
        BackendChoice::Cpu,
        p,
        &x.q,
        &x.k,
        &x.v,
        &x.o,
        &x.lse,
        &x.d_o,
        opts,
    )
    .unwrap();
    assert!(g.ran.starts_with("cpu"), "{}", g.ran);
    let exact = reference_backward(p, &x.q, &x.k, &x.v, &x.d_o).unwrap();
    let tol = Tolerance::for_dtype(T::DTYPE).o_rel_l2;
    for (name, got, want) in [
        ("dq", &g.dq, &exact.dq),
        ("dk", &g.dk, &exact.dk),
        ("dv", &g.dv, &exact.dv),
    ] {
        let d = diff(widen(got), want);
        assert!(
            d.is_clean() && d.rel_l2 <= tol,
            "{label} {} {name} seed={seed}: {d} (bound {tol:e})",
            T::DTYPE
        );
    }
    // A learnable sink's gradient: exactly when the problem has a sink, within the same bound.
    assert_eq!(g.d_sink.is_some(), p.scores.sink.is_some(), "{label}");
    assert_eq!(exact.d_sink.is_some(), p.scores.sink.is_some(), "{label}");
    if let (Some(got), Some(want)) = (&g.d_sink, &exact.d_sink) {
        let d = diff(widen(got), want);
        assert!(
            d.is_clean() && d.rel_l2 <= tol,
            "{label} {} d_sink seed={seed}: {d} (bound {tol:e})",
            T::DTYPE
        );
    }
    // Exact zeros where the gradient is zero by definition: rows of sequences without keys
    // (dq) and keys of sequences without queries (dk, dv).
    let lens = |cu: &[i32]| cu.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
    let (lq, lk) = (lens(&p.cu_seqlens_q), lens(&p.cu_seqlens_k));
    let (row_q, row_k) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    for b in 0..p.batch() {
        let (q0, k0) = (p.cu_seqlens_q[b] as usize, p.cu_seqlens_k[b] as usize);
        if lk[b] == 0 {
            let rows = &g.dq[q0 * row_q..(q0 + lq[b] as usize) * row_q];
            assert!(rows.iter().all(|x| x.to_f32() == 0.0), "{label}: dq of {b}");
        }
        if lq[b] == 0 {
            for grad in [&g.dk, &g.dv] {
                let rows = &grad[k0 * row_k..(k0 + lk[b] as usize) * row_k];
                assert!(
                    rows.iter().all(|x| x.to_f32() == 0.0),
                    "{label}: dk/dv of {b}"
                );
            }
        }
    }
}

fn batch(lq: &[usize], lk: &[usize], hq: usize, hkv: usize, d: usize) -> VarlenProblem {
    VarlenProblem::new(offsets(lq), offsets(lk), hq, hkv, d).unwrap()
}

#[test]
fn ragged_batches_match_the_exact_gradients() {
    // Lengths 0, 1, 17, 128, 300 in one batch; seqlen_q != seqlen_k (both ways, and causal
    // rows that see no key); a sequence without queries, then one without keys.
    let batches = [
        (vec![0, 1, 17, 128, 300], vec![5, 17, 1, 128, 300]),
        (vec![300, 128, 17, 1, 3], vec![0, 200, 17, 300, 0]),
    ];
    for (lq, lk) in &batches {
        for (hq, hkv, d) in [(4, 2, 64), (3, 3, 40), (4, 1, 36)] {
            for mask in [Mask::None, Mask::Causal] {
                let p = batch(lq, lk, hq, hkv, d).with_mask(mask);
                let label = format!("q{lq:?} k{lk:?} hq={hq} hkv={hkv} d={d} {mask:?}");
                check::<f16>(&p, &label);
                check::<bf16>(&p, &label);
            }
        }
    }
}

#[test]
fn score_modifiers_per_sequence() {
    let p = batch(&[65, 0, 130, 1], &[130, 7, 65, 40], 4, 2, 32)
        .with_mask(Mask::Causal)
        .with_scores(ScoreMods {
            window: Window::from_fa(30, 0).unwrap(),
            softcap: Some(5.0),
            alibi: Some(Alibi {
                slopes: (0..16).map(|i| 0.05 * (i + 1) as f32).collect(),
                per_batch: true,
            }),
            sink: None,
        })
        .unwrap();
    check::<f16>(&p, "window softcap alibi per sequence");
    check::<bf16>(&p, "window softcap alibi per sequence");
}

/// A learnable sink: dq, dk, dv through the sink-aware lse, and d_sink summed over every
/// packed row, against the exact gradients (sequences without keys or queries, causal rows
/// that see no key: their lse is the sink and they add nothing); with the modifiers too.
#[test]
fn a_learnable_sink_and_its_gradient() {
    let sink = |hq: usize| ScoreMods {
        sink: Some((0..hq).map(|h| 0.7 * h as f32 - 1.0).collect()),
        ..ScoreMods::default()
    };
    let (lq, lk) = (vec![300, 128, 17, 1, 3], vec![0, 200, 17, 300, 0]);
    for (hq, hkv, d) in [(4, 2, 64), (4, 1, 36)] {
        for mask in [Mask::None, Mask::Causal] {
            let p = batch(&lq, &lk, hq, hkv, d)
                .with_mask(mask)
                .with_scores(sink(hq))
                .unwrap();
            let label = format!("sink q{lq:?} k{lk:?} hq={hq} hkv={hkv} d={d} {mask:?}");
            check::<f16>(&p, &label);
            check::<bf16>(&p, &label);
        }
    }
    let p = batch(&[65, 0, 130, 1], &[130, 7, 65, 40], 4, 2, 32)
        .with_mask(Mask::Causal)
        .with_scores(ScoreMods {
            window: Window::from_fa(30, 0).unwrap(),
            softcap: Some(5.0),
            ..sink(4)
        })
        .unwrap();
    check::<f16>(&p, "sink window softcap");
    // No key anywhere: o = 0, lse = sink, d_sink = 0 exactly.
    let p = batch(&[3, 5], &[0, 0], 2, 1, 8)
        .with_scores(sink(2))
        .unwrap();
    check::<f16>(&p, "sink without keys");
    let x = inputs::<f16>(&p, 5);
    let g = backward(
        BackendChoice::Cpu,
        &p,
        &x.q,
        &x.k,
        &x.v,
        &x.o,
        &x.lse,
        &x.d_o,
        BackwardOptions::default(),
    )
    .unwrap();
    assert_eq!(g.d_sink, Some(vec![0.0; 2]));
}

/// Equal lengths packed are a dense batch: the same gradient bytes (same layouts).
#[test]
fn equal_lengths_are_a_dense_batch() {
    let (b, sq, sk, hq, hkv, d) = (3, 37, 29, 4, 2, 16);
    for mask in [Mask::None, Mask::Causal] {
        let vp = batch(&[sq; 3], &[sk; 3], hq, hkv, d).with_mask(mask);
        let dense = AttnProblem::new(AttnShape {
            batch: b,
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
        })
        .unwrap()
        .with_mask(mask);
        let x = inputs::<f16>(&vp, 7);
        // lse [heads_q, total_q] to the dense [batch, heads_q, seqlen_q].
        let mut lse = vec![0.0f32; b * hq * sq];
        for bb in 0..b {
            for h in 0..hq {
                for i in 0..sq {
                    lse[(bb * hq + h) * sq + i] = x.lse[h * b * sq + bb * sq + i];
                }
            }
        }
        let packed = backward(
            BackendChoice::Cpu,
            &vp,
            &x.q,
            &x.k,
            &x.v,
            &x.o,
            &x.lse,
            &x.d_o,
            BackwardOptions::default(),
        )
        .unwrap();
        let (nq, nk) = vp.packed_lens().unwrap();
        let (mut dq, mut dk, mut dv) = (
            vec![f16::ZERO; nq],
            vec![f16::ZERO; nk],
            vec![f16::ZERO; nk],
        );
        flashattn::cpu_backward::backward(
            &dense, &x.q, &x.k, &x.v, &x.o, &lse, &x.d_o, &mut dq, &mut dk, &mut dv,
        )
        .unwrap();
        assert_eq!(packed.dq, dq, "{mask:?}");
        assert_eq!(packed.dk, dk, "{mask:?}");
        assert_eq!(packed.dv, dv, "{mask:?}");
        // With a sink: the dense sink_grad's bytes too (the same rows in the same order).
        let logits = vec![0.5, -1.0, 2.0, 0.0];
        let sunk = |mods: ScoreMods| ScoreMods {
            sink: Some(logits.clone()),
            ..mods
        };
        let vps = vp.clone().with_scores(sunk(ScoreMods::default())).unwrap();
        let xs = inputs::<f16>(&vps, 8);
        let packed = backward(
            BackendChoice::Cpu,
            &vps,
            &xs.q,
            &xs.k,
            &xs.v,
            &xs.o,
            &xs.lse,
            &xs.d_o,
            BackwardOptions::default(),
        )
        .unwrap();
        let dense_sunk = dense
            .clone()
            .with_scores(sunk(ScoreMods::default()))
            .unwrap();
        let mut lse_s = vec![0.0f32; b * hq * sq];
        for bb in 0..b {
            for h in 0..hq {
                for i in 0..sq {
                    lse_s[(bb * hq + h) * sq + i] = xs.lse[h * b * sq + bb * sq + i];
                }
            }
        }
        let mut d_sink = vec![0.0f32; hq];
        flashattn::cpu_backward::sink_grad(&dense_sunk, &xs.o, &lse_s, &xs.d_o, &mut d_sink)
            .unwrap();
        assert_eq!(packed.d_sink, Some(d_sink), "{mask:?}");
        // The oracle agrees with the dense oracle too.
        let exact = reference_backward(&vp, &x.q, &x.k, &x.v, &x.d_o).unwrap();
        let dense_exact =
            flashattn::reference_grad::backward(&dense, &x.q, &x.k, &x.v, &x.d_o).unwrap();
        assert_eq!(exact, dense_exact, "{mask:?}");
    }
}

#[test]
fn bad_calls_get_typed_errors() {
    let p = batch(&[3, 5], &[4, 6], 2, 1, 8);
    let x = inputs::<f16>(&p, 11);
    let run = |p: &VarlenProblem, cut: &str| {
        let short = |name: &str, v: &[f16]| -> Vec<f16> {
            if name == cut {
                v[..v.len() - 1].to_vec()
            } else {
                v.to_vec()
            }
        };
        let lse = if cut == "lse" {
            x.lse[..x.lse.len() - 1].to_vec()
        } else {
            x.lse.clone()
        };
        backward(
            BackendChoice::Cpu,
            p,
            &short("q", &x.q),
            &short("k", &x.k),
            &short("v", &x.v),
            &short("o", &x.o),
            &lse,
            &short("do", &x.d_o),
            BackwardOptions::default(),
        )
    };
    for name in ["q", "k", "v", "o", "lse", "do"] {
        match run(&p, name) {
            Err(AttnError::BufferTooShort { tensor, .. }) => assert_eq!(tensor, name),
            other => panic!("{name} too short: {other:?}"),
        }
    }
    // Offsets that decrease, do not start at 0, or differ in count.
    for (cq, ck) in [
        (vec![0, 3, 2], vec![0, 4, 10]),
        (vec![1, 3, 8], vec![0, 4, 10]),
        (vec![0, 3, 8], vec![0, 10]),
    ] {
        let bad = VarlenProblem {
            cu_seqlens_q: cq.clone(),
            cu_seqlens_k: ck.clone(),
            ..p.clone()
        };
        match run(&bad, "") {
            Err(AttnError::InvalidInput { what }) => assert!(what.contains("cu_seqlens"), "{what}"),
            other => panic!("{cq:?} {ck:?}: {other:?}"),
        }
    }
}
