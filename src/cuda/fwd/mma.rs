//! Launcher of attn_mma.cu: flash forward on Tensor Cores with `mma.sync.m16n8k16`; its tile
//! shapes per (arch, head_dim) and the tile-spec language of `--tile`.

use crate::cuda::runtime::device::Gpu;
use crate::cuda::runtime::launch::{
    FlashKernel, KernelKind, Launch, LaunchInfo, launch_flash, score_defines, sink_defines,
};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use serde::Serialize;
use std::fmt;

/// Tile shape of `attn_mma`: each of `nwarps` warps owns `16 * mt` query rows; K/V tiles hold
/// `bc` keys. Chosen per (arch, head_dim) by [`MmaTile::default_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct MmaTile {
    /// m16 tiles per warp (1 or 2): 2 halves shared-memory traffic for K and V fragments.
    pub mt: u32,
    /// Warps per block.
    pub nwarps: u32,
    /// Keys per K/V tile (multiple of 16).
    pub bc: u32,
    /// Keep Q's A fragments in registers for the whole loop.
    pub q_in_regs: bool,
    /// Let a row's running max go stale by up to 2^8 before O is rescaled (exact result;
    /// most key tiles then skip the rescale).
    pub lazy_rescale: bool,
    /// Write O through shared memory in coalesced 16-byte pieces.
    pub smem_epilogue: bool,
    /// Non-causal only: order blocks head by head so that resident blocks share K/V in L2.
    pub head_major: bool,
    /// Blocks per SM that ptxas must fit (`__launch_bounds__` minimum, 1..=8): caps registers
    /// at 64K / (threads × blocks) so that more warps share each scheduler.
    pub min_blocks: u32,
}

/// The optional flags of a tile spec, in their written order: (letter, define).
const TILE_FLAGS: [(&str, &str); 4] = [
    ("q", "Q_IN_REGS"),
    ("l", "RESCALE_SLACK"),
    ("e", "SMEM_EPILOGUE"),
    ("h", "HEAD_MAJOR"),
];

impl MmaTile {
    /// Query rows per block (`Br`).
    pub fn br(&self) -> u32 {
        16 * self.mt * self.nwarps
    }

