//! Launcher of attn_wgmma_fp8.cu: the FP8 (e4m3) Hopper forward, FlashAttention-3 style (q, k,
//! v in [`E4m3`] with [`Fp8Descales`], f32 accumulation, `o` bf16, `lse` f32).
//!
//! Each call runs two kernels on the GPU's stream: the V^T pre-pass (`fp8_v_transpose`, V
//! transposed and key-permuted into a scratch buffer of `batch * heads_kv * head_dim * sk_pad`
//! bytes, `sk_pad` = seqlen_k rounded up to 64; wgmma takes 8-bit B operands K-major only), then
//! `attn_wgmma_fp8`. It serves compute capability 9.0, head_dim 64 and 128, no mask or causal;
//! everything else is refused with a typed error ([`unsupported`]).

use crate::cuda::fwd::attention::{HostRun, host_round_trip};
use crate::cuda::runtime::args::{check_aligned, check_contexts, device_ptrs};
use crate::cuda::runtime::device::{DeviceInfo, Gpu, cuda_err};
use crate::cuda::runtime::launch::{
    FlashParams, KernelKind, Launch, LaunchInfo, launch_context, set_dynamic_smem,
};
use crate::cuda::runtime::tma::{TiledMap, TmaMap};
use crate::cuda::sources::KernelSource;
use crate::dtype::DType;
use crate::error::{AttnError, Result};
use crate::fp8::{Descale, E4m3, Fp8Descales};
use crate::shape::{AttnProblem, Strides};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use half::bf16;
use std::sync::Arc;

// SAFETY: E4m3 is a transparent u8; every bit pattern (zero included) is a value.
unsafe impl DeviceRepr for E4m3 {}
// SAFETY: as above: 0x00 is +0.0.
unsafe impl ValidAsZeroBits for E4m3 {}

/// Query rows per block (two consumer warpgroups of 64).
pub const BR: u32 = 128;
/// Keys per K/V tile.
pub const BC: u32 = 128;
/// K/V stages.
pub const STAGES: u32 = 2;
/// Keys per block of the V^T pre-pass (fp8.cuh `VT_KEYS`); V^T rows are padded to a multiple.
pub const VT_KEYS: usize = 64;
/// Head dims the kernel is compiled for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];
/// The causal order's L2 budget (MiB), as attn_wgmma's.
const CAUSAL_L2_MB: u32 = crate::cuda::fwd::wgmma::CAUSAL_L2_MB;

/// Shared memory of a block at `head_dim`: Q (BR rows of 128 bytes), the K and V^T stages (V^T
/// one KB longer: the ones rows), the bf16 O tile, 1 KB of alignment slack, the mbarriers and
/// the tile slots (attn_wgmma_fp8.cu `Smem`).
pub fn smem_bytes(head_dim: usize) -> usize {
    let (br, bc, st) = (BR as usize, BC as usize, STAGES as usize);
    br * 128 + st * (bc * 128 + head_dim * 128 + 1024) + br * head_dim * 2 + 1024 + 8 * (3 + 4 * st)
}

/// The NVRTC defines of the kernel for a problem.
pub fn defines(p: &AttnProblem) -> Vec<(String, String)> {
    let flag = |b: bool| if b { "1" } else { "0" }.to_string();
    vec![
        ("HEAD_DIM".into(), p.shape.head_dim.to_string()),
        ("BC".into(), BC.to_string()),
        ("STAGES".into(), STAGES.to_string()),
        ("IS_CAUSAL".into(), flag(p.mask.is_causal())),
        ("HEAD_MAJOR".into(), "1".into()),
        ("DYNAMIC".into(), "1".into()),
        ("CAUSAL_L2_MB".into(), CAUSAL_L2_MB.to_string()),
    ]
}

