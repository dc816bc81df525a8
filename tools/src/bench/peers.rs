//! Running tools/bench/peers.py (PyTorch SDPA: flash, cuDNN, efficient) and merging its results.

use super::report::{BenchReport, LineResult, MatmulResult, PEERS, PeerEnv, PeersInfo, Source};
use super::stats::{self, Timing};
use super::sweep::Case;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One case as peers.py takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerCase {
    /// [`Case::id`].
    pub id: String,
    /// The case's fields.
    #[serde(flatten)]
    pub case: Case,
    /// FLOPs (our model, so TFLOP/s are comparable).
    pub flops: f64,
    /// Input sets to rotate (as ours).
    pub sets: usize,
}

/// The request written to peers.py's stdin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerRequest {
    /// Timed calls per case and peer.
    pub iters: usize,
    /// Untimed calls first.
    pub warmup: usize,
    /// Then untimed calls until this many milliseconds have passed.
    #[serde(default)]
    pub warmup_ms: u64,
    /// Backends to run: `flash`, `cudnn`, `efficient`.
    pub peers: Vec<String>,
    /// Cases.
    pub cases: Vec<PeerCase>,
}

impl PeerRequest {
    /// A request for every case of `report`, all three peers.
    pub fn from_report(report: &BenchReport) -> Self {
        PeerRequest {
            iters: report.method.iters,
            warmup: report.method.warmup,
            warmup_ms: report.method.warmup_ms,
            peers: PEERS.iter().map(|s| s.to_string()).collect(),
            // SDPA's fused backends have no window, softcap or ALiBi: those cases have no
            // peer lines.
            cases: report
                .cases
                .iter()
                .filter(|c| !c.case.has_score_mods())
                .map(|c| PeerCase {
                    id: c.id.clone(),
                    case: c.case.clone(),
                    flops: c.flops,
                    sets: c.sets,
                })
                .collect(),
        }
    }
}

/// One result line of peers.py.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerResult {
    /// Case id.
    pub id: String,
    /// Peer name.
    pub peer: String,
    /// Median ms.
    #[serde(default)]
    pub median_ms: Option<f64>,
    /// Min ms.
    #[serde(default)]
    pub min_ms: Option<f64>,
    /// p90 ms.
    #[serde(default)]
    pub p90_ms: Option<f64>,
    /// Timed calls.
    #[serde(default)]
    pub iters: Option<usize>,
    /// Why skipped.
    #[serde(default)]
    pub skipped: Option<String>,
    /// Peak allocated during one call minus the inputs.
    #[serde(default)]
    pub peak_mem_beyond_inputs_bytes: Option<i64>,
    /// The same minus o and an f32 lse.
    #[serde(default)]
    pub extra_mem_bytes: Option<i64>,
    /// Median host time of one call in the timed loop, microseconds.
    #[serde(default)]
    pub host_us: Option<f64>,
}

/// peers.py's response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerResponse {
    /// Torch and a GPU were there.
    pub ok: bool,
    /// Why not.
    #[serde(default)]
    pub error: Option<String>,
    /// Versions and device.
    #[serde(flatten)]
    pub env: PeerEnv,
    /// The dense matrix-product rate per dtype, same warm-up.
    #[serde(default)]
    pub matmul: Vec<MatmulResult>,
    /// One per (case, peer).
    #[serde(default)]
    pub results: Vec<PeerResult>,
}

/// Parses peers.py's output.
///
/// # Errors
/// The JSON error as text.
pub fn parse_response(text: &str) -> Result<PeerResponse, String> {
    serde_json::from_str(text).map_err(|e| format!("peers.py output is not the expected JSON: {e}"))
}

/// Where peers.py sits in the repository.
pub const SCRIPT: &str = "tools/bench/peers.py";

/// Finds peers.py: `$FLASHATTN_PEERS_SCRIPT`, else [`SCRIPT`] under the current
/// directory, else under the executable's folder or one of its ancestors (so that
/// `target/release/flashattn` finds the repository's script).
pub fn find_script() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FLASHATTN_PEERS_SCRIPT") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "FLASHATTN_PEERS_SCRIPT={} is not a file",
                p.display()
            ))
        };
    }
    let mut tried = Vec::new();
    let mut roots: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(exe.ancestors().skip(1).take(5).map(Path::to_path_buf));
    }
    for root in roots {
        let p = root.join(SCRIPT);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    }
    Err(format!(
        "{SCRIPT} not found (tried {}); set FLASHATTN_PEERS_SCRIPT",
        tried.join(", ")
    ))
}

