//! Decoding against a KV cache ([`flashattn::kvcache`]) on the GPU against the f64 oracle
//! ([`flashattn::cuda::decode`]), with the cases the decoding issue names: cache lengths 0 and at
//! capacity; page sizes 16, 64 and 256 (and 48, 144) with shuffled block tables; lengths that differ within
//! a batch, including a sequence with fewer key blocks than splits; appended rows crossing a
//! page boundary; seqlen_q 1, 2, 4, 16 with GQA 1, 4, 8 and MQA; every split count from 1 to
//! past the number of key blocks (and the heuristic's pick) against the same reference;
//! causal, window, softcap, ALiBi; head dims 40 to 256; both dtypes. And the arguments of
//! FlashAttention-2's `flash_attn_with_kvcache` beyond those: rotary embeddings (interleaved
//! and not, per-row and uniform query positions, partial and full rotary_dim), contiguous and
//! paged; `cache_batch_idx` (a permutation of a larger cache with appends, and a repeat);
//! `cache_leftpad` (with appends, causal, ALiBi); all of them together; and device index
//! arrays holding out-of-range values (lengths past the capacity and negative, first rows past
//! the length, cache sequences and pages outside the cache), which must compute the call with
//! the clamped values ([`flashattn::kvcache::clamp_index`]) and touch nothing else.
//!
//! Each call runs on the path FlashAttention-2's Python API takes, its index arrays on the
//! device ([`flashattn::cuda::decode::DecodeLaunch`], split count from the capacity), at every
//! split count of the case; the heuristic's count also on the host-index path
//! ([`flashattn::cuda::decode::forward_device`], split count from the lengths).
//!
//! Unused cache rows hold NaN (a read of one would reach o), outputs and the split-KV
//! workspace are poisoned (outputs with a guard past the end), the caches after the call must
//! equal the CPU's append byte for byte (rotated keys included: the GPU rotates with the
//! host's operations), and the heuristic's split count must give the same bytes on a second
//! run.

mod decode_loop;
mod run;

pub use decode_loop::{loop_label, run_loop};
pub use run::run_case;

use flashattn::dtype::DType;
use flashattn::kvcache::{
    CacheLayout, HostIndex, KvCacheProblem, MAX_SPLITS, Rotary, SPLIT_BLOCK, clamp_index,
    shuffled_pages,
};
use flashattn::mask::Mask;
use flashattn::scores::{Alibi, ScoreMods, Window};

/// One decoding call of the sweep.
#[derive(Debug, Clone)]
pub struct KvCase {
    /// Description: dtype, layout, lengths, heads, head_dim, mask, modifiers.
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The call (contiguous or paged).
    pub problem: KvCacheProblem,
    /// Split counts to run (`None`: the heuristic's).
    pub splits: Vec<Option<usize>>,
    /// Put a NaN in one query row and in one cached key: the rows that read them must come
    /// out non-finite (never silently dropped), every other row within tolerance.
    pub poison: bool,
    /// The device index arrays' values when they differ from the problem's: out-of-range
    /// values that the kernels clamp to the problem's ([`clamp_index`]). Such a case runs on
    /// the device-index path only.
    pub raw: Option<HostIndex>,
}

/// The split counts of a call: 1 to two past the number of key blocks of its longest
/// sequence (so some splits are empty for every sequence), at most [`MAX_SPLITS`], and the
/// heuristic's.
fn split_counts(p: &KvCacheProblem) -> Vec<Option<usize>> {
    let blocks = p.max_seqlen_k().div_ceil(SPLIT_BLOCK).max(1);
    let mut out: Vec<Option<usize>> = (1..=(blocks + 2).min(MAX_SPLITS)).map(Some).collect();
    out.push(None);
    out
}

