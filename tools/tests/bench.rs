//! Benchmark plumbing without a GPU: sweep builder, options, statistics, table, JSON, peers
//! merge (canned and through bench/peers.py --fake), and plot files.

#[allow(dead_code)]
#[path = "../src/cli/bench.rs"]
mod cli_bench;

use flashattn_tools::bench::peers::{self, PeerRequest, PeerResponse};
use flashattn_tools::bench::report::PEERS;
use flashattn_tools::bench::run::{finish, new_report};
use flashattn_tools::bench::{
    BenchOptions, BenchReport, LineResult, Source, Timing, plot, stats, table,
};
use std::path::{Path, PathBuf};

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

    // End to end through the real script with made-up timings (no torch needed).
    let mut r = synthetic(&opts(&["--quick"]));
    let req = PeerRequest::from_report(&r);
    let resp = peers::run_script(&py, &script, &["--fake"], &req).unwrap();
    assert_eq!(resp.results.len(), 8 * 3);
    peers::merge(&mut r, Ok(resp));
    assert!((r.cases[3].tflops("cudnn").unwrap() - 200.0).abs() < 1e-6);
    // Without torch the real run says why.
    let real = peers::run_script(&py, &script, &[], &req).unwrap();
    if !real.ok {
        assert!(real.error.unwrap().contains("torch"));
    }
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
        &["--backward", "--softcap", "30"],
        &["--backward", "--alibi"],
    ] {
        assert!(opts(bad).sweep().is_err(), "{bad:?}");
    }
}
