//! The PyTorch SDPA peers (flash, cuDNN, efficient) of tools/bench/peers.py: the request and
//! response types, one persistent peers process per bench run ([`Peers`], through
//! [`super::server`]), and their results turned into lines.

use super::report::{BenchReport, LineResult, MatmulResult, PEERS, PeerEnv, PeersInfo, Source};
use super::rounds::Measured;
use super::server::PeerServer;
use super::stats::{self, MAX_WINDOW_ITERS, Schedule, Timing};
use super::sweep::Case;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// A request to peers.py (see its docstring); `C` is the case type ([`PeerCase`] for the
/// sweep, the decode bench's own for KV-cache shapes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerRequest<C = PeerCase> {
    /// Timed calls per case and peer (the least, when a window asks for more).
    pub iters: usize,
    /// Untimed calls first.
    pub warmup: usize,
    /// Then untimed calls until this many milliseconds have passed.
    #[serde(default)]
    pub warmup_ms: u64,
    /// The least wall time of the timed calls, milliseconds (0: just `iters`).
    #[serde(default)]
    pub window_ms: u64,
    /// The most timed calls a window may ask for.
    #[serde(default = "max_iters")]
    pub max_iters: usize,
    /// Return every timed call's milliseconds (`times_ms`).
    #[serde(default)]
    pub times: bool,
    /// Dtypes whose dense matrix-product ceiling to time; `None`: the cases' dtypes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul: Option<Vec<String>>,
    /// Backends to run, in this order: `flash`, `cudnn`, `efficient`.
    pub peers: Vec<String>,
    /// Cases.
    pub cases: Vec<C>,
}

fn max_iters() -> usize {
    MAX_WINDOW_ITERS
}

impl<C> PeerRequest<C> {
    /// A request under `sched` (with every call's time returned) for `cases`, with `peers` in
    /// that order and the matmul ceiling of `matmul`'s dtypes only.
    pub fn new(sched: Schedule, peers: &[&str], matmul: &[&str], cases: Vec<C>) -> Self {
        PeerRequest {
            iters: sched.iters,
            warmup: sched.warmup,
            warmup_ms: sched.warmup_ms,
            window_ms: sched.window_ms,
            max_iters: MAX_WINDOW_ITERS,
            times: true,
            matmul: Some(matmul.iter().map(|s| s.to_string()).collect()),
            peers: peers.iter().map(|s| s.to_string()).collect(),
            cases,
        }
    }
}

impl PeerCase {
    /// The case of a report's line (its id, FLOPs and input sets).
    pub fn of(c: &super::report::CaseReport) -> Self {
        PeerCase {
            id: c.id.clone(),
            case: c.case.clone(),
            flops: c.flops,
            sets: c.sets,
        }
    }
}

