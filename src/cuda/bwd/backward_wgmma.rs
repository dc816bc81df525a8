//! The Hopper backward kernel, attn_bwd_wgmma.cu: which calls it serves, its shared memory,
//! defines and tensor maps. [`crate::cuda::bwd::backward::backward_device`] launches it between the D
//! and dQ-conversion kernels that it shares with attn_bwd.
//!
//! One block per (128 keys, kv head, batch): a producer warp loads K and V once and the Q and
//! dO tiles of each step (64 query rows) by TMA; two consumer warpgroups of 64 keys each run
//! S^T, dP^T, dV, dK and dQ on `wgmma` (PTX ISA 9.0, 9.7.15), dK and dV in registers; two
//! writer warps add each consumer's dQ tile to the f32 workspace by a bulk reduction (in
//! descending key-block order when deterministic).
//!
//! Persistent variant ([`defines`]' `persistent`, `BWD_PERSISTENT`): [`persistent_grid`]
//! blocks, each taking the tiles (key block, kv head, batch) blockIdx.x first,
//! then those an atomic counter hands out, the next tile's K, V and first Q/dO stage loading
//! while the consumers finish the last (its dK, the dK and dV stores).

use crate::cuda::runtime::device::DeviceInfo;
use crate::cuda::runtime::tma::{TiledMap, TmaMap, bshd_map};
use crate::dtype::DType;
use crate::shape::AttnProblem;
use serde::Serialize;

/// Keys per block (two consumer warpgroups of 64).
pub const BC: usize = 128;
/// Environment variable that overrides the query rows per step for experiments (64 or 128;
/// 128 only at head_dim 64), read once per process.
pub const BR_ENV: &str = "FLASHATTN_BWD_WG_BR";

/// Query rows per step: 128 at head_dim 64 (halves the per-step costs: barriers, the dQ
/// tile's staging and reduction), 64 above (S^T, dP^T, dK, dV and dQ of 128 rows would not
/// fit a consumer's registers at the padded head_dim 128).
pub fn br(head_dim: usize) -> usize {
    let default = if padded_head_dim(head_dim) == Some(64) {
        128
    } else {
        64
    };
    // Read once per process: every size and map of a call must agree with the kernel's BR.
    static OVERRIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let over = *OVERRIDE.get_or_init(|| match std::env::var(BR_ENV).as_deref() {
        Ok("64") => Some(64),
        Ok("128") => Some(128),
        _ => None,
    });
    match over {
        Some(64) => 64,
        Some(128) if default == 128 => 128,
        _ => default,
    }
}
/// Threads per block: the producer warpgroup and two consumers.
pub const THREADS: u32 = 384;
/// Q/dO ring depth.
pub const STAGES: usize = 2;

/// Which backward kernel a call runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum BwdKernel {
    /// attn_bwd_wgmma where it serves the call (sm_90, head_dim 64 or 72..=128,
    /// TMA-describable strides; every mask and score modifier), else attn_bwd.
    #[default]
    Auto,
    /// attn_bwd (`mma.sync`) always.
    Mma,
    /// attn_bwd_wgmma, or an error saying why it cannot serve the call.
    Wgmma,
}

/// The head_dim attn_bwd_wgmma computes with: 64, or 128 for 72..=128 (TMA zero-fills the
/// channels past the real head_dim; they are never stored). `None` where it does not serve.
pub fn padded_head_dim(head_dim: usize) -> Option<usize> {
    match head_dim {
        64 => Some(64),
        72..=128 if head_dim.is_multiple_of(8) => Some(128),
        _ => None,
    }
}

