//! The benchmark's record: every measurement, the machine, the method; written as bench.json
//! and read back by `bench-plot`.

use super::stats::{self, Timing};
use super::sweep::Case;
use flashattn::error::{AttnError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Who produced a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// One of our kernels.
    Ours,
    /// A PyTorch SDPA backend run by tools/bench/peers.py.
    Peer,
}

/// One line on one case: a timing, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineResult {
    /// `mma`, `mma[2,4,64]`, `simt`, `naive`, or a peer: `flash`, `cudnn`, `efficient`.
    pub name: String,
    /// Ours or a peer.
    pub source: Source,
    /// The timing; `None` when skipped.
    #[serde(default)]
    pub timing: Option<Timing>,
    /// Why there is no timing (error message, unavailable backend).
    #[serde(default)]
    pub skipped: Option<String>,
    /// Tile used (ours, mma).
    #[serde(default)]
    pub tile: Option<String>,
    /// Registers per thread (ours).
    #[serde(default)]
    pub registers: Option<u32>,
    /// Spill store bytes (ours).
    #[serde(default)]
    pub spill_bytes: Option<u32>,
    /// Dynamic shared memory per block (ours).
    #[serde(default)]
    pub smem_bytes: Option<usize>,
    /// Device memory beyond q, k, v, o and lse, in bytes.
    #[serde(default)]
    pub extra_mem_bytes: Option<i64>,
    /// How `extra_mem_bytes` was obtained.
    #[serde(default)]
    pub extra_mem_method: Option<String>,
    /// Peers: `torch.cuda.max_memory_allocated()` during one call, minus what was allocated
    /// before (the inputs), so it includes the output.
    #[serde(default)]
    pub peak_mem_beyond_inputs_bytes: Option<i64>,
    /// Ours: every lse value of the last launch was finite (a cheap sanity check).
    #[serde(default)]
    pub output_finite: Option<bool>,
    /// Ours: the kernel that ran and why, when not the one the line names (wgmma hands calls
    /// it cannot serve to mma).
    #[serde(default)]
    pub ran: Option<String>,
    /// Median host time of one call in the timed loop, microseconds (ours: the library's
    /// launch path; peers: the Python call). A call whose GPU time is shorter than this is
    /// bound by the host when launched back to back.
    #[serde(default)]
    pub host_us: Option<f64>,
    /// With --peers: the line in each round (round 1 ours first, round 2 the peers first),
    /// in the order they ran; `timing` is the median over the launches of all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<RoundTiming>,
}

/// One round of one line on one case (with --peers): when it ran and what it measured, so
/// that a reader sees how far the two rounds (the clock's drift) differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundTiming {
    /// 1 or 2.
    pub round: usize,
    /// Which side ran first in this round of the case: `ours` or `peers`.
    pub first: String,
    /// The index of this side's turn in the run's sequence of turns (0, 1, 2, ...: each turn
    /// is one side timing all its lines on one case in one round).
    pub step: usize,
    /// Seconds from the run's first turn to the start of this one.
    pub at_s: f64,
    /// The round's timing; `None` when skipped.
    #[serde(default)]
    pub timing: Option<Timing>,
    /// Wall milliseconds of the round's timed launches.
    #[serde(default)]
    pub window_ms: Option<f64>,
    /// Why the round has no timing.
    #[serde(default)]
    pub skipped: Option<String>,
}

impl LineResult {
    /// A line with no timing, saying why.
    pub fn skipped(name: &str, source: Source, reason: impl Into<String>) -> Self {
        LineResult {
            name: name.to_string(),
            source,
            timing: None,
            skipped: Some(reason.into()),
            tile: None,
            registers: None,
            spill_bytes: None,
            smem_bytes: None,
            extra_mem_bytes: None,
            extra_mem_method: None,
            peak_mem_beyond_inputs_bytes: None,
            output_finite: None,
            ran: None,
            host_us: None,
            rounds: Vec::new(),
        }
    }

    /// A line with a timing and nothing else filled in.
    pub fn timed(name: &str, source: Source, timing: Timing) -> Self {
        LineResult {
            timing: Some(timing),
            skipped: None,
            ..Self::skipped(name, source, "")
        }
    }
}

