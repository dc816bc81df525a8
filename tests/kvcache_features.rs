//! FlashAttention-2's `flash_attn_with_kvcache` arguments beyond the cache itself (issue 40,
//! item 5) on the CPU backend and the oracle: rotary embeddings (interleaved and not, per-row
//! and uniform query positions) against rotations written out here; `cache_batch_idx` against
//! the same call on the gathered cache; `cache_leftpad` against the same call on caches
//! shifted to start at row 0; every misuse refused with its typed error; the device's
//! clamping rule.

use flashattn::compare::{Tolerance, diff_rows, random_vec};
use flashattn::kvcache::{
    CacheLayout, HostIndex, KvCacheProblem, Rotary, RotaryTables, append, clamp_index, forward_cpu,
    place, reference, shuffled_pages,
};
use flashattn::scores::{ScoreMods, Window};
use flashattn::{AttnError, Element, Mask};
use half::{bf16, f16};

fn contiguous(
    lens: Vec<i32>,
    new: usize,
    cap: usize,
    (sq, hq, hkv, d): (usize, usize, usize, usize),
) -> KvCacheProblem {
    KvCacheProblem::new(
        lens.len(),
        sq,
        hq,
        hkv,
        d,
        CacheLayout::Contiguous { seqlen_cache: cap },
        lens,
        new,
    )
    .unwrap()
}

/// The o row (b, i, h) of lse row n of `[batch, heads_q, seqlen_q]`.
fn row_of(p: &KvCacheProblem) -> impl Fn(usize) -> usize {
    let (hq, sq, d) = (p.heads_q, p.seqlen_q, p.head_dim);
    move |n| {
        let row = n / d;
        let (b, i, h) = (row / (sq * hq), (row / hq) % sq, row % hq);
        (b * hq + h) * sq + i
    }
}

/// FA2's rotation of one head (`apply_rotary_emb`), written out in f64 from the element
/// values: the pairs of column k at position pos.
fn rotate_f64<T: Element>(x: &[T], r: &Rotary, cos: &[T], sin: &[T], pos: usize) -> Vec<T> {
    let half = r.dim / 2;
    let mut out = x.to_vec();
    for k in 0..half {
        let (i0, i1) = if r.interleaved {
            (2 * k, 2 * k + 1)
        } else {
            (k, k + half)
        };
        let (c, s) = (cos[pos * half + k].to_f64(), sin[pos * half + k].to_f64());
        let (x0, x1) = (x[i0].to_f64(), x[i1].to_f64());
        out[i0] = T::from_f32((x0 * c - x1 * s) as f32);
        out[i1] = T::from_f32((x1 * c + x0 * s) as f32);
    }
    out
}

/// Elements that differ by more than one unit in the last place of `T` (the host's fused
/// rotation and the f64 one above may round apart by that much).
fn ulps_apart<T: Element>(a: &[T], b: &[T]) -> usize {
    let eps = if T::DTYPE == flashattn::DType::BF16 {
        2f32.powi(-7)
    } else {
        2f32.powi(-10)
    };
    a.iter()
        .zip(b)
        .filter(|(x, y)| {
            let (x, y) = (x.to_f32(), y.to_f32());
            (x - y).abs() > eps * x.abs().max(y.abs()) + 1e-7
        })
        .count()
}

