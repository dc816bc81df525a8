//! `flashattn bench` and `flashattn bench-plot`.

use flashattn::Result;
use flashattn_tools::bench::{self, BenchOptions};
use std::path::Path;

/// Runs the benchmark, prints the table on stdout (notes and file list on stderr) and returns
/// the exit code: 0 when at least one of our timings succeeded, 1 otherwise.
///
/// # Errors
/// Bad options only; failing cases, peers and plots are reported, not returned.
pub fn run(opts: &BenchOptions) -> Result<i32> {
    if opts.decode {
        print!("{}", bench::decode::run(opts)?);
        return Ok(0);
    }
    if let Some(spec) = &opts.varlen {
        let mix = bench::varlen::parse_mix(spec)?;
        print!("{}", bench::varlen::run(opts, &mix)?);
        return Ok(0);
    }
    let out = bench::run(opts)?;
    for n in &out.notes {
        eprintln!("note: {n}");
    }
    for f in &out.files {
        eprintln!("wrote {}", f.display());
    }
    print!("{}", out.table);
    if out.report.our_timings() == 0 {
        eprintln!("error: none of our kernels produced a timing (reasons above the table's end)");
        return Ok(1);
    }
    Ok(0)
}

/// Redraws the plots of a bench.json into `out_dir`; exit code 1 when any figure failed.
///
/// # Errors
/// [`flashattn::AttnError::Io`] when the JSON cannot be read.
pub fn plot(json: &Path, out_dir: &Path) -> Result<i32> {
    // A bench-decode.json has "shapes"; a bench.json has "cases".
    let decode = std::fs::read_to_string(json)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("shapes").is_some());
    let out = if decode {
        bench::decode::plots_from_json(json, out_dir)?
    } else {
        bench::plot::from_json(json, out_dir)?
    };
    for f in &out.files {
        println!("wrote {}", f.display());
    }
    for e in &out.errors {
        eprintln!("plot failed: {e}");
    }
    Ok(i32::from(!out.errors.is_empty() || out.files.is_empty()))
}