    /// Dynamic shared memory in bytes: Q tile plus two stages of K and V, rows padded by one
    /// 16-byte chunk (see attn_mma.cu).
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let dp = head_dim.div_ceil(16) * 16;
        let row = (dp / 8 + 1) * 16;
        (self.br() as usize + 4 * self.bc as usize) * row
    }

    /// The measured default for an arch (compute capability) and head_dim; see
    /// docs/perf-notes.md. All keep registers at or under 255 with no spills (checked in CI).
    pub fn default_for(cc: (i32, i32), head_dim: usize) -> Self {
        let big_smem = matches!(cc, (8, 0) | (9, 0)); // 163/227 KB per block; others 99 KB
        let tile = |mt, nwarps, bc, q_in_regs| MmaTile {
            mt,
            nwarps,
            bc,
            q_in_regs,
            lazy_rescale: true,
            smem_epilogue: true,
            head_major: true,
            min_blocks: 1,
        };
        // The tightest register budgets below need rows of 16, 32, 64 or 128 halves with no
        // zero pad chunk: then every thread's K/V chunks share one column (attn_mma's fast
        // loads), and no chunk needs a bounds test (d56, padded to 64, spills 12 bytes at 168).
        let unpadded = head_dim >= 16 && head_dim.is_power_of_two();
        if head_dim <= 64 && cc == (9, 0) && unpadded {
            // Three blocks (12 warps) per SM instead of two: Q leaves the registers (168 per
            // thread, spill-free on sm_90 only) so that more warps hide the softmax latency.
            MmaTile {
                min_blocks: 3,
                ..tile(2, 4, 64, false)
            }
        } else if head_dim <= 64 {
            tile(2, 4, 64, true)
        } else if head_dim > 112 && head_dim <= 128 && big_smem {
            // Bc 64 halves the per-key softmax and barrier overhead; its 104 KB of shared
            // memory needs sm_80/sm_90, and the one-column K/V loads of 128-wide rows keep
            // ptxas from spilling (measured at d128 on sm_90; d120 compiles spill-free too).
            tile(2, 4, 64, false)
        } else if head_dim <= 128 {
            tile(2, 4, 32, false)
        } else if big_smem {
            tile(1, 4, 32, false)
        } else {
            tile(1, 4, 16, false)
        }
    }

    /// Parses `mt,nwarps,bc[,flag...]` with flags q (Q in registers), l (lazy rescale),
    /// e (shared-memory epilogue), h (head-major block order) and bN (at least N blocks per
    /// SM), e.g. `2,4,64` or `2,4,32,l,e,b2`.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] describing the expected form.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || AttnError::InvalidInput {
            what: format!(
                "tile '{s}': expected mt,nwarps,bc[,q][,l][,e][,h][,bN] with mt in 1..=4, nwarps in 1..=16, bc a multiple of 16 up to 128, N in 1..=8 and 32 * nwarps * N <= 2048 threads per SM"
            ),
        };
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let flags = parts.get(3..).unwrap_or_default();
        let min_blocks = |f: &str| f.strip_prefix('b').and_then(|n| n.parse::<u32>().ok());
        if parts.len() < 3
            || flags
                .iter()
                .any(|f| !TILE_FLAGS.iter().any(|(l, _)| l == f) && min_blocks(f).is_none())
        {
            return Err(bad());
        }
        let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
        let t = MmaTile {
            mt: num(parts[0])?,
            nwarps: num(parts[1])?,
            bc: num(parts[2])?,
            q_in_regs: flags.contains(&"q"),
            lazy_rescale: flags.contains(&"l"),
            smem_epilogue: flags.contains(&"e"),
            head_major: flags.contains(&"h"),
            min_blocks: flags.iter().find_map(|f| min_blocks(f)).unwrap_or(1),
        };
        let b_flags = flags.iter().filter(|f| min_blocks(f).is_some()).count();
        if !(1..=4).contains(&t.mt)
            || b_flags > 1
            || !(1..=8).contains(&t.min_blocks)
            // 2048 threads is the most an SM holds (sm_80/sm_90; 1536 on sm_86/89/120)
            || 32 * t.nwarps * t.min_blocks > 2048
            || !(1..=16).contains(&t.nwarps)
            || t.bc == 0
            || !t.bc.is_multiple_of(16)
            || t.bc > 128
        {
            return Err(bad());
        }
        Ok(t)
    }

    /// The flags set, in [`TILE_FLAGS`] order.
    fn flags(&self) -> [bool; 4] {
        [
            self.q_in_regs,
            self.lazy_rescale,
            self.smem_epilogue,
            self.head_major,
        ]
    }

    /// The `mt,nwarps,bc[,flag...]` form that [`Self::parse`] reads.
    pub fn spec(&self) -> String {
        let mut s = format!("{},{},{}", self.mt, self.nwarps, self.bc);
        for ((letter, _), on) in TILE_FLAGS.iter().zip(self.flags()) {
            if on {
                s.push(',');
                s.push_str(letter);
            }
        }
        if self.min_blocks > 1 {
            s.push_str(&format!(",b{}", self.min_blocks));
        }
        s
    }

    /// The tile when the kernel carries score modifiers or a packed variable-length batch
    /// (measured with ptxas): at most two blocks per SM, since three (168 registers) spill
    /// with a window, softcap and ALiBi at d64 and with packed batches; and with ALiBi above
    /// d64, Bc 32 instead of 64 (Bc 64 spills 8 bytes at d128 causal).
    pub fn with_headroom(self, head_dim: usize, alibi: bool) -> Self {
        let bc = if alibi && head_dim > 64 {
            self.bc.min(32)
        } else {
            self.bc
        };
        MmaTile {
            min_blocks: self.min_blocks.min(2),
            bc,
            ..self
        }
    }

    /// NVRTC defines for this tile.
    pub fn defines(&self, dtype: DType, head_dim: usize, causal: bool) -> Vec<(String, String)> {
        let mut d = vec![
            ("HEAD_DIM".to_string(), head_dim.to_string()),
            ("MT".to_string(), self.mt.to_string()),
            ("NWARPS".to_string(), self.nwarps.to_string()),
            ("BC".to_string(), self.bc.to_string()),
            (
                "IS_BF16".to_string(),
                u8::from(dtype == DType::BF16).to_string(),
            ),
            ("IS_CAUSAL".to_string(), u8::from(causal).to_string()),
        ];
        for ((_, define), on) in TILE_FLAGS.iter().zip(self.flags()) {
            if on {
                // The rescale slack is in log2 units: p = 2^(s - m) stays <= 256.
                let value = if *define == "RESCALE_SLACK" { "8" } else { "1" };
                d.push((define.to_string(), value.to_string()));
            }
        }
        d.push(("MIN_BLOCKS".to_string(), self.min_blocks.to_string()));
        d
    }
}

impl fmt::Display for MmaTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Br{}xBc{} ({}w x {}m16)",
            self.br(),
            self.bc,
            self.nwarps,
            self.mt
        )?;
        let names = [
            "Q in regs",
            "lazy rescale",
            "smem epilogue",
            "head-major grid",
        ];
        for (name, on) in names.iter().zip(self.flags()) {
            if on {
                write!(f, ", {name}")?;
            }
        }
        if self.min_blocks > 1 {
            write!(f, ", {} blocks/SM", self.min_blocks)?;
        }
        Ok(())
    }
}

