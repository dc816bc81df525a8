//! Learnable attention sinks (gpt-oss; issue 40 item 2) on the host: the oracle against the
//! definition written here independently (the sink as one more logit of the row, whose value
//! row is zero), the CPU backend against the oracle, the gradients (dq, dk, dv and d sink)
//! against central finite differences, the CPU backward and `sink_grad` against the exact
//! gradients, packed batches and the KV cache with rows that see no key, and the refusals.

use flashattn::compare::{
    Tolerance, dense_o, diff, diff_reference, random_inputs, random_seed, random_vec, widen,
};
use flashattn::cuda::KernelKind;
use flashattn::cuda::attention::check_gpu_problem;
use flashattn::reference_grad::{backward_f64, forward_f64};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::varlen::VarlenProblem;
use flashattn::{AttnError, AttnProblem, Element, Mask, cpu, cpu_backward, reference};
use half::{bf16, f16};

mod common;
use common::problem;

/// `p` with a sink (and the other modifiers of `mods`).
fn sunk(p: AttnProblem, sink: &[f32], mods: ScoreMods) -> AttnProblem {
    p.with_scores(ScoreMods {
        sink: Some(sink.to_vec()),
        ..mods
    })
    .unwrap()
}

/// gpt-oss's definition on dense f64 inputs: each row's visible logits and the sink's, one
/// softmax over all of them, the sink's column dropped (it has no value row).
fn brute(p: &AttnProblem, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let s = p.shape;
    let (d, sq, sk, hq, hkv) = (s.head_dim, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv);
    let sink = p.scores.sink.as_ref().expect("a sink");
    let mut o = vec![0.0; s.batch * sq * hq * d];
    let mut lse = vec![0.0; s.batch * hq * sq];
    for b in 0..s.batch {
        for h in 0..hq {
            let slope = p
                .scores
                .alibi
                .as_ref()
                .map_or(0.0, |a| f64::from(a.slope(b, h, hq)));
            for i in 0..sq {
                let qa = ((b * sq + i) * hq + h) * d;
                // (value row or none, logit)
                let mut logits: Vec<(Option<usize>, f64)> = p
                    .key_range(i)
                    .map(|j| {
                        let ka = ((b * sk + j) * hkv + h / (hq / hkv)) * d;
                        let x = (0..d).map(|t| q[qa + t] * k[ka + t]).sum::<f64>()
                            * f64::from(p.softmax_scale);
                        (Some(ka), p.scores.score(x, slope, i, j, sq, sk))
                    })
                    .collect();
                logits.push((None, f64::from(sink[h])));
                let m = logits.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|x| (x.1 - m).exp()).sum();
                lse[(b * hq + h) * sq + i] = m + z.ln();
                for (row, x) in logits {
                    if let Some(ka) = row {
                        for t in 0..d {
                            o[qa + t] += (x - m).exp() / z * v[ka + t];
                        }
                    }
                }
            }
        }
    }
    (o, lse)
}

/// Sinks that take a little of each row, most of it, and nothing; rows that see no key
/// (causal with sq > sk, a narrow window); GQA, MQA; with softcap, ALiBi and a window.
fn cases() -> Vec<(String, AttnProblem)> {
    let mut out = Vec::new();
    let plain = ScoreMods::default();
    let all = |hq: usize| ScoreMods {
        window: Window::from_fa(20, 3).unwrap(),
        softcap: Some(30.0),
        alibi: Some(Alibi::geometric(hq)),
        sink: None,
    };
    for (b, sq, sk, hq, hkv, d, mask) in [
        (1, 7, 7, 2, 2, 16, Mask::None),
        (2, 40, 30, 4, 2, 8, Mask::Causal),
        (1, 131, 300, 4, 1, 40, Mask::Causal),
        (2, 65, 129, 2, 1, 24, Mask::None),
    ] {
        let base = problem(b, sq, sk, hq, hkv, d, mask);
        let mild: Vec<f32> = (0..hq).map(|h| 0.5 - h as f32).collect();
        let strong: Vec<f32> = (0..hq).map(|h| 8.0 + h as f32).collect();
        let off: Vec<f32> = vec![-30.0; hq];
        for (name, sink, mods) in [
            ("mild", &mild, plain.clone()),
            ("strong", &strong, plain.clone()),
            ("-30", &off, plain.clone()),
            ("mild + window/softcap/alibi", &mild, all(hq)),
        ] {
            out.push((
                format!("{} {mask:?} sink {name}", base.shape),
                sunk(base.clone(), sink, mods),
            ));
        }
    }
    out
}

