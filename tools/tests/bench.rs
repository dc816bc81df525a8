//! Benchmark plumbing without a GPU: sweep builder, options, statistics, table, JSON, peers
//! merge (canned), the interleaved run against `bench/peers.py --serve --fake` and stub
//! servers that hang or die, and plot files.

#[allow(dead_code)]
#[path = "../src/cli/bench.rs"]
mod cli_bench;

use flashattn_tools::bench::interleave::{self, OursSide};
use flashattn_tools::bench::order::Order;
use flashattn_tools::bench::peers::{self, PeerRequest, PeerResponse, Peers};
use flashattn_tools::bench::report::{CaseReport, PEERS};
use flashattn_tools::bench::rounds::Measured;
use flashattn_tools::bench::run::{finish, new_report};
use flashattn_tools::bench::stats::Schedule;
use flashattn_tools::bench::sweep::{Line, Sweep};
use flashattn_tools::bench::{
    BenchOptions, BenchReport, LineResult, Source, Timing, plot, stats, table,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn opts(args: &[&str]) -> BenchOptions {
    BenchOptions::from_args(args.iter().copied()).unwrap()
}

fn temp_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!(
        "flashattn-bench-test-{tag}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn timing(tflops: f64, flops: f64) -> Timing {
    let ms = flops / (tflops * 1e12) * 1e3;
    stats::summarize(&[ms; 20], flops).unwrap()
}

/// A report of the given options with made-up timings: mma at 150 + seqlen/256 TFLOP/s, tiles
/// a little slower, and one skipped case.
fn synthetic(o: &BenchOptions) -> BenchReport {
    let sweep = o.sweep().unwrap();
    let mut r = new_report(&sweep);
    r.device = serde_json::json!({"name": "Test GPU", "arch": "sm_90"});
    for c in &mut r.cases {
        c.sets = 2;
        c.results = sweep
            .lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                if c.case.seqlen == 16384 && c.case.head_dim == 128 && c.case.causal && i == 0 {
                    LineResult::skipped(
                        &l.name,
                        Source::Ours,
                        "CUDA error in attn_mma launch: out of memory",
                    )
                } else {
                    LineResult::timed(
                        &l.name,
                        Source::Ours,
                        timing(
                            150.0 + c.case.seqlen as f64 / 256.0 - 10.0 * i as f64,
                            c.flops,
                        ),
                    )
                }
            })
            .collect();
    }
    r
}

fn fake_response(r: &BenchReport) -> PeerResponse {
    let mut results = Vec::new();
    for c in &r.cases {
        for (p, rate) in PEERS.iter().zip([100.0, 200.0, 50.0]) {
            let ms = c.flops / (rate * 1e12) * 1e3;
            results.push(serde_json::json!({"id": c.id, "peer": p, "median_ms": ms, "min_ms": ms, "p90_ms": ms, "iters": 20, "tflops": rate,
                "peak_mem_beyond_inputs_bytes": 1000, "extra_mem_bytes": 0}));
        }
    }
    // One peer refuses one case.
    results[2] = serde_json::json!({"id": r.cases[0].id, "peer": "efficient", "skipped": "RuntimeError: No available kernel. Aborting execution."});
    let v = serde_json::json!({"ok": true, "error": null, "torch": "2.11.0", "cudnn": "91900", "cuda": "13.0", "device": "Test GPU", "results": results});
    peers::parse_response(&v.to_string()).unwrap()
}

#[test]
fn default_sweep_is_flashattention_s() {
    let s = BenchOptions::default().sweep().unwrap();
    assert_eq!(s.cases.len(), 48);
    assert_eq!(
        (
            s.iters,
            s.lines.iter().map(|l| l.name.as_str()).collect::<Vec<_>>()
        ),
        (30, vec!["wgmma", "mma"])
    );
    for c in &s.cases {
        assert_eq!(c.batch * c.seqlen, 16384, "{}", c.id());
        assert_eq!(c.heads * c.head_dim, 2048, "{}", c.id());
    }
    let seqlens: Vec<usize> = s.cases.iter().take(6).map(|c| c.seqlen).collect();
    assert_eq!(seqlens, [512, 1024, 2048, 4096, 8192, 16384]);
    assert!(
        s.cases
            .iter()
            .any(|c| c.dtype == "bf16" && c.head_dim == 64 && c.causal)
    );
    let c = &s.cases[0];
    assert_eq!(
        (c.dtype.as_str(), c.batch, c.heads, c.head_dim, c.causal),
        ("f16", 32, 32, 64, false)
    );
    // Causal FLOPs count visible pairs only: (s + 1) / (2 s) of the square.
    let full = 4.0 * 32.0 * 32.0 * 64.0 * 512.0 * 512.0;
    assert_eq!(c.flops(), full);
    let causal = s
        .cases
        .iter()
        .find(|c| c.causal && c.seqlen == 512 && c.head_dim == 64)
        .unwrap();
    assert_eq!(causal.flops(), full * 513.0 / 1024.0);
}

