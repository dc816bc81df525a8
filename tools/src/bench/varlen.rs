//! `flashattn bench --varlen MIX`: a packed variable-length batch ([`flashattn::varlen`]) timed as
//! the library runs it (`auto`), as one packed `attn_mma` launch, as the same sequences through
//! the dense API one by one, and, for a uniform mix, as the dense kernels on the same shape as
//! one batch. TFLOP/s count each sequence's visible pairs; the
//! timing method is the main bench's ([`super::gpu::time_launches`]).

use super::gpu::time_launches;
use super::options::BenchOptions;
use super::report::write_record;
use super::stats;
use cudarc::driver::CudaSlice;
use flashattn::cuda::{Gpu, GpuElement, KernelKind, LaunchInfo, forward_device};
use flashattn::error::{AttnError, Result};
use flashattn::scores::ScoreMods;
use flashattn::shape::{AttnProblem, AttnShape};
use flashattn::varlen::{VarlenProblem, offsets};
use flashattn::{DType, compare::random_vec};
use half::{bf16, f16};
use serde::Serialize;
use std::fmt::Write as _;

/// The ragged mix of the variable-length issue: 16384 tokens in sequences of 64 to 8192.
pub const RAGGED: [usize; 11] = [8192, 3000, 2048, 1000, 700, 517, 300, 234, 200, 129, 64];

/// Most sequences a mix may hold.
pub const MAX_SEQUENCES: usize = 1 << 16;
/// Most tokens a mix may hold (the offsets are i32; the bench allocates q, k, v and o of this
/// many rows).
pub const MAX_TOKENS: usize = 1 << 24;

/// Parses a mix: `NxL` (N sequences of L), `ragged` ([`RAGGED`]), or a comma-separated list of
/// lengths (`k` = 1024), e.g. `8x2k`, `ragged`, `2k,512,77`; at most [`MAX_SEQUENCES`]
/// sequences and [`MAX_TOKENS`] tokens.
///
/// # Errors
/// [`AttnError::InvalidInput`] naming the expected forms or the limit passed.
pub fn parse_mix(spec: &str) -> Result<Vec<usize>> {
    let bad = || AttnError::InvalidInput {
        what: format!(
            "--varlen {spec}: expected NxL (e.g. 8x2k), 'ragged', or lengths like 2k,512,77"
        ),
    };
    let len = |s: &str| -> Result<usize> {
        let t = s.trim();
        let (num, mul) = match t.strip_suffix(['k', 'K']) {
            Some(n) => (n, 1024),
            None => (t, 1),
        };
        match num.parse::<usize>().ok().and_then(|n| n.checked_mul(mul)) {
            Some(n) if n > 0 => Ok(n),
            _ => Err(bad()),
        }
    };
    let spec_t = spec.trim();
    let mix = if spec_t == "ragged" {
        RAGGED.to_vec()
    } else if let Some((n, l)) = spec_t.split_once(['x', 'X']) {
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        if n == 0 || n > MAX_SEQUENCES {
            return Err(AttnError::InvalidInput {
                what: format!("--varlen {spec}: 1 to {MAX_SEQUENCES} sequences"),
            });
        }
        vec![len(l)?; n]
    } else {
        spec_t.split(',').map(len).collect::<Result<Vec<_>>>()?
    };
    let tokens = mix.iter().try_fold(0usize, |a, &l| a.checked_add(l));
    if mix.len() > MAX_SEQUENCES || tokens.is_none_or(|t| t > MAX_TOKENS) {
        return Err(AttnError::InvalidInput {
            what: format!(
                "--varlen {spec}: at most {MAX_SEQUENCES} sequences and {MAX_TOKENS} tokens in all"
            ),
        });
    }
    Ok(mix)
}

/// One timed line of the varlen bench.
#[derive(Debug, Clone, Serialize)]
pub struct VarlenLine {
    /// `varlen auto` (the library's choice), `packed mma`, `per-sequence mma`,
    /// `per-sequence wgmma` (the dense API per sequence), `dense mma`, `dense wgmma`.
    pub name: String,
    /// Median milliseconds of one call (all sequences).
    pub median_ms: f64,
    /// TFLOP/s over the visible pairs.
    pub tflops: f64,
    /// The kernel that ran and why (the packed call's).
    pub why: String,
}

/// One (dtype, head_dim, mask) case of the varlen bench.
#[derive(Debug, Clone, Serialize)]
pub struct VarlenCaseResult {
    /// f16 or bf16.
    pub dtype: String,
    /// Channels per head.
    pub head_dim: usize,
    /// Heads (query and key/value).
    pub heads: usize,
    /// Causal per sequence.
    pub causal: bool,
    /// Sequence lengths (queries = keys).
    pub lengths: Vec<usize>,
    /// FLOPs of one call (visible pairs).
    pub flops: f64,
    /// The lines.
    pub lines: Vec<VarlenLine>,
}