impl PeerRequest {
    /// A one-shot request for every case of `report`, all three peers, the matmul of the
    /// cases' dtypes (`peers.py REQUEST` without --serve).
    pub fn from_report(report: &BenchReport) -> Self {
        let sched = Schedule {
            iters: report.method.iters,
            warmup: report.method.warmup,
            warmup_ms: report.method.warmup_ms,
            window_ms: report.method.window_ms,
        };
        // SDPA's fused backends have no window, softcap or ALiBi: those cases have no
        // peer lines.
        let cases = report
            .cases
            .iter()
            .filter(|c| !c.case.has_score_mods())
            .map(PeerCase::of)
            .collect();
        PeerRequest {
            times: false,
            matmul: None,
            ..PeerRequest::new(sched, &PEERS, &[], cases)
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
    /// Wall milliseconds of the timed calls.
    #[serde(default)]
    pub window_ms: Option<f64>,
    /// Every timed call's milliseconds (when the request asked for them).
    #[serde(default)]
    pub times_ms: Vec<f64>,
}

/// peers.py's response (and, in serve mode, its hello: the same fields, no results).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerResponse {
    /// Torch and a GPU were there (and, in serve mode, the request was understood).
    #[serde(default)]
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

/// The peers of one bench run: one persistent `peers.py --serve` process, and what the
/// report says about it. Never fails: a process that cannot start, lacks torch or a GPU, or
/// stops during the run is recorded in [`Peers::info`], and every peer line after that is a
/// skip with the reason.
pub struct Peers {
    server: Option<PeerServer>,
    sched: Schedule,
    /// For the report: versions, device, the matmul ceilings, why not available.
    pub info: PeersInfo,
}

impl Peers {
    /// With `asked` (`--peers`): says so on stderr and starts [`find_script`]'s peers.py
    /// with `--serve` ([`Peers::start`], no extra arguments), each answer awaited at most
    /// `timeout_s` seconds (`--peers-timeout`); `None` without.
    pub fn start_if(asked: bool, sched: Schedule, timeout_s: u64) -> Option<Peers> {
        asked.then(|| {
            eprintln!(
                "flashattn bench: starting the PyTorch SDPA peers (tools/bench/peers.py --serve)"
            );
            Peers::start(
                find_script(),
                &[],
                sched,
                std::time::Duration::from_secs(timeout_s),
            )
        })
    }

    /// Starts `script` (`peers.py`; an `Err` is why it was not found) with `--serve` and
    /// `extra` arguments under `$PYTHON` or `python3`, each answer awaited at most `timeout`.
    pub fn start(
        script: Result<PathBuf, String>,
        extra: &[&str],
        sched: Schedule,
        timeout: Duration,
    ) -> Self {
        let started =
            script.and_then(|s| PeerServer::start(&python(), Path::new(&s), extra, timeout));
        let mut info = PeersInfo {
            requested: true,
            ..Default::default()
        };
        let server = match started {
            Err(message) => {
                info.message = Some(message);
                None
            }
            Ok(server) => match parse_response(server.hello()) {
                Err(e) => {
                    info.message = Some(format!("peers.py --serve said no usable hello: {e}"));
                    None
                }
                Ok(h) => {
                    info.available = h.ok;
                    info.message = h.error;
                    info.env = h.env;
                    // Without torch or a GPU the server has nothing to do: it is dropped (ends).
                    h.ok.then_some(server)
                }
            },
        };
        Peers {
            server,
            sched,
            info,
        }
    }

    /// Whether the peers ran (torch and a GPU were there); they may have stopped since.
    pub fn available(&self) -> bool {
        self.info.available
    }

    /// One request; on failure the reason, recorded in [`Peers::info`] the first time the
    /// process stops.
    pub fn request<C: Serialize>(
        &mut self,
        cases: Vec<C>,
        peers: &[&str],
        matmul: &[&str],
    ) -> Result<PeerResponse, String> {
        let Some(server) = self.server.as_mut() else {
            return Err(self
                .info
                .message
                .clone()
                .unwrap_or_else(|| "the peers did not start".into()));
        };
        let was_running = server.stopped().is_none();
        let got = server
            .request(&PeerRequest::new(self.sched, peers, matmul, cases))
            .and_then(|line| parse_response(&line));
        if was_running && let Some(why) = server.stopped() {
            self.info.message = Some(format!(
                "the peers process stopped during the run: {why}; every peer line after that is skipped"
            ));
        }
        match got {
            Ok(r) if !r.ok => Err(r.error.unwrap_or_else(|| "peers.py said not ok".into())),
            other => other,
        }
    }

    /// Times the dense matrix-product ceiling of `dtype` into [`Peers::info`].
    pub fn matmul(&mut self, dtype: &str) {
        let got = self.request(Vec::<PeerCase>::new(), &[], &[dtype]);
        let m = match got {
            Ok(r) => r.matmul.into_iter().find(|m| m.dtype == dtype),
            Err(why) => Some(MatmulResult {
                dtype: dtype.into(),
                n: 8192,
                median_ms: None,
                tflops: None,
                skipped: Some(why),
            }),
        };
        self.info.matmul.extend(m);
    }

    /// Times `peers` (in that order) on one case of the sweep; one [`Measured`] per peer.
    pub fn time_case(&mut self, case: &super::report::CaseReport, peers: &[&str]) -> Vec<Measured> {
        let got = self.request(vec![PeerCase::of(case)], peers, &[]);
        peers
            .iter()
            .map(|p| measured(&got, &case.id, p, case.flops))
            .collect()
    }
}

/// The line of `peer` on case `id` from a response (or why there is none).
pub fn measured(got: &Result<PeerResponse, String>, id: &str, peer: &str, flops: f64) -> Measured {
    match got {
        Err(why) => Measured::skipped(peer, Source::Peer, why.clone()),
        Ok(resp) => {
            let found = resp.results.iter().find(|r| r.id == id && r.peer == peer);
            Measured {
                line: line(found, peer, flops),
                times_ms: found.map(|r| r.times_ms.clone()).unwrap_or_default(),
                window_ms: found.and_then(|r| r.window_ms),
            }
        }
    }
}

/// Records one response covering every case (a one-shot `peers.py REQUEST` run, e.g. a saved
/// response) in `report`: versions and, when they ran, one line per case and peer (a missing
/// result is recorded as skipped). Our numbers are untouched.
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
