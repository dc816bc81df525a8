//! Kernel sources, embedded in the binary, made self-contained for NVRTC.
//!
//! The `.cu` files under `kernels/` include `ptx.cuh`; NVRTC is given no include path, so the
//! include line is replaced by the header's text here.

/// The shared PTX wrappers.
pub const PTX_CUH: &str = include_str!("../../kernels/common/ptx.cuh");
/// What the attention kernels share (parameters, conversions, causal rule, score rules).
pub const ATTN_COMMON_CUH: &str = include_str!("../../kernels/common/attn_common.cuh");
/// The tile scheduler: which (query block, head, batch) a block or tile index takes.
pub const TILE_SCHEDULER_CUH: &str = include_str!("../../kernels/common/tile_scheduler.cuh");
/// The online softmax of one query row (running max and sum, the row's end).
pub const SOFTMAX_CUH: &str = include_str!("../../kernels/common/softmax.cuh");
/// The Hopper wrappers: TMA, mbarrier, wgmma ordering and descriptors, setmaxnreg.
pub const HOPPER_CUH: &str = include_str!("../../kernels/common/hopper.cuh");
/// The wgmma.mma_async wrappers (written by scripts/gen_wgmma_ops.py).
pub const WGMMA_OPS_CUH: &str = include_str!("../../kernels/common/wgmma_ops.cuh");
/// The e4m3 wgmma.mma_async wrappers (written by scripts/gen_wgmma_fp8_ops.py).
pub const WGMMA_FP8_OPS_CUH: &str = include_str!("../../kernels/common/wgmma_fp8_ops.cuh");
/// What the FP8 kernel and the probe share: P's e4m3 fragment, V^T's key order, the pre-pass.
pub const FP8_CUH: &str = include_str!("../../kernels/common/fp8.cuh");
/// Where key j of a sequence sits in a contiguous or paged KV cache.
pub const KV_CACHE_CUH: &str = include_str!("../../kernels/decode/kv_cache.cuh");
/// Rotary position embedding of new keys and queries (the decode and append kernels).
pub const ROTARY_CUH: &str = include_str!("../../kernels/decode/rotary.cuh");
/// What the two backward kernels share (parameters, D and dQ-conversion kernels, step ranges).
pub const BWD_COMMON_CUH: &str = include_str!("../../kernels/bwd/bwd_common.cuh");
/// attn_bwd's packed variable-length batches: each block's sequence as a batch entry of its own.
pub const BWD_VARLEN_CUH: &str = include_str!("../../kernels/bwd/bwd_varlen.cuh");
/// Headers a kernel may include, by the name in its `#include "..."` line.
const HEADERS: [(&str, &str); 12] = [
    ("wgmma_fp8_ops.cuh", WGMMA_FP8_OPS_CUH),
    ("fp8.cuh", FP8_CUH),
    ("bwd_common.cuh", BWD_COMMON_CUH),
    ("bwd_varlen.cuh", BWD_VARLEN_CUH),
    ("tile_scheduler.cuh", TILE_SCHEDULER_CUH),
    ("softmax.cuh", SOFTMAX_CUH),
    ("kv_cache.cuh", KV_CACHE_CUH),
    ("rotary.cuh", ROTARY_CUH),
    ("ptx.cuh", PTX_CUH),
    ("attn_common.cuh", ATTN_COMMON_CUH),
    ("hopper.cuh", HOPPER_CUH),
    ("wgmma_ops.cuh", WGMMA_OPS_CUH),
];

/// One kernel source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelSource {
    /// Single-warp fragment-layout experiment.
    LayoutProbe,
    /// S materialised in global memory, softmax, P V (three kernels).
    AttnNaive,
    /// Flash forward on CUDA cores.
    AttnSimt,
    /// Flash forward on Tensor Cores with `mma.sync`.
    AttnMma,
    /// Hopper flash forward: wgmma + TMA + warp specialisation (sm_90a only).
    AttnWgmma,
    /// Single-warpgroup wgmma/TMA layout experiments (sm_90a only).
    WgmmaProbe,
    /// The FP8 (e4m3) Hopper forward and its V^T pre-pass (sm_90a only).
    AttnWgmmaFp8,
    /// Copies into and out of a head_dim padded to a multiple of 8.
    PadRows,
    /// Decoding against a KV cache: split-KV, GQA-packed, contiguous or paged.
    AttnDecode,
    /// The exact merge of split-KV partial results.
    AttnCombine,
    /// Appends new key/value rows to a KV cache in place.
    KvAppend,
    /// A read-only pass over memory (the bandwidth ceiling of `bench --decode`).
    ReadPass,
    /// The backward pass: D = rowsum(do o), dK/dV/dQ on Tensor Cores, dQ to the element type.
    AttnBwd,
    /// The Hopper backward: wgmma + TMA + a producer warp (sm_90a only).
    AttnBwdWgmma,
    /// The gradient of a learnable sink, from the backward's D and the forward's lse.
    SinkGrad,
}