#[test]
fn options_narrow_every_axis() {
    let s = opts(&["--quick"]).sweep().unwrap();
    assert_eq!(s.cases.len(), 8);
    assert!(
        s.cases
            .iter()
            .all(|c| c.dtype == "f16" && (c.seqlen == 1024 || c.seqlen == 4096))
    );
    let s = opts(&[
        "--seqlen",
        "1k,4096",
        "--head-dim",
        "128",
        "--causal",
        "on",
        "--dtype",
        "bf16",
        "--kernels",
        "naive,mma,simt",
        "--iters",
        "25",
        "--warmup",
        "3",
    ])
    .sweep()
    .unwrap();
    assert_eq!(s.cases.len(), 2);
    assert!(
        s.cases
            .iter()
            .all(|c| c.dtype == "bf16" && c.causal && c.head_dim == 128 && c.heads == 16)
    );
    let names: Vec<_> = s.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["naive", "mma", "simt"]);
    assert_eq!((s.iters, s.warmup), (25, 3));
    let s = opts(&[
        "--kernels",
        "mma",
        "--tiles",
        "2,4,64",
        "--tiles",
        "1,4,32;2,8,64,q",
        "--seqlen",
        "4k",
    ])
    .sweep()
    .unwrap();
    let names: Vec<_> = s.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["mma", "mma[2,4,64]", "mma[1,4,32]", "mma[2,8,64,q]"]
    );
    assert!(s.lines[3].tile.unwrap().q_in_regs);
    let s = opts(&["--tiles", "2,4,64", "--causal", "off"])
        .sweep()
        .unwrap();
    assert_eq!(s.lines.len(), 1);
    assert!(s.cases.iter().all(|c| !c.causal) && s.cases.len() == 24);
    assert!(BenchOptions::from_args(["--iters", "19"]).is_err());
    assert!(BenchOptions::from_args(["--causal", "maybe"]).is_err());
    assert!(opts(&["--kernels", "fast"]).sweep().is_err());
    assert!(opts(&["--tiles", "2,4,65"]).sweep().is_err());
    assert!(
        opts(&["--head-dim", "96", "--hidden", "2048"])
            .sweep()
            .is_err()
    );
    let o = opts(&["--peers", "--out-dir", "x/y", "--no-plot"]);
    assert!(o.peers && o.no_plot && o.out_dir == Path::new("x/y"));
    // --peers: interleaved over 250 ms windows unless told otherwise; --peers-after needs it.
    assert_eq!((o.order(), o.window_ms()), (Order::Interleaved, 250));
    let o = opts(&["--peers", "--peers-after", "--window-ms", "0"]);
    assert_eq!((o.order(), o.window_ms()), (Order::PeersAfter, 0));
    assert_eq!(
        (opts(&[]).order(), opts(&[]).window_ms()),
        (Order::OursOnly, 0)
    );
    assert!(BenchOptions::from_args(["--peers-after"]).is_err());
    assert!(BenchOptions::from_args(["--peers", "--peers-timeout", "0"]).is_err());
}

