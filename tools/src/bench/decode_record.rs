//! The decode bench's record (bench-decode.json): each shape with our layouts, the read-only
//! pass and SDPA's backends, and with --peers each line's rounds.

use super::report::RoundTiming;
use serde::{Deserialize, Serialize};

/// One timed layout of a decode shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecodeLine {
    /// `contiguous`, `paged16`, `paged256`, ...
    pub layout: String,
    /// Median microseconds per call.
    pub median_us: f64,
    /// GB/s at the median.
    pub gbps: f64,
    /// Splits the heuristic picked.
    pub splits: usize,
    /// Median host time of one call, microseconds (the plan's launches, not the GPU).
    #[serde(default)]
    pub host_us: Option<f64>,
    /// With --peers: each round (median and GB/s above: over the calls of all rounds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<DecodeRound>,
}

/// One SDPA backend on the same contiguous shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerLine {
    /// `flash`, `cudnn`, `efficient`.
    pub peer: String,
    /// Median microseconds per call (absent when skipped).
    pub median_us: Option<f64>,
    /// GB/s of the same bytes (absent when skipped).
    pub gbps: Option<f64>,
    /// Why it did not run.
    pub skipped: Option<String>,
    /// Median host time of one call, microseconds.
    #[serde(default)]
    pub host_us: Option<f64>,
    /// Each round (median and GB/s above: over the calls of all rounds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<DecodeRound>,
}

/// One (dtype, batch, seqlen_k, seqlen_q) shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecodeShape {
    /// f16 or bf16.
    pub dtype: String,
    /// Sequences.
    pub batch: usize,
    /// Keys per sequence.
    pub seqlen_k: usize,
    /// Query rows per sequence.
    pub seqlen_q: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads.
    pub heads_kv: usize,
    /// Bytes moved per call (k, v, q, o).
    pub bytes: f64,
    /// GB/s of the read-only pass over the same k and v bytes.
    pub read_gbps: f64,
    /// Our layouts.
    pub lines: Vec<DecodeLine>,
    /// SDPA's backends (with --peers).
    pub peers: Vec<PeerLine>,
}

/// One round of one decode line (with --peers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeRound {
    /// 1 or 2.
    pub round: usize,
    /// Which side ran first in this round of the shape: `ours` or `peers`.
    pub first: String,
    /// The index of this turn in the run's sequence of turns.
    pub step: usize,
    /// Seconds from the run's first turn to the start of this one.
    pub at_s: f64,
    /// Median microseconds per call (absent when skipped).
    #[serde(default)]
    pub median_us: Option<f64>,
    /// GB/s at that median.
    #[serde(default)]
    pub gbps: Option<f64>,
    /// Timed calls.
    #[serde(default)]
    pub iters: Option<usize>,
    /// Wall milliseconds of the timed calls.
    #[serde(default)]
    pub window_ms: Option<f64>,
    /// Why the round has no timing.
    #[serde(default)]
    pub skipped: Option<String>,
}

impl From<&RoundTiming> for DecodeRound {
    /// The bench's "TFLOP/s" of a decode line are TB/s (its FLOPs are the bytes).
    fn from(r: &RoundTiming) -> Self {
        DecodeRound {
            round: r.round,
            first: r.first.clone(),
            step: r.step,
            at_s: r.at_s,
            median_us: r.timing.map(|t| t.median_ms * 1e3),
            gbps: r.timing.map(|t| t.tflops * 1e3),
            iters: r.timing.map(|t| t.iters),
            window_ms: r.window_ms,
            skipped: r.skipped.clone(),
        }
    }
}