/// Why attn_bwd_wgmma cannot serve a call (`None` when it can); the maps are checked at
/// launch ([`maps`]).
pub fn unsupported(info: &DeviceInfo, p: &AttnProblem) -> Option<String> {
    if info.compute_capability != (9, 0) {
        return Some(format!(
            "attn_bwd_wgmma needs sm_90 (wgmma, TMA); this device is {}",
            info.arch
        ));
    }
    if padded_head_dim(p.shape.head_dim).is_none() {
        return Some(format!(
            "attn_bwd_wgmma serves head_dim 64 and multiples of 8 in 72..=128, not {}",
            p.shape.head_dim
        ));
    }
    // (The persistent variant's, the larger by one mbarrier.)
    if smem_bytes(p.shape.head_dim, true) > info.smem_per_block_optin as usize {
        return Some(format!(
            "{} bytes of shared memory, the device allows {}",
            smem_bytes(p.shape.head_dim, true),
            info.smem_per_block_optin
        ));
    }
    None
}

/// Dynamic shared memory of a block (attn_bwd_wgmma.cu's layout: K, V; STAGES of Q and dO;
/// two dS tiles; the f32 dQ staging rows; STAGES of lse and D; the mbarriers, one more
/// (kv_empty) when `persistent`; four words of the consumers' hand-off to the dQ writers,
/// 16 bytes more (the tile number) when `persistent`; 1024 bytes to align the base for the
/// swizzle).
pub fn smem_bytes(head_dim: usize, persistent: bool) -> usize {
    let dp = padded_head_dim(head_dim).unwrap_or(128);
    let br = br(head_dim);
    let kv = 2 * BC * dp * 2;
    let qdo = 2 * STAGES * br * dp * 2;
    let ds = 2 * br * BC * 2;
    let dq = br * dp * 4;
    let ld = 2 * STAGES * br * 4;
    let bars = 1 + 2 * STAGES + usize::from(persistent);
    kv + qdo + ds + dq + ld + 8 * bars + 16 + 16 * usize::from(persistent) + 1024
}

/// The blocks of the persistent variant: one per tile up to one per SM (`sm_count`; the
/// kernel's shared memory allows one block per SM), at most `cap` where given (a smaller
/// grid gives every block more tiles: the check's way to change tiles on small problems).
/// At least 1. Every block is resident at once, which the deterministic mode's waits
/// need (attn_bwd_wgmma.cu). Block i takes tile i, then the tiles an atomic counter hands
/// out: one i32 after the deterministic counters ([`dq_order_len`]), zeroed by the host.
pub fn persistent_grid(tiles: u32, sm_count: i32, cap: Option<u32>) -> u32 {
    let sms = u32::try_from(sm_count).unwrap_or(1).max(1);
    tiles.min(sms).min(cap.unwrap_or(u32::MAX)).max(1)
}

/// Elements of the tiled f32 dQ workspace: per (batch, query head, step of BR rows), a tile
/// of BR rows x the padded head_dim (attn_bwd_wgmma.cu's `dq_tile_index`).
pub fn dq_accum_len(p: &AttnProblem) -> usize {
    let s = &p.shape;
    let dp = padded_head_dim(s.head_dim).unwrap_or(128);
    let br = br(s.head_dim);
    s.batch * s.heads_q * s.seqlen_q.div_ceil(br) * br * dp
}

/// Counters of the deterministic mode: one per dQ tile of the workspace (per batch, query
/// head, step of [`br`] rows and consumer half), zeroed by the host.
pub fn dq_order_len(p: &AttnProblem) -> usize {
    let s = &p.shape;
    s.batch * s.heads_q * s.seqlen_q.div_ceil(br(s.head_dim)) * 2
}

/// NVRTC defines of attn_bwd_wgmma (and of the D and dQ kernels in the same program);
/// `deterministic` adds the dQ tiles in a fixed order; `persistent` makes each block loop
/// over tiles ([`persistent_grid`] blocks).
pub fn defines(
    dtype: DType,
    p: &AttnProblem,
    deterministic: bool,
    persistent: bool,
) -> Vec<(String, String)> {
    let b = |x: bool| u8::from(x).to_string();
    let mut d = vec![
        ("HEAD_DIM".to_string(), p.shape.head_dim.to_string()),
        ("STAGES".to_string(), STAGES.to_string()),
        ("BWD_BR".to_string(), br(p.shape.head_dim).to_string()),
        ("IS_BF16".to_string(), b(dtype == DType::BF16)),
        ("IS_CAUSAL".to_string(), b(p.mask.is_causal())),
        ("DETERMINISTIC".to_string(), b(deterministic)),
        ("BWD_PERSISTENT".to_string(), b(persistent)),
    ];
    d.extend(crate::cuda::runtime::launch::score_defines(p));
    d
}

