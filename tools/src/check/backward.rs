//! The GPU backward ([`flashattn::cuda::backward`]) against the exact f64 gradients
//! ([`flashattn::reference_grad`]), on both main kernels where attn_bwd_wgmma takes the head_dim
//! (the default and attn_bwd by name): both dtypes, head dims 8 to 256 (36 and 160 padded),
//! no mask, causal (seqlen_q
//! below, equal to and above seqlen_k) and sliding windows, GQA and MQA, lengths that are not
//! multiples of the tiles; softcap and ALiBi (both kernels, [`mod_cases`]); a learnable sink on
//! both kernels, its gradient from sink_grad judged too ([`sink_cases`]). o and lse come from
//! the CPU forward, so that a forward error cannot hide a backward one; the gradients start as
//! NaN (an element the kernels skip fails). The deterministic mode runs 5 times per case and
//! must give the same bytes every time. attn_bwd_wgmma's persistent variant
//! ([`BackwardOptions::persistent`]; the default for causal masks and head dims up to 64,
//! where those cases also run on one block per tile by name, labelled ` grid`) takes the
//! dense cases it serves again, on a grid of at
//! most 3 blocks (each block then changes tiles), labelled ` persistent grid<=3`, and
//! [`persistent_cases`] more tiles than twice an H100's SMs on its full grid, labelled
//! ` persistent`. Problems the GPU backward does not take must be refused with a typed error.

use super::outcome::CaseResult;
use flashattn::compare::{Tolerance, diff, random_inputs, random_vec, widen};
use flashattn::cuda::backward::{BackwardOptions, BwdKernel, backward_host, persistent_default};
use flashattn::cuda::backward_wgmma::padded_head_dim;
use flashattn::cuda::{Gpu, GpuElement, KernelKind};
use flashattn::dtype::DType;
use flashattn::error::Result;
use flashattn::mask::Mask;
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::shape::{AttnProblem, AttnShape};
use flashattn::{cpu, reference_grad};
use half::{bf16, f16};

/// One backward call of the sweep.
#[derive(Debug, Clone)]
pub struct BwdCase {
    /// Label (`f16 backward b=.. sq=.. ...`).
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The problem (dense layouts).
    pub problem: AttnProblem,
    /// Run in the deterministic mode, [`DETERMINISTIC_RUNS`] times: every run must give the
    /// same bytes.
    pub deterministic: bool,
    /// The main kernel asked for: `Auto` (attn_bwd_wgmma where it serves the call), or `Mma`
    /// to hold attn_bwd to the same cases.
    pub kernel: BwdKernel,
    /// attn_bwd_wgmma's grid: the library's choice, one block per tile, or persistent.
    pub grid: Grid,
}

impl BwdCase {
    /// A case of `problem` (its mask and modifiers described by `name`) on `kernel` and
    /// `grid`, labelled `{dtype} backward b=.. sq=.. sk=.. hq=.. hkv=.. d=.. {name}` and
    /// ` deterministic`, ` mma` (attn_bwd by name) and the grid's label where they apply.
    fn new(
        dtype: DType,
        problem: &AttnProblem,
        name: &str,
        deterministic: bool,
        (kernel, grid): (BwdKernel, Grid),
    ) -> Self {
        let s = problem.shape;
        BwdCase {
            label: format!(
                "{dtype} backward b={} sq={} sk={} hq={} hkv={} d={} {name}{}{}{}",
                s.batch,
                s.seqlen_q,
                s.seqlen_k,
                s.heads_q,
                s.heads_kv,
                s.head_dim,
                if deterministic { " deterministic" } else { "" },
                if kernel == BwdKernel::Mma { " mma" } else { "" },
                grid_label(grid)
            ),
            dtype,
            problem: problem.clone(),
            deterministic,
            kernel,
            grid,
        }
    }
}

/// How a case asks attn_bwd_wgmma to lay out its blocks ([`BackwardOptions::persistent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// The library's choice ([`persistent_default`]).
    Default,
    /// One block per tile, by name.
    PerTile,
    /// Persistent, on at most this many blocks (`None`: one per SM).
    Persistent(Option<u32>),
}

/// The persistent grid of the sweep's small cases: a few blocks, so that each takes several
/// tiles (K/V reloads, the ring, the dS buffers and the dQ hand-offs across tiles).
pub const PERSISTENT_SMALL_GRID: u32 = 3;

/// Runs of a deterministic case (issue 14: identical bytes across 5 runs).
pub const DETERMINISTIC_RUNS: usize = 5;