/// The interpreter: `$PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("PYTHON")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// Runs `python script [extra args] --out TMP` with the request on stdin; the script's stdout
/// and stderr go to our stderr (progress), its result comes back through the file.
///
/// # Errors
/// A message when the interpreter cannot start, exits non-zero, or writes no valid result.
pub fn run_script(
    python: &str,
    script: &Path,
    extra: &[&str],
    request: &impl Serialize,
) -> Result<PeerResponse, String> {
    let out = std::env::temp_dir().join(format!("flashattn-peers-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let body = serde_json::to_string(request).map_err(|e| e.to_string())?;
    let mut child = Command::new(python)
        .arg(script)
        .args(extra)
        .arg("--out")
        .arg(&out)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(std::io::stderr()))
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("could not start {python}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(body.as_bytes())
            .map_err(|e| format!("writing the request to {python}: {e}"))?;
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {python}: {e}"))?;
    let text = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    match text {
        Ok(t) => parse_response(&t),
        Err(e) => Err(format!(
            "{python} {} exited with {status} and wrote no result ({e})",
            script.display()
        )),
    }
}

/// Finds the script and interpreter and runs the peers on `report`'s cases.
///
/// # Errors
/// Why the peers could not run at all.
pub fn run(report: &BenchReport) -> Result<PeerResponse, String> {
    let script = find_script()?;
    run_script(&python(), &script, &[], &PeerRequest::from_report(report))
}

/// Records the peers' outcome in `report`: versions and, when they ran, one line per case and
/// peer (a missing result is recorded as skipped). Our numbers are untouched.
pub fn merge(report: &mut BenchReport, outcome: Result<PeerResponse, String>) {
    let resp = match outcome {
        Ok(r) => r,
        Err(message) => {
            report.peers = PeersInfo {
                requested: true,
                available: false,
                message: Some(message),
                ..Default::default()
            };
            return;
        }
    };
    report.peers = PeersInfo {
        requested: true,
        available: resp.ok,
        message: resp.error.clone(),
        env: resp.env.clone(),
        matmul: resp.matmul.clone(),
    };
    if !resp.ok {
        return;
    }
    let names: Vec<&str> = PEERS
        .iter()
        .copied()
        .filter(|p| resp.results.iter().any(|r| r.peer == *p))
        .collect();
    for case in &mut report.cases {
        for &peer in &names {
            case.results.retain(|r| r.name != peer);
            let found = resp
                .results
                .iter()
                .find(|r| r.id == case.id && r.peer == peer);
            case.results.push(line(found, peer, case.flops));
        }
    }
}

fn line(found: Option<&PeerResult>, peer: &str, flops: f64) -> LineResult {
    let Some(r) = found else {
        return LineResult::skipped(peer, Source::Peer, "no result from peers.py");
    };
    if let Some(why) = &r.skipped {
        return LineResult::skipped(peer, Source::Peer, why.clone());
    }
    match (r.median_ms, r.min_ms, r.p90_ms) {
        (Some(median), Some(min), Some(p90)) if median > 0.0 => {
            let t = Timing {
                median_ms: median,
                min_ms: min,
                p90_ms: p90,
                iters: r.iters.unwrap_or(0),
                tflops: stats::tflops(flops, median),
            };
            let mut l = LineResult::timed(peer, Source::Peer, t);
            l.peak_mem_beyond_inputs_bytes = r.peak_mem_beyond_inputs_bytes;
            l.extra_mem_bytes = r.extra_mem_bytes;
            l.host_us = r.host_us;
            l.extra_mem_method = Some("torch.cuda.max_memory_allocated() during one call minus the inputs, minus o and an f32 lse (clamped at 0)".into());
            l
        }
        _ => LineResult::skipped(peer, Source::Peer, "peers.py gave no valid timing"),
    }
}
