//! The backward of packed variable-length batches ([`flashattn::cuda::bwd::varlen`]: one
//! launch per kernel over every sequence) against the exact f64 gradients per sequence
//! ([`flashattn::varlen::reference_backward`]): lengths 0, 1, 17, 128 and 300 in one batch,
//! seqlen_q != seqlen_k per sequence, sequences without queries (dk = dv = 0) or without keys
//! (dq = 0), batches with no key or no query at all, causal and not, a window, softcap and
//! per-sequence ALiBi, GQA and MQA, head dims 64, 128, 40 (the packed path at an odd multiple
//! of 8), 36 (not a multiple of 8: padded copies, still one launch) and 256 (two channel
//! passes), f16 and bf16, the deterministic mode (5 runs, the same bytes), and a learnable
//! sink (its gradient d_sink judged too; labels end in ` sink`). o and lse come from the CPU
//! forward; dq, dk, dv (and d_sink) start poisoned (NaN) with a guard past their ends that
//! must stay so. Labels hold `backward varlen` (`--filter 'backward&varlen'`).

use super::outcome::{CaseResult, GUARD, POISON16, synced, to_bits};
use flashattn::BackendChoice;
use flashattn::compare::{Tolerance, diff, random_vec, widen};
use flashattn::cuda::backward::{BackwardOptions, BwdKernel};
use flashattn::cuda::bwd::varlen::{backward_device, backward_device_offsets};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind};
use flashattn::dtype::DType;
use flashattn::error::Result;
use flashattn::mask::Mask;
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::varlen::{self, DeviceVarlenProblem, VarlenProblem, offsets};
use half::{bf16, f16};

/// One packed batch of the backward sweep.
#[derive(Debug, Clone)]
pub struct VarlenBwdCase {
    /// `{dtype} backward varlen q[..] k[..] hq=.. hkv=.. d=.. {mask}{modifiers}[ deterministic]`.
    pub label: String,
    /// Element type.
    pub dtype: DType,
    /// The batch.
    pub problem: VarlenProblem,
    /// Run [`super::backward::DETERMINISTIC_RUNS`] times: every run must give the same bytes.
    pub deterministic: bool,
}

