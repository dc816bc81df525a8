//! Launcher of attn_wgmma.cu: the Hopper flash forward (wgmma + TMA + warp specialisation).
//!
//! It serves compute capability 9.0 with head_dim 64..=256 (a multiple of 8) and any strides
//! the copy engine can describe; every other call runs attn_mma, and the returned
//! [`LaunchInfo`] names the kernel that ran and why. Tile choices and their reasons are in
//! [`WgmmaTile::default_for`]; docs/perf-notes.md has the measurements behind them.

use crate::cuda::runtime::device::{DeviceInfo, Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    FlashParams, KernelKind, Launch, LaunchInfo, launch_context, push_sink, score_defines,
    set_dynamic_smem, sink_defines,
};
use crate::cuda::runtime::tma::{TiledMap, TmaMap, bshd_map};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::shape::AttnProblem;
use cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use serde::Serialize;
use std::fmt;

/// Query rows per consumer warpgroup (one wgmma m64 row block).
pub const ROWS_PER_CONSUMER: u32 = 64;
/// The L2 a causal launch plans K and V of its resident heads into (MiB), of the H200's 50.
/// Measured (run 31, d128 causal, wgmma alone, 1k / 2k / 4k / 16k TFLOP/s): 0 (every head
/// longest-first) 318 / 352 / 465 / 550; 16: 360 / 417 / 512 / 558; 48: 334 / 406 / 497 / 554.
/// Smaller groups keep more of each head's K and V resident between its query blocks.
pub const CAUSAL_L2_MB: u32 = 16;
/// Shared memory per block the kernel may plan for (the sm_90 opt-in limit, 227 KB).
pub const SMEM_LIMIT: usize = 227 * 1024;
/// Environment variable that overrides the tile of every wgmma launch (`bc,stages[,flags]`,
/// or flags alone: [`WgmmaTile::with_spec`]): a knob for experiments, read at each launch.
pub const TILE_ENV: &str = "FLASHATTN_WGMMA_TILE";

/// The specialisation of attn_wgmma: padded head_dim, keys per K/V tile, pipeline depth,
/// pingpong scheduling and block order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct WgmmaTile {
    /// head_dim rounded up to 64, 96, 128, 192 or 256 (TMA zero-fills the channels past the
    /// real head_dim; they are never stored).
    pub head_dim: u32,
    /// Keys per K/V tile (`Bc`, a multiple of 16).
    pub bc: u32,
    /// K/V shared-memory stages.
    pub stages: u32,
    /// Consumers take turns to issue their wgmmas (FA3's pingpong).
    pub pingpong: bool,
    /// Non-causal: blocks ordered head by head (resident blocks share K/V in L2).
    pub head_major: bool,
    /// One block per SM looping over tiles (the next tile's loads overlap this one's end),
    /// instead of one block per tile.
    pub persistent: bool,
    /// Tiles after the first are handed out by an atomic counter (blocks that drew short
    /// causal tiles take more), instead of every grid-th tile. The counter is the launch
    /// stream's ([`crate::cuda::runtime::device::Gpu::tile_counter`]); without one (a CUDA graph capture, or more
    /// streams than counters) the same kernel takes every grid-th tile.
    pub dynamic: bool,
    /// Consumer warpgroups of 64 query rows: 2 (Br 128), or 3 (Br 192, d64 with Bc <= 128
    /// only: a consumer then has 160 registers).
    pub consumers: u32,
    /// Causal: blocks run longest-first within groups of heads whose K and V fit in this many
    /// MiB of L2 (0: longest-first over every head, which streams K and V from HBM).
    pub causal_l2_mb: u32,
    /// Persistent grid size cap (0: one block per SM). A knob for tests: with a few blocks,
    /// every block runs many tiles, so small problems exercise the tile hand-offs.
    pub max_blocks: u32,
    /// The diagnostics build that records a timeline ([`crate::cuda::fwd::wgmma_trace`]).
    pub trace: bool,
    /// The row sums of P on the Tensor Cores where they fit ([`Self::row_sums_in_pv`]): each V
    /// stage carries a sub-tile of ones, so P V (N = head_dim + 8) also sums P's rows and the
    /// softmax issues no FADD per score (flag `fsum`: summed by the softmax instead).
    pub rowsum_v: bool,
    /// The softmax skips the quad's two shuffle rounds (and the rescale factor's ex2) in a
    /// warp where every lane's own maximum of the key tile stays within the rescale slack of
    /// its row's running maximum: the exact path would keep the running maxima there too, so
    /// P is the same bit for bit. On by default except bf16 at d64 ([`Self::for_dtype`]; run
    /// 111: +1 % for f16, -0.4 % for bf16 d64); flags `spec` (on) and `nospec` (off).
    pub spec_max: bool,
}

