//! `flashattn check`: every GPU kernel against the f64 oracle, over a sweep of dtypes, head
//! dims, masks, lengths, GQA, strides, `seqlen_q != seqlen_k` and field edge cases
//! ([`cases`]).
//!
//! Each case draws fresh inputs (seeded; the seed is printed and `FLASHATTN_SEED` replays it),
//! poisons `o` and `lse` (NaN bit patterns) including a guard region past the last element,
//! launches, and then requires: every compared row within [`Tolerance`] (rules for special
//! inputs in [`inputs`]), and the guard region untouched (no write past the end). The oracle of
//! a case is computed once and shared by every kernel.

pub mod backward;
pub mod bad_input;
pub mod cases;
pub mod field;
pub mod fp8;
pub mod inputs;
pub mod kvcache;
pub mod outcome;
pub mod sink;
pub mod varlen;
pub mod varlen_backward;

pub use cases::{Case, Inputs, Tensor, cases};
pub use outcome::CaseResult;

use flashattn::compare::{Tolerance, dense_o};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind, MmaTile, forward_device};
use flashattn::dtype::DType;
use flashattn::error::Result;
use half::{bf16, f16};
use outcome::Poisoned;

/// Options of [`run`].
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Kernels to check.
    pub kernels: Vec<KernelKind>,
    /// Small sweep.
    pub quick: bool,
    /// Base seed (printed).
    pub seed: u64,
    /// Only cases whose label contains this.
    pub filter: Option<String>,
    /// Tile override for `mma`.
    pub tile: Option<MmaTile>,
}

impl CheckOptions {
    /// Whether a case with this label is in the run (`--filter`: every `&`-separated part
    /// appears in the label).
    pub fn selects(&self, label: &str) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|f| f.split('&').all(|part| label.contains(part)))
    }

    /// The cases of a sweep that [`Self::selects`] by their `label`.
    fn select<C>(&self, cases: Vec<C>, label: impl Fn(&C) -> &str) -> Vec<C> {
        cases
            .into_iter()
            .filter(|c| self.selects(label(c)))
            .collect()
    }
}

/// The line of a call that must be refused: `[PASS]`/`[FAIL]`, the kernel, `invalid call:`,
/// the label and what happened.
fn invalid_call_line(x: &CaseResult) -> String {
    format!(
        "{} invalid call: {:<40} {}",
        line_head(x),
        x.label,
        x.message
    )
}

/// The start of every printed line: `[PASS]`/`[FAIL]` and the kernel, padded to 6.
fn line_head(x: &CaseResult) -> String {
    let verdict = if x.passed { "PASS" } else { "FAIL" };
    format!("[{verdict}] {:6}", x.kernel)
}