/// The sweep (the same in quick mode: the batches are small).
pub fn cases() -> Vec<VarlenBwdCase> {
    // Lengths 0, 1, 17, 128, 300 in one batch: a sequence without queries, 1 query on 17
    // keys, 17 queries on 1 key (causal: 16 rows see no key), equal lengths; then sequences
    // without keys, and seqlen_q < seqlen_k.
    let a = (vec![0, 1, 17, 128, 300], vec![5, 17, 1, 128, 300]);
    let b = (vec![300, 128, 17, 1, 0, 3], vec![0, 200, 17, 300, 9, 0]);
    let plain = ScoreMods::default;
    let mods = ScoreMods {
        window: Window::from_fa(100, 20).expect("valid window"),
        softcap: Some(5.0),
        alibi: Some(Alibi {
            slopes: (0..20).map(|i| 0.02 * (i + 1) as f32).collect(),
            per_batch: true,
        }),
        sink: None,
    };
    // A learnable sink: mild on every head, with the modifiers too (rows that see no key get
    // lse = sink and add nothing to d_sink).
    let sunk = |heads: usize, base: ScoreMods| ScoreMods {
        sink: Some(super::cases::sink_logits(heads, "mild")),
        ..base
    };
    // (lengths, heads_q, heads_kv, head_dim, masks, modifiers, dtypes, deterministic)
    type Spec = (
        (Vec<usize>, Vec<usize>),
        usize,
        usize,
        usize,
        &'static [Mask],
        ScoreMods,
        &'static [DType],
        bool,
    );
    let both = &[DType::F16, DType::BF16][..];
    let f16_only = &[DType::F16][..];
    let masks = &[Mask::None, Mask::Causal][..];
    let causal = &[Mask::Causal][..];
    let specs: Vec<Spec> = vec![
        (a.clone(), 4, 2, 64, masks, plain(), both, false),
        (a.clone(), 4, 2, 128, masks, plain(), both, false),
        (b.clone(), 8, 1, 128, masks, plain(), both, false),
        (b.clone(), 6, 2, 40, masks, plain(), both, false),
        (a.clone(), 4, 2, 36, masks, plain(), both, false),
        (b.clone(), 2, 1, 256, causal, plain(), f16_only, false),
        (a.clone(), 4, 2, 64, causal, mods.clone(), both, false),
        (
            a.clone(),
            4,
            2,
            96,
            causal,
            ScoreMods {
                window: Window::from_fa(64, 0).expect("valid window"),
                ..plain()
            },
            f16_only,
            true,
        ),
        (b.clone(), 4, 2, 128, masks, plain(), f16_only, true),
        // Sinks: the packed path (d128, both masks), padded copies (d36), the modifiers, the
        // deterministic mode.
        (b.clone(), 8, 2, 128, masks, sunk(8, plain()), both, false),
        (
            a.clone(),
            4,
            2,
            36,
            causal,
            sunk(4, plain()),
            f16_only,
            false,
        ),
        (
            a.clone(),
            4,
            2,
            64,
            causal,
            sunk(4, mods.clone()),
            both,
            false,
        ),
        (
            a.clone(),
            4,
            1,
            64,
            causal,
            sunk(4, plain()),
            f16_only,
            true,
        ),
        // Long sequences (2048+ query rows on average): one attn_bwd_wgmma backward per
        // sequence with host offsets (a sequence without queries and one without keys among
        // them), the packed attn_bwd with device offsets; the deterministic mode too.
        (
            (
                vec![2100, 0, 2300, 1900, 4000],
                vec![2100, 300, 2500, 1800, 0],
            ),
            4,
            2,
            128,
            masks,
            plain(),
            f16_only,
            false,
        ),
        (
            (vec![3000, 2048], vec![3000, 2048]),
            4,
            2,
            64,
            causal,
            plain(),
            &[DType::BF16][..],
            true,
        ),
        // Long, at a head_dim attn_bwd_wgmma does not take (not a multiple of 8): packed,
        // through padded copies, with host offsets too.
        (
            (vec![2100, 2300], vec![2100, 2300]),
            2,
            1,
            100,
            causal,
            plain(),
            f16_only,
            false,
        ),
        // No key at all (dq = 0, and d_sink = 0 with a sink), no query at all (dk = dv = 0).
        (
            (vec![3, 5], vec![0, 0]),
            2,
            1,
            64,
            masks,
            plain(),
            f16_only,
            false,
        ),
        (
            (vec![3, 5], vec![0, 0]),
            2,
            1,
            64,
            causal,
            sunk(2, plain()),
            f16_only,
            false,
        ),
        (
            (vec![0, 0], vec![4, 9]),
            2,
            1,
            64,
            masks,
            plain(),
            f16_only,
            false,
        ),
    ];
    let mut out = Vec::new();
    for ((lq, lk), hq, hkv, d, masks, mods, dtypes, deterministic) in specs {
        for &mask in masks {
            let p = VarlenProblem::new(offsets(&lq), offsets(&lk), hq, hkv, d)
                .expect("valid sweep batch")
                .with_mask(mask)
                .with_scores(mods.clone())
                .expect("valid sweep modifiers");
            for &dtype in dtypes {
                out.push(VarlenBwdCase {
                    label: format!(
                        "{dtype} backward varlen q{lq:?} k{lk:?} hq={hq} hkv={hkv} d={d} {}{}{}",
                        mask.name(),
                        super::cases::describe_scores(&mods),
                        if deterministic { " deterministic" } else { "" }
                    ),
                    dtype,
                    problem: p.clone(),
                    deterministic,
                });
            }
        }
    }
    out
}

/// Runs one case and judges dq, dk, dv against the exact gradients: rel-L2 within twice the
/// forward's o bound for the dtype (as the dense backward cases), no NaN or Inf where the
/// exact value is finite (the poison included), nothing written past the ends; in the
/// deterministic mode the same bytes every run.
///
/// # Errors
/// Oracle and copy failures; kernel failures are a failed result.
pub fn run_case(gpu: &Gpu, case: &VarlenBwdCase, seed: u64) -> Result<CaseResult> {
    match case.dtype {
        DType::BF16 => run_typed::<bf16>(gpu, case, seed),
        _ => run_typed::<f16>(gpu, case, seed),
    }
}

/// dq, dk and dv of one run, read back without their guards, d_sink (with a sink), the guard
/// elements written, and what ran.
struct Run<T> {
    grads: [Vec<T>; 3],
    d_sink: Option<Vec<f32>>,
    guard: usize,
    ran: String,
}

