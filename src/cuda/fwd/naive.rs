//! Launcher of attn_naive.cu: S materialised in global memory, softmax in place, P V.
//!
//! Three launches on `gpu.stream()` sharing one f32 workspace `S [batch, heads_q, seqlen_q,
//! seqlen_k]`, allocated here and refused up front (typed [`AttnError::TooLarge`]) when it
//! would not fit in free device memory.

use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{FlashParams, KernelKind, Launch, LaunchInfo, launch_context};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::shape::AttnShape;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Threads per block of each of the three kernels (attn_naive.cu's TS*TS, 8 warps, PM*PK).
const THREADS: u32 = 256;
/// Tile side of S in `attn_naive_scores`.
const TS: u64 = 16;
/// Rows (warps) per block in `attn_naive_softmax`.
const SOFTMAX_ROWS: u64 = 8;
/// Rows and channels of one tile of O in `attn_naive_pv`.
const PM: u64 = 16;
const PN: u64 = 64;
/// Grid cap: every kernel walks its tiles with a grid-stride loop over a 64-bit index, so
/// this many blocks is enough to fill any GPU and never hits the grid.x limit.
const MAX_GRID: u64 = 1 << 21;
/// Free device memory kept back after the workspace: at least this much ...
const HEADROOM_MIN: usize = 256 << 20;
/// ... or this fraction (1/32) of the device's memory, whichever is larger.
const HEADROOM_DIV: usize = 32;

/// The NVRTC defines [`launch`] compiles attn_naive.cu with (used by the compile tests).
pub fn defines(dtype: DType, head_dim: usize, causal: bool) -> Vec<(String, String)> {
    vec![
        ("HEAD_DIM".to_string(), head_dim.to_string()),
        (
            "IS_BF16".to_string(),
            u8::from(dtype == DType::BF16).to_string(),
        ),
        ("IS_CAUSAL".to_string(), u8::from(causal).to_string()),
    ]
}

/// Elements of the S workspace (`batch * heads_q * seqlen_q * seqlen_k`), or `None` when the
/// count or its size in bytes overflows the 64-bit index the kernels use.
pub fn workspace_elements(s: &AttnShape) -> Option<usize> {
    let n = (s.batch as u128)
        .checked_mul(s.heads_q as u128)?
        .checked_mul(s.seqlen_q as u128)?
        .checked_mul(s.seqlen_k as u128)?;
    let bytes = n.checked_mul(4)?;
    if bytes > i64::MAX as u128 || bytes > usize::MAX as u128 {
        return None;
    }
    Some(n as usize)
}

fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

fn grid(tiles: u64) -> u32 {
    tiles.clamp(1, MAX_GRID) as u32
}

/// Launches the three kernels of attn_naive on `gpu.stream()`.
///
/// The workspace is released when this function returns: cudarc frees it stream-ordered
/// (`cuMemFreeAsync` on the same stream, after the three kernels) or, without async
/// allocation, synchronises the stream before freeing, so the launch stays correct either way.
///
/// # Errors
/// [`AttnError::TooLarge`] (kernel `attn_naive`) when S does not fit in free device memory or
/// its size overflows; [`AttnError::Compile`]/[`AttnError::Cuda`] with the kernel name and shape.
pub fn launch(gpu: &Gpu, l: &Launch) -> Result<LaunchInfo> {
    let p = l.problem;
    let s = &p.shape;
    let ctx = launch_context("attn_naive", p);
    let want = s.batch as f64 * s.heads_q as f64 * s.seqlen_q as f64 * s.seqlen_k as f64 * 4.0;
    let elems = workspace_elements(s).ok_or_else(|| AttnError::TooLarge {
        kernel: "attn_naive",
        reason: format!(
            "S (batch*heads_q*seqlen_q*seqlen_k f32) would take {:.1} GiB, beyond 64-bit offsets: use the simt or mma kernel (O(seqlen) memory)",
            gib(want)
        ),
    })?;
    let bytes = elems * 4;
    let (free, total) = gpu
        .context()
        .mem_get_info()
        .map_err(cuda_err(format!("{ctx}: reading free memory")))?;
    let headroom = HEADROOM_MIN.max(total / HEADROOM_DIV);
    if bytes.saturating_add(headroom) > free {
        return Err(AttnError::TooLarge {
            kernel: "attn_naive",
            reason: format!(
                "S (batch*heads_q*seqlen_q*seqlen_k f32) needs {:.2} GiB, the device has {:.2} GiB free (keeping {:.2} GiB headroom): use the simt or mma kernel (O(seqlen) memory) or a smaller batch",
                gib(bytes as f64),
                gib(free as f64),
                gib(headroom as f64)
            ),
        });
    }

    let defines = defines(l.dtype, s.head_dim, p.mask.is_causal());
    let k_scores = gpu.kernel(KernelSource::AttnNaive, "attn_naive_scores", &defines)?;
    let k_softmax = gpu.kernel(KernelSource::AttnNaive, "attn_naive_softmax", &defines)?;
    let k_pv = gpu.kernel(KernelSource::AttnNaive, "attn_naive_pv", &defines)?;

    let stream = gpu.stream();
    // SAFETY: every element of S is written by attn_naive_scores before any kernel reads it.
    let mut ws: CudaSlice<f32> = unsafe { stream.alloc(elems) }.map_err(cuda_err(format!(
        "{ctx}: allocating S ({:.2} GiB)",
        gib(bytes as f64)
    )))?;
    let params = FlashParams::new(l, TS as u32);
    let (bh, sq, sk) = (
        s.batch as u64 * s.heads_q as u64,
        s.seqlen_q as u64,
        s.seqlen_k as u64,
    );
    let cfg = |tiles: u64| LaunchConfig {
        grid_dim: (grid(tiles), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };

    // (a) S = scale * Q K^T
    let mut b = stream.launch_builder(&k_scores.function);
    b.arg(&params);
    b.arg(&mut ws);
    // SAFETY: the parameters mirror the kernel's struct; forward_device checked q, k, v, o and lse
    // against the shape and strides; S holds batch*heads_q*seqlen_q*seqlen_k elements.
    unsafe { b.launch(cfg(sq.div_ceil(TS) * sk.div_ceil(TS) * bh)) }
        .map_err(cuda_err(format!("{ctx}: scores")))?;

    // (b) P = softmax(S) in place, lse
    let mut b = stream.launch_builder(&k_softmax.function);
    b.arg(&params);
    b.arg(&mut ws);
    // SAFETY: as above.
    unsafe { b.launch(cfg((bh * sq).div_ceil(SOFTMAX_ROWS))) }
        .map_err(cuda_err(format!("{ctx}: softmax")))?;

    // (c) O = P V
    let mut b = stream.launch_builder(&k_pv.function);
    b.arg(&params);
    b.arg(&ws);
    // SAFETY: as above.
    unsafe { b.launch(cfg(sq.div_ceil(PM) * (s.head_dim as u64).div_ceil(PN) * bh)) }
        .map_err(cuda_err(format!("{ctx}: P V")))?;
    drop(ws); // stream-ordered free (see above)

    let stats = [&k_scores.stats, &k_softmax.stats, &k_pv.stats];
    Ok(LaunchInfo {
        kernel: KernelKind::Naive,
        why: "asked for".into(),
        config: None,
        registers: stats.iter().map(|x| x.registers).max().unwrap_or(0),
        spill_bytes: stats.iter().map(|x| x.spill_stores).sum(),
        // No dynamic shared memory: report the largest static allocation of the three kernels.
        smem_bytes: stats.iter().map(|x| x.shared as usize).max().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_size_checks_overflow() {
        let s = AttnShape::new(2, 1000, 3, 64);
        assert_eq!(workspace_elements(&s), Some(2 * 3 * 1000 * 1000));
        let huge = AttnShape {
            seqlen_q: 1 << 31,
            seqlen_k: 1 << 31,
            ..AttnShape::new(1 << 10, 1, 1, 8)
        };
        assert_eq!(workspace_elements(&huge), None);
        let absurd = AttnShape {
            seqlen_q: usize::MAX,
            seqlen_k: usize::MAX,
            ..AttnShape::new(usize::MAX, 1, usize::MAX, 8)
        };
        assert_eq!(workspace_elements(&absurd), None);
    }
}
