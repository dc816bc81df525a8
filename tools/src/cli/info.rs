//! `flashattn info` and the hidden `flashattn cpu-gemm-rate`.

use clap::{Args, ValueEnum};
use flashattn::compare::{random_inputs, random_seed};
use flashattn::{AttnProblem, AttnShape, DType, Element, Mask, Result, cpu};
use half::{bf16, f16};

/// Prints the CPU side (threads, SIMD features, tile sizes) and the GPU side.
///
/// # Errors
/// None today; kept fallible for the GPU probe.
pub fn info() -> Result<()> {
    println!("flashattn {}", env!("CARGO_PKG_VERSION"));
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "CPU: {} rayon threads ({} logical CPUs), SIMD: {}",
        rayon::current_num_threads(),
        logical,
        simd_features()
    );
    println!(
        "CPU backend: tiles Br = {} query rows x Bc = {} keys, f32 accumulation",
        cpu::BR,
        cpu::BC
    );
    println!("{}", gpu_info());
    Ok(())
}

/// What the CUDA backend found: device facts and the default tiles, or why there is no GPU.
fn gpu_info() -> String {
    match flashattn::cuda::shared_gpu() {
        Err(e) => format!("GPU: none usable ({e}); `run --backend auto` uses the CPU"),
        Ok(gpu) => {
            let i = gpu.info();
            let tiles: Vec<String> = [64, 128, 256]
                .iter()
                .map(|&d| {
                    format!(
                        "d{d} {}",
                        flashattn::cuda::MmaTile::default_for(i.compute_capability, d)
                    )
                })
                .collect();
            let probe = flashattn::AttnProblem::new(flashattn::AttnShape::new(1, 128, 1, 128));
            let auto = match probe
                .ok()
                .and_then(|p| flashattn::cuda::wgmma::unsupported(i, &p))
            {
                None => format!(
                    "wgmma (sm_90: wgmma + TMA + warp specialisation) for head_dim 64..=256 and strides TMA can describe, mma otherwise; tiles (any seqlen_k and mask): {}",
                    [64, 128, 256]
                        .iter()
                        .filter_map(|&d| flashattn::cuda::WgmmaTile::default_for(d)
                            .map(|t| format!("d{d} {t}")))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                Some(why) => format!("mma (wgmma cannot run: {why})"),
            };
            format!(
                "GPU: {} ({}, compute capability {}.{}), {} SMs, {:.1} GiB\n\
                 shared memory: {} KB per block (opt-in), {} KB per SM\n\
                 driver CUDA {}.{}, NVRTC {}.{}\n\
                 kernel `auto`: {auto}\n\
                 attn_mma tiles: {}",
                i.name,
                i.arch,
                i.compute_capability.0,
                i.compute_capability.1,
                i.sm_count,
                i.total_mem as f64 / (1u64 << 30) as f64,
                i.smem_per_block_optin / 1024,
                i.smem_per_sm / 1024,
                i.driver_version / 1000,
                i.driver_version % 1000 / 10,
                i.nvrtc_version.0,
                i.nvrtc_version.1,
                tiles.join("; ")
            )
        }
    }
}

fn simd_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut f = Vec::new();
        if std::arch::is_x86_feature_detected!("avx512f") {
            f.push("avx512f");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            f.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("fma") {
            f.push("fma");
        }
        if std::arch::is_x86_feature_detected!("f16c") {
            f.push("f16c");
        }
        if f.is_empty() {
            "sse2".into()
        } else {
            f.join(" ")
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// Element type of the inputs for `cpu-gemm-rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchDType {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// f32.
    F32,
}

/// Arguments of `cpu-gemm-rate`: the problem to time.
#[derive(Debug, Args)]
pub struct GemmRateArgs {
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Sequence length (queries and keys).
    #[arg(long, default_value_t = 2048)]
    pub seqlen: usize,
    /// Heads (query and kv).
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// Causal mask.
    #[arg(long)]
    pub causal: bool,
    /// Element type of q, k, v, o.
    #[arg(long, value_enum, default_value_t = BenchDType::F16)]
    pub dtype: BenchDType,
    /// Timed repetitions (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
}

/// Times [`cpu::forward`] and [`cpu::tile_gemms_only`] on the same problem and prints both
/// rates (useful FLOPs of [`AttnProblem::flops`] over the best wall time) and their ratio.
///
/// # Errors
/// Validation errors of the problem.
pub fn cpu_gemm_rate(a: &GemmRateArgs) -> Result<()> {
    let shape = AttnShape::new(a.batch, a.seqlen, a.heads, a.head_dim);
    let mask = if a.causal { Mask::Causal } else { Mask::None };
    let p = AttnProblem::new(shape)?.with_mask(mask);
    match a.dtype {
        BenchDType::F16 => bench::<f16>(&p, a.repeat),
        BenchDType::Bf16 => bench::<bf16>(&p, a.repeat),
        BenchDType::F32 => bench::<f32>(&p, a.repeat),
    }
}

fn bench<T: Element>(p: &AttnProblem, repeat: usize) -> Result<()> {
    let s = p.shape;
    let seed = random_seed();
    let (q, k, v) = random_inputs::<T>(p, seed);
    let mut o = vec![T::default(); q.len()];
    let mut lse = vec![0.0f32; s.lse_len()];
    let repeat = repeat.max(1);
    let gf = p.flops() / 1e9;
    let mut best_fwd = f64::INFINITY;
    let mut best_gemm = f64::INFINITY;
    cpu::forward(p, &q, &k, &v, &mut o, &mut lse)?; // warm-up
    cpu::tile_gemms_only(p)?;
    for _ in 0..repeat {
        let t = std::time::Instant::now();
        cpu::forward(p, &q, &k, &v, &mut o, &mut lse)?;
        best_fwd = best_fwd.min(t.elapsed().as_secs_f64());
        best_gemm = best_gemm.min(cpu::tile_gemms_only(p)?);
    }
    println!(
        "shape b={} s={} h={} d={} {} {}, {} rayon threads, tiles {}x{}, best of {repeat}",
        s.batch,
        s.seqlen_q,
        s.heads_q,
        s.head_dim,
        p.mask.name(),
        DType::name(T::DTYPE),
        rayon::current_num_threads(),
        cpu::BR,
        cpu::BC
    );
    println!(
        "cpu forward:          {:9.3} ms  {:7.2} GFLOP/s",
        best_fwd * 1e3,
        gf / best_fwd
    );
    println!(
        "gemm crate, same tiles:{:9.3} ms  {:7.2} GFLOP/s",
        best_gemm * 1e3,
        gf / best_gemm
    );
    println!("forward / gemm-only time: {:.2}x", best_fwd / best_gemm);
    Ok(())
}