/// Why the FP8 kernel cannot take this problem on this device, as the typed error to return
/// (`None` when it can).
pub fn unsupported(info: &DeviceInfo, p: &AttnProblem) -> Option<AttnError> {
    if info.compute_capability != (9, 0) {
        return Some(AttnError::UnsupportedFeature {
            feature: "FP8 (e4m3) attention".into(),
            backend: format!("the CUDA backend on {} ({})", info.name, info.arch),
            hint: "it needs sm_90 (Hopper: wgmma with e4m3 operands); run it on the CPU backend (flashattn::forward_fp8 with BackendChoice::Cpu or Auto)".into(),
        });
    }
    let d = p.shape.head_dim;
    if !HEAD_DIMS.contains(&d) {
        return Some(AttnError::UnsupportedHeadDim {
            head_dim: d,
            backend: "attn_wgmma_fp8".into(),
            supported: "64, 128 (or the CPU backend, any head_dim)".into(),
        });
    }
    let m = &p.scores;
    let feature = [
        (!m.window.is_unbounded(), "a sliding window"),
        (m.softcap.is_some(), "softcap"),
        (m.alibi.is_some(), "ALiBi"),
        (m.sink.is_some(), "a learnable sink"),
    ]
    .into_iter()
    .find(|(on, _)| *on);
    if let Some((_, f)) = feature {
        return Some(AttnError::UnsupportedFeature {
            feature: f.into(),
            backend: "attn_wgmma_fp8".into(),
            hint:
                "the FP8 kernel takes no mask or causal only: use the CPU backend, or 16-bit inputs"
                    .into(),
        });
    }
    if smem_bytes(d) > info.smem_per_block_optin as usize {
        return Some(AttnError::TooLarge {
            kernel: "attn_wgmma_fp8",
            reason: format!(
                "it needs {} bytes of shared memory per block, the device allows {}",
                smem_bytes(d),
                info.smem_per_block_optin
            ),
        });
    }
    None
}

/// attn_wgmma_fp8.cu `Fp8Params` (same order and alignment).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
struct Fp8Params {
    tq: TmaMap,
    tk: TmaMap,
    tv: TmaMap,
    to: TmaMap,
    p: FlashParams,
    tile_counter: u64,
    descale: u64,
    q_descale: f32,
    k_descale: f32,
    v_descale: f32,
    descale_per_head: i32,
    heads_kv: i32,
}
// SAFETY: plain old data with C layout, mirrored by the kernel's struct.
unsafe impl DeviceRepr for Fp8Params {}

/// The V^T pre-pass's parameters (fp8.cuh `VtParams`, same order and types): V (e4m3, bshd
/// through its strides) read, V^T (`batch * heads_kv * head_dim * sk_pad` bytes) written.
/// Shared by [`forward_device`] and the probe's copy of the pre-pass (`wg_probe_fp8_vt`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VtParams {
    v: u64,
    vt: u64,
    v_sb: i64,
    v_ss: i64,
    v_sh: i64,
    seqlen_k: i32,
    sk_pad: i32,
    head_dim: i32,
    heads_kv: i32,
}
// SAFETY: plain old data with C layout, mirrored by the kernel's struct.
unsafe impl DeviceRepr for VtParams {}

impl VtParams {
    /// The pre-pass of V at device address `v` (element strides `v_strides`, `seqlen_k` keys,
    /// `heads_kv` heads of `head_dim` channels) into V^T at `vt`, rows padded to [`sk_pad`].
    pub fn new(
        v: u64,
        vt: u64,
        v_strides: Strides,
        seqlen_k: usize,
        head_dim: usize,
        heads_kv: usize,
    ) -> Self {
        VtParams {
            v,
            vt,
            v_sb: v_strides.batch as i64,
            v_ss: v_strides.seq as i64,
            v_sh: v_strides.head as i64,
            seqlen_k: seqlen_k as i32,
            sk_pad: sk_pad(seqlen_k) as i32,
            head_dim: head_dim as i32,
            heads_kv: heads_kv as i32,
        }
    }