impl WgmmaTile {
    /// The padded head_dim the kernel is compiled for, or `None` outside 64..=256.
    pub fn padded_head_dim(head_dim: usize) -> Option<u32> {
        match head_dim {
            64 => Some(64),
            65..=96 => Some(96),
            97..=128 => Some(128),
            129..=192 => Some(192),
            193..=256 => Some(256),
            _ => None,
        }
    }

    /// The default for a head_dim, for every seqlen_k and mask (`None` when the kernel does not
    /// serve the head_dim). Measured on the H200 (docs/perf-notes.md, runs 22-24 and 28):
    /// - d64: three consumers (Br 192, FA3's d64 shape), Bc 128, no pingpong: +1-12 % over two
    ///   consumers non-causal (1k-16k) and +5-10 % causal at 2k-16k. Causal at 1k lost 9 % (a
    ///   192-row diagonal tile wastes more) until each consumer skipped the key tiles its own
    ///   rows do not see and the consumers without a row stopped computing (run 113: +1-3 %
    ///   over two consumers there), so every length and mask now runs three.
    /// - Bc 128 up to 128 channels: S (64 f32 per thread) + O (<= 64) + P (32) fit a
    ///   consumer's 232 registers; two K/V stages, Q and an O tile fill 192 KB at d128. Bc 176
    ///   (FA3's d128 choice) was level at 16k and 5-13 % slower at 1k (its O tile no longer
    ///   fits, so the next Q waits for the store); 3 stages likewise; Bc 64 and 96 were slower
    ///   everywhere (causal 1k-4k too: 8-14 %, run 29; at d64 causal on three consumers that
    ///   run only their own key tiles, again 0.89-0.96 of Bc 128, run 120).
    /// - Bc 96 at 192 channels (O takes 96 registers) and Bc 64 at 256 (O takes 128; 192 KB).
    pub fn default_for(head_dim: usize) -> Option<Self> {
        let dp = Self::padded_head_dim(head_dim)?;
        let three = dp == 64;
        let bc = match dp {
            ..=128 => 128,
            192 => 96,
            _ => 64,
        };
        Some(WgmmaTile {
            head_dim: dp,
            bc,
            stages: 2,
            pingpong: !three,
            head_major: true,
            persistent: true,
            dynamic: true,
            consumers: if three { 3 } else { 2 },
            causal_l2_mb: CAUSAL_L2_MB,
            max_blocks: 0,
            trace: false,
            rowsum_v: true,
            spec_max: true,
        })
    }

    /// Query rows per block (`Br`).
    pub fn br(&self) -> u32 {
        ROWS_PER_CONSUMER * self.consumers
    }

    /// Threads per block: the producer warpgroup and the consumers.
    pub fn threads(&self) -> u32 {
        128 * (self.consumers + 1)
    }

    /// setmaxnreg targets (consumer, producer). The block's pool is what ptxas gives each
    /// thread at launch (64K / threads, a multiple of 8): 168 for 384 threads, where
    /// (2 * 232 + 40) * 128 = 64512 and 232 holds d256's 128 O accumulators plus S and P
    /// (the producer keeps 40: the tile scheduler's loop spilled at 24); 128 for 512, where
    /// (3 * 160 + 32) * 128 = 65536.
    pub fn registers(&self) -> (u32, u32) {
        if self.consumers == 3 {
            (160, 32)
        } else {
            (232, 40)
        }
    }