impl KernelSource {
    /// Every source, for compile tests.
    pub const ALL: [KernelSource; 15] = [
        KernelSource::AttnWgmmaFp8,
        KernelSource::LayoutProbe,
        KernelSource::AttnNaive,
        KernelSource::AttnSimt,
        KernelSource::AttnMma,
        KernelSource::AttnWgmma,
        KernelSource::WgmmaProbe,
        KernelSource::PadRows,
        KernelSource::AttnDecode,
        KernelSource::AttnCombine,
        KernelSource::KvAppend,
        KernelSource::ReadPass,
        KernelSource::AttnBwd,
        KernelSource::AttnBwdWgmma,
        KernelSource::SinkGrad,
    ];

    /// File stem, also the NVRTC program name.
    pub fn name(self) -> &'static str {
        match self {
            KernelSource::LayoutProbe => "layout_probe",
            KernelSource::AttnNaive => "attn_naive",
            KernelSource::AttnSimt => "attn_simt",
            KernelSource::AttnMma => "attn_mma",
            KernelSource::AttnWgmma => "attn_wgmma",
            KernelSource::WgmmaProbe => "wgmma_probe",
            KernelSource::AttnWgmmaFp8 => "attn_wgmma_fp8",
            KernelSource::PadRows => "pad_rows",
            KernelSource::AttnDecode => "attn_decode",
            KernelSource::AttnCombine => "attn_combine",
            KernelSource::KvAppend => "kv_append",
            KernelSource::ReadPass => "read_pass",
            KernelSource::AttnBwd => "attn_bwd",
            KernelSource::AttnBwdWgmma => "attn_bwd_wgmma",
            KernelSource::SinkGrad => "sink_grad",
        }
    }

    /// The NVRTC target for a device arch: the Hopper-only sources (`wgmma`, `setmaxnreg`)
    /// need the arch-specific `sm_90a` of an sm_90 device; the others the device's own arch.
    pub fn target(self, device_arch: &str) -> String {
        match self {
            KernelSource::AttnWgmma
            | KernelSource::WgmmaProbe
            | KernelSource::AttnBwdWgmma
            | KernelSource::AttnWgmmaFp8
                if device_arch == "sm_90" =>
            {
                "sm_90a".to_string()
            }
            _ => device_arch.to_string(),
        }
    }

    fn raw(self) -> &'static str {
        match self {
            KernelSource::LayoutProbe => include_str!("../../kernels/probe/layout_probe.cu"),
            KernelSource::AttnNaive => include_str!("../../kernels/ladder/attn_naive.cu"),
            KernelSource::AttnSimt => include_str!("../../kernels/ladder/attn_simt.cu"),
            KernelSource::AttnMma => include_str!("../../kernels/fwd/attn_mma.cu"),
            KernelSource::AttnWgmma => include_str!("../../kernels/fwd/attn_wgmma.cu"),
            KernelSource::WgmmaProbe => include_str!("../../kernels/probe/wgmma_probe.cu"),
            KernelSource::AttnWgmmaFp8 => include_str!("../../kernels/fwd/attn_wgmma_fp8.cu"),
            KernelSource::PadRows => include_str!("../../kernels/fwd/pad_rows.cu"),
            KernelSource::AttnDecode => include_str!("../../kernels/decode/attn_decode.cu"),
            KernelSource::AttnCombine => include_str!("../../kernels/decode/attn_combine.cu"),
            KernelSource::KvAppend => include_str!("../../kernels/decode/kv_append.cu"),
            KernelSource::ReadPass => include_str!("../../kernels/probe/read_pass.cu"),
            KernelSource::AttnBwd => include_str!("../../kernels/bwd/attn_bwd.cu"),
            KernelSource::AttnBwdWgmma => include_str!("../../kernels/bwd/attn_bwd_wgmma.cu"),
            KernelSource::SinkGrad => include_str!("../../kernels/bwd/sink_grad.cu"),
        }
    }

    /// The source with its `#include "ptx.cuh"` / `"attn_common.cuh"` lines expanded, ready
    /// for NVRTC.
    pub fn text(self) -> String {
        expand_includes(self.raw())
    }
}

fn expand_includes(src: &str) -> String {
    let mut out = String::with_capacity(src.len() + PTX_CUH.len());
    for line in src.lines() {
        let header = HEADERS.iter().find(|(name, _)| {
            line.trim_start().starts_with("#include") && line.contains(&format!("\"{name}\""))
        });
        if let Some((_, text)) = header {
            out.push_str(text);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}