/// One case and all its lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    /// [`Case::id`].
    pub id: String,
    /// The case.
    pub case: Case,
    /// FLOPs of one forward pass ([`flashattn::AttnProblem::flops`]).
    pub flops: f64,
    /// Input sets rotated between launches.
    pub sets: usize,
    /// Our lines, then the peers.
    pub results: Vec<LineResult>,
}

impl CaseReport {
    /// The line named `name`.
    pub fn line(&self, name: &str) -> Option<&LineResult> {
        self.results.iter().find(|r| r.name == name)
    }

    /// TFLOP/s of `name`, if it was timed.
    pub fn tflops(&self, name: &str) -> Option<f64> {
        self.line(name).and_then(|r| r.timing).map(|t| t.tflops)
    }

    /// `ours` TFLOP/s over `peer` TFLOP/s.
    pub fn ratio(&self, ours: &str, peer: &str) -> Option<f64> {
        stats::ratio(self.tflops(ours), self.tflops(peer))
    }
}

/// How the numbers were taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Method {
    /// Timed launches per case and line.
    pub iters: usize,
    /// Untimed launches first.
    pub warmup: usize,
    /// Then untimed launches until this many milliseconds have passed (0 in reports written
    /// before the option existed).
    #[serde(default)]
    pub warmup_ms: u64,
    /// With --peers (or a window): the least wall time of each line's timed launches,
    /// milliseconds; the launch count comes from the warm-up's time per launch, at least
    /// `iters` (0 in reports written before the option existed: `iters` launches).
    #[serde(default)]
    pub window_ms: u64,
    /// How ours and the peers were ordered: `interleaved` (case by case, round 1 ours first,
    /// round 2 the peers first, in one persistent peers process), `peers-after` (all our
    /// cases, then all the peers'), or absent without --peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// Rounds of each line on each case (2 interleaved, else 1; 0 in older reports).
    #[serde(default)]
    pub rounds: usize,
    /// The order and timing as a sentence (the table's `method:` line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// What the timer covers.
    pub timing: String,
    /// The FLOP model.
    pub flops: String,
    /// L2 size the input rotation was sized against.
    #[serde(default)]
    pub l2_bytes: Option<u64>,
}

/// peers.py's dense matrix product (kept here, with the rest of what the report holds,
/// so that the report does not import the module that runs the peers): (torch.matmul, `n`^3, the cases' warm-up and timing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatmulResult {
    /// `f16` or `bf16`.
    pub dtype: String,
    /// Matrix side.
    pub n: usize,
    /// Median ms.
    #[serde(default)]
    pub median_ms: Option<f64>,
    /// TFLOP/s at the median (2 n^3 FLOPs).
    #[serde(default)]
    pub tflops: Option<f64>,
    /// Why it was not measured.
    #[serde(default)]
    pub skipped: Option<String>,
}

/// The software and GPU under the peers, as peers.py reports them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerEnv {
    /// `torch.__version__`.
    #[serde(default)]
    pub torch: Option<String>,
    /// `torch.backends.cudnn.version()`.
    #[serde(default)]
    pub cudnn: Option<String>,
    /// `torch.version.cuda`.
    #[serde(default)]
    pub cuda: Option<String>,
    /// The GPU torch saw.
    #[serde(default)]
    pub device: Option<String>,
}

/// What the peers run said about itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeersInfo {
    /// `--peers` was given.
    pub requested: bool,
    /// The peers ran (torch and a GPU were there).
    pub available: bool,
    /// Why not, or notes.
    #[serde(default)]
    pub message: Option<String>,
    /// Versions and device the peers reported.
    #[serde(flatten)]
    pub env: PeerEnv,
    /// The dense matrix-product rate per dtype, measured by peers.py in the same run.
    #[serde(default)]
    pub matmul: Vec<MatmulResult>,
}

/// The whole benchmark record (bench.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// `flashattn` version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// `git rev-parse HEAD`, or `unknown`.
    pub git_commit: String,
    /// UTC, RFC 3339.
    pub timestamp: String,
    /// The device ([`flashattn::cuda::DeviceInfo`]), or null without a GPU.
    #[serde(default)]
    pub device: serde_json::Value,
    /// Why our kernels could not run at all, if so.
    #[serde(default)]
    pub gpu_error: Option<String>,
    /// Driver's CUDA version, e.g. 13000.
    #[serde(default)]
    pub driver_version: Option<i32>,
    /// NVRTC version, e.g. `13.0`.
    #[serde(default)]
    pub nvrtc_version: Option<String>,
    /// How the numbers were taken.
    pub method: Method,
    /// The peers' run.
    #[serde(default)]
    pub peers: PeersInfo,
    /// Our line names in column order.
    pub lines: Vec<String>,
    /// Every case.
    pub cases: Vec<CaseReport>,
}