    /// Applies a
    /// `[bc,stages,][nopp][,nohm][,np][,static][,wg3][,trace][,fsum][,spec|nospec][,l2=MiB][,grid=N]`
    /// override (see [`TILE_ENV`]): no pingpong, no head-major order, not persistent, no tile
    /// counter, three consumers, the timeline build ([`crate::cuda::fwd::wgmma_trace`]), the row sums by
    /// the softmax (as before run 108), the speculative maxima on or off ([`Self::spec_max`]),
    /// the causal order's L2 budget (0: off), at most N persistent blocks (so that small
    /// problems run many tiles per block: a test knob). With `bc,stages` the tile is two
    /// consumers with pingpong unless the flags say otherwise; without them (a spec of flags
    /// only) the default tile of each call keeps its Bc, stages, consumers and pingpong, and only
    /// the flags change it.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] naming the expected form.
    pub fn with_spec(self, spec: &str) -> Result<Self> {
        let bad = || AttnError::InvalidInput {
            what: format!(
                "wgmma tile '{spec}': expected [bc,stages,]flags with flags from nopp, nohm, np, static, wg3, trace, fsum, spec, nospec, l2=MiB, grid=N; bc a multiple of 16 in 16..=256, stages in 2..=8, wg3 only at head_dim 64 with bc <= 128 or head_dim 96-128 with bc <= 64, MiB in 0..=1024 and N in 1..=4096"
            ),
        };
        let parts: Vec<&str> = spec.split(',').map(str::trim).collect();
        let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
        // A leading number starts the `bc,stages` form.
        let sized = parts[0].parse::<u32>().is_ok();
        if sized && parts.len() < 2 {
            return Err(bad());
        }
        let flags = if sized { &parts[2..] } else { &parts[..] };
        let valued = |key: &str| {
            flags
                .iter()
                .filter_map(|f| f.strip_prefix(key))
                .map(num)
                .next_back()
                .transpose()
        };
        let l2 = valued("l2=")?;
        let grid = valued("grid=")?;
        let has = |f: &str| flags.contains(&f);
        let (bc, stages, pingpong, consumers) = if sized {
            (num(parts[0])?, num(parts[1])?, true, 2)
        } else {
            (self.bc, self.stages, self.pingpong, self.consumers)
        };
        let t = WgmmaTile {
            bc,
            stages,
            pingpong: pingpong && !has("nopp"),
            head_major: !has("nohm"),
            persistent: !has("np"),
            dynamic: !has("static"),
            consumers: if has("wg3") { 3 } else { consumers },
            causal_l2_mb: l2.unwrap_or(self.causal_l2_mb),
            max_blocks: grid.unwrap_or(0),
            trace: has("trace"),
            rowsum_v: self.rowsum_v && !has("fsum"),
            spec_max: (self.spec_max || has("spec")) && !has("nospec"),
            ..self
        };
        const SWITCHES: [&str; 9] = [
            "nopp", "nohm", "np", "static", "wg3", "trace", "fsum", "spec", "nospec",
        ];
        const VALUED: [&str; 2] = ["l2=", "grid="];
        if flags
            .iter()
            .any(|f| !SWITCHES.contains(f) && !VALUED.iter().any(|k| f.starts_with(k)))
            || t.causal_l2_mb > 1024
            || grid.is_some_and(|g| !(1..=4096).contains(&g))
            || (t.consumers == 3 && !Self::three_consumers_fit(t.head_dim, t.bc))
            || t.bc == 0
            || !t.bc.is_multiple_of(16)
            || t.bc > 256
            || !(2..=8).contains(&t.stages)
        {
            return Err(bad());
        }
        Ok(t)
    }

    /// Three consumers have 160 registers each: S (bc/2), P (bc/4) and O (head_dim/2) fit
    /// without spills at d64 up to Bc 128 and at d96-d128 up to Bc 64 (ptxas, NVRTC 13.0;
    /// d128 Bc 80 spilled 24 bytes).
    fn three_consumers_fit(head_dim: u32, bc: u32) -> bool {
        (head_dim == 64 && bc <= 128) || (head_dim <= 128 && bc <= 64)
    }

    /// 64-channel sub-tiles (TMA boxes of 128-byte rows) per row.
    fn subtiles(&self) -> usize {
        self.head_dim.div_ceil(64) as usize
    }

    /// Q, the K and V stages, the O staging tile when it fits (see [`Self::o_own`]), 1 KB of
    /// alignment slack (the swizzle atoms are 1024-byte aligned) and the mbarriers: the
    /// dynamic shared memory attn_wgmma.cu lays out.
    pub fn smem_bytes(&self) -> usize {
        self.core_bytes() + if self.o_own() { self.q_bytes() } else { 0 } + self.slack_bytes()
    }

