//! Launcher of attn_simt.cu: flash forward on CUDA cores (FFMA), online softmax.

use crate::cuda::runtime::device::Gpu;
use crate::cuda::runtime::launch::{FlashKernel, KernelKind, Launch, LaunchInfo, launch_flash};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::AttnProblem;

/// Tile of `attn_simt`: `nwarps` warps of `rows_per_warp` query rows each; K/V tiles of
/// `32 * keys_per_lane` keys (lane `j` computes the dot products of keys `j`, `j + 32`, ..).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SimtTile {
    /// Query rows per warp (`RW`, a multiple of 4).
    pub rows_per_warp: u32,
    /// Keys per lane and tile (`KPL`).
    pub keys_per_lane: u32,
    /// Warps per block.
    pub nwarps: u32,
}

impl SimtTile {
    /// The tile used for a head_dim: 8 rows per warp, 4 warps; 64-key tiles up to head_dim 128,
    /// 32-key tiles above (keeps registers near 140 with no spills and shared memory under
    /// 99 KB on every arch; checked in tests/kernels_compile.rs).
    pub fn for_head_dim(head_dim: usize) -> Self {
        SimtTile {
            rows_per_warp: 8,
            keys_per_lane: if head_dim <= 128 { 2 } else { 1 },
            nwarps: 4,
        }
    }

    /// Query rows per block (`Br`).
    pub fn br(&self) -> u32 {
        self.rows_per_warp * self.nwarps
    }

    /// Keys per tile (`Bc`).
    pub fn bc(&self) -> u32 {
        32 * self.keys_per_lane
    }

    /// Dynamic shared memory in bytes, as laid out in attn_simt.cu: Q as f32 `[Br][D]`, K as
    /// 16-bit `[Bc][KRS]` (KRS = an odd number of 16-byte chunks), V 16-bit `[Bc][D]`, and a
    /// per-warp P slice f32 `[Bc][RW]`.
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let (br, bc) = (self.br() as usize, self.bc() as usize);
        let ch = head_dim / 8;
        let krs = if ch % 2 == 1 { ch } else { ch + 1 } * 8;
        br * head_dim * 4
            + bc * krs * 2
            + bc * head_dim * 2
            + self.nwarps as usize * bc * self.rows_per_warp as usize * 4
    }

    /// NVRTC defines for this tile.
    pub fn defines(&self, dtype: DType, head_dim: usize, causal: bool) -> Vec<(String, String)> {
        vec![
            ("HEAD_DIM".to_string(), head_dim.to_string()),
            (
                "IS_BF16".to_string(),
                u8::from(dtype == DType::BF16).to_string(),
            ),
            ("IS_CAUSAL".to_string(), u8::from(causal).to_string()),
            ("RW".to_string(), self.rows_per_warp.to_string()),
            ("KPL".to_string(), self.keys_per_lane.to_string()),
            ("NWARPS".to_string(), self.nwarps.to_string()),
        ]
    }
}

/// The NVRTC defines [`launch`] compiles attn_simt.cu with (used by the compile tests).
pub fn defines(dtype: DType, head_dim: usize, causal: bool) -> Vec<(String, String)> {
    SimtTile::for_head_dim(head_dim).defines(dtype, head_dim, causal)
}

/// Launches attn_simt on `gpu.stream()` (asynchronous).
///
/// # Errors
/// [`crate::AttnError::TooLarge`] when the tile's shared memory exceeds the device's per-block limit;
/// [`crate::AttnError::Compile`]/[`crate::AttnError::Cuda`] with the kernel name and shape.
pub fn launch(gpu: &Gpu, l: &Launch) -> Result<LaunchInfo> {
    launch_flash(gpu, l, flash_kernel(l.dtype, l.problem))
}

/// attn_simt specialised for this problem (the tile follows head_dim).
pub(crate) fn flash_kernel(dtype: DType, p: &AttnProblem) -> FlashKernel {
    let d = p.shape.head_dim;
    let tile = SimtTile::for_head_dim(d);
    FlashKernel {
        kernel: KernelKind::Simt,
        source: KernelSource::AttnSimt,
        function: "attn_simt",
        defines: tile.defines(dtype, d, p.mask.is_causal()),
        br: tile.br(),
        nwarps: tile.nwarps,
        smem: tile.smem_bytes(d),
        config: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smem_fits_every_arch() {
        for d in (8..=256).step_by(8) {
            let t = SimtTile::for_head_dim(d);
            assert!(t.smem_bytes(d) <= 99 * 1024, "d={d}: {}", t.smem_bytes(d));
            assert_eq!(
                t.br() % 16,
                0,
                "Br must be >= 16 for the grid bound of check_gpu_problem"
            );
        }
        // d=128: Q 32*128*4 + K 64*136*2 + V 64*128*2 + P 4*64*8*4
        assert_eq!(
            SimtTile::for_head_dim(128).smem_bytes(128),
            16384 + 17408 + 16384 + 8192
        );
        // d=40: 5 chunks (odd) -> no pad
        assert_eq!(
            SimtTile::for_head_dim(40).smem_bytes(40),
            32 * 40 * 4 + 64 * 40 * 2 + 64 * 40 * 2 + 8192
        );
    }
}