/// The sweep: (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) x masks x dtypes.
pub fn cases() -> Vec<BwdCase> {
    let shapes = [
        (1, 17, 17, 2, 2, 64),
        (2, 33, 65, 4, 1, 40),
        (1, 65, 20, 4, 2, 8),
        (1, 1, 129, 8, 1, 128),
        (2, 100, 100, 4, 2, 128),
        (1, 300, 257, 6, 2, 96),
        (1, 128, 128, 2, 2, 64),
        (2, 64, 200, 8, 8, 128),
        (1, 513, 513, 2, 1, 64),
        (1, 700, 900, 4, 2, 128),
        (1, 77, 130, 4, 2, 36),
        (2, 90, 70, 2, 1, 160),
        (1, 200, 300, 4, 2, 256),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for &(b, sq, sk, hq, hkv, d) in &shapes {
            let mut shape = AttnShape::new(b, sq, hq, d);
            shape.seqlen_k = sk;
            shape.heads_kv = hkv;
            let base = AttnProblem::new(shape).expect("valid case");
            let window = ScoreMods {
                window: Window::from_fa(40, 8).expect("valid window"),
                ..ScoreMods::default()
            };
            let variants = [
                ("none", base.clone()),
                ("causal", base.clone().with_mask(Mask::Causal)),
                (
                    "window(40,8)",
                    base.clone().with_scores(window).expect("valid window"),
                ),
            ];
            // The deterministic mode where more than one key block adds to a dQ row (more
            // than 128 keys): every shape in f16, the GQA one in bf16 too.
            let det = sk > 128 && (dtype == DType::F16 || hq != hkv && d == 96);
            // Where attn_bwd_wgmma takes the head_dim, the cases run on both kernels (the
            // default and attn_bwd by name), the deterministic ones too.
            let kernels: &[BwdKernel] = if padded_head_dim(d).is_some() {
                &[BwdKernel::Auto, BwdKernel::Mma]
            } else {
                &[BwdKernel::Auto]
            };
            let wgmma_d = padded_head_dim(d).is_some();
            for (name, problem) in variants {
                for deterministic in [false, true] {
                    if deterministic && !det {
                        continue;
                    }
                    // attn_bwd_wgmma's persistent variant too where it serves the call, and
                    // one block per tile by name where the default is persistent.
                    let mut grids = vec![Grid::Default];
                    if wgmma_d {
                        if persistent_default(&problem, deterministic) {
                            grids.push(Grid::PerTile);
                        }
                        grids.push(Grid::Persistent(Some(PERSISTENT_SMALL_GRID)));
                    }
                    for &kernel in kernels {
                        for &grid in &grids {
                            if grid != Grid::Default && kernel == BwdKernel::Mma {
                                continue;
                            }
                            out.push(BwdCase::new(
                                dtype,
                                &problem,
                                name,
                                deterministic,
                                (kernel, grid),
                            ));
                        }
                    }
                }
            }
        }
    }
    out.extend(persistent_cases());
    out.extend(mod_cases());
    out.extend(sink_cases());
    out
}

