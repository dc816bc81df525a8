//! `flashattn bench` end to end: our kernels (and, with --peers, the peers interleaved with
//! them case by case), then table, JSON and plots.

use super::gpu::GpuBench;
use super::interleave::{self, NoGpu, OursSide};
use super::options::BenchOptions;
use super::order::Order;
use super::peers::Peers;
use super::report::{self, BenchReport, CaseReport, Method, PEERS};
use super::rounds::Measured;
use super::stats::Schedule;
use super::sweep::{Line, Sweep};
use super::{plot, table};
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
            window_ms: sweep.window_ms,
            order: (sweep.order != Order::OursOnly).then(|| sweep.order.name().to_string()),
            rounds: sweep.order.rounds(),
            schedule: Some(sweep.order.describe(sweep.warmup_ms, sweep.window_ms)),
            timing: "CUDA events recorded on the stream right before and after each launch; median (also min, p90) of the timed launches (`iters`, or as many as last `window_ms` at the warm-up's time per launch) after untimed warm-up launches (a count, then more until `warmup_ms` have passed, for steady clocks); random normal(0,1) inputs rotated among `sets` q/k/v sets per case (together over 3x L2 where memory allows)".into(),
            flops: if sweep.cases.iter().any(|c| c.backward) {
                "backward: 2.5 x the forward's 4 * batch * heads * head_dim * visible (query, key) pairs (FlashAttention's convention; causal counts only unmasked pairs); ours times attn_bwd on one input set with o and lse from one forward, the peers time torch.autograd.grad of one SDPA forward".into()
            } else {
                "4 * batch * heads * head_dim * visible (query, key) pairs: causal counts only unmasked pairs (about half)".into()
            },
            l2_bytes: None,
        },
        peers: Default::default(),
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
fn summary(results: &[Measured]) -> String {
    let parts: Vec<String> = results
        .iter()
        .map(|m| match m.line.timing {
            Some(t) => format!("{} {:.1} TFLOP/s", m.line.name, t.tflops),
            None => format!("{} skipped", m.line.name),
        })
        .collect();
    parts.join(", ")
}

/// Our side on the GPU: input sets kept between cases, a progress bar (or a line per turn
/// when stderr is not a terminal).
struct GpuSide<'g> {
    bench: GpuBench<'g>,
    sched: Schedule,
    pb: ProgressBar,
    turns: usize,
    done: usize,
}

impl Drop for GpuSide<'_> {
    /// After the sweep: clears the progress bar and frees every input set.
    fn drop(&mut self) {
        self.pb.finish_and_clear();
        self.bench.release();
    }
}

impl OursSide for GpuSide<'_> {
    fn time(&mut self, case: &mut CaseReport, lines: &[Line], round: usize) -> Vec<Measured> {
        if case.sets == 0 {
            case.sets = self.bench.sets_for(&case.case);
        }
        let (pb, id) = (&self.pb, &case.id);
        let got = self
            .bench
            .run_case(&case.case, lines, case.sets, self.sched, |line| {
                pb.set_message(format!("{id} {line}"));
                pb.inc(1);
            });
        self.done += 1;
        if self.pb.is_hidden() {
            eprintln!(
                "[ours {}/{} round {round}] {id}: {}",
                self.done,
                self.turns,
                summary(&got)
            );
        }
        got
    }
}

/// Runs the sweep of `opts`: our kernels (each failure recorded, never fatal) and, with
/// --peers, the peers in one persistent process, interleaved case by case in both orders
/// (or after ours with --peers-after); then writes bench.json, bench.txt and the plots
/// (failures become notes).
///
/// # Errors
/// Bad options (unknown kernel, malformed tile, impossible shape), and no usable GPU when the
/// peers were not asked for (then nothing could be measured).
pub fn run(opts: &BenchOptions) -> Result<BenchOutcome> {
    let mut sweep = opts.sweep()?;
    if opts.peers && sweep.cases.iter().all(|c| c.has_score_mods()) {
        return Err(flashattn::AttnError::InvalidInput {
            what: "--peers with --window, --softcap or --alibi: SDPA's fused backends have none of them, so there is nothing to compare; drop --peers".into(),
        });
    }
    let gpu = match Gpu::new(opts.device) {
        Ok(g) => Ok(g),
        // Nothing would be measured: say so before writing any file or table.
        Err(e) if !opts.peers => return Err(e),
        Err(e) => Err(e),
    };
    let mut peers = Peers::start_if(opts.peers, sweep.schedule(), opts.peers_timeout);
    // Without torch or a GPU for the peers, interleaving has nothing to interleave with.
    if peers.as_ref().is_some_and(|p| !p.available()) {
        sweep.order = Order::OursOnly;
    }
    let mut report = new_report(&sweep);
    let peer_lines = if sweep.order == Order::OursOnly {
        0
    } else {
        PEERS.len()
    };
    let per_line_ms = sweep.warmup_ms + sweep.window_ms + 50;
    let total_s = (sweep.cases.len() * (sweep.lines.len() + peer_lines) * sweep.order.rounds())
        as u64
        * per_line_ms
        / 1000;
    eprintln!(
        "flashattn bench: {} cases x {} lines ({}), {}; about {} s",
        sweep.cases.len(),
        sweep.lines.len(),
        report.lines.join(", "),
        sweep.order.describe(sweep.warmup_ms, sweep.window_ms),
        total_s
    );
    let mut side: Box<dyn OursSide + '_> = match &gpu {
        Ok(gpu) => {
            let info = gpu.info();
            report.device = serde_json::to_value(info).unwrap_or(serde_json::Value::Null);
            report.driver_version = Some(info.driver_version);
            report.nvrtc_version =
                Some(format!("{}.{}", info.nvrtc_version.0, info.nvrtc_version.1));
            let bench = GpuBench::new(gpu);
            report.method.l2_bytes = Some(bench.l2_bytes() as u64);
            let turns = sweep.cases.len() * sweep.order.rounds();
            Box::new(GpuSide {
                bench,
                sched: sweep.schedule(),
                pb: progress_bar((turns * sweep.lines.len()) as u64),
                turns,
                done: 0,
            })
        }
        Err(e) => {
            report.gpu_error = Some(e.to_string());
            Box::new(NoGpu(format!("GPU unavailable: {e}")))
        }
    };
    interleave::measure(
        &mut report,
        &sweep.lines,
        sweep.order,
        side.as_mut(),
        peers.as_mut(),
    );
    // GpuSide's drop clears the progress bar and frees the input sets; then the GPU goes.
    drop(side);
    drop(gpu);
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