fn run_typed<T: GpuElement>(gpu: &Gpu, case: &VarlenBwdCase, seed: u64) -> Result<CaseResult> {
    let p = &case.problem;
    let mut result = CaseResult::new(&case.label, KernelKind::Mma);
    result.kernel = "bwd".into();
    let (nq, nk) = p.packed_lens()?;
    let q: Vec<T> = random_vec(nq, seed);
    let k: Vec<T> = random_vec(nk, seed ^ 0x5555);
    let v: Vec<T> = random_vec(nk, seed ^ 0xAAAA);
    let fwd = varlen::forward(BackendChoice::Cpu, p, &q, &k, &v)?;
    let d_o: Vec<T> = random_vec(nq, seed ^ 0xd0);
    let exact = varlen::reference_backward(p, &q, &k, &v, &d_o)?;
    let opts = BackwardOptions {
        deterministic: case.deterministic,
        kernel: BwdKernel::Auto,
        ..BackwardOptions::default()
    };
    let runs = if case.deterministic {
        super::backward::DETERMINISTIC_RUNS
    } else {
        1
    };
    let mut got: Vec<Run<T>> = Vec::new();
    let inputs = [&q[..], &k, &v, &fwd.o, &d_o];
    // Deterministic runs alternate the host offsets with offsets already on the device
    // (backward_device_offsets): the same bytes either way, where both run the packed
    // attn_bwd (long sequences with host offsets run attn_bwd_wgmma per sequence: its own
    // bytes, the same every run).
    let per_sequence = flashattn::cuda::varlen::per_sequence_pays(p)
        && gpu.info().compute_capability == (9, 0)
        && flashattn::cuda::backward_wgmma::padded_head_dim(p.head_dim).is_some()
        && p.scores.sink.is_none();
    let alternate = !per_sequence;
    for run in 1..=runs {
        match launch(gpu, p, opts, inputs, &fwd.lse, alternate && run % 2 == 0) {
            Ok(r) => got.push(r),
            Err(e) => {
                result.message = format!("run {run}: {e}");
                return Ok(result);
            }
        }
    }
    let [dq, dk, dv] = &got[0].grads;
    let ran = &got[0].ran;
    result.guard_overwritten = got.iter().map(|r| r.guard).sum();
    let bound = 2.0 * Tolerance::for_dtype(T::DTYPE).o_rel_l2;
    let (mut problems, mut notes) = (Vec::new(), vec![ran.clone()]);
    let (mut worst_rel, mut worst_abs) = (0.0f64, 0.0f64);
    for (name, g, want) in [
        ("dq", dq, &exact.dq),
        ("dk", dk, &exact.dk),
        ("dv", dv, &exact.dv),
    ] {
        let d = diff(widen(g), want);
        worst_rel = worst_rel.max(d.rel_l2);
        worst_abs = worst_abs.max(d.max_abs);
        notes.push(format!("{name} rel-L2 {:.2e}", d.rel_l2));
        if !d.is_clean() || d.rel_l2.is_nan() || d.rel_l2 > bound {
            problems.push(format!("{name}: {d} (bound {bound:.1e})"));
        }
    }
    // A sink's gradient: present exactly when the problem has a sink, within the same bound.
    match (&got[0].d_sink, &exact.d_sink) {
        (Some(g), Some(want)) => {
            let d = diff(widen(g), want);
            worst_rel = worst_rel.max(d.rel_l2);
            notes.push(format!("d_sink rel-L2 {:.2e}", d.rel_l2));
            if !d.is_clean() || d.rel_l2.is_nan() || d.rel_l2 > bound {
                problems.push(format!("d_sink: {d} (bound {bound:.1e})"));
            }
        }
        (None, None) => {}
        (g, _) => problems.push(format!(
            "d_sink {} but the problem {} a sink",
            if g.is_some() { "returned" } else { "missing" },
            if g.is_some() { "has no" } else { "has" }
        )),
    }
    for (run, r) in got.iter().enumerate().skip(1) {
        let bits = |x: &Option<Vec<f32>>| x.iter().flatten().map(|e| e.to_bits()).collect();
        let (s1, s0): (Vec<u32>, Vec<u32>) = (bits(&r.d_sink), bits(&got[0].d_sink));
        if s1 != s0 {
            problems.push(format!("run {}: d_sink differs from run 1", run + 1));
        }
        for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
            let differ = r.grads[i]
                .iter()
                .zip(&got[0].grads[i])
                .filter(|(a, b)| to_bits(**a) != to_bits(**b))
                .count();
            if differ > 0 {
                problems.push(format!(
                    "run {}: {differ} {name} elements differ from run 1",
                    run + 1
                ));
            }
        }
    }
    if case.deterministic && problems.is_empty() {
        notes.push(format!(
            "{runs} runs identical (runs 2 and 4 with the offsets on the device)"
        ));
    }
    if !case.deterministic {
        // The offsets on the device (backward_device_offsets): the same bound.
        match launch(gpu, p, opts, inputs, &fwd.lse, true) {
            Ok(r) => {
                result.guard_overwritten += r.guard;
                for ((name, g), want) in ["dq", "dk", "dv"]
                    .into_iter()
                    .zip(&r.grads)
                    .zip([&exact.dq, &exact.dk, &exact.dv])
                {
                    let d = diff(widen(g), want);
                    if !d.is_clean() || d.rel_l2.is_nan() || d.rel_l2 > bound {
                        problems.push(format!(
                            "{name} (offsets on the device): {d} (bound {bound:.1e})"
                        ));
                    }
                }
                notes.push("offsets on the device: within the bound".into());
            }
            Err(e) => problems.push(format!("offsets on the device: {e}")),
        }
    }
    result.o_rel_l2 = worst_rel;
    result.o_max_abs = worst_abs;
    result.lse_max_abs = 0.0;
    result.conclude(problems, notes);
    Ok(result)
}

