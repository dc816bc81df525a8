//! Field edge cases (issue: "Edge cases from the field") on the CPU backend; the same cases run
//! on every GPU kernel in `flashattn check` (tools/src/check/cases.rs). Seeds are printed; replay with
//! FLASHATTN_SEED=<seed>.

use flashattn::compare::{Tolerance, dense_o, diff, random_inputs, random_seed};
use flashattn::{AttnProblem, Element, Mask, cpu, reference};
use half::{bf16, f16};

mod common;

/// Batch 1: every case here is about lengths, heads or inputs.
fn problem(sq: usize, sk: usize, hq: usize, hkv: usize, d: usize, mask: Mask) -> AttnProblem {
    common::problem(1, sq, sk, hq, hkv, d, mask)
}

/// Runs the CPU backend with `o` and `lse` longer than needed and poisoned; returns them whole.
fn run_poisoned<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    guard: usize,
) -> (Vec<T>, Vec<f32>) {
    let s = p.shape;
    let olen = p
        .o_strides
        .required_len("o", s.batch, s.seqlen_q, s.heads_q, s.head_dim)
        .unwrap();
    let mut o = vec![T::from_f32(f32::NAN); olen + guard];
    let mut lse = vec![f32::NAN; s.lse_len() + guard];
    cpu::forward(p, q, k, v, &mut o, &mut lse).unwrap();
    (o, lse)
}

/// CPU vs the oracle on the query positions `rows` (all heads), within tolerance.
fn check_rows<T: Element>(p: &AttnProblem, rows: &[usize], label: &str) {
    let seed = random_seed();
    let (q, k, v) = random_inputs::<T>(p, seed);
    let s = p.shape;
    let (o, lse) = run_poisoned(p, &q, &k, &v, 0);
    let keys: Vec<_> = rows
        .iter()
        .flat_map(|&i| (0..s.heads_q).map(move |h| (0, i, h)))
        .collect();
    let exact = reference::attention_rows(p, &q, &k, &v, &keys).unwrap();
    let dense = dense_o(p, &o).unwrap();
    let (mut got, mut want, mut got_l, mut want_l) = (vec![], vec![], vec![], vec![]);
    for (&(_, i, h), (eo, el, _)) in keys.iter().zip(&exact) {
        let at = (i * s.heads_q + h) * s.head_dim;
        got.extend_from_slice(&dense[at..at + s.head_dim]);
        want.extend_from_slice(eo);
        got_l.push(lse[h * s.seqlen_q + i] as f64);
        want_l.push(*el);
    }
    let (od, ld) = (diff(got, &want), diff(got_l, &want_l));
    Tolerance::for_dtype(T::DTYPE)
        .check(&format!("{label} {} seed={seed}", T::DTYPE), &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn decoding_one_query_sees_every_key() {
    for sk in [8, 1000, 65537] {
        let p = problem(1, sk, 8, 2, 128, Mask::Causal);
        check_rows::<f16>(&p, &[0], &format!("decode sk={sk}"));
        check_rows::<bf16>(&p, &[0], &format!("decode sk={sk}"));
    }
}

#[test]
fn every_channel_counts_for_odd_head_dims() {
    for d in [40, 72, 80, 96, 112, 256] {
        for mask in [Mask::None, Mask::Causal] {
            let p = problem(70, 70, 2, 1, d, mask);
            check_rows::<f16>(&p, &(0..70).collect::<Vec<_>>(), &format!("d={d} {mask:?}"));
        }
        // A change in the last channel alone must change the output.
        let p = problem(4, 4, 1, 1, d, Mask::None);
        let (q, k, mut v) = random_inputs::<f32>(&p, 7);
        let (o1, _) = run_poisoned(&p, &q, &k, &v, 0);
        for j in 0..4 {
            v[j * d + d - 1] += 100.0;
        }
        let (o2, _) = run_poisoned(&p, &q, &k, &v, 0);
        assert!(
            (0..4).all(|i| (o2[i * d + d - 1] - o1[i * d + d - 1] - 100.0).abs() < 1e-3),
            "d={d}: last channel ignored"
        );
    }
}

#[test]
fn short_sequences_leave_the_buffer_past_the_end_untouched() {
    const GUARD: usize = 512;
    for l in [1, 8, 17, 63, 127, 129] {
        for mask in [Mask::None, Mask::Causal] {
            let p = problem(l, l, 2, 2, 64, mask);
            let (q, k, v) = random_inputs::<f16>(&p, random_seed());
            let (o, lse) = run_poisoned(&p, &q, &k, &v, GUARD);
            let n = l * 2 * 64;
            assert!(
                o[..n].iter().all(|x| x.is_finite()),
                "l={l}: an o element was not written"
            );
            assert!(
                o[n..].iter().all(|x| x.is_nan()),
                "l={l}: o written past the end"
            );
            assert!(
                lse[2 * l..].iter().all(|x| x.is_nan()),
                "l={l}: lse written past the end"
            );
        }
    }
}

#[test]
fn both_sides_of_2_pow_16() {
    let rows = |l: usize| -> Vec<usize> {
        [0, 1, 127, 128, 32767, 32768, 65534, 65535, 65536, l - 1]
            .into_iter()
            .filter(|&i| i < l)
            .collect()
    };
    check_rows::<f16>(
        &problem(65536, 65536, 1, 1, 32, Mask::Causal),
        &rows(65536),
        "65536 causal",
    );
    check_rows::<bf16>(
        &problem(65537, 65537, 1, 1, 32, Mask::None),
        &rows(65537),
        "65537",
    );
    // 2^17 keys with one head (bottom-right causal: the last query sees all of them).
    check_rows::<f16>(
        &problem(64, 131072, 1, 1, 64, Mask::Causal),
        &[0, 31, 63],
        "sk=131072 causal",
    );
}

#[test]
fn gqa_64_query_heads_over_8_kv_heads() {
    for mask in [Mask::None, Mask::Causal] {
        let p = problem(256, 256, 64, 8, 128, mask);
        check_rows::<f16>(
            &p,
            &(0..256).collect::<Vec<_>>(),
            &format!("gqa 64/8 {mask:?}"),
        );
    }
}