#[test]
fn the_oracle_is_gpt_oss_definition() {
    for (label, p) in cases() {
        let s = p.shape;
        let q = random_vec::<f32>(s.batch * s.seqlen_q * s.heads_q * s.head_dim, 1);
        let k = random_vec::<f32>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, 2);
        let v = random_vec::<f32>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim, 3);
        let w = |x: &[f32]| x.iter().map(|&e| f64::from(e)).collect::<Vec<_>>();
        let (o, lse) = brute(&p, &w(&q), &w(&k), &w(&v));
        let r = reference::attention(&p, &q, &k, &v).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
        assert!(o.iter().zip(&r.o).all(|(a, b)| close(*a, *b)), "{label}: o");
        assert!(
            lse.iter().zip(&r.lse).all(|(a, b)| close(*a, *b)),
            "{label}: lse"
        );
        // The f64 forward the gradients differentiate agrees too.
        let (o2, l2) = forward_f64(&p, &w(&q), &w(&k), &w(&v));
        assert!(o2.iter().zip(&r.o).all(|(a, b)| close(*a, *b)), "{label}");
        assert!(l2.iter().zip(&r.lse).all(|(a, b)| close(*a, *b)), "{label}");
        // A row that sees no key: o = 0 and lse = the sink's logit.
        for b in 0..s.batch {
            for h in 0..s.heads_q {
                for i in (0..s.seqlen_q).filter(|&i| p.key_range(i).is_empty()) {
                    let at = ((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim;
                    assert!(r.o[at..at + s.head_dim].iter().all(|&x| x == 0.0));
                    let sink = p.scores.sink_of(h).unwrap();
                    assert_eq!(r.lse[(b * s.heads_q + h) * s.seqlen_q + i], sink, "{label}");
                }
            }
        }
    }
}

fn cpu_vs_oracle<T: Element>(p: &AttnProblem, label: &str) {
    let seed = random_seed();
    let (q, k, v) = random_inputs::<T>(p, seed);
    let s = p.shape;
    let mut o = vec![T::from_f32(f32::NAN); q.len()];
    let mut lse = vec![f32::NAN; s.lse_len()];
    cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
    let r = reference::attention(p, &q, &k, &v).unwrap();
    let (od, ld) = diff_reference(p, dense_o(p, &o).unwrap(), widen(&lse), &r);
    Tolerance::for_dtype(T::DTYPE)
        .check(&format!("{label} {} seed={seed}", T::DTYPE), &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cpu_matches_the_oracle() {
    for (label, p) in cases() {
        cpu_vs_oracle::<f16>(&p, &label);
        cpu_vs_oracle::<bf16>(&p, &label);
        cpu_vs_oracle::<f32>(&p, &label);
    }
}

/// dq, dk, dv and d sink of the f64 oracle against central differences of its forward, with a
/// mask that leaves rows without keys (causal, sq > sk), a window, softcap and ALiBi.
#[test]
fn gradients_match_finite_differences() {
    let h = 1e-6;
    for (mask, mods, sink) in [
        (Mask::None, ScoreMods::default(), [0.3f32, -0.7]),
        (Mask::Causal, ScoreMods::default(), [1.5, 2.5]),
        (
            Mask::None,
            ScoreMods {
                window: Window::from_fa(1, 1).unwrap(),
                softcap: Some(1.5),
                alibi: Some(Alibi::geometric(2)),
                sink: None,
            },
            [-0.4, 0.9],
        ),
    ] {
        let p = sunk(
            problem(1, 5, 4, 2, 1, 3, mask).with_scale(0.9).unwrap(),
            &sink,
            mods,
        );
        let n = |x: usize, seed| {
            random_vec::<f32>(x, seed)
                .iter()
                .map(|&e| f64::from(e) * 2.0)
                .collect::<Vec<f64>>()
        };
        let (q, k, v, d_o) = (n(5 * 2 * 3, 1), n(4 * 3, 2), n(4 * 3, 3), n(5 * 2 * 3, 4));
        let g = backward_f64(&p, &q, &k, &v, &d_o);
        let loss = |p: &AttnProblem, q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            forward_f64(p, q, k, v)
                .0
                .iter()
                .zip(&d_o)
                .map(|(a, b)| a * b)
                .sum()
        };
        let label = format!("{mask:?} {:?}", p.scores);
        for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
            for e in 0..grad.len() {
                let bumped = |delta: f64| {
                    let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
                    [&mut q2, &mut k2, &mut v2][which][e] += delta;
                    loss(&p, &q2, &k2, &v2)
                };
                let fd = (bumped(h) - bumped(-h)) / (2.0 * h);
                assert!(
                    (fd - grad[e]).abs() < 1e-7 * grad[e].abs().max(1.0),
                    "{label} {which} {e}: {} vs {fd}",
                    grad[e]
                );
            }
        }
        // d sink: the sink's logits bumped (in f32, then the difference taken exactly).
        let d_sink = g.d_sink.as_ref().expect("a sink gradient");
        for hh in 0..2 {
            let bumped = |delta: f32| {
                let mut s2 = sink;
                s2[hh] += delta;
                let p2 = AttnProblem {
                    scores: ScoreMods {
                        sink: Some(s2.to_vec()),
                        ..p.scores.clone()
                    },
                    ..p.clone()
                };
                (loss(&p2, &q, &k, &v), f64::from(s2[hh]))
            };
            let ((hi, xh), (lo, xl)) = (bumped(1e-3), bumped(-1e-3));
            let fd = (hi - lo) / (xh - xl);
            // Central differences at a step of 1e-3: error ~ 1e-7 of the third derivative.
            assert!(
                (fd - d_sink[hh]).abs() < 1e-6 * d_sink[hh].abs().max(1.0),
                "{label} d_sink[{hh}]: {} vs {fd}",
                d_sink[hh]
            );
            assert!(d_sink[hh] != 0.0, "{label}: a check that cannot fail");
        }
    }
}