/// Runs the varlen bench on `mix` for the options' head dims, masks and dtypes; returns the
/// table and writes `bench-varlen.json` and `bench-varlen.txt` into the output folder.
///
/// # Errors
/// Setup and launch errors; [`AttnError::Io`] when the files cannot be written.
pub fn run(opts: &BenchOptions, mix: &[usize]) -> Result<String> {
    // What the sweep's options mean has no place in a varlen run: refuse rather than ignore.
    for (given, name) in [
        (opts.peers, "--peers"),
        (!opts.kernels.is_empty(), "--kernels"),
        (!opts.tiles.is_empty(), "--tiles"),
        (
            !opts.seqlen.is_empty(),
            "--seqlen (the mix gives the lengths)",
        ),
        (
            opts.tokens != super::sweep::DEFAULT_TOKENS,
            "--tokens (the mix gives the tokens)",
        ),
    ] {
        if given {
            return Err(AttnError::InvalidInput {
                what: format!(
                    "--varlen with {name}: a varlen run times the library's paths on one mix; it takes --head-dim, --causal, --dtype, --hidden, --iters, --warmup, --warmup-ms, --window-ms, --out-dir, --device, --window, --softcap and --alibi"
                ),
            });
        }
    }
    let sweep = opts.sweep()?;
    let gpu = Gpu::new(opts.device)?;
    // One run per (dtype, head_dim, mask) of the sweep, with that case's score modifiers.
    let mut seen: Vec<(DType, usize, bool)> = Vec::new();
    let mut results = Vec::new();
    for c in &sweep.cases {
        let key = (c.dtype()?, c.head_dim, c.causal);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let mods = c.problem()?.scores;
        let r = match key.0 {
            DType::BF16 => case::<bf16>(&gpu, opts, mix, c, &mods)?,
            _ => case::<f16>(&gpu, opts, mix, c, &mods)?,
        };
        results.push(r);
    }
    let mods = match sweep.cases.first() {
        Some(c) => crate::check::cases::describe_scores(&c.problem()?.scores),
        None => String::new(),
    };
    let table = table(&gpu, mix, &mods, &results);
    write_record(&opts.out_dir, "bench-varlen", "varlen", &results, &table)?;
    Ok(table)
}

fn table(gpu: &Gpu, mix: &[usize], mods: &str, results: &[VarlenCaseResult]) -> String {
    let mut out = format!(
        "flashattn {} bench --varlen on {} {}: forward TFLOP/s over visible pairs (median, CUDA events); {} sequences, {} tokens, lengths {:?}{}\n",
        env!("CARGO_PKG_VERSION"),
        gpu.info().name,
        gpu.info().arch,
        mix.len(),
        mix.iter().sum::<usize>(),
        mix,
        if mods.is_empty() {
            String::new()
        } else {
            format!("; score modifiers:{mods}")
        }
    );
    let names: Vec<String> = results
        .first()
        .map(|r| r.lines.iter().map(|l| l.name.clone()).collect())
        .unwrap_or_default();
    let _ = write!(out, "{:<6} {:<4} {:<7}", "dtype", "d", "causal");
    for n in &names {
        let _ = write!(out, " {n:>18}");
    }
    out.push_str("  auto / best other\n");
    for r in results {
        let _ = write!(
            out,
            "{:<6} {:<4} {:<7}",
            r.dtype,
            r.head_dim,
            if r.causal { "yes" } else { "no" }
        );
        for l in &r.lines {
            let _ = write!(out, " {:>18.1}", l.tflops);
        }
        let auto = r.lines.first().map_or(f64::NAN, |l| l.tflops);
        let best = r
            .lines
            .iter()
            .skip(1)
            .map(|l| l.tflops)
            .fold(f64::NAN, f64::max);
        let _ = writeln!(out, "  {:.2}", auto / best);
    }
    out
}