#[test]
fn ratios_and_table() {
    let mut r = synthetic(&opts(&["--quick", "--kernels", "mma", "--tiles", "2,4,64"]));
    let resp = fake_response(&r);
    peers::merge(&mut r, Ok(resp));
    assert!(r.peers.available);
    assert_eq!(r.peer_names(), ["flash", "cudnn", "efficient"]);
    let c = &r.cases[1];
    let mma = c.tflops("mma").unwrap();
    assert!((c.ratio("mma", "flash").unwrap() - mma / 100.0).abs() < 1e-9);
    assert!((c.ratio("mma", "cudnn").unwrap() - mma / 200.0).abs() < 1e-9);
    assert!((c.tflops("flash").unwrap() - 100.0).abs() < 1e-9);
    assert_eq!(
        r.cases[0].line("efficient").unwrap().skipped.as_deref(),
        Some("RuntimeError: No available kernel. Aborting execution.")
    );
    assert_eq!(stats::ratio(Some(1.0), None), None);
    let t = table::render(&r);
    assert!(
        t.contains("mma/flash")
            && t.contains("mma/cudnn")
            && t.contains("mma/efficient")
            && t.contains("mma[2,4,64]"),
        "{t}"
    );
    assert!(
        t.contains("torch 2.11.0") && t.contains("No available kernel"),
        "{t}"
    );
    let row = t
        .lines()
        .find(|l| l.starts_with("f16") && l.contains(" 4096 ") && l.contains("no "))
        .unwrap();
    // mma at 4096 = 166 TFLOP/s: 1.66 of flash, 0.83 of cudnn, 3.32 of efficient.
    assert!(
        row.contains("166.0")
            && row.contains("1.66")
            && row.contains("0.83")
            && row.contains("3.32"),
        "{row}"
    );
}