    fn q_bytes(&self) -> usize {
        self.br() as usize * self.subtiles() * 128
    }

    /// Q, then the K and V stages (a V stage one sub-tile longer with the row sums in P V).
    fn core_bytes(&self) -> usize {
        self.core_bytes_with(self.row_sums_in_pv())
    }

    fn core_bytes_with(&self, row_sums: bool) -> usize {
        let sub = self.bc as usize * 128;
        let v_subs = self.subtiles() + usize::from(row_sums);
        self.q_bytes() + self.stages as usize * sub * (self.subtiles() + v_subs)
    }

    /// The row sums run in P V ([`Self::rowsum_v`]) where the padded head_dim is a multiple of
    /// 64 (the ones sub-tile then starts at column head_dim: at d96 column 96 lies inside V's
    /// second TMA box, which TMA zero-fills; run 108), wgmma's N (head_dim + 8) is at most 256,
    /// and the ones sub-tiles neither push the O tile out of its own buffer nor the block past
    /// [`SMEM_LIMIT`]: d64, d128 and d192 with the default tiles.
    pub fn row_sums_in_pv(&self) -> bool {
        let fits = self.core_bytes_with(true) + self.slack_bytes() <= SMEM_LIMIT;
        self.rowsum_v
            && self.head_dim.is_multiple_of(64)
            && self.head_dim <= 192
            && fits
            && self.o_own_with(true) == self.o_own_with(false)
    }

    /// The tile for an element type: the row sums in P V for f16 only. They sum the 16-bit P
    /// that multiplies V, so `o` stays a convex combination, but `lse = m + ln(sum)` takes the
    /// rounding of P: at most 2^-11 relative (5e-4 in lse) for f16, 2^-9 (2e-3, the whole lse
    /// tolerance) for bf16, where run 108's check failed one ALiBi case by 2.4e-3. The
    /// speculative maxima are off for bf16 at d64, the one case where run 111 measured them
    /// slower (0.994-1.003 over eight cases).
    pub fn for_dtype(self, dtype: DType) -> Self {
        WgmmaTile {
            rowsum_v: self.rowsum_v && dtype == DType::F16,
            spec_max: self.spec_max && !(dtype == DType::BF16 && self.head_dim == 64),
            ..self
        }
    }

    /// Alignment slack and the mbarriers (q full/empty, 4 per stage) with the tile slot.
    fn slack_bytes(&self) -> usize {
        1024 + 8 * (3 + 4 * self.stages as usize)
    }

    /// O is staged in a buffer of its own (so the next tile's Q loads during this tile's end)
    /// when that fits in [`SMEM_LIMIT`]; else in the Q tile (attn_wgmma.cu `O_OWN`).
    pub fn o_own(&self) -> bool {
        self.o_own_with(self.row_sums_in_pv())
    }

    fn o_own_with(&self, row_sums: bool) -> bool {
        self.core_bytes_with(row_sums) + self.q_bytes() + self.slack_bytes() <= SMEM_LIMIT
    }

    /// NVRTC defines for this tile on a problem: [`Self::defines`], the problem's score
    /// modifiers and its sink.
    pub fn problem_defines(&self, dtype: DType, p: &AttnProblem) -> Vec<(String, String)> {
        let mut d = self.defines(dtype, p.mask.is_causal());
        d.extend(score_defines(p));
        d.extend(sink_defines(p));
        d
    }