/// Peer names in column order.
pub const PEERS: [&str; 3] = ["flash", "cudnn", "efficient"];

impl BenchReport {
    /// Peer names with at least one timing or skip recorded, in [`PEERS`] order.
    pub fn peer_names(&self) -> Vec<String> {
        let mut names: Vec<String> = PEERS.iter().map(|s| s.to_string()).collect();
        names.retain(|p| self.cases.iter().any(|c| c.line(p).is_some()));
        names
    }

    /// The line the ratios are taken for: `wgmma`, else `mma`, when measured; else the first
    /// of ours.
    pub fn primary_line(&self) -> Option<String> {
        ["wgmma", "mma"]
            .iter()
            .find(|p| self.lines.iter().any(|l| l == *p))
            .map(|p| p.to_string())
            .or_else(|| self.lines.first().cloned())
    }

    /// The dense matrix-product TFLOP/s peers.py measured for `dtype` in this run.
    pub fn matmul_tflops(&self, dtype: &str) -> Option<f64> {
        self.peers
            .matmul
            .iter()
            .find(|m| m.dtype == dtype)
            .and_then(|m| m.tflops)
            .filter(|t| t.is_finite() && *t > 0.0)
    }

    /// Number of our timings that succeeded.
    pub fn our_timings(&self) -> usize {
        self.cases
            .iter()
            .flat_map(|c| &c.results)
            .filter(|r| r.source == Source::Ours && r.timing.is_some())
            .count()
    }

    /// Writes pretty JSON.
    ///
    /// # Errors
    /// [`AttnError::Io`].
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| io_err(path, std::io::Error::other(e)))?;
        std::fs::write(path, text).map_err(|e| io_err(path, e))
    }

    /// Reads a bench.json.
    ///
    /// # Errors
    /// [`AttnError::Io`] for unreadable files, [`AttnError::InvalidInput`] for malformed ones.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
        serde_json::from_str(&text).map_err(|e| AttnError::InvalidInput {
            what: format!(
                "{}: not a bench.json written by `flashattn bench` ({e})",
                path.display()
            ),
        })
    }
}

/// An I/O error naming the path.
pub(crate) fn io_err(path: &Path, source: std::io::Error) -> AttnError {
    AttnError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes a bench mode's record into `dir` (made if missing): `{stem}.json`, `value` as pretty
/// JSON, and `{stem}.txt`, the text `table`. `what` names the results in a serialising error.
///
/// # Errors
/// [`AttnError::Io`] naming the folder or file; [`AttnError::InvalidInput`] when `value`
/// does not serialise.
pub(crate) fn write_record(
    dir: &Path,
    stem: &str,
    what: &str,
    value: &impl Serialize,
    table: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let json = serde_json::to_string_pretty(value).map_err(|e| AttnError::InvalidInput {
        what: format!("serialising the {what} results: {e}"),
    })?;
    for (ext, text) in [("json", json.as_str()), ("txt", table)] {
        let path = dir.join(format!("{stem}.{ext}"));
        std::fs::write(&path, text).map_err(|e| io_err(&path, e))?;
    }
    Ok(())
}

/// The commit this binary was built from (`-dirty` when tracked files differed), recorded by
/// build.rs, or `unknown` when git was not there at build time. (Asking git in the current
/// directory named the wrong commit when the binary ran in an older checkout on the GPU
/// machine.)
pub fn git_commit() -> String {
    option_env!("FLASHATTN_GIT_COMMIT")
        .filter(|c| !c.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// The current time as RFC 3339 UTC, e.g. `2026-11-20T13:45:07Z`.
pub fn timestamp_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(secs)
}

/// Formats seconds since the Unix epoch as RFC 3339 UTC (proleptic Gregorian calendar).
pub fn format_utc(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_commit_is_a_hash_or_unknown() {
        let c = git_commit();
        let hash = c.strip_suffix("-dirty").unwrap_or(&c);
        assert!(
            c == "unknown" || (hash.len() == 40 && hash.chars().all(|x| x.is_ascii_hexdigit())),
            "{c}"
        );
    }

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
