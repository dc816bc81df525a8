//! `flashattn bench` end to end: our kernels, then the peers, then table, JSON and plots.

use super::gpu::GpuBench;
use super::options::BenchOptions;
use super::report::{self, BenchReport, CaseReport, LineResult, Method, PeersInfo, Source};
use super::sweep::Sweep;
use super::{peers, plot, table};
use flashattn::cuda::Gpu;
use flashattn::error::Result;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

/// What a bench run produced.
#[derive(Debug, Clone)]
pub struct BenchOutcome {
    /// Every measurement.
    pub report: BenchReport,
    /// The rendered table (also in bench.txt).
    pub table: String,
    /// Files written under the out dir.
    pub files: Vec<PathBuf>,
    /// Things that went wrong without stopping the run (writing files, plotting).
    pub notes: Vec<String>,
}

/// An empty report for `sweep`: no device, every case without results.
pub fn new_report(sweep: &Sweep) -> BenchReport {
    BenchReport {
        version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: report::git_commit(),
        timestamp: report::timestamp_utc(),
        device: serde_json::Value::Null,
        gpu_error: None,
        driver_version: None,
        nvrtc_version: None,
        method: Method {
            iters: sweep.iters,
            warmup: sweep.warmup,
            warmup_ms: sweep.warmup_ms,
            timing: "CUDA events recorded on the stream right before and after each launch; median (also min, p90) of the timed launches after untimed warm-up launches (a count, then more until `warmup_ms` have passed, for steady clocks); random normal(0,1) inputs rotated among `sets` q/k/v sets per case (together over 3x L2 where memory allows)".into(),
            flops: if sweep.cases.iter().any(|c| c.backward) {
                "backward: 2.5 x the forward's 4 * batch * heads * head_dim * visible (query, key) pairs (FlashAttention's convention; causal counts only unmasked pairs); ours times attn_bwd on one input set with o and lse from one forward, the peers time torch.autograd.grad of one SDPA forward".into()
            } else {
                "4 * batch * heads * head_dim * visible (query, key) pairs: causal counts only unmasked pairs (about half)".into()
            },
            l2_bytes: None,
        },
        peers: PeersInfo::default(),
        lines: sweep.lines.iter().map(|l| l.name.clone()).collect(),
        cases: sweep
            .cases
            .iter()
            .map(|c| CaseReport { id: c.id(), case: c.clone(), flops: c.flops(), sets: 0, results: Vec::new() })
            .collect(),
    }
}

fn progress_bar(len: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {msg}")
    {
        pb.set_style(style);
    }
    pb
}

/// `mma 283.0 TFLOP/s, simt skipped` for a progress line.
fn summary(results: &[LineResult]) -> String {
    let parts: Vec<String> = results
        .iter()
        .map(|r| match r.timing {
            Some(t) => format!("{} {:.1} TFLOP/s", r.name, t.tflops),
            None => format!("{} skipped", r.name),
        })
        .collect();
    parts.join(", ")
}

/// Times our lines on every case of the sweep into `report`.
fn measure(gpu: &Gpu, sweep: &Sweep, report: &mut BenchReport) {
    let info = gpu.info();
    report.device = serde_json::to_value(info).unwrap_or(serde_json::Value::Null);
    report.driver_version = Some(info.driver_version);
    report.nvrtc_version = Some(format!("{}.{}", info.nvrtc_version.0, info.nvrtc_version.1));
    let mut bench = GpuBench::new(gpu);
    report.method.l2_bytes = Some(bench.l2_bytes() as u64);
    let pb = progress_bar((sweep.cases.len() * sweep.lines.len()) as u64);
    let total = sweep.cases.len();
    for (i, (case, rep)) in sweep.cases.iter().zip(report.cases.iter_mut()).enumerate() {
        rep.sets = bench.sets_for(case);
        let (lines, iters) = (&sweep.lines, sweep.iters);
        let warmup = (sweep.warmup, sweep.warmup_ms);
        rep.results = bench.run_case(case, lines, rep.sets, iters, warmup, |line| {
            pb.set_message(format!("{} {line}", rep.id));
            pb.inc(1);
        });
        if pb.is_hidden() {
            eprintln!(
                "[ours {}/{total}] {}: {}",
                i + 1,
                rep.id,
                summary(&rep.results)
            );
        }
    }
    pb.finish_and_clear();
    bench.release();
}

/// Runs the sweep of `opts`: our kernels (each failure recorded, never fatal), the peers when
/// asked, then writes bench.json, bench.txt and the plots (failures become notes).
///
/// # Errors
/// Bad options (unknown kernel, malformed tile, impossible shape), and no usable GPU when the
/// peers were not asked for (then nothing could be measured).
pub fn run(opts: &BenchOptions) -> Result<BenchOutcome> {
    let sweep = opts.sweep()?;
    if opts.peers && sweep.cases.iter().all(|c| c.has_score_mods()) {
        return Err(flashattn::AttnError::InvalidInput {
            what: "--peers with --window, --softcap or --alibi: SDPA's fused backends have none of them, so there is nothing to compare; drop --peers".into(),
        });
    }
    let mut report = new_report(&sweep);
    eprintln!(
        "flashattn bench: {} cases x {} lines ({}), {} timed launches each",
        sweep.cases.len(),
        sweep.lines.len(),
        report.lines.join(", "),
        sweep.iters
    );
    match Gpu::new(opts.device) {
        Ok(gpu) => measure(&gpu, &sweep, &mut report),
        // Nothing would be measured: say so before writing any file or table.
        Err(e) if !opts.peers => return Err(e),
        Err(e) => {
            let why = format!("GPU unavailable: {e}");
            for c in &mut report.cases {
                c.results = sweep
                    .lines
                    .iter()
                    .map(|l| LineResult::skipped(&l.name, Source::Ours, why.clone()))
                    .collect();
            }
            report.gpu_error = Some(e.to_string());
        }
    }
    if opts.peers {
        eprintln!("flashattn bench: running the PyTorch SDPA peers (tools/bench/peers.py)");
        let outcome = peers::run(&report);
        peers::merge(&mut report, outcome);
    }
    Ok(finish(report, opts))
}

/// Renders the table and writes bench.json, bench.txt and (unless `--no-plot`) the plots.
pub fn finish(report: BenchReport, opts: &BenchOptions) -> BenchOutcome {
    let table = table::render(&report);
    let mut notes = Vec::new();
    let mut files = Vec::new();
    let dir = &opts.out_dir;
    if let Err(e) = std::fs::create_dir_all(dir) {
        notes.push(format!("could not create {}: {e}", dir.display()));
    } else {
        let json = dir.join("bench.json");
        match report.write(&json) {
            Ok(()) => files.push(json),
            Err(e) => notes.push(e.to_string()),
        }
        let txt = dir.join("bench.txt");
        match std::fs::write(&txt, &table) {
            Ok(()) => files.push(txt),
            Err(e) => notes.push(format!("writing {}: {e}", txt.display())),
        }
        if !opts.no_plot {
            let p = plot::write_all(&report, dir);
            files.extend(p.files);
            notes.extend(p.errors.into_iter().map(|e| {
                format!(
                    "plot failed (bench.json is complete; redraw with `flashattn bench-plot`): {e}"
                )
            }));
        }
    }
    BenchOutcome {
        report,
        table,
        files,
        notes,
    }
}