/// A learnable sink (the forward's lse includes it; d sink comes from sink_grad): mild and
/// strong sinks; no mask, causal with seqlen_q above seqlen_k (rows that see no key) and a
/// window; GQA and MQA; head dims 64 and 128 on both kernels (attn_bwd_wgmma where it serves,
/// attn_bwd by name), 96, 77 (padded), 256, with softcap and ALiBi (attn_bwd at d256), and the
/// deterministic mode; both dtypes. Labels end in ` sink`.
pub fn sink_cases() -> Vec<BwdCase> {
    let shape = |b, sq, sk, hq, hkv, d| {
        let mut s = AttnShape::new(b, sq, hq, d);
        s.seqlen_k = sk;
        s.heads_kv = hkv;
        s
    };
    let sunk = |heads, kind| ScoreMods {
        sink: Some(super::cases::sink_logits(heads, kind)),
        ..ScoreMods::default()
    };
    let window = Window::from_fa(40, 8).expect("valid window");
    use Mask::{Causal, None as Full};
    // (shape, mask, modifiers, deterministic)
    let list = [
        (shape(2, 100, 100, 4, 2, 64), Full, sunk(4, "mild"), false),
        (
            shape(1, 300, 257, 4, 1, 128),
            Causal,
            sunk(4, "strong"),
            false,
        ),
        (
            shape(1, 200, 300, 2, 2, 128),
            Full,
            ScoreMods {
                window,
                ..sunk(2, "mild")
            },
            false,
        ),
        (shape(2, 90, 130, 6, 2, 96), Causal, sunk(6, "mild"), false),
        (shape(1, 77, 130, 4, 2, 77), Causal, sunk(4, "mild"), false),
        (
            shape(1, 100, 180, 4, 2, 256),
            Causal,
            ScoreMods {
                softcap: Some(5.0),
                alibi: Some(Alibi::geometric(4)),
                ..sunk(4, "mild")
            },
            false,
        ),
        (shape(1, 513, 513, 2, 1, 64), Causal, sunk(2, "mild"), true),
    ];
    let mut out = Vec::new();
    for (shape, mask, mods, deterministic) in list {
        let name = format!("{}{}", mask.name(), super::cases::describe_scores(&mods));
        let problem = AttnProblem::new(shape)
            .expect("valid case")
            .with_mask(mask)
            .with_scores(mods)
            .expect("valid sink");
        let AttnShape {
            batch: b,
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
        } = shape;
        let kernels: &[BwdKernel] = if padded_head_dim(d).is_some() {
            &[BwdKernel::Auto, BwdKernel::Mma]
        } else {
            &[BwdKernel::Auto]
        };
        for dtype in [DType::F16, DType::BF16] {
            for &kernel in kernels {
                out.push(BwdCase {
                    label: format!(
                        "{dtype} backward b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} {name}{}{}",
                        if deterministic { " deterministic" } else { "" },
                        if kernel == BwdKernel::Mma { " mma" } else { "" }
                    ),
                    dtype,
                    problem: problem.clone(),
                    deterministic,
                    kernel,
                    grid: Grid::Default,
                });
            }
        }
    }
    out
}

/// ` persistent` (one block per SM), ` persistent grid<=N`, ` grid` (one block per tile), or
/// nothing.
fn grid_label(g: Grid) -> String {
    match g {
        Grid::Default => String::new(),
        Grid::PerTile => " grid".into(),
        Grid::Persistent(None) => " persistent".into(),
        Grid::Persistent(Some(n)) => format!(" persistent grid<={n}"),
    }
}

/// attn_bwd_wgmma persistent on its full grid (one block per SM) with more tiles than twice
/// the H100's 132 SMs (324 at d64: 9 key blocks x 12 kv heads x 3; 288 at d128), GQA,
/// seqlen_q below seqlen_k and not multiples of the tiles; no mask, causal and a window (the
/// window leaves the first key blocks without rows: tiles without steps), the deterministic
/// mode in both head dims.
pub fn persistent_cases() -> Vec<BwdCase> {
    let window = ScoreMods {
        window: Window::from_fa(40, 8).expect("valid window"),
        ..ScoreMods::default()
    };
    // (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), mask, window, dtype, deterministic
    let list = [
        (
            (3, 200, 1100, 24, 12, 64),
            Mask::None,
            false,
            DType::F16,
            false,
        ),
        (
            (3, 200, 1100, 24, 12, 64),
            Mask::Causal,
            false,
            DType::F16,
            true,
        ),
        (
            (3, 200, 1100, 24, 12, 64),
            Mask::None,
            true,
            DType::F16,
            false,
        ),
        (
            (3, 200, 1100, 24, 12, 64),
            Mask::Causal,
            false,
            DType::BF16,
            false,
        ),
        (
            (3, 130, 1000, 12, 12, 128),
            Mask::None,
            false,
            DType::F16,
            true,
        ),
        (
            (3, 130, 1000, 12, 12, 128),
            Mask::None,
            true,
            DType::F16,
            true,
        ),
        (
            (3, 130, 1000, 12, 12, 128),
            Mask::Causal,
            false,
            DType::BF16,
            false,
        ),
    ];
    list.into_iter()
        .map(|((b, sq, sk, hq, hkv, d), mask, windowed, dtype, deterministic)| {
            let mut shape = AttnShape::new(b, sq, hq, d);
            shape.seqlen_k = sk;
            shape.heads_kv = hkv;
            let mut problem = AttnProblem::new(shape).expect("valid case").with_mask(mask);
            if windowed {
                problem = problem.with_scores(window.clone()).expect("valid window");
            }
            let name = if windowed { "window(40,8)" } else { mask.name() };
            BwdCase {
                label: format!(
                    "{dtype} backward b={b} sq={sq} sk={sk} hq={hq} hkv={hkv} d={d} {name}{} persistent",
                    if deterministic { " deterministic" } else { "" },
                ),
                dtype,
                problem,
                deterministic,
                kernel: BwdKernel::Auto,
                grid: Grid::Persistent(None),
            }
        })
        .collect()
}

