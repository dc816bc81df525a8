//! The check's fixed inputs held to what they claim, on the CPU (no GPU needed): every varlen
//! batch of `check` fits the GPU's padded envelope, and the field reports' large-logit inputs
//! are what the reports describe and pass the CPU backend within the oracle's allowance.
//! Moved here from the library's tests with `check` (issue 39).

use flashattn::compare::random_inputs;
use flashattn::cuda::KernelKind;
use flashattn::cuda::attention::check_gpu_problem;
use flashattn::cuda::varlen::envelope;
use flashattn::varlen::VarlenProblem;
use flashattn::{AttnError, Element, Mask, reference};
use half::{bf16, f16};

// The library's integration-test helpers (the CPU backend against the oracle), shared by path
// so that both crates' tests judge the CPU path the same way.
#[path = "../../tests/common/mod.rs"]
mod common;
use common::cmp;

/// Every batch the varlen check runs has an envelope the GPU accepts, with the batch's sizes;
/// a head_dim the packed kernels cannot take is refused by name.
#[test]
fn every_check_batch_has_a_valid_envelope() {
    for c in flashattn_tools::check::varlen::cases() {
        let env = envelope(&c.problem).unwrap();
        check_gpu_problem(&env, KernelKind::Mma).unwrap();
        assert_eq!(env.shape.batch, c.problem.batch());
        assert_eq!(env.shape.seqlen_q, c.problem.max_seqlen_q().max(1));
    }
    let odd = VarlenProblem::new(vec![0, 3], vec![0, 3], 1, 1, 36).unwrap();
    assert!(matches!(
        envelope(&odd),
        Err(AttnError::UnsupportedHeadDim { .. })
    ));
}