#[test]
fn peers_unavailable_is_said_plainly() {
    let mut r = synthetic(&opts(&["--quick"]));
    peers::merge(
        &mut r,
        Err("could not start python3: No such file or directory".into()),
    );
    let t = table::render(&r);
    assert!(
        t.contains("peers: NOT AVAILABLE (could not start python3"),
        "{t}"
    );
    assert!(t.contains("166.0"), "{t}");
    let mut r2 = synthetic(&opts(&["--quick"]));
    let resp = peers::parse_response(r#"{"ok": false, "error": "PyTorch is not importable: No module named 'torch'", "results": []}"#).unwrap();
    peers::merge(&mut r2, Ok(resp));
    assert!(!r2.peers.available && r2.peer_names().is_empty());
    assert!(table::render(&r2).contains("No module named 'torch'"));
    assert!(peers::parse_response("not json").is_err());
}

#[test]
fn json_round_trip_and_plots() {
    let mut r = synthetic(&BenchOptions::default());
    let resp = fake_response(&r);
    peers::merge(&mut r, Ok(resp));
    let dir = temp_dir("plots");
    let o = opts(&["--out-dir", dir.to_str().unwrap()]);
    let out = finish(r.clone(), &o);
    assert!(out.notes.is_empty(), "{:?}", out.notes);
    let names: Vec<String> = out
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for n in [
        "bench.json",
        "bench.txt",
        "bench-f16.svg",
        "bench-f16.png",
        "bench-bf16.svg",
        "bench-bf16.png",
    ] {
        assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
        assert!(
            std::fs::metadata(dir.join(n)).unwrap().len() > 500,
            "{n} is (nearly) empty"
        );
    }
    assert!(std::fs::read_dir(&dir).unwrap().count() <= 6);
    let png = std::fs::read(dir.join("bench-f16.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(dir.join("bench-bf16.svg")).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("<text")
            && svg.contains("TFLOP/s")
            && svg.contains("SDPA cuDNN")
            && svg.contains("head_dim 128, causal")
            && svg.contains("head_dim 64, non-causal")
            && svg.contains("16k")
    );
    let back = BenchReport::read(&dir.join("bench.json")).unwrap();
    // Floats come back within an ulp or so (serde_json's default float parsing).
    assert_eq!(
        (back.cases.len(), &back.lines, &back.peers),
        (out.report.cases.len(), &out.report.lines, &out.report.peers)
    );
    for (x, y) in back.cases.iter().zip(&out.report.cases) {
        assert_eq!(
            (&x.id, &x.case, x.results.len()),
            (&y.id, &y.case, y.results.len())
        );
        for (a, b) in x.results.iter().zip(&y.results) {
            assert_eq!(
                (&a.name, a.source, &a.skipped),
                (&b.name, b.source, &b.skipped)
            );
            let (ta, tb) = (
                a.timing.map_or(0.0, |t| t.tflops),
                b.timing.map_or(0.0, |t| t.tflops),
            );
            assert!(
                (ta - tb).abs() <= 1e-9 * tb.abs(),
                "{} {}: {ta} vs {tb}",
                x.id,
                a.name
            );
        }
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        json["cases"][0]["results"][0]["timing"]["median_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    // Redraw from the JSON alone, as `flashattn bench-plot` does.
    let dir2 = temp_dir("replot");
    assert_eq!(cli_bench::plot(&dir.join("bench.json"), &dir2).unwrap(), 0);
    assert_eq!(std::fs::read_dir(&dir2).unwrap().count(), 4);
    assert!(cli_bench::plot(&dir.join("missing.json"), &dir2).is_err());
    let figs = plot::figures(&back);
    assert_eq!(figs.len(), 2);
    assert_eq!(figs[0].panels.len(), 4);
    assert_eq!(
        figs[0].legend,
        ["wgmma", "mma", "flash", "cudnn", "efficient"]
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

#[test]
fn plots_survive_missing_data() {
    let mut r = synthetic(&opts(&["--quick", "--causal", "on"]));
    for c in &mut r.cases {
        c.results = vec![LineResult::skipped("mma", Source::Ours, "GPU unavailable")];
    }
    let dir = temp_dir("empty");
    let out = plot::write_all(&r, &dir);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.files.len(), 2);
    assert!(
        plot::svg(&plot::figures(&r)[0])
            .unwrap()
            .contains("no data")
    );
    let png = std::fs::read(dir.join("bench-f16.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let _ = std::fs::remove_dir_all(&dir);
}

fn python3() -> Option<String> {
    let py = peers::python();
    std::process::Command::new(&py)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| py)
}

#[test]
fn peers_script_compiles_and_selftests() {
    let Some(py) = python3() else {
        eprintln!("python3 not found: skipping");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/peers.py");
    let dir = temp_dir("pyc");
    let compile = format!(
        "import py_compile; py_compile.compile({:?}, cfile={:?}, doraise=True)",
        script.to_str().unwrap(),
        dir.join("peers.pyc").to_str().unwrap()
    );
    let ok = std::process::Command::new(&py)
        .args(["-c", &compile])
        .status()
        .unwrap();
    assert!(ok.success(), "bench/peers.py does not compile");
    let out = std::process::Command::new(&py)
        .arg(&script)
        .arg("--selftest")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("selftest ok"),
        "{out:?}"
    );

    // Without torch the real server says why in its hello, and the run goes on without it.
    let sched = Schedule {
        iters: 20,
        warmup: 0,
        warmup_ms: 0,
        window_ms: 0,
    };
    let real = Peers::start(Ok(script), &[], sched, Duration::from_secs(60));
    if !real.available() {
        let why = real.info.message.clone().unwrap_or_default();
        assert!(why.contains("torch") || why.contains("GPU"), "{why}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn peers_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/peers.py")
}

/// Our side with made-up timings: wgmma at 150 + seqlen/256 TFLOP/s, mma 10 less, in round 1, 1 %
/// slower in round 2 (a clock drifting down); every call logged.
struct FakeOurs {
    calls: Vec<(String, usize, Vec<String>)>,
}

impl OursSide for FakeOurs {
    fn time(&mut self, case: &mut CaseReport, lines: &[Line], round: usize) -> Vec<Measured> {
        if case.sets == 0 {
            case.sets = 2;
        }
        self.calls.push((
            case.id.clone(),
            round,
            lines.iter().map(|l| l.name.clone()).collect(),
        ));
        lines
            .iter()
            .map(|l| {
                let i = ["wgmma", "mma"]
                    .iter()
                    .position(|n| *n == l.name)
                    .unwrap_or(2);
                let rate = 150.0 + case.case.seqlen as f64 / 256.0 - 10.0 * i as f64;
                let ms = case.flops / (rate * 1e12) * 1e3 * if round == 2 { 1.01 } else { 1.0 };
                let t = stats::summarize(&[ms; 40], case.flops).unwrap();
                Measured {
                    line: LineResult::timed(&l.name, Source::Ours, t),
                    times_ms: vec![ms; 40],
                    window_ms: Some(40.0 * ms),
                }
            })
            .collect()
    }
}

fn schedule(window_ms: u64) -> Schedule {
    Schedule {
        iters: 20,
        warmup: 1,
        warmup_ms: 0,
        window_ms,
    }
}

/// peers.py `--serve --fake` on `sched`, each answer awaited at most 60 s.
fn fake_peers(sched: Schedule) -> Peers {
    Peers::start(
        Ok(peers_script()),
        &["--fake"],
        sched,
        Duration::from_secs(60),
    )
}

/// Runs `sweep`'s lines into `r` with [`FakeOurs`] as our side against `peers`; returns ours
/// with its calls logged.
fn measure_fake_ours(r: &mut BenchReport, sweep: &Sweep, peers: &mut Peers) -> FakeOurs {
    let mut ours = FakeOurs { calls: Vec::new() };
    interleave::measure(r, &sweep.lines, sweep.order, &mut ours, Some(peers));
    ours
}

#[test]
fn interleaved_run_against_the_fake_peers_server_takes_both_orders_and_records_rounds() {
    if python3().is_none() {
        eprintln!("python3 not found: skipping");
        return;
    }
    let o = opts(&["--quick", "--dtype", "both", "--peers", "--window-ms", "10"]);
    let sweep = o.sweep().unwrap();
    assert_eq!((sweep.order, sweep.window_ms), (Order::Interleaved, 10));
    let mut r = new_report(&sweep);
    r.device = serde_json::json!({"name": "Test GPU", "arch": "sm_90"});
    let mut peers = fake_peers(sweep.schedule());
    assert!(peers.available(), "{:?}", peers.info);
    let ours = measure_fake_ours(&mut r, &sweep, &mut peers);
    drop(peers);

    // Ours twice per case, round 2 with the lines mirrored.
    assert_eq!(ours.calls.len(), 2 * r.cases.len());
    assert_eq!(ours.calls[0].2, ["wgmma", "mma"]);
    assert_eq!(
        (ours.calls[1].1, &ours.calls[1].2[..]),
        (2, &["mma".to_string(), "wgmma".to_string()][..])
    );
    assert_eq!(r.method.order.as_deref(), Some("interleaved"));
    assert_eq!((r.method.rounds, r.method.window_ms), (2, 10));
    assert!(r.peers.available && r.peers.env.torch.as_deref() == Some("fake"));
    // The matmul ceiling once per dtype.
    let mm: Vec<&str> = r.peers.matmul.iter().map(|m| m.dtype.as_str()).collect();
    assert_eq!(mm, ["f16", "bf16"]);
    for c in &r.cases {
        let names: Vec<&str> = c.results.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            ["wgmma", "mma", "flash", "cudnn", "efficient"],
            "{}",
            c.id
        );
        let step = |name: &str, round: usize| {
            let l = c.line(name).unwrap();
            l.rounds.iter().find(|x| x.round == round).unwrap().step
        };
        // Round 1: ours before the peers; round 2: the peers before ours.
        assert!(step("wgmma", 1) < step("cudnn", 1), "{}", c.id);
        assert!(step("cudnn", 2) < step("wgmma", 2), "{}", c.id);
        assert!(step("cudnn", 1) < step("cudnn", 2));
        for l in &c.results {
            assert_eq!(l.rounds.len(), 2, "{} {}", c.id, l.name);
            assert_eq!(
                (l.rounds[0].first.as_str(), l.rounds[1].first.as_str()),
                ("ours", "peers")
            );
            // The pooled median is the middle of the two rounds' (equal counts of equal
            // times each), and the rounds differ (both sides drift).
            let (a, b) = (
                l.rounds[0].timing.unwrap().median_ms,
                l.rounds[1].timing.unwrap().median_ms,
            );
            let t = l.timing.unwrap();
            assert!(b > a * 1.0001, "{} {}: {a} {b}", c.id, l.name);
            if l.source == Source::Ours {
                assert!((t.median_ms - 0.5 * (a + b)).abs() < 1e-12 * a);
                assert_eq!(t.iters, 80);
            } else {
                assert!(t.median_ms >= a && t.median_ms <= b);
                // The window set the call count: at least 10 ms of calls in each round.
                assert!(l.rounds.iter().all(|x| x.window_ms.unwrap() >= 10.0 - 1e-9));
            }
        }
        // The ratio columns come from the pooled medians.
        let want = c.tflops("wgmma").unwrap() / c.tflops("cudnn").unwrap();
        assert!((c.ratio("wgmma", "cudnn").unwrap() - want).abs() < 1e-12);
    }
    // The fake cuDNN runs at 200 TFLOP/s less its drift.
    let cud = r.cases[0].tflops("cudnn").unwrap();
    assert!(cud < 200.0 && cud > 190.0, "{cud}");

    // The record: method, per-round values in bench.json, the method in the table.
    let dir = temp_dir("interleaved");
    let out = finish(r, &opts(&["--out-dir", dir.to_str().unwrap(), "--no-plot"]));
    assert!(out.notes.is_empty(), "{:?}", out.notes);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("bench.json")).unwrap()).unwrap();
    assert_eq!(json["method"]["order"], "interleaved");
    assert_eq!(json["method"]["rounds"], 2);
    assert_eq!(json["method"]["window_ms"], 10);
    assert!(
        json["method"]["schedule"]
            .as_str()
            .unwrap()
            .contains("both orders")
    );
    let rounds = &json["cases"][0]["results"][3]["rounds"];
    assert_eq!(json["cases"][0]["results"][3]["name"], "cudnn");
    assert_eq!(rounds.as_array().unwrap().len(), 2);
    assert_eq!(rounds[1]["first"], "peers");
    assert!(rounds[0]["timing"]["median_ms"].as_f64().unwrap() > 0.0);
    let back = BenchReport::read(&dir.join("bench.json")).unwrap();
    assert_eq!(back.cases[0].results[3].rounds.len(), 2);
    let t = &out.table;
    assert!(
        t.contains("method: ours and the peers interleaved case by case")
            && t.contains("at least 10 ms")
            && t.contains("wgmma/cudnn r1|r2"),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn peers_after_times_every_case_of_ours_first() {
    if python3().is_none() {
        return;
    }
    let o = opts(&["--quick", "--peers", "--peers-after", "--window-ms", "0"]);
    let sweep = o.sweep().unwrap();
    assert_eq!(sweep.order, Order::PeersAfter);
    let mut r = new_report(&sweep);
    let mut peers = fake_peers(sweep.schedule());
    let ours = measure_fake_ours(&mut r, &sweep, &mut peers);
    let n = r.cases.len();
    assert_eq!(ours.calls.len(), n);
    for c in &r.cases {
        let ours_step = c.line("wgmma").unwrap().rounds[0].step;
        let peer_step = c.line("cudnn").unwrap().rounds[0].step;
        assert!(ours_step < n && peer_step >= n, "{}", c.id);
        // No window: --iters calls.
        assert_eq!(c.line("flash").unwrap().timing.unwrap().iters, 30);
    }
    assert_eq!(r.method.rounds, 1);
    assert!(table::render(&r).contains("--peers-after"));
}

/// A stand-in for peers.py that says hello, answers `answers` requests (the fake way) and
/// then hangs (`hang`) or exits.
fn stub_server(dir: &Path, answers: usize, hang: bool) -> PathBuf {
    let path = dir.join(format!("stub-{answers}-{hang}.py"));
    let body = format!(
        r#"import json, sys, time
print(json.dumps({{"ready": True, "ok": True, "torch": "stub"}}), flush=True)
n = 0
for line in iter(sys.stdin.readline, ""):
    if n == {answers}:
        if {hang}:
            time.sleep(3600)
        sys.exit(3)
    req = json.loads(line)
    mm = [{{"dtype": d, "n": 8192, "median_ms": 1.0, "tflops": 1100.0}} for d in req.get("matmul") or []]
    res = [{{"id": c["id"], "peer": p, "median_ms": 1.0, "min_ms": 1.0, "p90_ms": 1.0, "iters": 20}} for c in req["cases"] for p in req["peers"]]
    print("a stray line from a library")
    print(json.dumps({{"ok": True, "seq": req["seq"], "matmul": mm, "results": res}}), flush=True)
    n += 1
"#,
        hang = if hang { "True" } else { "False" }
    );
    std::fs::write(&path, body).unwrap();
    path
}

#[test]
fn a_peers_server_that_hangs_or_dies_leaves_the_rest_skipped_with_the_reason() {
    if python3().is_none() {
        return;
    }
    let dir = temp_dir("stub");
    let sweep = opts(&["--quick", "--peers"]).sweep().unwrap();
    for (answers, hang, why) in [
        (2, true, "no answer from peers.py within 1 s"),
        (2, false, "peers.py exited"),
    ] {
        let mut r = new_report(&sweep);
        let script = stub_server(&dir, answers, hang);
        let mut peers = Peers::start(Ok(script), &[], schedule(0), Duration::from_secs(1));
        assert!(peers.available());
        let t = std::time::Instant::now();
        measure_fake_ours(&mut r, &sweep, &mut peers);
        // One time-out at most, never one per case.
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // The matmul and case 0's round 1 were answered; from round 2 on, skips.
        assert_eq!(r.peers.matmul[0].tflops, Some(1100.0));
        let c0 = r.cases[0].line("cudnn").unwrap();
        assert!(c0.timing.is_some() && c0.rounds[1].skipped.as_deref().unwrap().contains(why));
        for c in &r.cases[1..] {
            let l = c.line("cudnn").unwrap();
            assert!(
                l.timing.is_none() && l.skipped.as_deref().unwrap().contains(why),
                "{:?}",
                l.skipped
            );
            // Ours still ran both rounds.
            assert!(c.line("wgmma").unwrap().timing.is_some());
        }
        let msg = r.peers.message.clone().unwrap();
        assert!(
            msg.contains("stopped during the run") && msg.contains(why),
            "{msg}"
        );
        let table = table::render(&r);
        assert!(table.contains("skipped:") && table.contains(why), "{table}");
    }
    // A server that never says hello.
    let quiet = dir.join("quiet.py");
    std::fs::write(&quiet, "import time\ntime.sleep(3600)\n").unwrap();
    let p = Peers::start(Ok(quiet), &[], schedule(0), Duration::from_secs(1));
    assert!(!p.available());
    assert!(p.info.message.unwrap().contains("did not start"));
    // No script at all.
    let p = Peers::start(
        Err("not found".into()),
        &[],
        schedule(0),
        Duration::from_secs(1),
    );
    assert!(!p.available() && p.info.message.as_deref() == Some("not found"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore]
fn write_sample_plots() {
    let mut r = synthetic(&opts(&["--kernels", "mma", "--tiles", "2,4,64"]));
    let resp = fake_response(&r);
    peers::merge(&mut r, Ok(resp));
    let dir = std::env::temp_dir().join("flashattn-sample-plots");
    let out = finish(r, &opts(&["--out-dir", dir.to_str().unwrap()]));
    eprintln!("plots in {}", dir.display());
    println!("{}", out.table);
}

/// The whole command on a real GPU: `FLASHATTN_BENCH_ARGS="--quick --peers" cargo test --release
/// --test bench gpu_bench -- --ignored --nocapture` (a smoke test for GPU machines).
#[test]
#[ignore]
fn gpu_bench() {
    let args = std::env::var("FLASHATTN_BENCH_ARGS").unwrap_or_else(|_| "--quick".into());
    let o = BenchOptions::from_args(args.split_whitespace()).unwrap();
    let code = cli_bench::run(&o).unwrap();
    eprintln!("exit code {code}");
}

#[test]
fn backward_sweep_has_bwd_bwd_mma_and_bwd_det_lines_and_two_and_a_half_forward_flops() {
    let o = opts(&["--backward", "--quick"]);
    let sweep = o.sweep().unwrap();
    let names = |s: &flashattn_tools::bench::sweep::Sweep| {
        s.lines.iter().map(|l| l.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&sweep), ["bwd", "bwd-mma", "bwd-det"]);
    // --kernels picks among the backward lines, in their order.
    let picked = opts(&["--backward", "--quick", "--kernels", "bwd-det,bwd"])
        .sweep()
        .unwrap();
    assert_eq!(names(&picked), ["bwd", "bwd-det"]);
    // bwd-persistent only when named.
    let persistent = opts(&["--backward", "--quick", "--kernels", "bwd-persistent,bwd"])
        .sweep()
        .unwrap();
    assert_eq!(names(&persistent), ["bwd", "bwd-persistent"]);
    for c in &sweep.cases {
        assert!(c.backward && c.id().ends_with("-bwd"), "{}", c.id());
        let forward = flashattn_tools::bench::Case {
            backward: false,
            ..c.clone()
        };
        assert_eq!(c.flops(), 2.5 * forward.flops());
    }
    let r = new_report(&sweep);
    assert!(r.method.flops.starts_with("backward: 2.5 x"));
    // The peers get the flag through the flattened case.
    let req = PeerRequest::from_report(&r);
    assert!(req.cases.iter().all(|c| c.case.backward));
    for bad in [
        &["--backward", "--kernels", "mma"][..],
        &["--backward", "--tiles", "2,4,64"],
    ] {
        assert!(opts(bad).sweep().is_err(), "{bad:?}");
    }
    // The GPU backward has the score modifiers (no peers: SDPA's fused backends lack them).
    for good in [
        &["--backward", "--softcap", "30"][..],
        &["--backward", "--alibi"],
    ] {
        let s = opts(good).sweep().expect("backward with a modifier");
        assert!(
            s.cases.iter().all(|c| c.backward && c.has_score_mods()),
            "{good:?}"
        );
    }
}

#[test]
fn decode_turns_against_the_fake_peers_server() {
    use flashattn_tools::bench::decode::DecodeShape;
    use flashattn_tools::bench::decode_rounds::{DecodeRun, decode_line, peer_lines};
    use flashattn_tools::bench::order::Side;
    use flashattn_tools::bench::rounds::Steps;
    if python3().is_none() {
        return;
    }
    let shape = DecodeShape {
        dtype: "bf16".into(),
        batch: 8,
        seqlen_k: 8192,
        seqlen_q: 1,
        head_dim: 128,
        heads_q: 32,
        heads_kv: 8,
        bytes: 2.0 * 8.0 * 8192.0 * 8.0 * 128.0 * 2.0,
        read_gbps: 4000.0,
        lines: Vec::new(),
        peers: Vec::new(),
    };
    let sched = schedule(5);
    let mut peers = fake_peers(sched);
    let mut run = DecodeRun {
        sched,
        order: Order::Interleaved,
        peers: Some(&mut peers),
        steps: Steps::new(),
    };
    let turns = run.shape_turns();
    let sides: Vec<Side> = turns.iter().map(|t| t.side).collect();
    assert_eq!(sides, [Side::Ours, Side::Peers, Side::Peers, Side::Ours]);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for turn in turns {
        if turn.side == Side::Peers {
            let got = run.peers_turn(&shape, turn);
            // Round 2 asks the peers in reverse order.
            let first = got.first().map(|g| g.0);
            assert_eq!(first, Some(if turn.round == 1 { 0 } else { 2 }));
            theirs.extend(got.into_iter().map(|(i, info, m)| (i, vec![(info, m)])));
        } else {
            let info = run.steps.start(turn);
            let ms = 0.01 * if turn.round == 2 { 1.02 } else { 1.0 };
            let t = stats::summarize(&[ms; 20], shape.bytes).unwrap();
            let m = Measured {
                line: LineResult::timed("contiguous", Source::Ours, t),
                times_ms: vec![ms; 20],
                window_ms: Some(0.2),
            };
            ours.push((info, m));
        }
    }
    let line = decode_line(ours, shape.bytes, 4, run.record()).unwrap();
    assert_eq!(
        (line.layout.as_str(), line.splits, line.rounds.len()),
        ("contiguous", 4, 2)
    );
    assert!((line.median_us - 10.1).abs() < 1e-9, "{}", line.median_us);
    assert_eq!((line.rounds[0].step, line.rounds[1].step), (0, 3));
    let pl = peer_lines(theirs, shape.bytes);
    let names: Vec<&str> = pl.iter().map(|p| p.peer.as_str()).collect();
    assert_eq!(names, ["flash", "cudnn", "efficient"]);
    for p in &pl {
        assert_eq!(p.rounds.len(), 2);
        assert_eq!((p.rounds[0].first.as_str(), p.rounds[0].step), ("ours", 1));
        assert_eq!((p.rounds[1].first.as_str(), p.rounds[1].step), ("peers", 2));
        // At least 5 ms of calls per round.
        assert!(p.rounds.iter().all(|r| r.window_ms.unwrap() >= 5.0 - 1e-9));
    }
    // The fake cuDNN moves the "FLOPs" (here the bytes) at 200 T/s: 200,000 GB/s less drift.
    let g = pl[1].gbps.unwrap();
    assert!(g <= 200_000.0 && g > 190_000.0, "{g}");
    // --peers-after: the peers of every shape after ours, one round.
    let mut shapes = vec![shape.clone(), shape];
    run.order = Order::PeersAfter;
    assert_eq!(run.shape_turns().len(), 1);
    run.peers_after(&mut shapes);
    assert!(
        shapes
            .iter()
            .all(|s| s.peers.len() == 3 && s.peers[0].rounds.len() == 1)
    );
    assert!(shapes[1].peers[0].rounds[0].step > shapes[0].peers[0].rounds[0].step);
}