/// Softcap and ALiBi, on attn_bwd_wgmma where it takes the head_dim (on one block per tile
/// or persistent as the default has it, and persistent on a few blocks) and on attn_bwd (by
/// name there, the default elsewhere): softcaps
/// small enough that tanh bends the random scores (2, 5) and FlashAttention's usual 30;
/// slopes per head and per (batch, head); alone, together, with causal (seqlen_q above
/// seqlen_k: rows that see no key) and a window; GQA and MQA; odd lengths; head dims 64, 128,
/// 96, 36 (padded to 40) in both dtypes, 256 (two channel passes) and the deterministic mode
/// in f16 (at d96 and d64); several key blocks and steps at d128 and d64. Labels carry
/// ` softcapC` and ` alibi` ([`super::cases::describe_scores`]), ` mma` for attn_bwd by name.
pub fn mod_cases() -> Vec<BwdCase> {
    let shape = |b, sq, sk, hq, hkv, d| {
        let mut s = AttnShape::new(b, sq, hq, d);
        s.seqlen_k = sk;
        s.heads_kv = hkv;
        s
    };
    let window = Window::from_fa(40, 8).expect("valid window");
    let mods = |window, softcap, alibi| ScoreMods {
        window,
        softcap,
        alibi,
        sink: None,
    };
    let full = Window::default();
    let per_head = |h| Some(Alibi::geometric(h));
    // A row of slopes per batch entry: the geometric ones times 1, 2, ...
    let per_batch = |b: usize, h: usize| {
        let row = |i: usize| {
            Alibi::geometric(h)
                .slopes
                .into_iter()
                .map(move |x| x * (i + 1) as f32)
        };
        Some(Alibi {
            slopes: (0..b).flat_map(row).collect(),
            per_batch: true,
        })
    };
    let both = &[DType::F16, DType::BF16][..];
    let f16_only = &[DType::F16][..];
    use Mask::{Causal, None as Full};
    // (shape, mask, modifiers, dtypes, deterministic)
    let list = [
        (
            shape(1, 77, 77, 4, 2, 64),
            Full,
            mods(full, Some(5.0), None),
            both,
            false,
        ),
        (
            shape(2, 100, 130, 4, 1, 128),
            Causal,
            mods(full, None, per_batch(2, 4)),
            both,
            false,
        ),
        (
            shape(1, 200, 150, 6, 2, 96),
            Causal,
            mods(full, Some(2.0), per_head(6)),
            both,
            false,
        ),
        (
            shape(1, 65, 300, 2, 2, 36),
            Full,
            mods(window, Some(30.0), per_head(2)),
            both,
            false,
        ),
        (
            shape(1, 200, 150, 6, 2, 96),
            Causal,
            mods(full, Some(2.0), per_head(6)),
            f16_only,
            true,
        ),
        (
            shape(1, 100, 180, 4, 2, 256),
            Causal,
            mods(full, Some(5.0), per_head(4)),
            f16_only,
            false,
        ),
        // Several key blocks and steps on attn_bwd_wgmma: both modifiers at d128, and the
        // deterministic mode at d64 (128-row steps).
        (
            shape(1, 300, 400, 4, 2, 128),
            Full,
            mods(full, Some(30.0), per_head(4)),
            both,
            false,
        ),
        (
            shape(2, 300, 300, 2, 1, 64),
            Causal,
            mods(full, Some(5.0), per_batch(2, 2)),
            f16_only,
            true,
        ),
    ];
    let mut out = Vec::new();
    for (shape, mask, mods, dtypes, deterministic) in list {
        let name = format!("{}{}", mask.name(), super::cases::describe_scores(&mods));
        let problem = AttnProblem::new(shape)
            .expect("valid case")
            .with_mask(mask)
            .with_scores(mods)
            .expect("valid modifiers");
        let d = shape.head_dim;
        // Where attn_bwd_wgmma takes the head_dim: the default (it), its persistent variant
        // on a few blocks, and attn_bwd by name.
        let runs: &[(BwdKernel, Grid)] = if padded_head_dim(d).is_some() {
            &[
                (BwdKernel::Auto, Grid::Default),
                (
                    BwdKernel::Auto,
                    Grid::Persistent(Some(PERSISTENT_SMALL_GRID)),
                ),
                (BwdKernel::Mma, Grid::Default),
            ]
        } else {
            &[(BwdKernel::Auto, Grid::Default)]
        };
        for &dtype in dtypes {
            for &run in runs {
                out.push(BwdCase::new(dtype, &problem, &name, deterministic, run));
            }
        }
    }
    out
}