/// One backward call on the device: inputs copied in, dq, dk and dv poisoned with a guard
/// each, the call, the stream synchronised (a fault is the call's error), the gradients read
/// back. `device_offsets`: the offsets copied to the device first and the call made with them
/// there ([`backward_device_offsets`], as a CUDA graph would replay it).
fn launch<T: GpuElement>(
    gpu: &Gpu,
    p: &VarlenProblem,
    opts: BackwardOptions,
    [q, k, v, o, d_o]: [&[T]; 5],
    lse: &[f32],
    device_offsets: bool,
) -> Result<Run<T>> {
    let stream = gpu.stream();
    // Device buffers of at least one element (empty allocations are refused): the packed
    // sizes may be 0.
    let up = |x: &[T], what: &str| {
        let mut h = x.to_vec();
        if h.is_empty() {
            h.push(T::from_f32(0.0));
        }
        stream
            .clone_htod(&h)
            .map_err(cuda_err(format!("copying {what} to the device")))
    };
    let (g_q, g_k, g_v, g_o, g_do) = (
        up(q, "q")?,
        up(k, "k")?,
        up(v, "v")?,
        up(o, "o")?,
        up(d_o, "do")?,
    );
    let mut lse_h = lse.to_vec();
    lse_h.push(0.0);
    let g_lse = stream
        .clone_htod(&lse_h)
        .map_err(cuda_err("copying lse to the device"))?;
    // SAFETY: T is f16 or bf16; every 16-bit pattern is a valid value.
    let poison: T = unsafe { std::mem::transmute_copy::<u16, T>(&POISON16) };
    let (nq, nk) = (q.len(), k.len());
    let poisoned = |n: usize| {
        stream
            .clone_htod(&vec![poison; n + GUARD])
            .map_err(cuda_err("poisoning the gradients"))
    };
    let (mut g_dq, mut g_dk, mut g_dv) = (poisoned(nq)?, poisoned(nk)?, poisoned(nk)?);
    let hq = p.heads_q;
    let mut g_ds = p
        .scores
        .sink
        .as_ref()
        .map(|_| {
            stream
                .clone_htod(&vec![f32::NAN; hq + GUARD])
                .map_err(cuda_err("poisoning d_sink"))
        })
        .transpose()?;
    let info = {
        let (mut vq, mut vk, mut vv) = (
            g_dq.slice_mut(0..nq),
            g_dk.slice_mut(0..nk),
            g_dv.slice_mut(0..nk),
        );
        let mut vs = g_ds.as_mut().map(|x| x.slice_mut(0..hq));
        let d_sink = vs
            .as_mut()
            .map(|x| x as &mut dyn cudarc::driver::DevicePtrMut<f32>);
        let (vq_in, vk_in, vv_in) = (g_q.slice(0..nq), g_k.slice(0..nk), g_v.slice(0..nk));
        let (vo, vl, vdo) = (
            g_o.slice(0..nq),
            g_lse.slice(0..lse.len()),
            g_do.slice(0..nq),
        );
        let called = if device_offsets {
            let up = |x: &[i32]| {
                stream
                    .clone_htod(x)
                    .map_err(cuda_err("copying the offsets to the device"))
            };
            let (cq, ck) = (up(&p.cu_seqlens_q)?, up(&p.cu_seqlens_k)?);
            backward_device_offsets(
                gpu,
                &DeviceVarlenProblem::from(p),
                opts,
                [&cq, &ck],
                &vq_in,
                &vk_in,
                &vv_in,
                &vo,
                &vl,
                &vdo,
                &mut vq,
                &mut vk,
                &mut vv,
                d_sink,
            )
        } else {
            backward_device(
                gpu, p, opts, &vq_in, &vk_in, &vv_in, &vo, &vl, &vdo, &mut vq, &mut vk, &mut vv,
                d_sink,
            )
        };
        // Only the stream's outcome matters here: a stand-in LaunchInfo carries the call's
        // result through `synced`.
        let stand_in = called.map(|info| {
            let why = match info.padded_head_dim {
                Some(dp) => format!("{} blocks, head_dim padded to {dp}", info.blocks),
                None => format!("{} blocks", info.blocks),
            };
            // attn_bwd_wgmma: one dense backward per sequence (host offsets, long sequences).
            let why = match info.kernel {
                "attn_bwd" => why,
                k => format!("{k} per sequence, the last {why}"),
            };
            flashattn::cuda::LaunchInfo {
                kernel: KernelKind::Mma,
                why,
                config: info.tile.map(|t| format!("{t:?}")),
                registers: info.registers,
                spill_bytes: info.spill_bytes,
                smem_bytes: info.smem_bytes,
            }
        });
        synced(gpu, stand_in, "varlen backward")?
    };
    let back =
        |x: &cudarc::driver::CudaSlice<T>, n: usize, name: &str| -> Result<(Vec<T>, usize)> {
            let mut h: Vec<T> = stream
                .clone_dtoh(x)
                .map_err(cuda_err(format!("copying {name} back")))?;
            let written = h[n..].iter().filter(|e| to_bits(**e) != POISON16).count();
            h.truncate(n);
            Ok((h, written))
        };
    let (dq, wq) = back(&g_dq, nq, "dq")?;
    let (dk, wk) = back(&g_dk, nk, "dk")?;
    let (dv, wv) = back(&g_dv, nk, "dv")?;
    let (d_sink, ws) = match &g_ds {
        Some(x) => {
            let mut h: Vec<f32> = stream
                .clone_dtoh(x)
                .map_err(cuda_err("copying d_sink back"))?;
            let written = h[hq..].iter().filter(|e| !e.is_nan()).count();
            h.truncate(hq);
            (Some(h), written)
        }
        None => (None, 0),
    };
    let ran = format!(
        "{} ({}; {} registers, {} spill bytes)",
        if info.why.contains("per sequence") {
            "attn_bwd_wgmma"
        } else {
            "attn_bwd"
        },
        info.why,
        info.registers,
        info.spill_bytes
    );
    Ok(Run {
        grads: [dq, dk, dv],
        d_sink,
        guard: wq + wk + wv + ws,
        ran,
    })
}