/// The sweep's calls.
pub fn cases() -> Vec<KvCase> {
    // (batch lengths, seqlen_new, capacity, seqlen_q, heads_q, heads_kv, head_dim, mask, mods)
    type Spec = (
        Vec<i32>,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        Mask,
        ScoreMods,
    );
    let plain = ScoreMods::default;
    let mut specs: Vec<Spec> = Vec::new();
    // seqlen_q 1, 2, 4, 16 with GQA 1, 4, 8 and MQA; lengths that differ (one at 0, one with
    // fewer key blocks than splits); three appended rows, crossing a 16-key page boundary.
    for (sq, hq, hkv) in [(1, 4, 4), (2, 8, 2), (4, 8, 1), (16, 4, 1), (1, 32, 8)] {
        for mask in [Mask::None, Mask::Causal] {
            specs.push((vec![300, 0, 14], 3, 320, sq, hq, hkv, 128, mask, plain()));
        }
    }
    // Cache lengths 0 and at capacity; all empty.
    specs.push((vec![0, 256], 0, 256, 2, 4, 2, 64, Mask::Causal, plain()));
    specs.push((vec![0, 0], 0, 256, 1, 4, 2, 64, Mask::None, plain()));
    specs.push((vec![250, 200], 6, 256, 2, 4, 1, 64, Mask::Causal, plain()));
    // A long cache (many splits), head dims 40 and 256.
    specs.push((vec![3000, 700], 1, 3072, 1, 16, 2, 128, Mask::None, plain()));
    specs.push((vec![1000, 37], 2, 1024, 3, 6, 2, 40, Mask::Causal, plain()));
    specs.push((vec![1000, 37], 2, 1024, 4, 4, 2, 256, Mask::Causal, plain()));
    // Window, softcap and ALiBi per (batch, head).
    specs.push((
        vec![700, 37],
        2,
        768,
        4,
        8,
        2,
        128,
        Mask::Causal,
        ScoreMods {
            window: Window::from_fa(100, 0).expect("valid window"),
            softcap: Some(30.0),
            alibi: Some(Alibi {
                slopes: (0..16).map(|i| 0.5f32.powi(i % 8 + 1)).collect(),
                per_batch: true,
            }),
            sink: None,
        },
    ));
    // A learnable sink: one split (attn_decode folds it in) and many (attn_combine does);
    // a sequence with one key only, the new row (causal: its first query row sees none, and
    // its lse is the sink).
    for lens in [vec![200, 0], vec![3000, 700]] {
        specs.push((
            lens,
            1,
            3072,
            2,
            8,
            2,
            128,
            Mask::Causal,
            ScoreMods {
                sink: Some(super::cases::sink_logits(8, "mild")),
                ..ScoreMods::default()
            },
        ));
    }
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (n, (lens, new, cap, sq, hq, hkv, d, mask, mods)) in specs.iter().enumerate() {
            let contiguous = KvCacheProblem::new(
                lens.len(),
                *sq,
                *hq,
                *hkv,
                *d,
                CacheLayout::Contiguous { seqlen_cache: *cap },
                lens.clone(),
                *new,
            )
            .and_then(|p| p.with_mask(*mask).with_scores(mods.clone()))
            .expect("valid sweep call");
            // Contiguous, and paged with one of the three page sizes (rotating through the
            // specs), pages shuffled.
            let page = [16, 64, 256][n % 3];
            let paged = shuffled_pages(&contiguous, page, n as u64 + 1).expect("valid pages");
            for (layout, p) in [
                ("contiguous".to_string(), contiguous),
                (format!("paged{page}"), paged),
            ] {
                let label = format!(
                    "{dtype} kvcache {layout} lens{lens:?}+{new} sq={sq} hq={hq} hkv={hkv} d={d} {}{}",
                    mask.name(),
                    super::cases::describe_scores(mods)
                );
                out.push(KvCase {
                    label,
                    dtype,
                    splits: split_counts(&p),
                    problem: p,
                    poison: false,
                    raw: None,
                });
            }
        }
        // Pages that neither divide the 128-key tile nor are a multiple of it (48, 144): the
        // copy engine path refuses them (a box would straddle two pages), so these run the
        // cp.async path on every GPU.
        let odd = d128_call(1, 600, vec![577, 130, 0], 0);
        for page in [48, 144] {
            let p = shuffled_pages(&odd, page, 7 + page as u64).expect("valid pages");
            out.push(KvCase {
                label: format!(
                    "{dtype} kvcache paged{page} lens[577, 130, 0]+0 sq=1 hq=8 hkv=2 d=128 none"
                ),
                dtype,
                splits: split_counts(&p),
                problem: p,
                poison: false,
                raw: None,
            });
        }
        // A cache with no rows at all (capacity 0): every row sees no key (o = 0, lse = -inf);
        // a tensor map cannot describe it, so the copy engine path refuses it.
        let none = d128_call(1, 0, vec![0, 0], 0);
        out.push(KvCase {
            label: format!(
                "{dtype} kvcache contiguous capacity 0 lens[0, 0]+0 sq=1 hq=8 hkv=2 d=128 none"
            ),
            dtype,
            splits: vec![Some(1), None],
            problem: none,
            poison: false,
            raw: None,
        });
        // NaN inputs: a NaN in q row (0, 0, head 0) and in a cached key of sequence 1 (kv head
        // 1, read by query heads 4..7), contiguous and paged, several splits.
        let nan = d128_call(2, 512, vec![300, 50], 1).with_mask(Mask::Causal);
        let paged = shuffled_pages(&nan, 16, 99).expect("valid pages");
        for (layout, p) in [("contiguous", nan), ("paged16", paged)] {
            out.push(KvCase {
                label: format!(
                    "{dtype} kvcache {layout} lens[300, 50]+1 sq=2 hq=8 hkv=2 d=128 causal NaN in q and k"
                ),
                dtype,
                splits: vec![Some(1), Some(3), None],
                problem: p,
                poison: true,
                raw: None,
            });
        }
        out.extend(feature_cases(dtype));
    }
    out
}

