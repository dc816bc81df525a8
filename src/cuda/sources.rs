//! Kernel sources, embedded in the binary, made self-contained for NVRTC.
//!
//! The `.cu` files under `kernels/` include `ptx.cuh`; NVRTC is given no include path, so the
//! include line is replaced by the header's text here.

/// The shared PTX wrappers.
pub const PTX_CUH: &str = include_str!("../../kernels/ptx.cuh");
/// What the attention kernels share (parameters, conversions, causal rule, block map).
pub const ATTN_COMMON_CUH: &str = include_str!("../../kernels/attn_common.cuh");
/// Headers a kernel may include, by the name in its `#include "..."` line.
const HEADERS: [(&str, &str); 2] = [("ptx.cuh", PTX_CUH), ("attn_common.cuh", ATTN_COMMON_CUH)];

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
}

impl KernelSource {
    /// Every source, for compile tests.
    pub const ALL: [KernelSource; 4] = [
        KernelSource::LayoutProbe,
        KernelSource::AttnNaive,
        KernelSource::AttnSimt,
        KernelSource::AttnMma,
    ];

    /// File stem, also the NVRTC program name.
    pub fn name(self) -> &'static str {
        match self {
            KernelSource::LayoutProbe => "layout_probe",
            KernelSource::AttnNaive => "attn_naive",
            KernelSource::AttnSimt => "attn_simt",
            KernelSource::AttnMma => "attn_mma",
        }
    }

    fn raw(self) -> &'static str {
        match self {
            KernelSource::LayoutProbe => include_str!("../../kernels/layout_probe.cu"),
            KernelSource::AttnNaive => include_str!("../../kernels/attn_naive.cu"),
            KernelSource::AttnSimt => include_str!("../../kernels/attn_simt.cu"),
            KernelSource::AttnMma => include_str!("../../kernels/attn_mma.cu"),
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
