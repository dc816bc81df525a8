//! The text table: one row per case, TFLOP/s of every line and peer, and our ratios.

use super::report::BenchReport;
use super::stats;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Renders the header, the table and the skip reasons.
pub fn render(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", header(report));
    let peers = report.peer_names();
    let primary = report.primary_line();
    let mut head: Vec<String> = ["dtype", "d", "causal", "seqlen"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    head.extend(report.lines.iter().cloned());
    head.extend(peers.iter().cloned());
    if let Some(p) = &primary {
        head.extend(peers.iter().map(|q| format!("{p}/{q}")));
    }
    // Fractions of the dense matrix-product rate of the same run: ours and cuDNN.
    let has_mm = report
        .cases
        .iter()
        .any(|c| report.matmul_tflops(&c.case.dtype).is_some());
    let mm_lines: Vec<String> = if has_mm {
        report
            .lines
            .iter()
            .cloned()
            .chain(peers.iter().filter(|q| *q == "cudnn").cloned())
            .collect()
    } else {
        Vec::new()
    };
    head.extend(mm_lines.iter().map(|l| format!("{l}/mm")));
    // With two rounds: the primary line over cuDNN in each round (the drift between them).
    let by_round = primary
        .clone()
        .filter(|_| report.method.rounds > 1 && peers.iter().any(|q| q == "cudnn"));
    if let Some(p) = &by_round {
        head.push(format!("{p}/cudnn r1|r2"));
    }
    let mut rows = vec![head];
    for c in &report.cases {
        let k = &c.case;
        let mut row = vec![
            k.dtype.clone(),
            k.head_dim.to_string(),
            if k.causal { "yes" } else { "no" }.to_string(),
            k.seqlen.to_string(),
        ];
        for name in report.lines.iter().chain(&peers) {
            row.push(c.tflops(name).map_or("-".into(), |t| format!("{t:.1}")));
        }
        if let Some(p) = &primary {
            row.extend(
                peers
                    .iter()
                    .map(|q| c.ratio(p, q).map_or("-".into(), |r| format!("{r:.2}"))),
            );
        }
        let mm = report.matmul_tflops(&k.dtype);
        row.extend(mm_lines.iter().map(|l| match (c.tflops(l), mm) {
            (Some(t), Some(m)) => format!("{:.2}", t / m),
            _ => "-".into(),
        }));
        if let Some(p) = &by_round {
            let cell = |round: usize| {
                let rate = |name: &str| {
                    c.line(name)?
                        .rounds
                        .iter()
                        .find(|r| r.round == round)
                        .and_then(|r| r.timing)
                        .map(|t| t.tflops)
                };
                stats::ratio(rate(p), rate("cudnn")).map_or("-".into(), |r| format!("{r:.2}"))
            };
            row.push(format!("{}|{}", cell(1), cell(2)));
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    for (n, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i < 4 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        if n == 0 {
            let _ = writeln!(
                out,
                "{}",
                "-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1))
            );
        }
    }
    out.push_str(&skips(report));
    out
}

fn header(report: &BenchReport) -> String {
    let dev = report
        .device
        .get("name")
        .and_then(|v| v.as_str())
        .unwrap_or("no GPU");
    let arch = report
        .device
        .get("arch")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let (pass, inputs) = if report.cases.iter().any(|c| c.case.backward) {
        (
            "backward TFLOP/s, 2.5x the forward's FLOPs",
            "one input set, o and lse from one forward",
        )
    } else {
        ("forward TFLOP/s", "inputs rotated past L2")
    };
    let m = &report.method;
    let launches = if m.window_ms > 0 {
        format!(
            "median of at least {} launches over at least {} ms",
            m.iters, m.window_ms
        )
    } else {
        format!("median of {} launches", m.iters)
    };
    let mut h = format!(
        "flashattn {} bench on {dev} {arch}: {pass} ({launches}, CUDA events, {inputs}; causal FLOPs count visible pairs only)",
        report.version
    );
    if let Some(s) = &m.schedule {
        let _ = write!(h, "\nmethod: {s}");
    }
    if let Some(e) = &report.gpu_error {
        let _ = write!(h, "\nour kernels did not run: {e}");
    }
    // Score modifiers (the same on every case of a run): FLOPs count the pairs they let
    // through; SDPA's fused backends lack them.
    if let Some(c) = report.cases.iter().find(|c| c.case.has_score_mods()) {
        let mods = crate::check::cases::describe_scores(
            &c.case.problem().map(|p| p.scores).unwrap_or_default(),
        );
        let _ = write!(
            h,
            "\nscore modifiers:{mods} (FLOPs count the visible pairs; no peer has them)"
        );
    }
    let p = &report.peers;
    if p.requested && p.available {
        let _ = write!(
            h,
            "\npeers: PyTorch SDPA (torch {}, cuDNN {}, CUDA {}): flash = FlashAttention-2 backend, cudnn = cuDNN backend, efficient = memory-efficient backend",
            p.env.torch.as_deref().unwrap_or("?"),
            p.env.cudnn.as_deref().unwrap_or("?"),
            p.env.cuda.as_deref().unwrap_or("?")
        );
        if let Some(msg) = &p.message {
            let _ = write!(h, "\npeers: {msg}");
        }
    } else if p.requested {
        let _ = write!(
            h,
            "\npeers: NOT AVAILABLE ({}); only our numbers follow",
            p.message.as_deref().unwrap_or("no reason given")
        );
    }
    let mm: Vec<String> = report
        .peers
        .matmul
        .iter()
        .filter_map(|m| m.tflops.map(|t| format!("{} {t:.0}", m.dtype)))
        .collect();
    if !mm.is_empty() {
        let _ = write!(
            h,
            "\ndense matrix product (torch.matmul 8192^3, same warm-up, same run): {} TFLOP/s; X/mm = line X over it",
            mm.join(", ")
        );
    }
    if let Some(prim) = report.primary_line()
        && !report.peer_names().is_empty()
    {
        let _ = write!(
            h,
            "\nratios: {prim} TFLOP/s over the peer's (> 1 means {prim} is faster)"
        );
    }
    h
}

/// Skip reasons grouped by (line, reason), with the number of cases.
fn skips(report: &BenchReport) -> String {
    let mut groups: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for c in &report.cases {
        for r in &c.results {
            if let Some(why) = &r.skipped {
                groups
                    .entry((r.name.clone(), why.clone()))
                    .or_default()
                    .push(c.id.clone());
            }
        }
    }
    let mut out = String::new();
    if !groups.is_empty() {
        out.push_str("skipped:\n");
    }
    for ((name, why), ids) in groups {
        let first = &ids[0];
        let more = if ids.len() > 1 {
            format!(" and {} more", ids.len() - 1)
        } else {
            String::new()
        };
        let why: String = why.chars().take(400).collect();
        let _ = writeln!(out, "  {name} on {first}{more}: {why}");
    }
    out
}