/// The arguments of FlashAttention-2's `flash_attn_with_kvcache` beyond the cache itself
/// (see the module docs), in one dtype.
fn feature_cases(dtype: DType) -> Vec<KvCase> {
    let rotary = |dim, seqlen_ro, interleaved| Rotary {
        dim,
        seqlen_ro,
        interleaved,
    };
    let few = vec![Some(1), Some(3), None];
    let case = |label: String, p: KvCacheProblem, splits: Vec<Option<usize>>| KvCase {
        label: format!("{dtype} kvcache {label}"),
        dtype,
        splits,
        problem: p,
        poison: false,
        raw: None,
    };
    let call = |lens: Vec<i32>, new, cap, (sq, hq, hkv, d): (usize, usize, usize, usize)| {
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
        .expect("valid sweep call")
    };
    let mut out = Vec::new();
    // Rotary, half the channels, not interleaved, causal (queries at per-row positions);
    // contiguous and paged (pages of 16, appended rows crossing a page boundary).
    let p = call(vec![300, 0, 14], 3, 320, (4, 8, 2, 128))
        .with_mask(Mask::Causal)
        .with_rotary(rotary(64, 330, false))
        .expect("valid rotary call");
    let paged = shuffled_pages(&p, 16, 21).expect("valid pages");
    let label = "lens[300, 0, 14]+3 sq=4 hq=8 hkv=2 d=128 causal rotary64";
    out.push(case(format!("contiguous {label}"), p, few.clone()));
    out.push(case(format!("paged16 {label}"), paged, few.clone()));
    // Rotary on every channel, interleaved, not causal (every query at the cache's end);
    // paged 64 and contiguous, MHA, d64.
    let p = call(vec![100, 37], 2, 256, (2, 4, 4, 64))
        .with_rotary(rotary(64, 256, true))
        .expect("valid rotary call");
    let paged = shuffled_pages(&p, 64, 22).expect("valid pages");
    let label = "lens[100, 37]+2 sq=2 hq=4 hkv=4 d=64 none rotary64 interleaved";
    out.push(case(format!("contiguous {label}"), p, few.clone()));
    out.push(case(format!("paged64 {label}"), paged, few.clone()));
    // Rotary with a local window (per-row positions without causal) and softcap, d256 with 32
    // rotated channels; one query row per sequence (seqlen_q 1, GQA 8).
    let mods = ScoreMods {
        window: Window::from_fa(50, 2).expect("valid window"),
        softcap: Some(30.0),
        alibi: None,
        sink: None,
    };
    for (sq, hq) in [(3, 6), (1, 16)] {
        let p = call(vec![700, 5], 1, 768, (sq, hq, 2, 256))
            .with_scores(mods.clone())
            .and_then(|p| p.with_rotary(rotary(32, 800, true)))
            .expect("valid rotary call");
        out.push(case(
            format!(
                "contiguous lens[700, 5]+1 sq={sq} hq={hq} hkv=2 d=256 none window(50,2) softcap30 rotary32 interleaved"
            ),
            p,
            few.clone(),
        ));
    }
    // cache_batch_idx: a permutation into a larger cache, with appends, causal.
    let p = call(vec![200, 10, 0], 2, 256, (2, 8, 2, 128))
        .with_mask(Mask::Causal)
        .with_cache_batch_idx(5, vec![4, 0, 2])
        .expect("valid batch index");
    out.push(case(
        "contiguous cache_batch_idx[4, 0, 2] of 5 lens[200, 10, 0]+2 sq=2 hq=8 hkv=2 d=128 causal"
            .into(),
        p,
        few.clone(),
    ));
    // cache_batch_idx with a repeat (read only: no appends), lengths that differ.
    let p = call(vec![50, 80, 120, 50], 0, 128, (1, 8, 2, 64))
        .with_cache_batch_idx(2, vec![1, 1, 0, 1])
        .expect("valid batch index");
    out.push(case(
        "contiguous cache_batch_idx[1, 1, 0, 1] of 2 lens[50, 80, 120, 50]+0 sq=1 hq=8 hkv=2 d=64 none"
            .into(),
        p,
        few.clone(),
    ));
    // cache_leftpad: keys from row 100 (and a sequence of only its new rows), appends, causal
    // with ALiBi (distances in the sequence's own key indices).
    let alibi = ScoreMods {
        alibi: Some(Alibi {
            slopes: (0..8).map(|i| 0.5f32.powi(i % 8 + 1)).collect(),
            per_batch: false,
        }),
        ..ScoreMods::default()
    };
    let p = call(vec![300, 40, 16], 3, 320, (3, 8, 2, 128))
        .with_mask(Mask::Causal)
        .with_scores(alibi)
        .and_then(|p| p.with_leftpad(vec![100, 0, 16]))
        .expect("valid left padding");
    out.push(case(
        "contiguous cache_leftpad[100, 0, 16] lens[300, 40, 16]+3 sq=3 hq=8 hkv=2 d=128 causal alibi"
            .into(),
        p,
        few.clone(),
    ));
    // Everything at once, at every split count.
    let p = call(vec![500, 3, 64], 2, 640, (2, 16, 4, 96))
        .with_mask(Mask::Causal)
        .with_cache_batch_idx(4, vec![3, 1, 0])
        .and_then(|p| p.with_leftpad(vec![17, 3, 0]))
        .and_then(|p| p.with_rotary(rotary(96, 640, false)))
        .expect("valid call");
    let splits = split_counts(&p);
    out.push(case(
        "contiguous cache_batch_idx[3, 1, 0] of 4 cache_leftpad[17, 3, 0] lens[500, 3, 64]+2 sq=2 hq=16 hkv=4 d=96 causal rotary96"
            .into(),
        p,
        splits,
    ));
    out.extend(clamped_cases(dtype));
    out
}