    /// Launches `function` (`fp8_v_transpose` or the probe's copy) on these parameters over
    /// `batch` sequences: a block of 256 threads per [`VT_KEYS`] keys of one (batch, kv head).
    ///
    /// # Safety
    /// V must hold every element its strides address for `batch` sequences, and V^T
    /// `batch * heads_kv * head_dim * sk_pad` bytes; each block writes its [`VT_KEYS`] key
    /// positions of `head_dim` rows of one (batch, kv head) only.
    ///
    /// # Errors
    /// The driver's launch error.
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        function: &CudaFunction,
        batch: usize,
    ) -> std::result::Result<(), DriverError> {
        let mut b = stream.launch_builder(function);
        b.arg(self);
        let cfg = LaunchConfig {
            grid_dim: (
                self.sk_pad as u32 / VT_KEYS as u32,
                self.heads_kv as u32,
                batch as u32,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller's (above).
        unsafe { b.launch(cfg) }.map(|_| ())
    }
}

/// `seqlen_k` rounded up to the pre-pass's 64 keys: V^T's row length in bytes.
pub fn sk_pad(seqlen_k: usize) -> usize {
    seqlen_k.div_ceil(VT_KEYS) * VT_KEYS
}

/// A bshd map of one-byte elements (q, k) with a box of 128 channels: at d64 the box's upper
/// half lies past head_dim and TMA zero-fills it (the kernel never reads it).
fn byte_map(addr: u64, dims: [usize; 4], st: Strides, rows: u32) -> Result<TmaMap, String> {
    TiledMap {
        dtype: DType::F16, // unused by encode_bytes
        addr,
        dims: dims.iter().map(|&x| x as u64).collect(),
        strides: vec![st.seq as u64, st.head as u64, st.batch as u64],
        boxes: vec![128, rows, 1, 1],
    }
    .encode_bytes()
}

/// The device descales: the per-(batch, kv head) factors uploaded as `[q | k | v]`, each
/// `batch * heads_kv` long (a tensor-wide factor repeated), or `None` when all three are
/// tensor-wide (passed by value).
fn descale_buffer(gpu: &Gpu, p: &AttnProblem, d: &Fp8Descales) -> Result<Option<CudaSlice<f32>>> {
    if !d.per_head() {
        return Ok(None);
    }
    if gpu.capturing() {
        return Err(AttnError::InvalidInput {
            what: "per-(batch, kv head) descales are copied from host memory, which a CUDA graph capture cannot record: call outside the capture, or pass per-tensor descales".into(),
        });
    }
    let n = p.shape.batch * p.shape.heads_kv;
    let mut all = Vec::with_capacity(3 * n);
    for x in [&d.q, &d.k, &d.v] {
        match x {
            Descale::Tensor(v) => all.extend(std::iter::repeat_n(*v, n)),
            Descale::PerBatchHeadKv(v) => all.extend_from_slice(v),
        }
    }
    gpu.stream()
        .clone_htod(&all)
        .map(Some)
        .map_err(cuda_err("copying the descales to the device"))
}

/// Runs FP8 attention on device buffers: `q`, `k`, `v` e4m3 in the problem's layout, `o` bf16
/// written through `o_strides`, `lse` dense `[batch, heads_q, seqlen_q]` f32. Asynchronous on
/// `gpu.stream()`.
///
/// # Errors
/// [`crate::fp8::check_call`]'s (problem, descales, buffer lengths), [`unsupported`]'s (another
/// arch, head_dim or modifier), [`AttnError::InvalidStrides`] for q/k strides or base addresses
/// the copy engine cannot take (byte strides and addresses must be multiples of 16),
/// [`AttnError::ShapeMismatch`] for a buffer of another context, compile and launch errors.
#[allow(clippy::too_many_arguments)]
pub fn forward_device<Q, K, V, O, L>(
    gpu: &Gpu,
    p: &AttnProblem,
    q: &Q,
    k: &K,
    v: &V,
    descales: &Fp8Descales,
    o: &mut O,
    lse: &mut L,
) -> Result<LaunchInfo>
where
    Q: DevicePtr<E4m3>,
    K: DevicePtr<E4m3>,
    V: DevicePtr<E4m3>,
    O: DevicePtrMut<bf16>,
    L: DevicePtrMut<f32>,
{
    crate::fp8::check_call(p, descales, [q.len(), k.len(), v.len(), o.len(), lse.len()])?;
    crate::cuda::runtime::args::check_gpu_problem(p, KernelKind::Wgmma)?;
    if let Some(e) = unsupported(gpu.info(), p) {
        return Err(e);
    }
    check_contexts!(gpu; "q" => q, "k" => k, "v" => v, "o" => o, "lse" => lse)?;
    let stream = gpu.stream();
    device_ptrs!(stream; qp = q, kp = k, vp = v, op = mut o);
    let (lp, _gl) = lse.device_ptr_mut(stream);
    check_aligned([("q", qp), ("k", kp), ("o", op)])?;
    let s = &p.shape;
    let d = s.head_dim;
    let pad = sk_pad(s.seqlen_k);
    let ctx = launch_context("attn_wgmma_fp8", p);
    // V^T, written in full by the pre-pass (zeros past seqlen_k), so not zeroed here.
    let vt_len = s.batch * s.heads_kv * d * pad;
    // SAFETY: every byte is written by the pre-pass below before the attention kernel reads it
    // (same stream).
    let mut vt: CudaSlice<u8> =
        unsafe { stream.alloc(vt_len) }.map_err(cuda_err(format!("{ctx}: allocating V^T")))?;
    let descale_dev = descale_buffer(gpu, p, descales)?;
    let bad_map = |t: &'static str| {
        move |why: String| AttnError::InvalidStrides {
            tensor: t,
            reason: format!(
                "the copy engine cannot describe it ({why}): byte strides and the base address must be multiples of 16"
            ),
        }
    };
    let tq =
        byte_map(qp, [d, s.seqlen_q, s.heads_q, s.batch], p.q_strides, BR).map_err(bad_map("q"))?;
    let tk = byte_map(kp, [d, s.seqlen_k, s.heads_kv, s.batch], p.k_strides, BC)
        .map_err(bad_map("k"))?;
    let (vtp, _gvt) = vt.device_ptr_mut(stream);
    let tv = TiledMap {
        dtype: DType::F16,
        addr: vtp,
        dims: vec![pad as u64, d as u64, s.heads_kv as u64, s.batch as u64],
        strides: vec![pad as u64, (d * pad) as u64, (s.heads_kv * d * pad) as u64],
        boxes: vec![BC, d as u32, 1, 1],
    }
    .encode_bytes()
    .map_err(bad_map("v"))?;
    let to = crate::cuda::runtime::tma::bshd_map(
        DType::BF16,
        op,
        [d, s.seqlen_q, s.heads_q, s.batch],
        p.o_strides,
        64,
    )
    .encode()
    .map_err(bad_map("o"))?;

    let defs = defines(p);
    let pre = gpu.kernel(KernelSource::AttnWgmmaFp8, "fp8_v_transpose", &defs)?;
    let k_attn = gpu.kernel(KernelSource::AttnWgmmaFp8, "attn_wgmma_fp8", &defs)?;
    let vt_params = VtParams::new(vp, vtp, p.v_strides, s.seqlen_k, d, s.heads_kv);
    // SAFETY: check_call bounded every V element the strides address by v's length; V^T holds
    // batch * heads_kv * head_dim * sk_pad bytes (allocated above).
    unsafe { vt_params.launch(stream, &pre.function, s.batch) }
        .map_err(cuda_err(format!("{ctx}: the V^T pre-pass")))?;

    let smem = smem_bytes(d);
    set_dynamic_smem(&k_attn.function, smem, &ctx)?;
    let launch = Launch::dense(p, DType::BF16, [qp, kp, vp, op, lp]);
    let fp = FlashParams::new(&launch, BR);
    let tiles = fp.scheduled_tiles("attn_wgmma_fp8", BR)?;
    let blocks = tiles.min(gpu.info().sm_count.max(1) as u32);
    let counter = gpu.tile_counter();
    let dptr = descale_dev.as_ref().map(|x| x.device_ptr(stream));
    let one = |x: &Descale| match x {
        Descale::Tensor(v) => *v,
        Descale::PerBatchHeadKv(_) => 1.0,
    };
    let params = Fp8Params {
        tq,
        tk,
        tv,
        to,
        p: fp,
        tile_counter: counter.unwrap_or(0),
        descale: dptr.as_ref().map_or(0, |(ptr, _)| *ptr),
        q_descale: one(&descales.q),
        k_descale: one(&descales.k),
        v_descale: one(&descales.v),
        descale_per_head: i32::from(dptr.is_some()),
        heads_kv: s.heads_kv as i32,
    };
    let mut b = stream.launch_builder(&k_attn.function);
    b.arg(&params);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (128 * 3, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: the parameters mirror the kernel's struct; check_call checked every buffer
    // against the shape and strides; the tensor maps describe exactly q, k, V^T and o (the copy
    // engine stays inside them); the counter is this stream's pair of u32 (or null: static
    // order); the descales, when uploaded, hold 3 * batch * heads_kv floats.
    unsafe { b.launch(cfg) }.map_err(cuda_err(ctx.clone()))?;
    drop(dptr);
    Ok(LaunchInfo {
        kernel: KernelKind::Wgmma,
        why: "FP8 (e4m3) on sm_90".into(),
        config: Some(format!(
            "attn_wgmma_fp8 Br{BR}xBc{BC} d{d} ({STAGES} stages, pingpong, V^T pre-pass, row sums in P V{})",
            if counter.is_none() {
                ", static order"
            } else {
                ""
            }
        )),
        registers: k_attn.stats.registers,
        spill_bytes: k_attn.stats.spill_stores,
        smem_bytes: smem,
    })
}

/// Compiles and loads both kernels for this problem (so that a timed launch measures the
/// kernels, not NVRTC).
///
/// # Errors
/// [`unsupported`]'s; compile and load errors.
pub fn prepare(gpu: &Gpu, p: &AttnProblem) -> Result<()> {
    if let Some(e) = unsupported(gpu.info(), p) {
        return Err(e);
    }
    let defs = defines(p);
    gpu.kernel(KernelSource::AttnWgmmaFp8, "fp8_v_transpose", &defs)?;
    gpu.kernel(KernelSource::AttnWgmmaFp8, "attn_wgmma_fp8", &defs)?;
    Ok(())
}

/// Host-memory convenience: copies the inputs to the device, runs, copies `o` (dense bf16) and
/// `lse` back; `seconds` covers both kernels (CUDA events).
///
/// # Errors
/// As [`forward_device`], plus allocation and copy failures.
pub fn forward_host(
    gpu: &Gpu,
    p: &AttnProblem,
    q: &[E4m3],
    k: &[E4m3],
    v: &[E4m3],
    descales: &Fp8Descales,
) -> Result<HostRun<bf16>> {
    let s = &p.shape;
    let dense = AttnProblem {
        o_strides: Strides::contiguous(s.seqlen_q, s.heads_q, s.head_dim),
        ..p.clone()
    };
    crate::fp8::check_call(
        &dense,
        descales,
        [q.len(), k.len(), v.len(), usize::MAX, usize::MAX],
    )?;
    if let Some(e) = unsupported(gpu.info(), &dense) {
        return Err(e);
    }
    prepare(gpu, &dense)?;
    host_round_trip(
        gpu,
        "attn_wgmma_fp8",
        p,
        [q, k, v],
        |dq, dk, dv, d_o, d_lse| forward_device(gpu, &dense, dq, dk, dv, descales, d_o, d_lse),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_layout_and_smem() {
        // 4 maps of 128 bytes, FlashParams (224), counter + descale pointer (16), 5 x 4 bytes,
        // rounded up to 64.
        assert_eq!(std::mem::size_of::<Fp8Params>(), 832);
        assert_eq!(std::mem::size_of::<VtParams>(), 56);
        // d128: Q 16 KB + 2 x (K 16 KB + V^T 17 KB) + O 32 KB + slack and barriers.
        assert_eq!(
            smem_bytes(128),
            16384 + 2 * (16384 + 16384 + 1024) + 32768 + 1024 + 88
        );
        assert!(smem_bytes(128) <= 227 * 1024);
        assert_eq!((sk_pad(1), sk_pad(64), sk_pad(65)), (64, 64, 128));
    }
}