/// Field reports (turn 2, 1, 2 and 4): logits so large that f32 rounding of the scores and of
/// lse exceeds a constant bound (lse near -5e4, where one f32 step is 3.9e-3; q = k near 110 at
/// d6; logits near 150 at d128 in f32). The bound follows the logits' size
/// (`compare::diff_reference`, row by row); each case passes in every dtype, both masks. The d4 rows
/// (padded on the GPU) are checked against their closed form.
#[test]
fn field_reports_large_logits_are_judged_by_their_f32_precision() {
    use flashattn_tools::check::field::FieldInput;
    fn one<T: Element>(f: FieldInput, mask: Mask) {
        let p = f.problem().with_mask(mask);
        let (mut q, mut k, mut v) = random_inputs::<T>(&p, 7);
        f.fill(&p, &mut q, &mut k, &mut v);
        let r = reference::attention(&p, &q, &k, &v).unwrap();
        let finite: Vec<f64> = r.lse.iter().copied().filter(|x| x.is_finite()).collect();
        let (lo, hi) = finite
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        // The inputs are what the report describes.
        match f {
            FieldInput::LseNear5e4 => {
                assert!(lo > -76801.0 && hi < -38000.0 && lo < -50000.0, "{lo} {hi}")
            }
            FieldInput::QEqualsKNear110 => assert!(hi > 29000.0, "{hi}"),
            FieldInput::Logits150 => assert!(lo > 140.0 && hi < 165.0, "{lo} {hi}"),
            FieldInput::D4ConstantRows => {
                // Exact: o_i = sum_j p_ij c_j in every channel, p_ij = softmax_j(4 c_i c_j / 2)
                // over the keys row i sees, with c the rows as rounded to T.
                let c: Vec<f64> = FieldInput::ROWS
                    .iter()
                    .map(|&x| T::from_f32(x).to_f64())
                    .collect();
                for i in 0..4 {
                    let seen = mask.visible_keys(i, 4, 4);
                    let w: Vec<f64> = (0..seen).map(|j| (2.0 * c[i] * c[j]).exp()).collect();
                    let want = (0..seen).map(|j| w[j] * c[j]).sum::<f64>() / w.iter().sum::<f64>();
                    for ch in 0..4 {
                        assert!((r.o[i * 4 + ch] - want).abs() < 1e-12, "row {i}");
                    }
                }
                // Small logits: the allowances are negligible.
                return cmp(&p, &q, &k, &v, &format!("{} {}", f.name(), mask.name()))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        // The oracle sees each row's logit size (what its allowance follows).
        let big = r.precision.iter().map(|x| x.logits).fold(0.0, f64::max);
        assert!(big >= hi.abs().min(lo.abs()) * 0.9, "{big}");
        cmp(&p, &q, &k, &v, &format!("{} {}", f.name(), mask.name()))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for f in FieldInput::ALL {
        for mask in [Mask::None, Mask::Causal] {
            one::<f16>(f, mask);
            one::<bf16>(f, mask);
            one::<f32>(f, mask);
        }
    }
}

/// The backward check's softcap and ALiBi cases (`check::backward::mod_cases`): labels unique
/// among every backward case and carrying `softcap` or `alibi` (the GPU check's filters), and
/// well-conditioned: the CPU backward, which rounds as coarsely as the kernels do not, meets
/// the bound the GPU is held to against the exact gradients on each of them.
#[test]
fn backward_softcap_and_alibi_cases_are_labelled_and_within_reach() {
    use flashattn::compare::{Tolerance, diff, random_vec, widen};
    use flashattn::dtype::DType;
    use flashattn::{cpu, cpu_backward, reference_grad};
    use flashattn_tools::check::backward::{cases, mod_cases};
    let all = cases();
    let mut labels: Vec<&str> = all.iter().map(|c| c.label.as_str()).collect();
    labels.sort_unstable();
    let n = labels.len();
    labels.dedup();
    assert_eq!(labels.len(), n, "backward labels must be unique");
    let mods = mod_cases();
    // Each problem runs on up to three kernel/grid choices (attn_bwd_wgmma's head dims).
    assert!(mods.len() >= 8 && mods.len() <= 40, "{} cases", mods.len());
    fn one<T: Element>(p: &flashattn::AttnProblem, label: &str) {
        let s = p.shape;
        let (q, k, v) = random_inputs::<T>(p, 11);
        let n_o = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
        let n_k = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
        let (mut o, mut lse) = (vec![T::default(); n_o], vec![0.0f32; s.lse_len()]);
        cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
        let d_o: Vec<T> = random_vec(n_o, 0xd0);
        let (mut dq, mut dk, mut dv) = (
            vec![T::default(); n_o],
            vec![T::default(); n_k],
            vec![T::default(); n_k],
        );
        cpu_backward::backward(p, &q, &k, &v, &o, &lse, &d_o, &mut dq, &mut dk, &mut dv).unwrap();
        let exact = reference_grad::backward(p, &q, &k, &v, &d_o).unwrap();
        let bound = 2.0 * Tolerance::for_dtype(T::DTYPE).o_rel_l2;
        for (name, g, want) in [
            ("dq", &dq, &exact.dq),
            ("dk", &dk, &exact.dk),
            ("dv", &dv, &exact.dv),
        ] {
            let d = diff(widen(g), want);
            assert!(
                d.is_clean() && d.rel_l2 <= bound,
                "{label} {name}: {d} (bound {bound:e})"
            );
        }
    }
    for c in &mods {
        assert!(
            c.label.contains("softcap") || c.label.contains("alibi"),
            "{}",
            c.label
        );
        assert!(all.iter().any(|a| a.label == c.label));
        // The CPU bound once per problem and dtype (the kernel and grid do not change it).
        if c.kernel != flashattn::cuda::backward::BwdKernel::Auto
            || c.grid != flashattn_tools::check::backward::Grid::Default
        {
            continue;
        }
        match c.dtype {
            DType::BF16 => one::<bf16>(&c.problem, &c.label),
            _ => one::<f16>(&c.problem, &c.label),
        }
    }
}

/// The sink cases of `check` (forward, packed, KV cache, backward) are labelled ` sink`, and the
/// backward ones are within reach: the CPU backward and `sink_grad` meet the bound the GPU is
/// held to against the exact gradients (d_sink included) on each.
#[test]
fn sink_cases_are_labelled_and_within_reach() {
    use flashattn::compare::{Tolerance, diff, random_vec, widen};
    use flashattn::dtype::DType;
    use flashattn::{cpu, cpu_backward, reference_grad};
    use flashattn_tools::check::backward::{cases, sink_cases};
    let forward = flashattn_tools::check::cases(false);
    let sunk: Vec<_> = forward
        .iter()
        .filter(|c| c.problem.scores.sink.is_some())
        .collect();
    assert!(sunk.len() >= 16, "{} forward sink cases", sunk.len());
    assert!(sunk.iter().all(|c| c.label.contains("sink")));
    assert!(
        forward
            .iter()
            .filter(|c| c.label.contains("sink"))
            .all(|c| c.problem.scores.sink.is_some())
    );
    for c in flashattn_tools::check::varlen::cases() {
        assert_eq!(c.label.contains("sink"), c.problem.scores.sink.is_some());
    }
    for c in flashattn_tools::check::kvcache::cases() {
        assert_eq!(c.label.contains("sink"), c.problem.scores.sink.is_some());
    }
    let all = cases();
    let sinks = sink_cases();
    assert!(sinks.len() >= 14, "{} backward sink cases", sinks.len());
    fn one<T: Element>(p: &flashattn::AttnProblem, label: &str) {
        let s = p.shape;
        let (q, k, v) = random_inputs::<T>(p, 13);
        let n_o = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
        let n_k = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
        let (mut o, mut lse) = (vec![T::default(); n_o], vec![0.0f32; s.lse_len()]);
        cpu::forward(p, &q, &k, &v, &mut o, &mut lse).unwrap();
        let d_o: Vec<T> = random_vec(n_o, 0xd0);
        let (mut dq, mut dk, mut dv) = (
            vec![T::default(); n_o],
            vec![T::default(); n_k],
            vec![T::default(); n_k],
        );
        cpu_backward::backward(p, &q, &k, &v, &o, &lse, &d_o, &mut dq, &mut dk, &mut dv).unwrap();
        let mut d_sink = vec![0.0f32; s.heads_q];
        cpu_backward::sink_grad(p, &o, &lse, &d_o, &mut d_sink).unwrap();
        let exact = reference_grad::backward(p, &q, &k, &v, &d_o).unwrap();
        let bound = 2.0 * Tolerance::for_dtype(T::DTYPE).o_rel_l2;
        let want_sink = exact.d_sink.as_ref().expect("a sink case");
        for (name, g, want) in [
            ("dq", widen(&dq).collect::<Vec<_>>(), &exact.dq),
            ("dk", widen(&dk).collect(), &exact.dk),
            ("dv", widen(&dv).collect(), &exact.dv),
            ("d_sink", widen(&d_sink).collect(), want_sink),
        ] {
            let d = diff(g, want);
            assert!(
                d.is_clean() && d.rel_l2 <= bound,
                "{label} {name}: {d} (bound {bound:e})"
            );
        }
    }
    for c in &sinks {
        assert!(c.label.contains("sink"), "{}", c.label);
        assert!(all.iter().any(|a| a.label == c.label));
        match c.dtype {
            DType::BF16 => one::<bf16>(&c.problem, &c.label),
            _ => one::<f16>(&c.problem, &c.label),
        }
    }
}

/// The persistent backward's cases (`check::backward`): every dense case attn_bwd_wgmma serves
/// (the sink's own list aside) has a ` persistent grid<=3` twin (not on attn_bwd), and a ` grid`
/// twin (one block per tile) where the default is persistent; `persistent_cases` give more tiles
/// than twice an H100's 132 SMs on the full grid, among them the deterministic mode, causal and
/// a window that leaves key blocks without rows (tiles without steps).
#[test]
fn backward_persistent_cases_cover_tile_changes() {
    use flashattn::cuda::backward_wgmma::{BC, padded_head_dim};
    use flashattn_tools::check::backward::{Grid, PERSISTENT_SMALL_GRID, cases, persistent_cases};
    let all = cases();
    for c in all
        .iter()
        .filter(|c| c.grid == Grid::Default && c.kernel == Default::default())
    {
        if padded_head_dim(c.problem.shape.head_dim).is_some()
            && !c.label.contains("softcap")
            && !c.label.contains("alibi")
            && !c.label.contains("sink")
        {
            let twin = format!("{} persistent grid<={PERSISTENT_SMALL_GRID}", c.label);
            assert!(
                all.iter()
                    .any(|a| a.label == twin
                        && a.grid == Grid::Persistent(Some(PERSISTENT_SMALL_GRID))),
                "{twin}"
            );
            // Where the default is persistent, one block per tile by name too.
            if flashattn::cuda::backward::persistent_default(&c.problem, c.deterministic) {
                let per_tile = format!("{} grid", c.label);
                assert!(
                    all.iter()
                        .any(|a| a.label == per_tile && a.grid == Grid::PerTile),
                    "{per_tile}"
                );
            }
        }
    }
    assert!(
        !all.iter()
            .any(|c| c.grid != Grid::Default && c.label.contains(" mma"))
    );
    let big = persistent_cases();
    assert!(
        big.iter()
            .all(|c| c.grid == Grid::Persistent(None) && c.label.ends_with(" persistent"))
    );
    for c in &big {
        let s = c.problem.shape;
        let tiles = s.seqlen_k.div_ceil(BC) * s.heads_kv * s.batch;
        assert!(tiles > 2 * 132, "{}: {tiles} tiles", c.label);
    }
    assert!(big.iter().any(|c| c.deterministic));
    assert!(big.iter().any(|c| c.label.contains("causal")));
    // The window (40 left, 8 right; seqlen_k - seqlen_q keys ahead of the first row): the first
    // key block sees no row.
    assert!(big.iter().any(|c| {
        let s = c.problem.shape;
        c.label.contains("window(40,8)") && s.seqlen_k - s.seqlen_q > 40 + BC
    }));
}
