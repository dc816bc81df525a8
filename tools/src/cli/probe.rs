//! `flashattn probe`: prove the fragment layouts lane by lane, on the GPU or on the CPU
//! emulators: the warp experiments of `mma.m16n8k16` / `ldmatrix` (every GPU), and the
//! warpgroup experiments of `wgmma` + TMA + descriptors (sm_90 only on a GPU).

use flashattn::cuda::Gpu;
use flashattn::{DType, Result};
use flashattn_tools::probe::{self, ProbeReport};
use flashattn_tools::{probe_wgmma, probe_wgmma_fp8};

/// Which experiment a report is of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One warp: ldmatrix, mma.m16n8k16, S -> P.
    Warp,
    /// One warpgroup: wgmma, TMA swizzle, descriptors, S -> P as the register A operand.
    Warpgroup,
    /// One warpgroup, e4m3: 8-bit K-major descriptors, P's e4m3 fragment, V^T (once per run).
    Fp8,
}

/// Runs the layout probe for `dtype` (both f16 and bf16 when `None`) and prints each report.
///
/// `emulate` runs on the CPU emulator built on the layout model (no GPU needed); otherwise on
/// GPU 0. `inject_fault` loads B without `.trans`: the checker must then name the wrong lanes
/// and registers, and a line says whether the fault was caught.
///
/// Returns the exit code: 0 when every check passed; 1 when a check failed (the expected
/// outcome with `inject_fault`); 2 when a fault was injected but no check failed (the checker
/// missed it).
///
/// # Errors
/// Without `emulate`: no GPU or NVRTC, or a compile or launch failure.
pub fn run(emulate: bool, inject_fault: bool, dtype: Option<DType>) -> Result<i32> {
    let dtypes = match dtype {
        Some(d) => vec![d],
        None => vec![DType::F16, DType::BF16],
    };
    let gpu = if emulate { None } else { Some(Gpu::new(0)?) };
    let hopper = gpu
        .as_ref()
        .is_none_or(|g| g.info().compute_capability == (9, 0));
    let mut reports = Vec::new();
    for &d in &dtypes {
        for kind in [Kind::Warp, Kind::Warpgroup] {
            let report = match (&gpu, kind) {
                (Some(gpu), Kind::Warp) => probe::run_gpu(gpu, d, inject_fault)?,
                (Some(_), Kind::Warpgroup) if !hopper => {
                    println!("warpgroup (wgmma) probe: skipped, it needs sm_90 (Hopper)\n");
                    continue;
                }
                (Some(gpu), Kind::Warpgroup) => probe_wgmma::run_gpu(gpu, d, inject_fault)?,
                (None, Kind::Warp) => probe::run_emulated(d, inject_fault),
                (None, Kind::Warpgroup) => probe_wgmma::run_emulated(d, inject_fault),
                (_, Kind::Fp8) => unreachable!("the e4m3 probe runs once, below"),
            };
            println!("{}", header(&report, kind, inject_fault));
            println!("{report}");
            if inject_fault {
                println!("{}", fault_verdict(&report, kind));
            }
            println!();
            reports.push(report);
        }
    }
    // The e4m3 experiments once (their output is bf16 whatever the asked dtype), unless the
    // run asks for f32 alone.
    if dtype != Some(DType::F32) {
        let report = match &gpu {
            Some(_) if !hopper => {
                println!("warpgroup e4m3 (wgmma fp8) probe: skipped, it needs sm_90 (Hopper)\n");
                None
            }
            Some(gpu) => Some(probe_wgmma_fp8::run_gpu(gpu, inject_fault)?),
            None => Some(probe_wgmma_fp8::run_emulated(inject_fault)),
        };
        if let Some(report) = report {
            println!("{}", header(&report, Kind::Fp8, inject_fault));
            println!("{report}");
            if inject_fault {
                println!("{}", fault_verdict(&report, Kind::Fp8));
            }
            println!();
            reports.push(report);
        }
    }
    let failed = reports.iter().filter(|r| !r.passed).count();
    let code = summary_code(failed, reports.len(), inject_fault);
    println!("{}", summary_line(&reports, failed, inject_fault));
    Ok(code)
}