/// Runs the sweep, printing one line per (case, kernel) with `print`. Returns every result.
///
/// # Errors
/// Only failures that stop the sweep (oracle errors on a valid case); kernel failures are
/// recorded as failed results.
pub fn run(gpu: &Gpu, opts: &CheckOptions, mut print: impl FnMut(&str)) -> Result<Vec<CaseResult>> {
    let mut results = Vec::new();
    let all = cases(opts.quick);
    let selected: Vec<&Case> = all.iter().filter(|c| opts.selects(&c.label)).collect();
    print(&format!(
        "checking {} cases x {} kernels on {} ({}), seed {} (replay with FLASHATTN_SEED={})",
        selected.len(),
        opts.kernels.len(),
        gpu.info().name,
        gpu.info().arch,
        opts.seed,
        opts.seed
    ));
    // Each case's seed: the run's seed plus a fixed stride per case index (replayable alone).
    let seed = |n: usize| opts.seed.wrapping_add(n as u64 * 0x9E37_79B9);
    // Every result is printed as it comes, then kept for the summary.
    let mut record = |line: String, x: CaseResult| {
        print(&line);
        results.push(x);
    };
    for (i, case) in selected.iter().enumerate() {
        let r = match case.dtype {
            DType::F16 => run_case::<f16>(gpu, case, opts, seed(i))?,
            DType::BF16 => run_case::<bf16>(gpu, case, opts, seed(i))?,
            DType::F32 => continue,
        };
        for x in r {
            record(result_line(&x), x);
        }
    }
    // Packed variable-length batches: one launch over every sequence.
    let packed: Vec<varlen::VarlenCase> = opts.select(varlen::cases(), |c| &c.label);
    for (i, case) in packed.iter().enumerate() {
        for x in varlen::run_case(gpu, case, &opts.kernels, seed(selected.len() + i))? {
            record(result_line(&x), x);
        }
    }
    // FP8 (e4m3) on attn_wgmma_fp8 (sm_90 only), with the Hopper kernel.
    if opts.kernels.contains(&KernelKind::Wgmma) && gpu.info().compute_capability == (9, 0) {
        let calls: Vec<fp8::Fp8Case> = opts.select(fp8::cases(), |c| &c.label);
        for (i, case) in calls.iter().enumerate() {
            let x = fp8::run_case(gpu, case, seed(3000 + i))?;
            record(result_line(&x), x);
        }
        for (label, passed, message) in fp8::refusals(gpu) {
            if !opts.selects(&label) {
                continue;
            }
            let mut x = CaseResult::new(&label, KernelKind::Wgmma);
            x.kernel = "fp8".into();
            x.passed = passed;
            x.message = message;
            record(invalid_call_line(&x), x);
        }
    }
    // Decoding against a KV cache (attn_decode, attn_combine, kv_append), with the kernels
    // that take the score modifiers.
    if opts.kernels.iter().any(|k| k.has_score_mods()) {
        let calls: Vec<kvcache::KvCase> = opts.select(kvcache::cases(), |c| &c.label);
        for (i, case) in calls.iter().enumerate() {
            let x = kvcache::run_case(gpu, case, seed(selected.len() + packed.len() + i))?;
            record(result_line(&x), x);
        }
        for (i, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
            if opts.selects(&kvcache::loop_label(dtype)) {
                let x = kvcache::run_loop(gpu, dtype, seed(1000 + i))?;
                record(result_line(&x), x);
            }
        }
    }
    // The backward pass (attn_bwd, attn_bwd_wgmma; packed batches on attn_bwd), with the
    // kernels that take the score modifiers.
    if opts.kernels.iter().any(|k| k.has_score_mods()) {
        let calls: Vec<backward::BwdCase> = opts.select(backward::cases(), |c| &c.label);
        for (i, case) in calls.iter().enumerate() {
            let x = backward::run_case(gpu, case, seed(2000 + i))?;
            record(result_line(&x), x);
        }
        // Packed variable-length batches: one launch per kernel over every sequence.
        let packed: Vec<varlen_backward::VarlenBwdCase> =
            opts.select(varlen_backward::cases(), |c| &c.label);
        for (i, case) in packed.iter().enumerate() {
            let x = varlen_backward::run_case(gpu, case, seed(3000 + i))?;
            record(result_line(&x), x);
        }
        let refused = backward::refusals(gpu)
            .into_iter()
            .chain(varlen_backward::refusals(gpu));
        for (label, passed, message) in refused {
            if !opts.selects(&label) {
                continue;
            }
            let mut x = CaseResult::new(&label, KernelKind::Mma);
            x.kernel = "bwd".into();
            x.passed = passed;
            x.message = message;
            record(invalid_call_line(&x), x);
        }
        // Learnable-sink calls that must be refused (labels `sink: ...`).
        for (label, passed, message) in sink::refusals(gpu)? {
            if !opts.selects(&label) {
                continue;
            }
            let mut x = CaseResult::new(&label, KernelKind::Mma);
            x.kernel = "all".into();
            x.passed = passed;
            x.message = message;
            record(invalid_call_line(&x), x);
        }
    }
    if opts.filter.is_none() {
        for x in bad_input::run(gpu)? {
            record(invalid_call_line(&x), x);
        }
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    print(&format!(
        "{} passed, {} failed",
        results.len() - failed,
        failed
    ));
    Ok(results)
}

fn run_case<T: GpuElement>(
    gpu: &Gpu,
    case: &Case,
    opts: &CheckOptions,
    seed: u64,
) -> Result<Vec<CaseResult>> {
    let p = &case.problem;
    let s = p.shape;
    let (q, k, v) = inputs::make_inputs::<T>(case, seed);
    let oracle = inputs::oracle(case, &q, &k, &v)?;
    let tol = Tolerance::for_dtype(case.dtype);
    let stream = gpu.stream();
    let up = |x: &[T]| stream.clone_htod(x).map_err(cuda_err("copying inputs"));
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let o_len = p
        .o_strides
        .required_len("o", s.batch, s.seqlen_q, s.heads_q, s.head_dim)?;
    let lse_len = s.lse_len();
    let mut out = Vec::new();
    for &kernel in &opts.kernels {
        // naive and simt do not claim the score modifiers (they refuse them with a typed
        // error, tested in the CPU tests); the case is for the kernels that do.
        if !p.scores.is_plain() && !kernel.has_score_mods() {
            continue;
        }
        let mut result = CaseResult::new(&case.label, kernel);
        // Fresh poisoned outputs for every kernel; the kernel sees only the first o_len/lse_len.
        let mut outs = Poisoned::<T>::new(gpu, o_len, lse_len)?;
        let mut o_view = outs.o.slice_mut(0..o_len);
        let mut lse_view = outs.lse.slice_mut(0..lse_len);
        let what = flashattn::cuda::launch::launch_context(kernel.name(), p);
        let launched = forward_device(
            gpu,
            kernel,
            opts.tile,
            p,
            &dq,
            &dk,
            &dv,
            &mut o_view,
            &mut lse_view,
        );
        let Some((o_host, lse_host)) = outs.collect(gpu, &mut result, kernel, launched, what)?
        else {
            out.push(result);
            continue;
        };
        let verdict = inputs::judge(case, &oracle, &dense_o(p, &o_host)?, &lse_host, &tol);
        result.o_rel_l2 = verdict.o.rel_l2;
        result.o_max_abs = verdict.o.max_abs;
        result.lse_max_abs = verdict.lse.max_abs;
        result.conclude(verdict.problems, verdict.notes);
        out.push(result);
    }
    Ok(out)
}

/// One printed line of a result.
fn result_line(x: &CaseResult) -> String {
    format!(
        "{} {:<48} o rel-L2 {:.2e} max-abs {:.2e} | lse max-abs {:.2e}{}",
        line_head(x),
        x.label,
        x.o_rel_l2,
        x.o_max_abs,
        x.lse_max_abs,
        if x.message.is_empty() {
            String::new()
        } else {
            format!(" | {}", x.message)
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_parts_must_all_appear() {
        let opts = |f: &str| CheckOptions {
            kernels: Vec::new(),
            quick: false,
            seed: 0,
            filter: Some(f.into()),
            tile: None,
        };
        let label = "bf16 b=2 sq=127 sk=129 hq=3 hkv=1 d=128 causal";
        assert!(opts("b=2&d=128").selects(label));
        assert!(opts("d=128").selects(label));
        assert!(!opts("b=2&d=64").selects(label));
        assert!(!opts("b=1").selects(label));
    }
}