/// A rotary call against its definition: the new keys in the cache rotated at
/// `cache_seqlens[b] + t`, q at `cache_seqlens[b] (+ i)`, and o the oracle's on those
/// inputs without rotary.
fn check_rotary<T: Element>(p: &KvCacheProblem, label: &str) {
    let r = p.rotary.unwrap();
    let d = p.head_dim;
    let row = p.heads_kv * d;
    let logical: Vec<Vec<T>> = (0..p.batch)
        .map(|b| random_vec(p.cache_seqlens[b] as usize * row, 40 + b as u64))
        .collect();
    let (kc0, vc0) = (place(p, &logical), place(p, &logical));
    let q: Vec<T> = random_vec(p.batch * p.seqlen_q * p.heads_q * d, 1);
    let nn = p.batch * p.seqlen_new * row;
    let (kn, vn): (Vec<T>, Vec<T>) = (random_vec(nn, 2), random_vec(nn, 3));
    let angles: Vec<f32> = random_vec(r.seqlen_ro * r.dim / 2, 4);
    let cos: Vec<T> = angles
        .iter()
        .map(|a| T::from_f32((3.0 * a).cos()))
        .collect();
    let sin: Vec<T> = angles
        .iter()
        .map(|a| T::from_f32((3.0 * a).sin()))
        .collect();
    let tables = RotaryTables {
        cos: &cos,
        sin: &sin,
    };
    let (mut kc, mut vc) = (kc0.clone(), vc0.clone());
    let out = forward_cpu(p, &q, &mut kc, &mut vc, &kn, &vn, tables, 3).unwrap();
    // The inputs rotated by hand; the call without rotary on them.
    let per_row = p.mask.is_causal() || !p.scores.window.is_unbounded();
    let mut q_rot = q.clone();
    for (n, head) in q_rot.chunks_exact_mut(d).enumerate() {
        let (b, i) = (n / (p.seqlen_q * p.heads_q), (n / p.heads_q) % p.seqlen_q);
        let pos = p.cache_seqlens[b] as usize + if per_row { i } else { 0 };
        head.copy_from_slice(&rotate_f64(head, &r, &cos, &sin, pos));
    }
    let mut kn_rot = kn.clone();
    for (n, head) in kn_rot.chunks_exact_mut(d).enumerate() {
        let (b, t) = (
            n / (p.seqlen_new * p.heads_kv),
            (n / p.heads_kv) % p.seqlen_new,
        );
        let pos = p.cache_seqlens[b] as usize + t;
        head.copy_from_slice(&rotate_f64(head, &r, &cos, &sin, pos));
    }
    let plain = KvCacheProblem {
        rotary: None,
        ..p.clone()
    };
    let (mut kc2, mut vc2) = (kc0.clone(), vc0.clone());
    append(
        &plain,
        &mut kc2,
        &mut vc2,
        &kn_rot,
        &vn,
        RotaryTables::none(),
    )
    .unwrap();
    // The rotated keys: the same up to the rounding of the fused multiply-add.
    let finite = |x: &[T]| {
        x.iter()
            .map(|v| {
                if v.to_f32().is_nan() {
                    T::from_f32(0.0)
                } else {
                    *v
                }
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ulps_apart(&finite(&kc), &finite(&kc2)),
        0,
        "{label}: rotated keys"
    );
    let exact = reference(&plain, &q_rot, &kc2, &vc2, RotaryTables::none()).unwrap();
    let (od, ld) = diff_rows(
        out.o.iter().map(|x| x.to_f64()),
        out.lse.iter().map(|&x| f64::from(x)),
        &exact,
        d,
        row_of(p),
    );
    Tolerance::for_dtype(T::DTYPE)
        .check(label, &od, &ld)
        .unwrap_or_else(|e| panic!("{e}"));
    // The oracle with the tables agrees too, and the rotation changed the result.
    let with = reference(p, &q, &kc, &vc, tables).unwrap();
    let (od, _) = diff_rows(
        out.o.iter().map(|x| x.to_f64()),
        out.lse.iter().map(|&x| f64::from(x)),
        &with,
        d,
        row_of(p),
    );
    assert!(od.rel_l2 < 1e-2, "{label}: {}", od.rel_l2);
    let (mut kc3, mut vc3) = (kc0, vc0);
    let unrotated = forward_cpu(
        &plain,
        &q,
        &mut kc3,
        &mut vc3,
        &kn,
        &vn,
        RotaryTables::none(),
        3,
    )
    .unwrap();
    assert!(unrotated.o != out.o, "{label}: the rotation did nothing");
}

fn rotary(dim: usize, seqlen_ro: usize, interleaved: bool) -> Rotary {
    Rotary {
        dim,
        seqlen_ro,
        interleaved,
    }
}

#[test]
fn rotary_embeddings_match_their_definition() {
    for interleaved in [false, true] {
        for (mask, window) in [
            (Mask::Causal, (-1, -1)),
            (Mask::None, (-1, -1)),
            (Mask::None, (20, 3)),
        ] {
            for dim in [16, 32] {
                let p = contiguous(vec![40, 0, 7], 3, 64, (3, 4, 2, 32))
                    .with_mask(mask)
                    .with_scores(ScoreMods {
                        window: Window::from_fa(window.0, window.1).unwrap(),
                        ..ScoreMods::default()
                    })
                    .unwrap()
                    .with_rotary(rotary(dim, 70, interleaved))
                    .unwrap();
                let label = format!(
                    "rotary{dim} interleaved={interleaved} {} window{window:?}",
                    mask.name()
                );
                check_rotary::<f16>(&p, &label);
                check_rotary::<bf16>(&p, &label);
                let paged = shuffled_pages(&p, 16, 9).unwrap();
                check_rotary::<f16>(&paged, &format!("{label} paged16"));
            }
        }
    }
    // A window wider than the capacity is unbounded (FA2 folds it): uniform positions.
    let p = contiguous(vec![10], 1, 32, (2, 2, 2, 16))
        .with_scores(ScoreMods {
            window: Window::from_fa(64, 64).unwrap(),
            ..ScoreMods::default()
        })
        .unwrap();
    assert!(!p.shape().rotary_per_row());
}

/// The cache sequences of a contiguous cache picked by `idx`, as a cache of their own.
fn gather<T: Copy>(cache: &[T], per_seq: usize, idx: &[i32]) -> Vec<T> {
    idx.iter()
        .flat_map(|&c| cache[c as usize * per_seq..(c as usize + 1) * per_seq].to_vec())
        .collect()
}

#[test]
fn cache_batch_idx_picks_the_cache_sequences() {
    // A permutation of 3 of 5 cache sequences, with appends; and a repeat without appends.
    for (idx, lens, new, cache_batch) in [
        (vec![4, 0, 2], vec![30, 0, 12], 2, 5),
        (vec![1, 1, 0], vec![20, 33, 40], 0, 2),
    ] {
        let (cap, d, hkv) = (48, 16, 2);
        let per_seq = cap * hkv * d;
        let p = contiguous(lens.clone(), new, cap, (2, 4, hkv, d))
            .with_mask(Mask::Causal)
            .with_cache_batch_idx(cache_batch, idx.clone())
            .unwrap();
        assert_eq!(p.cache_len(), cache_batch * per_seq);
        let kc: Vec<f32> = random_vec(p.cache_len(), 1);
        let vc: Vec<f32> = random_vec(p.cache_len(), 2);
        let q: Vec<f32> = random_vec(3 * 2 * 4 * d, 3);
        let (kn, vn): (Vec<f32>, Vec<f32>) = (
            random_vec(3 * new * hkv * d, 4),
            random_vec(3 * new * hkv * d, 5),
        );
        let (mut k1, mut v1) = (kc.clone(), vc.clone());
        let got = forward_cpu(&p, &q, &mut k1, &mut v1, &kn, &vn, RotaryTables::none(), 2).unwrap();
        // The same call on the gathered cache, then scattered back.
        let plain = contiguous(lens, new, cap, (2, 4, hkv, d)).with_mask(Mask::Causal);
        let (mut k2, mut v2) = (gather(&kc, per_seq, &idx), gather(&vc, per_seq, &idx));
        let want = forward_cpu(
            &plain,
            &q,
            &mut k2,
            &mut v2,
            &kn,
            &vn,
            RotaryTables::none(),
            2,
        )
        .unwrap();
        assert_eq!(got, want);
        assert_eq!(gather(&k1, per_seq, &idx), k2);
        assert_eq!(gather(&v1, per_seq, &idx), v2);
        // Cache sequences nobody picked are untouched.
        for c in (0..cache_batch).filter(|c| !idx.contains(&(*c as i32))) {
            assert_eq!(
                k1[c * per_seq..(c + 1) * per_seq],
                kc[c * per_seq..(c + 1) * per_seq]
            );
        }
    }
}

#[test]
fn cache_leftpad_starts_each_sequence_at_its_row() {
    let (cap, d, hkv, new) = (64, 16, 1, 3);
    let (lens, pad) = (vec![50, 9, 20], vec![13, 9, 0]);
    let p = contiguous(lens.clone(), new, cap, (3, 2, hkv, d))
        .with_mask(Mask::Causal)
        .with_leftpad(pad.clone())
        .unwrap();
    let row = hkv * d;
    let kc: Vec<f32> = random_vec(p.cache_len(), 1);
    let vc: Vec<f32> = random_vec(p.cache_len(), 2);
    let q: Vec<f32> = random_vec(3 * 3 * 2 * d, 3);
    let (kn, vn): (Vec<f32>, Vec<f32>) =
        (random_vec(3 * new * row, 4), random_vec(3 * new * row, 5));
    let (mut k1, mut v1) = (kc.clone(), vc.clone());
    let got = forward_cpu(&p, &q, &mut k1, &mut v1, &kn, &vn, RotaryTables::none(), 3).unwrap();
    // The same sequences shifted to row 0, lengths cut by the padding.
    let shift = |c: &[f32]| -> Vec<f32> {
        let mut out = vec![f32::NAN; c.len()];
        for b in 0..3 {
            let from = (b * cap + pad[b] as usize) * row;
            let n = (cap - pad[b] as usize) * row;
            out[b * cap * row..][..n].copy_from_slice(&c[from..from + n]);
        }
        out
    };
    let short: Vec<i32> = lens.iter().zip(&pad).map(|(l, x)| l - x).collect();
    let plain = contiguous(short, new, cap, (3, 2, hkv, d)).with_mask(Mask::Causal);
    let (mut k2, mut v2) = (shift(&kc), shift(&vc));
    let want = forward_cpu(
        &plain,
        &q,
        &mut k2,
        &mut v2,
        &kn,
        &vn,
        RotaryTables::none(),
        3,
    )
    .unwrap();
    assert_eq!(got, want);
    // The new rows went to rows cache_seqlens[b].., the rows before the padding untouched.
    for b in 0..3 {
        let at = (b * cap + lens[b] as usize) * row;
        assert_eq!(
            k1[at..at + new * row],
            kn[b * new * row..(b + 1) * new * row]
        );
        let start = b * cap * row;
        assert_eq!(
            k1[start..start + pad[b] as usize * row],
            kc[start..start + pad[b] as usize * row]
        );
    }
    // Sequence 1 (padding = length) attends to its new rows only.
    assert_eq!(p.seqlen_k(1), new);
}

#[test]
fn misuse_of_the_new_arguments_is_refused() {
    let base = || contiguous(vec![10, 20], 2, 32, (1, 4, 2, 16));
    let invalid = |r: flashattn::Result<KvCacheProblem>, want: &str| match r {
        Err(AttnError::InvalidInput { what }) => assert!(what.contains(want), "{want}: {what}"),
        other => panic!("{want}: {other:?}"),
    };
    // 6 is even: fine (FlashAttention-2 asks for a multiple of 16); odd and too wide are not.
    assert_eq!(
        base()
            .with_rotary(rotary(6, 40, false))
            .unwrap()
            .rotary
            .unwrap()
            .dim,
        6
    );
    invalid(base().with_rotary(rotary(7, 40, false)), "rotary_dim = 7");
    invalid(base().with_rotary(rotary(0, 40, false)), "rotary_dim = 0");
    invalid(
        base().with_rotary(rotary(18, 40, false)),
        "at most head_dim",
    );
    invalid(base().with_rotary(rotary(16, 31, false)), "31 rows");
    invalid(
        contiguous(vec![10, 20], 0, 32, (1, 4, 2, 16)).with_rotary(rotary(16, 32, true)),
        "pass k and v",
    );
    // Per-row query positions past the tables' end (causal, 4 query rows at 30..33).
    invalid(
        contiguous(vec![30, 0], 1, 32, (4, 4, 2, 16))
            .with_mask(Mask::Causal)
            .with_rotary(rotary(16, 32, true)),
        "past the 32 rows",
    );
    invalid(
        base().with_cache_batch_idx(3, vec![0, 3]),
        "outside the cache's 3",
    );
    invalid(
        base().with_cache_batch_idx(3, vec![-1, 0]),
        "cache_batch_idx[0] = -1",
    );
    invalid(
        base().with_cache_batch_idx(3, vec![0]),
        "cache_batch_idx has 1",
    );
    invalid(base().with_cache_batch_idx(3, vec![2, 2]), "both 2");
    assert!(
        contiguous(vec![10, 20], 0, 32, (1, 4, 2, 16))
            .with_cache_batch_idx(3, vec![2, 2])
            .is_ok()
    );
    invalid(base().with_leftpad(vec![11, 0]), "cache_leftpad[0] = 11");
    invalid(base().with_leftpad(vec![0, -1]), "cache_leftpad[1] = -1");
    invalid(base().with_leftpad(vec![0]), "cache_leftpad has 1");
    // A contiguous cache of another batch needs cache_batch_idx.
    let mut other = base();
    other.cache_batch = 3;
    assert!(matches!(
        other.validate(),
        Err(AttnError::ShapeMismatch { .. })
    ));
    // Paged caches take neither cache_batch_idx nor cache_leftpad (as FlashAttention-2).
    let paged = shuffled_pages(&base(), 16, 1).unwrap();
    for r in [
        paged.clone().with_cache_batch_idx(2, vec![0, 1]),
        paged.clone().with_leftpad(vec![0, 0]),
    ] {
        assert!(
            matches!(r, Err(AttnError::UnsupportedFeature { .. })),
            "{r:?}"
        );
    }
    // Tables given to a call without rotary, or too short for one with it.
    let p = base();
    let q: Vec<f16> = random_vec(2 * 4 * 16, 1);
    let (mut kc, mut vc) = (vec![f16::ONE; p.cache_len()], vec![f16::ONE; p.cache_len()]);
    let new: Vec<f16> = random_vec(2 * 2 * 2 * 16, 2);
    let t = [f16::ONE; 8];
    let tables = RotaryTables { cos: &t, sin: &t };
    let r = forward_cpu(&p, &q, &mut kc, &mut vc, &new, &new, tables, 1);
    assert!(matches!(r, Err(AttnError::InvalidInput { what }) if what.contains("rotary tables")));
    let rp = base().with_rotary(rotary(16, 32, false)).unwrap();
    let r = forward_cpu(&rp, &q, &mut kc, &mut vc, &new, &new, tables, 1);
    assert!(
        matches!(
            r,
            Err(AttnError::BufferTooShort {
                tensor: "rotary_cos",
                ..
            })
        ),
        "{r:?}"
    );
    assert!(
        kc.iter().all(|x| *x == f16::ONE),
        "nothing written by a refused call"
    );
}

#[test]
fn device_values_clamp_to_the_cache() {
    let p = contiguous(vec![0, 0, 0], 2, 32, (1, 2, 1, 8))
        .with_cache_batch_idx(4, vec![0, 1, 2])
        .unwrap()
        .with_leftpad(vec![0, 0, 0])
        .unwrap();
    let raw = HostIndex {
        cache_seqlens: vec![-5, 1000, 7],
        block_table: vec![9, 9],
        cache_batch_idx: Some(vec![-1, 4, 2]),
        cache_leftpad: Some(vec![3, -8, 100]),
    };
    let c = clamp_index(&p.shape(), &raw);
    assert_eq!(c.cache_seqlens, vec![0, 30, 7]);
    assert!(c.block_table.is_empty());
    assert_eq!(c.cache_batch_idx, Some(vec![0, 3, 2]));
    assert_eq!(c.cache_leftpad, Some(vec![0, 0, 7]));
    assert!(KvCacheProblem::from_shape(&p.shape(), c).is_ok());
    let paged = shuffled_pages(&contiguous(vec![1, 1], 0, 32, (1, 2, 1, 8)), 16, 3).unwrap();
    let mut raw = paged.index();
    raw.block_table[0] = -3;
    raw.block_table[3] = i32::MAX;
    let c = clamp_index(&paged.shape(), &raw);
    assert_eq!(c.block_table[0], 0);
    assert_eq!(c.block_table[3], 2 * 2 + 3 - 1);
}