/// Launches attn_mma with `tile`, or the arch's default ([`MmaTile::default_for`]).
///
/// # Errors
/// [`AttnError::TooLarge`] when the tile's shared memory exceeds the device's limit;
/// [`AttnError::Compile`]/[`AttnError::Cuda`] with the kernel name and shape.
pub fn launch(gpu: &Gpu, l: &Launch, tile: Option<MmaTile>) -> Result<LaunchInfo> {
    let packed = l.varlen.is_some();
    launch_flash(gpu, l, mma_kernel(gpu, l.dtype, l.problem, tile, packed))
}

/// attn_mma specialised for this problem: `tile`, or the arch's default.
pub(crate) fn mma_kernel(
    gpu: &Gpu,
    dtype: DType,
    p: &AttnProblem,
    tile: Option<MmaTile>,
    packed: bool,
) -> FlashKernel {
    let d = p.shape.head_dim;
    let tile = tile.unwrap_or_else(|| {
        let t = MmaTile::default_for(gpu.info().compute_capability, d);
        if p.scores.scores_unmodified() && !packed {
            t
        } else {
            t.with_headroom(d, p.scores.alibi.is_some())
        }
    });
    let mut defines = tile.defines(dtype, d, p.mask.is_causal());
    defines.extend(score_defines(p));
    defines.extend(sink_defines(p));
    if packed {
        defines.push(("IS_VARLEN".into(), "1".into()));
    }
    FlashKernel {
        kernel: KernelKind::Mma,
        source: KernelSource::AttnMma,
        function: "attn_mma",
        defines,
        br: tile.br(),
        nwarps: tile.nwarps,
        smem: tile.smem_bytes(d),
        config: Some(format!("{} ({tile})", tile.spec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tile_flag_parses_round_trips_and_defines() {
        for (letter, define) in TILE_FLAGS {
            let spec = format!("2,4,32,{letter}");
            let t = MmaTile::parse(&spec).unwrap();
            assert_eq!(t.spec(), spec);
            assert!(
                t.defines(DType::F16, 128, false)
                    .iter()
                    .any(|(k, _)| k == define),
                "{define}"
            );
        }
        let all = MmaTile::parse("1,8,64,q,l,e,h").unwrap();
        assert_eq!(all.spec(), "1,8,64,q,l,e,h");
        assert_eq!(all.min_blocks, 1);
        let b3 = MmaTile::parse("2,4,64,l,e,h,b3").unwrap();
        assert_eq!((b3.min_blocks, b3.spec().as_str()), (3, "2,4,64,l,e,h,b3"));
        assert!(
            b3.defines(DType::F16, 64, false)
                .contains(&("MIN_BLOCKS".to_string(), "3".to_string()))
        );
        assert!(b3.to_string().ends_with("3 blocks/SM"), "{b3}");
        for bad in [
            "2,4",
            "2,4,33",
            "0,4,32",
            "2,4,32,x",
            "2,4,32,q,z",
            "2,4,32,p", // the pipelined-fragments knob, removed (measured -2 to +3 %)
            "2,4,32,b0",
            "2,4,32,b9",
            "2,4,32,bx",
            "2,4,32,b2,b3",
            "1,16,64,b8",
        ] {
            assert!(MmaTile::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_follow_the_arch_and_head_dim() {
        let h200 = (9, 0);
        assert_eq!(MmaTile::default_for(h200, 64).spec(), "2,4,64,l,e,h,b3");
        assert_eq!(MmaTile::default_for(h200, 128).spec(), "2,4,64,l,e,h");
        // 40 pads to 48-wide rows (no fast loads) and 56 to 64 (a zero chunk): no three-block
        // budget for either.
        assert_eq!(MmaTile::default_for(h200, 40).spec(), "2,4,64,q,l,e,h");
        assert_eq!(MmaTile::default_for(h200, 56).spec(), "2,4,64,q,l,e,h");
        assert_eq!(MmaTile::default_for(h200, 32).spec(), "2,4,64,l,e,h,b3");
        assert_eq!(MmaTile::default_for((8, 0), 64).spec(), "2,4,64,q,l,e,h");
        // 99 KB of shared memory per block: Bc 64 at d128 (104 KB) does not fit.
        for cc in [(8, 6), (8, 9), (12, 0)] {
            let t = MmaTile::default_for(cc, 128);
            assert_eq!(t.spec(), "2,4,32,l,e,h");
            assert!(t.smem_bytes(128) <= 99 * 1024);
        }
    }
}