/// The fault each experiment injects.
fn fault_text(kind: Kind) -> &'static str {
    match kind {
        Kind::Warp => "B loaded with ldmatrix.x4 WITHOUT .trans",
        Kind::Warpgroup => {
            "K-major descriptors with a 64-byte swizzle where TMA wrote 128, V's descriptor with an SBO of 512 instead of 1024"
        }
        Kind::Fp8 => {
            "e4m3 K-major descriptors (Q, K, V^T) with a 64-byte swizzle where TMA wrote 128"
        }
    }
}

/// `layout probe (warp: mma.m16n8k16): f16 on emulator` (+ the fault being injected).
fn header(report: &ProbeReport, kind: Kind, inject_fault: bool) -> String {
    let fault = if inject_fault {
        format!(", fault injected: {}", fault_text(kind))
    } else {
        String::new()
    };
    let what = match kind {
        Kind::Warp => "warp: ldmatrix, mma.m16n8k16",
        Kind::Warpgroup => "warpgroup: TMA, descriptors, wgmma",
        Kind::Fp8 => "warpgroup: e4m3 TMA, descriptors, wgmma k32, P fragment, V^T",
    };
    let dtype = if kind == Kind::Fp8 {
        "e4m3".to_string()
    } else {
        report.dtype.to_string()
    };
    format!("layout probe ({what}): {dtype} on {}{fault}", report.source)
}

/// Whether an injected fault was caught, naming the lanes.
fn fault_verdict(report: &ProbeReport, kind: Kind) -> String {
    let dtype = if kind == Kind::Fp8 {
        "e4m3".to_string()
    } else {
        report.dtype.to_string()
    };
    if report.passed {
        format!(
            "fault NOT caught ({dtype}): every check passed despite: {}",
            fault_text(kind)
        )
    } else {
        let lanes = report.wrong_lanes();
        let list = match kind {
            Kind::Warp => lane_list(&lanes),
            Kind::Warpgroup | Kind::Fp8 => lane_list(&lanes).replacen("lane", "thread", 1),
        };
        format!(
            "fault caught ({dtype}): {} wrong cells in {list}, as expected with the injected fault",
            report.wrong
        )
    }
}

/// `lane 3`, `lanes 0-31` or `lanes 3, 13`.
fn lane_list(lanes: &[usize]) -> String {
    let contiguous = lanes.windows(2).all(|w| w[1] == w[0] + 1);
    match lanes {
        [] => "no lane".to_string(),
        [one] => format!("lane {one}"),
        [first, .., last] if contiguous => format!("lanes {first}-{last}"),
        _ => {
            let l: Vec<String> = lanes.iter().map(|l| l.to_string()).collect();
            format!("lanes {}", l.join(", "))
        }
    }
}

fn summary_code(failed: usize, total: usize, inject_fault: bool) -> i32 {
    match (failed, inject_fault) {
        (0, true) => 2,
        (0, false) => 0,
        _ if inject_fault && failed < total => 2,
        _ => 1,
    }
}

fn summary_line(reports: &[ProbeReport], failed: usize, inject_fault: bool) -> String {
    let cells: usize = reports.iter().map(|r| r.checked).sum();
    let n = reports.len();
    match (failed, inject_fault) {
        (0, false) => format!("all layout checks passed ({n} experiments; {cells} cells)"),
        (0, true) => "the injected fault was NOT caught: the checker is broken".to_string(),
        (f, true) if f == n => format!(
            "the injected fault was caught in all {n} experiments (exit code 1 is the expected outcome)"
        ),
        (f, true) => format!("the injected fault was caught in only {f} of {n} experiments"),
        (f, false) => format!("{f} of {n} experiments FAILED the layout probe"),
    }
}