    /// NVRTC defines for this tile.
    pub fn defines(&self, dtype: DType, causal: bool) -> Vec<(String, String)> {
        let b = |x: bool| u8::from(x).to_string();
        let mut d = vec![
            ("HEAD_DIM".into(), self.head_dim.to_string()),
            ("BC".into(), self.bc.to_string()),
            ("STAGES".into(), self.stages.to_string()),
            ("PINGPONG".into(), b(self.pingpong)),
            ("HEAD_MAJOR".into(), b(self.head_major)),
            ("IS_BF16".into(), b(dtype == DType::BF16)),
            ("IS_CAUSAL".into(), b(causal)),
            ("CONSUMERS".into(), self.consumers.to_string()),
            ("CONSUMER_REGS".into(), self.registers().0.to_string()),
            ("PRODUCER_REGS".into(), self.registers().1.to_string()),
            ("SMEM_LIMIT".into(), SMEM_LIMIT.to_string()),
            ("DYNAMIC".into(), b(self.dynamic)),
            ("CAUSAL_L2_MB".into(), self.causal_l2_mb.to_string()),
        ];
        // Only when asked: the default defines (and module cache keys) stay as they were.
        if self.trace {
            d.push(("TRACE".into(), "1".into()));
        }
        if !self.row_sums_in_pv() {
            d.push(("ROWSUM_V".into(), "0".into()));
        }
        if self.spec_max {
            d.push(("SPEC_MAX".into(), "1".into()));
        }
        d
    }
}

impl fmt::Display for WgmmaTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Br{}xBc{} d{} ({} stages{}{}{}{})",
            self.br(),
            self.bc,
            self.head_dim,
            self.stages,
            if self.pingpong { ", pingpong" } else { "" },
            if self.head_major {
                ", head-major grid"
            } else {
                ""
            },
            if self.row_sums_in_pv() {
                ", row sums in P V"
            } else {
                ""
            },
            if self.spec_max {
                ", speculative maxima"
            } else {
                ""
            }
        )
    }
}

/// The tile a launch on this problem and element type uses: the default, or the [`TILE_ENV`]
/// override.
///
/// # Errors
/// A malformed override.
pub fn tile_for(p: &AttnProblem, dtype: DType) -> Result<Option<WgmmaTile>> {
    let Some(t) = WgmmaTile::default_for(p.shape.head_dim) else {
        return Ok(None);
    };
    let mut t = t.for_dtype(dtype);
    if p.scores.softcap.is_some() || p.scores.alibi.is_some() {
        // Three d64 consumers have 160 registers each: softcap spills there (ptxas), two
        // consumers with pingpong do not.
        t.consumers = 2;
        t.pingpong = true;
    }
    match std::env::var(TILE_ENV) {
        Ok(spec) if !spec.trim().is_empty() => t.with_spec(&spec).map(Some),
        _ => Ok(Some(t)),
    }
}

/// Why attn_wgmma cannot serve this problem on this device (`None` when it can), before any
/// pointer is known. Strides and addresses are checked again when the tensor maps are built.
pub fn unsupported(info: &DeviceInfo, p: &AttnProblem) -> Option<String> {
    if info.compute_capability != (9, 0) {
        return Some(format!(
            "it needs sm_90 (Hopper: wgmma, TMA); this GPU is {}",
            info.arch
        ));
    }
    let d = p.shape.head_dim;
    let Some(tile) = WgmmaTile::default_for(d) else {
        return Some(format!(
            "head_dim {d} is outside 64..=256 (its TMA rows hold 64 channels; below 64 mma is the better fit)"
        ));
    };
    if tile.smem_bytes() > info.smem_per_block_optin as usize {
        return Some(format!(
            "it needs {} bytes of shared memory per block, the device allows {}",
            tile.smem_bytes(),
            info.smem_per_block_optin
        ));
    }
    None
}

/// attn_wgmma's kernel parameters: four tensor maps, the shared [`FlashParams`], and the tile
/// counter (kernels/fwd/attn_wgmma.cu `WgmmaParams`, same order and alignment).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
struct WgmmaParams {
    tq: TmaMap,
    tk: TmaMap,
    tv: TmaMap,
    to: TmaMap,
    p: FlashParams,
    tile_counter: u64,
    trace: u64,
}
// SAFETY: plain old data with C layout, mirrored by the kernel's struct.
unsafe impl DeviceRepr for WgmmaParams {}