/// The CPU backward (dq, dk, dv from the sink-aware lse) and `sink_grad` against the exact
/// gradients, in f32 and f16; `sink_grad` the same bytes run to run.
#[test]
fn cpu_backward_and_sink_grad_match_the_exact_gradients() {
    fn run<T: Element>(p: &AttnProblem, bound: f64, label: &str) {
        let s = p.shape;
        let (q, k, v) = random_inputs::<T>(p, 5);
        let n_q = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
        let n_k = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
        let mut o = vec![T::default(); n_q];
        let mut lse = vec![0.0f32; s.lse_len()];
        cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
        let d_o: Vec<T> = random_vec(n_q, 9);
        let (mut dq, mut dk, mut dv) = (
            vec![T::default(); n_q],
            vec![T::default(); n_k],
            vec![T::default(); n_k],
        );
        cpu_backward::backward(p, &q, &k, &v, &o, &lse, &d_o, &mut dq, &mut dk, &mut dv).unwrap();
        let mut d_sink = vec![f32::NAN; s.heads_q];
        cpu_backward::sink_grad(p, &o, &lse, &d_o, &mut d_sink).unwrap();
        let exact = flashattn::reference_grad::backward(p, &q, &k, &v, &d_o).unwrap();
        let want = exact.d_sink.as_ref().unwrap();
        for (name, got, want) in [
            ("dq", widen(&dq).collect::<Vec<_>>(), &exact.dq),
            ("dk", widen(&dk).collect(), &exact.dk),
            ("dv", widen(&dv).collect(), &exact.dv),
            ("d_sink", widen(&d_sink).collect(), want),
        ] {
            let dd = diff(got, want);
            assert!(
                dd.is_clean() && dd.rel_l2 <= bound,
                "{label} {} {name}: {dd} (bound {bound:e})",
                T::DTYPE
            );
        }
        let mut again = vec![0.0f32; s.heads_q];
        cpu_backward::sink_grad(p, &o, &lse, &d_o, &mut again).unwrap();
        assert_eq!(
            d_sink.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    for (label, p) in cases() {
        // f16: its o and P rounded (the bound check/backward.rs holds the GPU to).
        run::<f16>(&p, 2.0 * Tolerance::F16.o_rel_l2, &label);
        run::<f32>(&p, 1e-4, &label);
    }
}

/// Packed batches: a sequence without keys (its rows get lse = sink_h) and one without
/// queries, on the CPU path against the packed oracle.
#[test]
fn packed_batches_and_rows_without_keys() {
    let (lq, lk, hq, hkv, d) = ([5usize, 0, 7, 3], [9usize, 4, 0, 11], 4, 2, 16);
    let off = |l: &[usize]| flashattn::varlen::offsets(l);
    let sink = vec![0.25, -1.0, 3.0, 7.5];
    let p = VarlenProblem::new(off(&lq), off(&lk), hq, hkv, d)
        .unwrap()
        .with_mask(Mask::Causal)
        .with_scores(ScoreMods {
            sink: Some(sink.clone()),
            ..ScoreMods::default()
        })
        .unwrap();
    let (tq, tk) = (p.total_q(), p.total_k());
    let q: Vec<f16> = random_vec(tq * hq * d, 1);
    let k: Vec<f16> = random_vec(tk * hkv * d, 2);
    let v: Vec<f16> = random_vec(tk * hkv * d, 3);
    let out = flashattn::varlen::forward(flashattn::BackendChoice::Cpu, &p, &q, &k, &v).unwrap();
    let r = flashattn::varlen::reference(&p, &q, &k, &v).unwrap();
    let (od, ld) = flashattn::varlen::diff_reference(&p, &out, &r);
    Tolerance::F16
        .check("varlen with a sink", &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
    // Sequence 2 has queries 5..12 and no key: its rows' lse is each head's sink.
    for (h, &s) in sink.iter().enumerate() {
        for i in 5..12 {
            assert_eq!(out.lse[h * tq + i], s);
            assert_eq!(r.lse[h * tq + i], f64::from(s));
        }
    }
}

#[test]
fn refusals() {
    let p = problem(2, 8, 8, 4, 2, 16, Mask::None);
    let with = |sink: Vec<f32>| {
        p.clone().with_scores(ScoreMods {
            sink: Some(sink),
            ..ScoreMods::default()
        })
    };
    // Wrong length, non-finite values: typed errors naming the problem.
    for (bad, says) in [
        (vec![0.5; 3], "expected 4"),
        (vec![0.5; 8], "expected 4"),
        (vec![0.5, f32::NAN, 0.0, 0.0], "learnable_sink[1]"),
        (vec![0.5, 0.0, f32::NEG_INFINITY, 0.0], "learnable_sink[2]"),
    ] {
        match with(bad) {
            Err(e @ AttnError::InvalidInput { .. }) => assert!(e.to_string().contains(says), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    let sunk = with(vec![0.5, -1.0, 2.0, 0.0]).unwrap();
    // The rungs that serve modifiers take it; naive and simt refuse it by name.
    for kernel in [KernelKind::Mma, KernelKind::Wgmma] {
        assert!(check_gpu_problem(&sunk, kernel).is_ok());
    }
    for kernel in [KernelKind::Naive, KernelKind::Simt] {
        match check_gpu_problem(&sunk, kernel) {
            Err(e @ AttnError::UnsupportedFeature { .. }) => {
                assert!(e.to_string().contains("learnable sink"), "{e}")
            }
            other => panic!("{kernel}: {other:?}"),
        }
    }
    // The GPU backward serves it (its gradient is a kernel of its own).
    assert!(flashattn::cuda::backward::unsupported(&sunk).is_none());
    // FP8 has none, on every backend.
    let e = flashattn::fp8::check_call(
        &sunk,
        &flashattn::fp8::Fp8Descales::per_tensor(1.0, 1.0, 1.0),
        [usize::MAX; 5],
    )
    .unwrap_err();
    assert!(matches!(e, AttnError::UnsupportedFeature { .. }), "{e}");
    // sink_grad: a problem without a sink, a d_sink too short.
    let (q, _, _) = random_inputs::<f32>(&sunk, 1);
    let lse = vec![0.0f32; sunk.shape.lse_len()];
    let e = cpu_backward::sink_grad(&p, &q, &lse, &q, &mut [0.0; 4]).unwrap_err();
    assert!(matches!(e, AttnError::InvalidInput { .. }), "{e}");
    let e = cpu_backward::sink_grad(&sunk, &q, &lse, &q, &mut [0.0; 3]).unwrap_err();
    assert!(
        matches!(
            e,
            AttnError::BufferTooShort {
                tensor: "d_sink",
                ..
            }
        ),
        "{e}"
    );
}