fn case<T: GpuElement>(
    gpu: &Gpu,
    opts: &BenchOptions,
    mix: &[usize],
    sweep_case: &super::sweep::Case,
    mods: &ScoreMods,
) -> Result<VarlenCaseResult> {
    let (d, causal, heads) = (sweep_case.head_dim, sweep_case.causal, sweep_case.heads);
    let mask = sweep_case.mask();
    let cu = offsets(mix);
    let p = VarlenProblem::new(cu.clone(), cu, heads, heads, d)?
        .with_mask(mask)
        .with_scores(mods.clone())?;
    let total = p.total_q();
    let n = total * heads * d;
    let stream = gpu.stream();
    let up = |x: Vec<T>| -> Result<CudaSlice<T>> {
        stream
            .clone_htod(&x)
            .map_err(flashattn::cuda::device::cuda_err("copying bench inputs"))
    };
    let (q, k, v) = (
        up(random_vec(n, 1))?,
        up(random_vec(n, 2))?,
        up(random_vec(n, 3))?,
    );
    let mut o = up(vec![T::from_f32(0.0); n])?;
    let mut lse: CudaSlice<f32> = stream
        .alloc_zeros(heads * total)
        .map_err(flashattn::cuda::device::cuda_err("allocating lse"))?;
    // One dense batch-1 problem per sequence, with its first packed row (the per-sequence
    // lines).
    let seqs: Vec<(AttnProblem, usize)> = mix
        .iter()
        .zip(&p.cu_seqlens_q)
        .map(|(&l, &start)| {
            Ok((
                AttnProblem::new(AttnShape::new(1, l, heads, d))?
                    .with_mask(mask)
                    .with_scores(mods.clone())?,
                start as usize,
            ))
        })
        .collect::<Result<_>>()?;
    let flops: f64 = seqs.iter().map(|(sp, _)| sp.flops()).sum();
    let sched = super::stats::Schedule {
        iters: opts.iters as usize,
        warmup: opts.warmup as usize,
        warmup_ms: opts.warmup_ms,
        window_ms: opts.window_ms(),
    };
    let mut lines = Vec::new();
    let mut line = |name: &str, timed: super::gpu::Timed, flops: f64| -> Result<LaunchInfo> {
        let t = stats::summarize(&timed.times, flops).ok_or_else(|| AttnError::Cuda {
            context: name.into(),
            message: "no valid event times".into(),
        })?;
        lines.push(VarlenLine {
            name: name.into(),
            median_ms: t.median_ms,
            tflops: t.tflops,
            why: timed.info.why.clone(),
        });
        Ok(timed.info)
    };
    // The library's choice (auto: per-sequence wgmma launches on sm_90 for small batches),
    // then the packed attn_mma launch.
    for (name, kernel) in [
        ("varlen auto", KernelKind::Wgmma),
        ("packed mma", KernelKind::Mma),
    ] {
        let timed = time_launches(gpu, name, sched, |_| {
            flashattn::cuda::varlen::forward_device(gpu, kernel, &p, &q, &k, &v, &mut o, &mut lse)
        })?;
        line(name, timed, flops)?;
    }
    let row = heads * d;
    for kernel in [KernelKind::Mma, KernelKind::Wgmma] {
        let name = format!("per-sequence {kernel}");
        let timed = time_launches(gpu, &name, sched, |_| {
            let mut last = None;
            for (sp, start) in &seqs {
                let r = start * row..(start + sp.shape.seqlen_q) * row;
                let (qs, ks, vs) = (q.slice(r.clone()), k.slice(r.clone()), v.slice(r.clone()));
                let mut os = o.slice_mut(r);
                let mut ls = lse.slice_mut(0..sp.shape.lse_len());
                last = Some(forward_device(
                    gpu, kernel, None, sp, &qs, &ks, &vs, &mut os, &mut ls,
                )?);
            }
            last.ok_or_else(|| AttnError::InvalidInput {
                what: "an empty mix".into(),
            })
        })?;
        line(&name, timed, flops)?;
    }
    // A uniform mix is also one dense batch of the same shape.
    if mix.iter().all(|&l| l == mix[0]) {
        let dp = AttnProblem::new(AttnShape::new(mix.len(), mix[0], heads, d))?
            .with_mask(mask)
            .with_scores(mods.clone())?;
        for kernel in [KernelKind::Mma, KernelKind::Wgmma] {
            let name = format!("dense {kernel}");
            let timed = time_launches(gpu, &name, sched, |_| {
                forward_device(gpu, kernel, None, &dp, &q, &k, &v, &mut o, &mut lse)
            })?;
            line(&name, timed, dp.flops())?;
        }
    }
    Ok(VarlenCaseResult {
        dtype: T::DTYPE.name().into(),
        head_dim: d,
        heads,
        causal,
        lengths: mix.to_vec(),
        flops,
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixes_parse() {
        assert_eq!(parse_mix("8x2k").unwrap(), vec![2048; 8]);
        assert_eq!(parse_mix("2k,512,77").unwrap(), vec![2048, 512, 77]);
        let r = parse_mix("ragged").unwrap();
        assert_eq!(r.iter().sum::<usize>(), 16384);
        assert!(r.iter().all(|&l| (64..=8192).contains(&l)));
        assert_eq!(parse_mix("2X1K").unwrap(), vec![1024; 2]);
        for bad in [
            "",
            "0x2k",
            "8x",
            "x2k",
            "2k,,3",
            "-1",
            "8x0",
            "abc",
            "18014398509481984k",
            "3000000000",
            "65536x16k",
            "65537x1",
        ] {
            assert!(parse_mix(bad).is_err(), "{bad}");
        }
    }
}