/// The device addresses the maps describe.
pub struct MapAddrs {
    /// q.
    pub q: u64,
    /// k.
    pub k: u64,
    /// v.
    pub v: u64,
    /// do (o's strides).
    pub d_o: u64,
}

/// The four tensor maps (q, k, v, do), boxes of 64 channels x [`br`] rows (q, do) or BC keys
/// (k, v), or why the copy engine cannot describe one (strides not multiples of 16 bytes).
pub fn maps(dtype: DType, p: &AttnProblem, a: &MapAddrs) -> Result<[TmaMap; 4], String> {
    let s = &p.shape;
    let d = s.head_dim;
    let qd = [d, s.seqlen_q, s.heads_q, s.batch];
    let kd = [d, s.seqlen_k, s.heads_kv, s.batch];
    let br = br(d) as u32;
    let m: [(&str, TiledMap); 4] = [
        ("q", bshd_map(dtype, a.q, qd, p.q_strides, br)),
        ("k", bshd_map(dtype, a.k, kd, p.k_strides, BC as u32)),
        ("v", bshd_map(dtype, a.v, kd, p.v_strides, BC as u32)),
        ("do", bshd_map(dtype, a.d_o, qd, p.o_strides, br)),
    ];
    let enc = |(name, map): &(&str, TiledMap)| map.encode().map_err(|e| format!("{name}: {e}"));
    Ok([enc(&m[0])?, enc(&m[1])?, enc(&m[2])?, enc(&m[3])?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_dims_and_shared_memory() {
        assert_eq!(padded_head_dim(64), Some(64));
        assert_eq!(padded_head_dim(72), Some(128));
        assert_eq!(padded_head_dim(128), Some(128));
        for d in [8, 40, 56, 68, 136, 256] {
            assert_eq!(padded_head_dim(d), None, "d{d}");
        }
        // d128: K, V 2 x 32 KB; Q, dO 2 stages x 16 KB each; dS 2 x 16 KB; dQ 64 x 128 f32;
        // lse, D 2 stages x 256 B; 5 mbarriers; the hand-off words; alignment.
        assert_eq!(
            smem_bytes(128, false),
            65536 + 65536 + 32768 + 64 * 128 * 4 + 1024 + 40 + 16 + 1024
        );
        // Persistent: kv_empty, one mbarrier more, and the tile number.
        assert_eq!(smem_bytes(128, true), smem_bytes(128, false) + 8 + 16);
        // d64 takes 128 rows per step: K, V 2 x 16 KB; Q, dO 2 x 2 x 16 KB; dS 2 x 32 KB; dQ
        // 128 x 64 f32; lse, D 2 x 2 x 512 B.
        assert_eq!(br(64), 128);
        assert_eq!(
            smem_bytes(64, false),
            32768 + 65536 + 65536 + 128 * 64 * 4 + 2048 + 40 + 16 + 1024
        );
        // Both fit the H100's and H200's 227 KB per block.
        assert!(smem_bytes(128, true) <= 227 * 1024 && smem_bytes(64, true) <= 227 * 1024);
    }

    #[test]
    fn persistent_grid_is_tiles_up_to_the_sms() {
        assert_eq!(persistent_grid(1000, 132, None), 132);
        assert_eq!(persistent_grid(40, 132, None), 40);
        assert_eq!(persistent_grid(1000, 132, Some(3)), 3);
        assert_eq!(persistent_grid(2, 132, Some(3)), 2);
        assert_eq!(persistent_grid(0, 132, None), 1);
        assert_eq!(persistent_grid(10, 0, None), 1);
    }
}