/// Device index arrays holding out-of-range values, against the calls with the values the
/// kernels clamp them to.
fn clamped_cases(dtype: DType) -> Vec<KvCase> {
    let mut out = Vec::new();
    // Contiguous: lengths -5 and 10000 (capacity 128), first rows -2 and past the length,
    // cache sequences -3 and 99 (of 4); rotary; appends.
    let raw = HostIndex {
        cache_seqlens: vec![-5, 10_000, 40],
        block_table: Vec::new(),
        cache_batch_idx: Some(vec![-3, 1, 99]),
        cache_leftpad: Some(vec![3, -2, 50]),
    };
    let shape = KvCacheProblem::new(
        3,
        2,
        4,
        2,
        64,
        CacheLayout::Contiguous { seqlen_cache: 128 },
        vec![0; 3],
        2,
    )
    .and_then(|p| {
        p.with_mask(Mask::Causal)
            .with_cache_batch_idx(4, vec![0, 1, 2])
    })
    .and_then(|p| p.with_leftpad(vec![0; 3]))
    .and_then(|p| {
        p.with_rotary(Rotary {
            dim: 64,
            seqlen_ro: 128,
            interleaved: false,
        })
    })
    .expect("valid call")
    .shape();
    let p = KvCacheProblem::from_shape(&shape, clamp_index(&shape, &raw)).expect("clamped call");
    out.push(KvCase {
        label: format!(
            "{dtype} kvcache contiguous clamped: lens[-5, 10000, 40]+2 leftpad[3, -2, 50] cache_batch_idx[-3, 1, 99] of 4 cap 128 sq=2 hq=4 hkv=2 d=64 causal rotary64"
        ),
        dtype,
        splits: vec![Some(1), Some(2), None],
        problem: p,
        poison: false,
        raw: Some(raw),
    });
    // Paged 16: lengths -1 and 5000, pages -7 and past the pool among the used ones; no
    // appends (a clamped page may be another sequence's).
    let base = d128_call(1, 64, vec![0, 0, 0], 0);
    let paged = shuffled_pages(&base, 16, 31).expect("valid pages");
    let mut raw = paged.index();
    raw.cache_seqlens = vec![-1, 5000, 33];
    let num_blocks = 3 * 4 + 3;
    raw.block_table[4] = -7; // sequence 1, page 0
    raw.block_table[6] = num_blocks + 5; // sequence 1, page 2
    raw.block_table[10] = i32::MAX; // sequence 2, page 2 (keys 32..)
    let shape = paged.shape();
    let p = KvCacheProblem::from_shape(&shape, clamp_index(&shape, &raw)).expect("clamped call");
    out.push(KvCase {
        label: format!(
            "{dtype} kvcache paged16 clamped: lens[-1, 5000, 33]+0 pages -7, {}, 2^31-1 cap 64 sq=1 hq=8 hkv=2 d=128 none",
            num_blocks + 5
        ),
        dtype,
        splits: vec![Some(1), Some(2), None],
        problem: p,
        poison: false,
        raw: Some(raw),
    });
    out
}