/// Runs one case on the GPU and judges dq, dk, dv (and a sink's d_sink) against the exact
/// gradients: rel-L2 within twice the forward's o bound for the dtype (P and dS go through
/// 16-bit values, as in FlashAttention-2; d_sink reads the 16-bit o), and no NaN or Inf where
/// the exact value is finite.
///
/// # Errors
/// Only oracle failures on a valid case; kernel failures are a failed result.
pub fn run_case(gpu: &Gpu, case: &BwdCase, seed: u64) -> Result<CaseResult> {
    match case.dtype {
        DType::BF16 => run_typed::<bf16>(gpu, case, seed),
        _ => run_typed::<f16>(gpu, case, seed),
    }
}

fn run_typed<T: GpuElement>(gpu: &Gpu, case: &BwdCase, seed: u64) -> Result<CaseResult> {
    let p = &case.problem;
    let s = p.shape;
    let mut result = CaseResult::new(&case.label, KernelKind::Mma);
    result.kernel = "bwd".into();
    let (q, k, v) = random_inputs::<T>(p, seed);
    let n_o = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let mut o = vec![T::default(); n_o];
    let mut lse = vec![0.0f32; s.lse_len()];
    cpu::forward(p, &q, &k, &v, &mut o, &mut lse)?;
    let d_o: Vec<T> = random_vec(n_o, seed ^ 0xd0);
    let exact = reference_grad::backward(p, &q, &k, &v, &d_o)?;
    let opts = BackwardOptions {
        deterministic: case.deterministic,
        kernel: case.kernel,
        persistent: match case.grid {
            Grid::Default => None,
            Grid::PerTile => Some(false),
            Grid::Persistent(_) => Some(true),
        },
        persistent_blocks: match case.grid {
            Grid::Persistent(n) => n,
            _ => None,
        },
    };
    let got = match backward_host(gpu, p, opts, &q, &k, &v, &o, &lse, &d_o) {
        Ok(g) => g,
        Err(e) => {
            result.message = e.to_string();
            return Ok(result);
        }
    };
    // The kernel that ran, in the result's kernel column: bwd (attn_bwd) or bwd-wg.
    if got.info.kernel == "attn_bwd_wgmma" {
        result.kernel = "bwd-wg".into();
    }
    // The deterministic mode: the other runs must give the bytes of the first.
    let mut same = Vec::new();
    if case.deterministic {
        let bits = |x: &[T]| x.iter().map(|e| e.to_f32().to_bits()).collect::<Vec<u32>>();
        for run in 2..=DETERMINISTIC_RUNS {
            let again = match backward_host(gpu, p, opts, &q, &k, &v, &o, &lse, &d_o) {
                Ok(g) => g,
                Err(e) => {
                    result.message = format!("run {run}: {e}");
                    return Ok(result);
                }
            };
            let sink_bits = |x: &Option<Vec<f32>>| {
                x.iter()
                    .flatten()
                    .map(|e| e.to_bits())
                    .collect::<Vec<u32>>()
            };
            let (s1, s2) = (sink_bits(&got.d_sink), sink_bits(&again.d_sink));
            let sink_differ = s1.iter().zip(&s2).filter(|(x, y)| x != y).count();
            if sink_differ > 0 || s1.len() != s2.len() {
                same.push(format!(
                    "run {run}: {sink_differ} d_sink elements differ from run 1"
                ));
            }
            for (name, a, b) in [
                ("dq", &got.dq, &again.dq),
                ("dk", &got.dk, &again.dk),
                ("dv", &got.dv, &again.dv),
            ] {
                let differ = bits(a)
                    .iter()
                    .zip(bits(b))
                    .filter(|(x, y)| **x != *y)
                    .count();
                if differ > 0 {
                    same.push(format!(
                        "run {run}: {differ} {name} elements differ from run 1"
                    ));
                }
            }
        }
    }
    let bound = 2.0 * Tolerance::for_dtype(T::DTYPE).o_rel_l2;
    let mut notes = Vec::new();
    if !got.info.why_not_wgmma.is_empty() {
        notes.push(format!("attn_bwd: {}", got.info.why_not_wgmma));
    }
    let (mut worst_rel, mut worst_abs) = (0.0f64, 0.0f64);
    let mut ok = true;
    // The grid asked for where attn_bwd_wgmma ran.
    if got.info.kernel == "attn_bwd_wgmma" {
        match (case.grid, got.info.persistent) {
            (Grid::Persistent(_), true) => {
                notes.push(format!("persistent on {} blocks", got.info.blocks));
            }
            (Grid::Persistent(_), false) => {
                ok = false;
                notes.push("asked for the persistent variant, got one block per tile".into());
            }
            (Grid::PerTile, true) => {
                ok = false;
                notes.push("asked for one block per tile, got the persistent variant".into());
            }
            _ => {}
        }
    }
    for (name, g, want) in [
        ("dq", &got.dq, &exact.dq),
        ("dk", &got.dk, &exact.dk),
        ("dv", &got.dv, &exact.dv),
    ] {
        let d = diff(widen(g), want);
        worst_rel = worst_rel.max(d.rel_l2);
        worst_abs = worst_abs.max(d.max_abs);
        notes.push(format!("{name} rel-L2 {:.2e}", d.rel_l2));
        if !d.is_clean() || d.rel_l2.is_nan() || d.rel_l2 > bound {
            ok = false;
            notes.push(format!("{name}: {d} (bound {bound:.1e})"));
        }
    }
    // A sink's gradient: present exactly when the problem has a sink, within the same bound.
    match (&got.d_sink, &exact.d_sink) {
        (Some(g), Some(want)) => {
            let d = diff(widen(g), want);
            worst_rel = worst_rel.max(d.rel_l2);
            notes.push(format!("d_sink rel-L2 {:.2e}", d.rel_l2));
            if !d.is_clean() || d.rel_l2.is_nan() || d.rel_l2 > bound {
                ok = false;
                notes.push(format!("d_sink: {d} (bound {bound:.1e})"));
            }
        }
        (None, None) => {}
        (g, _) => {
            ok = false;
            notes.push(format!(
                "d_sink {} but the problem {} a sink",
                if g.is_some() { "came back" } else { "missing" },
                if g.is_some() { "has no" } else { "has" }
            ));
        }
    }
    if case.deterministic {
        if same.is_empty() {
            notes.push(format!("{DETERMINISTIC_RUNS} runs identical"));
        } else {
            ok = false;
            notes.extend(same);
        }
    }
    result.o_rel_l2 = worst_rel;
    result.o_max_abs = worst_abs;
    result.lse_max_abs = 0.0;
    result.passed = ok;
    result.message = notes.join(", ");
    Ok(result)
}

