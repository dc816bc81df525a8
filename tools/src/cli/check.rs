//! `flashattn check`: the GPU kernels against the f64 oracle (see `flashattn_tools::check`).

use clap::Args;
use flashattn::compare::random_seed;
use flashattn::cuda::{KernelKind, MmaTile, shared_gpu};
use flashattn::{AttnError, Result};
use flashattn_tools::check::{self, CheckOptions};
use std::path::PathBuf;

/// Options of `flashattn check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Kernels to check (comma-separated: wgmma, mma, simt, naive, auto (= wgmma, which hands
    /// what it cannot serve to mma), or all).
    #[arg(long, default_value = "all", value_delimiter = ',')]
    pub kernel: Vec<String>,
    /// A small sweep (for compute-sanitizer).
    #[arg(long)]
    pub quick: bool,
    /// Only cases whose label contains this text (e.g. "bf16", "d=128", "causal", "decode");
    /// `&` joins several that must all appear ("b=2&d=128").
    #[arg(long)]
    pub filter: Option<String>,
    /// Override the mma tile: mt,nwarps,bc[,q][,l][,p][,e][,h] (flags: Q in registers, lazy
    /// rescale, pipelined fragments, smem epilogue, head-major grid).
    #[arg(long)]
    pub tile: Option<String>,
    /// Write every result as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the sweep; an error (exit 1) when any case fails.
///
/// # Errors
/// No usable GPU, a bad option, or any failed case ([`AttnError::CheckFailed`]).
pub fn run(a: &CheckArgs) -> Result<()> {
    let mut kernels = Vec::new();
    for k in &a.kernel {
        if k == "all" {
            kernels.extend(KernelKind::ALL);
        } else {
            kernels.push(KernelKind::parse(k)?);
        }
    }
    let opts = CheckOptions {
        kernels,
        quick: a.quick,
        seed: random_seed(),
        filter: a.filter.clone(),
        tile: a.tile.as_deref().map(MmaTile::parse).transpose()?,
    };
    let gpu = shared_gpu()?;
    let results = check::run(gpu, &opts, |line| println!("{line}"))?;
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        std::fs::write(path, text).map_err(|source| AttnError::Io {
            path: path.display().to_string(),
            source,
        })?;
    }
    let failed = results.iter().filter(|r| !r.passed).count();
    if failed > 0 || results.is_empty() {
        return Err(AttnError::CheckFailed {
            what: format!(
                "{failed} of {} (case, kernel) pairs failed; seed {}",
                results.len(),
                opts.seed
            ),
        });
    }
    Ok(())
}