/// A call of the sweep's extra cases: `seqlen_q` rows of 8 query heads on 2 kv heads, d128,
/// against a contiguous cache of `capacity` rows per sequence holding `lens`, `new` rows
/// appended.
fn d128_call(seqlen_q: usize, capacity: usize, lens: Vec<i32>, new: usize) -> KvCacheProblem {
    KvCacheProblem::new(
        lens.len(),
        seqlen_q,
        8,
        2,
        128,
        CacheLayout::Contiguous {
            seqlen_cache: capacity,
        },
        lens,
        new,
    )
    .expect("valid sweep call")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kvcache_sweep_has_the_issue_cases() {
        let cs = cases();
        assert!(cs.iter().all(|c| c.problem.validate().is_ok()));
        let has = |f: &dyn Fn(&KvCacheProblem) -> bool| cs.iter().any(|c| f(&c.problem));
        let page = |p: &KvCacheProblem, n| matches!(p.layout, CacheLayout::Paged { page_size, .. } if page_size == n);
        for n in [16, 64, 256, 48, 144] {
            assert!(has(&|p| page(p, n)), "page size {n}");
        }
        assert!(has(&|p| p.cache_seqlens.contains(&0)));
        assert!(has(&|p| p
            .cache_seqlens
            .iter()
            .any(|&l| l as usize == p.capacity())));
        for sq in [1, 2, 4, 16] {
            assert!(has(&|p| p.seqlen_q == sq), "seqlen_q {sq}");
        }
        for g in [1, 4, 8] {
            assert!(has(&|p| p.heads_q / p.heads_kv == g), "group {g}");
        }
        assert!(has(&|p| p.heads_kv == 1), "MQA");
        // Appended rows crossing a 16-key page boundary.
        assert!(has(&|p| page(p, 16)
            && p.seqlen_new > 0
            && p.cache_seqlens
                .iter()
                .any(|&l| (l as usize % 16) + p.seqlen_new > 16)));
        // The arguments beyond the cache: rotary (interleaved and not, per-row and uniform
        // positions, contiguous and paged), cache_batch_idx (a permutation with appends, a
        // repeat), cache_leftpad, all at once, and clamped device values.
        let rot = |p: &KvCacheProblem, interleaved: bool, paged: bool| {
            p.rotary.is_some_and(|r| r.interleaved == interleaved)
                && matches!(p.layout, CacheLayout::Paged { .. }) == paged
        };
        for (interleaved, paged) in [(false, false), (false, true), (true, false), (true, true)] {
            assert!(
                has(&|p| rot(p, interleaved, paged)),
                "rotary {interleaved} {paged}"
            );
        }
        assert!(has(&|p| p.rotary.is_some() && p.shape().rotary_per_row()));
        assert!(has(&|p| p.rotary.is_some() && !p.shape().rotary_per_row()));
        assert!(has(&|p| p.rotary.is_some()
            && !p.mask.is_causal()
            && p.shape().rotary_per_row()));
        let idx = |p: &KvCacheProblem| p.cache_batch_idx.clone().unwrap_or_default();
        assert!(has(&|p| p.seqlen_new > 0
            && idx(p).len() > 1
            && p.cache_batch > p.batch));
        assert!(has(&|p| {
            let i = idx(p);
            (1..i.len()).any(|n| i[..n].contains(&i[n]))
        }));
        assert!(has(&|p| p.seqlen_new > 0
            && p.cache_leftpad
                .as_ref()
                .is_some_and(|l| l.iter().any(|&x| x > 0))));
        assert!(has(&|p| p.rotary.is_some()
            && p.cache_batch_idx.is_some()
            && p.cache_leftpad.is_some()));
        let clamped: Vec<_> = cs.iter().filter(|c| c.raw.is_some()).collect();
        assert!(clamped.len() >= 4, "clamped cases in both dtypes");
        for c in &clamped {
            let raw = c.raw.as_ref().expect("raw");
            assert_ne!(raw, &c.problem.index(), "{}", c.label);
            assert_eq!(clamp_index(&c.problem.shape(), raw), c.problem.index());
        }
        // Every split count from 1 past the key blocks, and the heuristic's.
        assert!(cs.iter().any(|c| c.poison));
        for c in cs.iter().filter(|c| !c.poison && c.splits.len() != 3) {
            let blocks = c.problem.max_seqlen_k().div_ceil(SPLIT_BLOCK).max(1);
            assert!(c.splits.contains(&Some(1)) && c.splits.contains(&None));
            assert!(c.splits.len() > blocks.min(MAX_SPLITS - 2));
        }
    }

    /// Every case's inputs, append and oracle work on the host (what a GPU run starts from),
    /// and the CPU backend agrees with the oracle on the features' cases.
    #[test]
    fn the_feature_cases_run_on_the_cpu() {
        use flashattn::compare::{Tolerance, diff_rows};
        use flashattn::kvcache::{append, forward_cpu, reference};
        use half::f16;
        for c in cases().iter().filter(|c| c.dtype == DType::F16) {
            let p = &c.problem;
            let x = run::data::<f16>(p, 5);
            let (mut kc, mut vc) = (x.k_cache.clone(), x.v_cache.clone());
            append(p, &mut kc, &mut vc, &x.k_new, &x.v_new, x.tables()).expect(&c.label);
            let exact = reference(p, &x.q, &kc, &vc, x.tables()).expect(&c.label);
            let features = p.rotary.is_some() || p.cache_batch_idx.is_some() || c.raw.is_some();
            if !features {
                continue;
            }
            let (mut kc2, mut vc2) = (x.k_cache.clone(), x.v_cache.clone());
            let out = forward_cpu(
                p,
                &x.q,
                &mut kc2,
                &mut vc2,
                &x.k_new,
                &x.v_new,
                x.tables(),
                2,
            )
            .expect(&c.label);
            let bits =
                |a: &[f16], b: &[f16]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                bits(&kc2, &kc) && bits(&vc2, &vc),
                "{}: appends differ",
                c.label
            );
            let (hq, sq, d) = (p.heads_q, p.seqlen_q, p.head_dim);
            let (od, ld) = diff_rows(
                out.o.iter().map(|v| f64::from(v.to_f32())),
                out.lse.iter().map(|&v| f64::from(v)),
                &exact,
                d,
                |n| {
                    let row = n / d;
                    let (b, i, h) = (row / (sq * hq), (row / hq) % sq, row % hq);
                    (b * hq + h) * sq + i
                },
            );
            Tolerance::for_dtype(DType::F16)
                .check(&c.label, &od, &ld)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