/// The four tensor maps of a launch, or why the copy engine cannot describe one of them.
fn maps(l: &Launch, tile: &WgmmaTile) -> std::result::Result<[TmaMap; 4], String> {
    let p = l.problem;
    let s = &p.shape;
    let d = s.head_dim;
    let q = bshd_map(
        l.dtype,
        l.q,
        [d, s.seqlen_q, s.heads_q, s.batch],
        p.q_strides,
        tile.br(),
    );
    let k = bshd_map(
        l.dtype,
        l.k,
        [d, s.seqlen_k, s.heads_kv, s.batch],
        p.k_strides,
        tile.bc,
    );
    let v = bshd_map(
        l.dtype,
        l.v,
        [d, s.seqlen_k, s.heads_kv, s.batch],
        p.v_strides,
        tile.bc,
    );
    let o = bshd_map(
        l.dtype,
        l.o,
        [d, s.seqlen_q, s.heads_q, s.batch],
        p.o_strides,
        ROWS_PER_CONSUMER,
    );
    let enc = |name: &str, m: &TiledMap| m.encode().map_err(|e| format!("{name}: {e}"));
    Ok([enc("q", &q)?, enc("k", &k)?, enc("v", &v)?, enc("o", &o)?])
}

/// Launches attn_wgmma, or attn_mma (with the reason in [`LaunchInfo::why`]) for a call it
/// cannot serve.
///
/// # Errors
/// A malformed [`TILE_ENV`] override; [`AttnError::Compile`]/[`AttnError::Cuda`] with the
/// kernel name and shape; the errors of [`crate::cuda::fwd::mma::launch`] when it hands the call on.
pub fn launch(gpu: &Gpu, l: &Launch) -> Result<LaunchInfo> {
    let hand_on = |why: String| -> Result<LaunchInfo> {
        let mut info = crate::cuda::fwd::mma::launch(gpu, l, None)?;
        info.why = format!("wgmma cannot serve this call: {why}");
        Ok(info)
    };
    if let Some(why) = unsupported(gpu.info(), l.problem) {
        return hand_on(why);
    }
    let Some(tile) = tile_for(l.problem, l.dtype)? else {
        return hand_on("no tile for this head_dim".into());
    };
    // This stream's scheduler counter; without one (a graph capture, or every slot held by
    // other streams) the same kernel takes the static order.
    let tile_counter = if tile.dynamic {
        gpu.tile_counter()
    } else {
        None
    };
    let [tq, tk, tv, to] = match maps(l, &tile) {
        Ok(m) => m,
        Err(why) => return hand_on(format!("the copy engine cannot describe {why}")),
    };
    let p = l.problem;
    let k = gpu.kernel(
        KernelSource::AttnWgmma,
        "attn_wgmma",
        &tile.problem_defines(l.dtype, p),
    )?;
    let ctx = launch_context("attn_wgmma", p);
    let smem = tile.smem_bytes();
    set_dynamic_smem(&k.function, smem, &ctx)?;
    let br = tile.br();
    let fp = FlashParams::new(l, br);
    let tiles = fp.scheduled_tiles("attn_wgmma", br)?;
    let blocks = if tile.persistent {
        let cap = match tile.max_blocks {
            0 => gpu.info().sm_count.max(1) as u32,
            n => n,
        };
        tiles.min(cap)
    } else {
        tiles
    };
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (tile.threads(), 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let stream = gpu.stream();
    let trace_buf = if tile.trace {
        let n = crate::cuda::fwd::wgmma_trace::buffer_len(tile.consumers, blocks);
        Some(
            stream
                .alloc_zeros::<u32>(n)
                .map_err(cuda_err(ctx.clone()))?,
        )
    } else {
        None
    };
    let trace_ptr = trace_buf.as_ref().map(|t| t.device_ptr(stream));
    let params = WgmmaParams {
        tq,
        tk,
        tv,
        to,
        p: fp,
        tile_counter: tile_counter.unwrap_or(0),
        trace: trace_ptr.as_ref().map_or(0, |(ptr, _)| *ptr),
    };
    let mut b = stream.launch_builder(&k.function);
    b.arg(&params);
    push_sink(&mut b, l)?;
    // SAFETY: the parameters mirror the kernel's struct (and its sink parameter, with a
    // sink: heads_q logits); forward_device checked every buffer
    // against the shape and strides; the tensor maps describe exactly those buffers, and the
    // copy engine neither reads nor writes outside them; with DYNAMIC the counter is this
    // stream's live pair of u32 (zero: every launch before it on the stream zeroed it); the
    // trace buffer, when there is one, holds buffer_len elements, the kernel's extent.
    unsafe { b.launch(cfg) }.map_err(cuda_err(ctx.clone()))?;
    drop(trace_ptr);
    if let Some(buf) = trace_buf {
        let data = stream.clone_dtoh(&buf).map_err(cuda_err(ctx.clone()))?;
        crate::cuda::fwd::wgmma_trace::write(&tile.to_string(), tile.consumers, blocks, &data)?;
    }
    Ok(LaunchInfo {
        kernel: KernelKind::Wgmma,
        why: "asked for (sm_90)".into(),
        config: Some(if tile.dynamic && tile_counter.is_none() {
            format!("{tile} (static order: no scheduler counter for this stream)")
        } else {
            tile.to_string()
        }),
        registers: k.stats.registers,
        spill_bytes: k.stats.spill_stores,
        smem_bytes: smem,
    })
}

/// Compiles and loads the module a wgmma launch on this problem will use (or mma's, when
/// wgmma would hand the call on).
///
/// # Errors
/// As [`launch`], before any launch.
pub fn prepare(gpu: &Gpu, p: &AttnProblem, dtype: DType) -> Result<bool> {
    if unsupported(gpu.info(), p).is_some() {
        return Ok(false);
    }
    let Some(tile) = tile_for(p, dtype)? else {
        return Ok(false);
    };
    gpu.kernel(
        KernelSource::AttnWgmma,
        "attn_wgmma",
        &tile.problem_defines(dtype, p),
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_matches_the_kernel() {
        // 4 maps of 128 bytes, Params (224 bytes), the counter (16), rounded up to 64 bytes.
        assert_eq!(std::mem::size_of::<FlashParams>(), 224);
        assert_eq!(std::mem::size_of::<WgmmaParams>(), 768);
        assert_eq!(std::mem::align_of::<WgmmaParams>(), 64);
    }

    #[test]
    fn head_dims_and_tiles() {
        for d in [8, 32, 56, 264] {
            assert_eq!(WgmmaTile::default_for(d), None, "{d}");
        }
        let pad: Vec<(usize, u32)> = [64, 72, 96, 104, 128, 136, 192, 200, 256]
            .iter()
            .map(|&d| (d, WgmmaTile::padded_head_dim(d).unwrap()))
            .collect();
        assert_eq!(
            pad,
            [
                (64, 64),
                (72, 96),
                (96, 96),
                (104, 128),
                (128, 128),
                (136, 192),
                (192, 192),
                (200, 256),
                (256, 256)
            ]
        );
        for d in (64..=256).step_by(8) {
            let t = WgmmaTile::default_for(d).unwrap();
            assert!(t.smem_bytes() <= 227 * 1024, "d{d}: {}", t.smem_bytes());
        }
        let t64 = WgmmaTile::default_for(64).unwrap();
        assert_eq!((t64.consumers, t64.bc, t64.pingpong), (3, 128, false));
        let t = WgmmaTile::default_for(128).unwrap();
        // Q + 2 stages of K and V (each V with its ones sub-tile) + its own O tile + slack and
        // 10 mbarriers.
        assert!(t.o_own());
        assert_eq!(
            t.smem_bytes(),
            32768 + 4 * 32768 + 2 * 16384 + 32768 + 1024 + 88
        );
        let g = t.with_spec("128,2,grid=3").unwrap();
        assert_eq!((g.max_blocks, g.smem_bytes()), (3, t.smem_bytes()));
        assert!(t.with_spec("128,2,grid=0").is_err() && t.with_spec("128,2,grid=x").is_err());
        // d256: O goes through the Q tile (64 KB more would not fit).
        let t256 = WgmmaTile::default_for(256).unwrap();
        assert!(!t256.o_own());
        assert_eq!(t256.smem_bytes(), 65536 + 4 * 32768 + 1024 + 88);
        let o = t.with_spec("176,2,nopp,np,static").unwrap();
        assert_eq!(
            (
                o.bc,
                o.stages,
                o.pingpong,
                o.head_major,
                o.persistent,
                o.dynamic
            ),
            (176, 2, false, true, false, false)
        );
        let w3 = t64.with_spec("128,2,wg3").unwrap();
        assert_eq!((w3.consumers, w3.br(), w3.threads()), (3, 192, 512));
        let (c, p) = w3.registers();
        assert!((3 * c + p) * 128 <= 65536);
        assert!(t64.with_spec("192,2,wg3").is_err());
        // d128: three consumers up to Bc 64 (160 registers each).
        assert!(t.with_spec("64,2,wg3").is_ok() && t.with_spec("80,2,wg3").is_err());
        assert_eq!(t64.causal_l2_mb, CAUSAL_L2_MB);
        assert_eq!(t64.with_spec("128,2,l2=0").unwrap().causal_l2_mb, 0);
        assert_eq!(t64.with_spec("128,2,l2=16,nopp").unwrap().causal_l2_mb, 16);
        assert!(t64.with_spec("128,2,l2=x").is_err());
        assert!(t64.with_spec("128,2,l2=2000").is_err());
        // Flags alone keep each call's default shape.
        let w3d = WgmmaTile::default_for(64).unwrap();
        // The timeline build: one define more, and only when asked for.
        let traced = w3d.with_spec("trace").unwrap();
        assert_eq!(traced, WgmmaTile { trace: true, ..w3d });
        let has_trace = |t: &WgmmaTile| {
            t.defines(DType::F16, false)
                .iter()
                .any(|(k, _)| k == "TRACE")
        };
        assert!(has_trace(&traced) && !has_trace(&w3d));
        // J's packing (P packed inside the softmax, `split`: measured 0-2 % slower, run 108)
        // is gone: its flag is refused.
        assert!(w3d.with_spec("split").is_err());
        let define = |t: &WgmmaTile, key: &str| {
            t.defines(DType::F16, false)
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        // The maxima kept without the quad's shuffles: on by default, off for bf16 at d64
        // (run 111) and under `nospec`, forced on by `spec`; one define when on.
        let off = w3d.with_spec("nospec").unwrap();
        assert!(w3d.spec_max && !off.spec_max);
        assert_eq!(define(&w3d, "SPEC_MAX").as_deref(), Some("1"));
        assert_eq!(define(&off, "SPEC_MAX"), None);
        let bf = w3d.for_dtype(DType::BF16);
        assert!(!bf.spec_max && bf.with_spec("spec").unwrap().spec_max);
        assert!(t.for_dtype(DType::BF16).spec_max && t.for_dtype(DType::F16).spec_max);
        // The row sums in P V: a ones sub-tile per V stage; the O tile still fits at d128; not
        // at d256 (N would be 264), nor where the block would not fit (Bc 176), nor where the
        // ones would push O into the Q tile (Bc 144).
        let fsum = t.with_spec("fsum").unwrap();
        assert!(t.row_sums_in_pv() && !fsum.row_sums_in_pv());
        assert_eq!(define(&fsum, "ROWSUM_V").as_deref(), Some("0"));
        assert_eq!(define(&t, "ROWSUM_V"), None);
        assert_eq!(t.smem_bytes(), fsum.smem_bytes() + 2 * 128 * 128);
        assert!(!t256.row_sums_in_pv());
        assert!(!t.with_spec("176,2").unwrap().row_sums_in_pv());
        let t144 = t.with_spec("144,2").unwrap();
        assert!(!t144.row_sums_in_pv() && t144.o_own());
        for d in [64, 128, 192] {
            let t = WgmmaTile::default_for(d).unwrap();
            assert!(t.row_sums_in_pv(), "d{d}");
            assert!(!t.for_dtype(DType::BF16).row_sums_in_pv(), "d{d} bf16");
            assert_eq!(t.for_dtype(DType::F16), t);
        }
        assert!(!WgmmaTile::default_for(96).unwrap().row_sums_in_pv());
        assert_eq!(
            crate::cuda::fwd::wgmma_trace::buffer_len(traced.consumers, 132),
            132 * 8 * 4 * crate::cuda::fwd::wgmma_trace::SLOTS
        );
        assert_eq!(
            w3d.with_spec("grid=2").unwrap(),
            WgmmaTile {
                max_blocks: 2,
                ..w3d
            }
        );
        let l = w3d.with_spec("nohm,l2=8").unwrap();
        assert_eq!(
            (l.consumers, l.pingpong, l.head_major, l.causal_l2_mb),
            (3, false, false, 8)
        );
        for bad in [
            "176",
            "100,2",
            "128,1",
            "128,2,x",
            "272,2",
            "128,2,wg3",
            "x",
            "grid=2,9",
        ] {
            assert!(t.with_spec(bad).is_err(), "{bad}");
        }
    }
}
