//! Argument parsing (clap) and dispatch to the subcommands.

pub mod bench;
pub mod check;
pub mod info;
pub mod probe;
pub mod ring;
pub mod run;

use clap::{Parser, Subcommand};
use flashattn::Result;
use std::process::ExitCode;

/// Exact attention (FlashAttention forward) on the CPU and NVIDIA GPUs.
#[derive(Debug, Parser)]
#[command(name = "flashattn", version, about)]
pub struct Cli {
    /// Worker threads for the CPU backend (rayon), 1 to 1024; default: one per logical CPU.
    /// (Each is an OS thread started at once: tens of thousands took minutes to start.)
    #[arg(long, global = true, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub threads: Option<usize>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run attention on q/k/v from a safetensors file (default: the MiniLM sample) and check
    /// it against the references stored in the file.
    Run(run::RunArgs),
    /// Check every GPU kernel against the f64 oracle over a sweep of shapes; exit 1 on any failure.
    Check(check::CheckArgs),
    /// Time our kernels against PyTorch SDPA (flash, cuDNN, memory-efficient): table, JSON, plots.
    Bench(Box<flashattn_tools::bench::BenchOptions>),
    /// Redraw the benchmark plots from a bench.json.
    BenchPlot(flashattn_tools::bench::PlotOptions),
    /// Print what this machine offers (CPU threads, GPU).
    Info,
    /// The fragment-layout experiments: one warp (mma.m16n8k16, ldmatrix, the S->P hand-off)
    /// and one warpgroup (wgmma accumulators, swizzled shared-memory descriptors, P as the
    /// register A operand), each cell checked against the CPU model.
    Probe(ProbeArgs),
    /// Ring attention (one sequence over N ranks, partials merged through lse), simulated on
    /// the CPU; checked against one device and the f64 oracle; exit 1 on a mismatch.
    Ring(ring::RingArgs),
    /// Measure the CPU backend against the gemm crate's own rate on the same tile products.
    #[command(hide = true)]
    CpuGemmRate(info::GemmRateArgs),
}

/// Options of `flashattn probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Run on the CPU warp emulator (built on the PTX layout model) instead of the GPU.
    #[arg(long)]
    pub emulate: bool,
    /// Load B without `.trans`: the probe must name the wrong lanes and registers and exit 1.
    #[arg(long)]
    pub inject_fault: bool,
    /// Only this element type (default: f16 and bf16).
    #[arg(long, value_parser = ["f16", "bf16"])]
    pub dtype: Option<String>,
}

/// Parses the command line, runs it, and turns errors into a message and exit code 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a subcommand; `Ok(code)` is the exit code of commands that report a verdict (probe).
fn dispatch(cli: Cli) -> Result<u8> {
    if let Some(n) = cli.threads {
        // Fails only when the global pool already exists, which cannot happen this early.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    match cli.command {
        Command::Run(args) => run::run(&args).map(|()| 0),
        Command::Check(args) => check::run(&args).map(|()| 0),
        Command::Info => info::info().map(|()| 0),
        Command::Bench(o) => bench::run(&o).map(|c| c.clamp(0, 255) as u8),
        Command::BenchPlot(o) => bench::plot(&o.json, &o.out_dir).map(|c| c.clamp(0, 255) as u8),
        Command::Probe(a) => {
            let dtype = match a.dtype.as_deref() {
                Some("bf16") => Some(flashattn::DType::BF16),
                Some(_) => Some(flashattn::DType::F16),
                None => None,
            };
            probe::run(a.emulate, a.inject_fault, dtype).map(|c| c.clamp(0, 255) as u8)
        }
        Command::Ring(a) => ring::run(&a),
        Command::CpuGemmRate(args) => info::cpu_gemm_rate(&args).map(|()| 0),
    }
}