/// The call the varlen backward must refuse with a typed error: attn_bwd_wgmma asked for by
/// name (it does not take packed batches). `(label, passed, message)`.
pub fn refusals(gpu: &Gpu) -> Vec<(String, bool, String)> {
    let label = "backward varlen on attn_bwd_wgmma".to_string();
    let p = VarlenProblem::new(offsets(&[3, 5]), offsets(&[4, 6]), 2, 1, 64).expect("valid");
    let (nq, nk) = p.packed_lens().expect("small");
    let x = vec![f16::from_f32(0.5); nq.max(nk)];
    let lse = vec![0.0f32; p.heads_q * p.total_q()];
    let opts = BackwardOptions {
        kernel: BwdKernel::Wgmma,
        ..BackwardOptions::default()
    };
    let want = "attn_bwd_wgmma does not take packed";
    let verdict = match flashattn::cuda::bwd::varlen::backward_host(
        gpu, &p, opts, &x, &x, &x, &x, &lse, &x,
    ) {
        Err(e) if e.to_string().contains(want) => (true, e.to_string()),
        Err(e) => (
            false,
            format!("refused with an unexpected error: {e} (expected '{want}')"),
        ),
        Ok(_) => (
            false,
            "accepted a call attn_bwd_wgmma does not serve".into(),
        ),
    };
    vec![(label, verdict.0, verdict.1)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashattn::Element;

    #[test]
    fn the_sweep_has_the_issue_cases() {
        let cs = cases();
        assert!(cs.iter().all(|c| c.problem.validate().is_ok()));
        assert!(cs.iter().all(|c| c.label.contains("backward varlen")));
        let lens = |cu: &[i32]| cu.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
        let has = |f: &dyn Fn(&VarlenBwdCase) -> bool| cs.iter().any(f);
        // lengths 0, 1, 17, 128, 300 in one batch; sq != sk per sequence; causal and not;
        // GQA; both dtypes; d64, d128, an odd multiple of 8, a non-multiple of 8
        assert!(has(&|c| {
            let l = lens(&c.problem.cu_seqlens_q);
            [0, 1, 17, 128, 300].iter().all(|x| l.contains(x))
        }));
        assert!(has(&|c| lens(&c.problem.cu_seqlens_q)
            .iter()
            .zip(lens(&c.problem.cu_seqlens_k))
            .any(|(a, b)| *a != b && *a > 0 && b > 0)));
        for d in [64, 128, 40, 36] {
            for dtype in [DType::F16, DType::BF16] {
                for mask in [Mask::None, Mask::Causal] {
                    assert!(
                        has(&|c| c.problem.head_dim == d
                            && c.dtype == dtype
                            && c.problem.mask == mask
                            && c.problem.heads_q != c.problem.heads_kv),
                        "d{d} {dtype} {mask:?}"
                    );
                }
            }
        }
        assert!(has(&|c| c.deterministic));
        assert!(has(&|c| c.problem.total_k() == 0) && has(&|c| c.problem.total_q() == 0));
        // Sinks: both dtypes, a padded head dim, the deterministic mode, no key at all.
        let sunk = |c: &VarlenBwdCase| c.problem.scores.sink.is_some();
        assert!(has(&|c| sunk(c) && c.dtype == DType::BF16));
        assert!(has(&|c| sunk(c) && c.problem.head_dim == 36));
        assert!(has(&|c| sunk(c) && c.deterministic));
        assert!(has(&|c| sunk(c) && c.problem.total_k() == 0));
    }

    /// The bound the GPU is held to is reachable: the CPU backward (f32 accumulation, no 16-bit
    /// P or dS) meets it on every case's inputs, so a GPU failure is the GPU's.
    #[test]
    fn the_cpu_backward_meets_the_bound_on_every_case() {
        fn typed<T: Element>(c: &VarlenBwdCase, seed: u64) {
            let p = &c.problem;
            let (nq, nk) = p.packed_lens().unwrap();
            let q: Vec<T> = random_vec(nq, seed);
            let k: Vec<T> = random_vec(nk, seed ^ 0x5555);
            let v: Vec<T> = random_vec(nk, seed ^ 0xAAAA);
            let f = varlen::forward(BackendChoice::Cpu, p, &q, &k, &v).unwrap();
            let d_o: Vec<T> = random_vec(nq, seed ^ 0xd0);
            let exact = varlen::reference_backward(p, &q, &k, &v, &d_o).unwrap();
            let opts = BackwardOptions::default();
            let g = varlen::backward(BackendChoice::Cpu, p, &q, &k, &v, &f.o, &f.lse, &d_o, opts)
                .unwrap();
            let bound = 2.0 * Tolerance::for_dtype(T::DTYPE).o_rel_l2;
            for (name, got, want) in [
                ("dq", &g.dq, &exact.dq),
                ("dk", &g.dk, &exact.dk),
                ("dv", &g.dv, &exact.dv),
            ] {
                let d = diff(widen(got), want);
                assert!(d.is_clean() && d.rel_l2 <= bound, "{} {name}: {d}", c.label);
            }
            assert_eq!(g.d_sink.is_some(), exact.d_sink.is_some(), "{}", c.label);
            if let (Some(got), Some(want)) = (&g.d_sink, &exact.d_sink) {
                let d = diff(widen(got), want);
                assert!(d.is_clean() && d.rel_l2 <= bound, "{} d_sink: {d}", c.label);
            }
        }
        for (i, c) in cases().iter().enumerate() {
            let seed = 0x5eed + i as u64;
            match c.dtype {
                DType::BF16 => typed::<bf16>(c, seed),
                _ => typed::<f16>(c, seed),
            }
        }
    }
}