/// Calls the GPU backward must refuse with a typed error, each checked through
/// [`backward_host`]: attn_bwd_wgmma asked for by name at a head_dim it does not take (40,
/// which attn_bwd serves by default; the error says attn_bwd_wgmma cannot serve the call, on
/// any device: off sm_90 for the device). `(label, passed, message)`.
pub fn refusals(gpu: &Gpu) -> Vec<(String, bool, String)> {
    let with = |d: usize| {
        AttnProblem::new(AttnShape::new(1, 32, 2, d))
            .expect("valid shape")
            .with_scores(ScoreMods {
                softcap: Some(30.0),
                ..ScoreMods::default()
            })
            .expect("valid modifiers")
    };
    let wgmma = BackwardOptions {
        kernel: BwdKernel::Wgmma,
        ..BackwardOptions::default()
    };
    let want = "attn_bwd_wgmma cannot serve this call";
    [("d=40 softcap30", with(40))]
        .into_iter()
        .map(|(label, prob)| {
            let label = format!("backward {label} on attn_bwd_wgmma");
            let s = prob.shape;
            let n_q = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
            let n_k = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
            let x = vec![f16::from_f32(0.5); n_q.max(n_k)];
            let lse = vec![0.0f32; s.lse_len()];
            match backward_host(gpu, &prob, wgmma, &x, &x, &x, &x, &lse, &x) {
                Err(e) if e.to_string().contains(want) => (label, true, e.to_string()),
                Err(e) => (
                    label,
                    false,
                    format!("refused with an unexpected error: {e} (expected '{want}')"),
                ),
                Ok(_) => (
                    label,
                    false,
                    "accepted a call attn_bwd_wgmma does not serve".into(),
                ),
            }
        })
        .collect()
}
