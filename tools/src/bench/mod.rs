//! Benchmark: our kernels against PyTorch SDPA (flash, cuDNN, memory-efficient) on
//! FlashAttention's sweep, timed with CUDA events; a table, bench.json and plots.
//!
//! - [`options`]: `flashattn bench` / `bench-plot` options (clap `Args`).
//! - [`sweep`]: cases (batch x seqlen = 16384, heads x head_dim = 2048) and lines (kernels, tiles).
//! - [`gpu`]: input sets rotated past L2, events around each launch, extra memory.
//! - [`stats`]: median / min / p90, TFLOP/s, ratios, input-set count.
//! - [`peers`]: the SDPA peers of `tools/bench/peers.py`, one persistent process per run
//!   ([`server`]: its line protocol with time limits).
//! - [`order`]: the order of the turns (ours and the peers interleaved, both orders);
//!   [`rounds`]: each line pooled over its rounds; [`interleave`]: the turns run into the
//!   report.
//! - [`report`]: the record written as bench.json; [`table`]: the text table;
//!   [`plot`]: SVG and PNG figures (built-in font: no system fonts needed).
//! - [`mod@run`]: the whole command ([`run()`]); [`varlen`]: `--varlen`, packed batches;
//!   [`decode`]: `--decode`, KV-cache decoding ([`decode_record`]: its JSON record;
//!   [`decode_rounds`]: its turns with --peers).

pub mod decode;
pub mod decode_record;
pub mod decode_rounds;
pub mod gpu;
pub mod interleave;
pub mod options;
pub mod order;
pub mod peers;
pub mod plot;
pub mod report;
pub mod rounds;
pub mod run;
pub mod server;
pub mod stats;
pub mod sweep;
pub mod table;
pub mod varlen;

pub use options::{BenchOptions, CausalChoice, DTypeChoice, PlotOptions};
pub use report::{BenchReport, CaseReport, LineResult, Source};
pub use run::{BenchOutcome, run};
pub use stats::Timing;
pub use sweep::{Case, Line, Sweep};

/// The message a caught panic carried (`panic!` with a format string or a literal), or
/// empty: the bench turns a panicking line or figure into a reported skip, not a crash.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
