//! head_dim padding: a problem whose head_dim is not a multiple of 8 runs on a copy padded to
//! the next multiple of 8, as FlashAttention's Python wrapper does (`kernels/pad_rows.cu`).
//!
//! Zero channels add nothing to `q . k`; the scale stays the problem's own (by default
//! 1/sqrt of the true head_dim); the extra channels of `o` are dropped when o is copied back
//! into the caller's strides. Costs: three dense copies in, one out, and the padded buffers
//! (freed stream-ordered when the call returns).

use super::device::{Gpu, cuda_err};
use super::launch::{GpuElement, KernelKind, LaunchInfo, launch_context};
use super::sources::KernelSource;
use crate::error::Result;
use crate::shape::{AttnProblem, AttnShape, Strides};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

/// Threads per block of the copy kernels.
const THREADS: u32 = 256;
/// Blocks of the copy kernels at most (they loop over the rest).
const MAX_BLOCKS: u64 = 1 << 16;

/// head_dim rounded up to the kernels' multiple of 8.
pub fn padded(head_dim: usize) -> usize {
    head_dim.next_multiple_of(8)
}

/// `RowMap` of pad_rows.cu: rows (batch, seq, head) of a strided tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RowMap {
    seqlen: i64,
    heads: i64,
    st_b: i64,
    st_s: i64,
    st_h: i64,
}
// SAFETY: plain old data with C layout, mirrored by the kernel's struct.
unsafe impl DeviceRepr for RowMap {}

impl RowMap {
    fn new(st: Strides, seqlen: usize, heads: usize) -> Self {
        // validate() bounded every offset by i64::MAX.
        RowMap {
            seqlen: seqlen as i64,
            heads: heads as i64,
            st_b: st.batch as i64,
            st_s: st.seq as i64,
            st_h: st.head as i64,
        }
    }
}

/// The dense problem the kernels run: head_dim rounded up to 8, same mask and scale.
///
/// # Errors
/// Those of [`AttnProblem::new`] (none for a problem that passed validation).
pub fn padded_problem(p: &AttnProblem) -> Result<AttnProblem> {
    let shape = AttnShape {
        head_dim: padded(p.shape.head_dim),
        ..p.shape
    };
    AttnProblem::new(shape)?
        .with_mask(p.mask)
        .with_scale(p.softmax_scale)?
        .with_scores(p.scores.clone())
}

/// Device pointers of one call (validated by the caller against `p`).
pub struct Buffers {
    /// q, k, v, o: 16-bit elements laid out by the problem's strides.
    pub q: u64,
    /// See `q`.
    pub k: u64,
    /// See `q`.
    pub v: u64,
    /// See `q`.
    pub o: u64,
}

/// Runs `kernel` on `p` (head_dim not a multiple of 8) through padded copies; lse is written
/// straight into `lse` (it does not depend on head_dim's layout). The returned info names
/// the padding in `why`.
///
/// # Errors
/// Allocation, compile and launch errors ([`AttnError::Cuda`], [`AttnError::Compile`]), and
/// those of the kernel on the padded problem.
pub fn forward_padded<T, L>(
    gpu: &Gpu,
    kernel: KernelKind,
    tile: Option<super::MmaTile>,
    p: &AttnProblem,
    b: &Buffers,
    lse: &mut L,
) -> Result<LaunchInfo>
where
    T: GpuElement,
    L: cudarc::driver::DevicePtrMut<f32>,
{
    let s = p.shape;
    let dp = padded(s.head_dim);
    let pp = padded_problem(p)?;
    let ctx = launch_context("pad_rows", p);
    let stream = gpu.stream();
    let alloc = |n: usize, what: &str| -> Result<CudaSlice<T>> {
        // SAFETY: pad_rows writes every element (channels past head_dim as zero) before any
        // kernel reads it; o is written by the attention kernel.
        unsafe { stream.alloc::<T>(n) }
            .map_err(cuda_err(format!("{ctx}: allocating padded {what}")))
    };
    let rows_q = s.batch * s.seqlen_q * s.heads_q;
    let rows_k = s.batch * s.seqlen_k * s.heads_kv;
    let mut q2 = alloc(rows_q * dp, "q")?;
    let mut k2 = alloc(rows_k * dp, "k")?;
    let mut v2 = alloc(rows_k * dp, "v")?;
    let mut o2 = alloc(rows_q * dp, "o")?;
    let pad = gpu.kernel(KernelSource::PadRows, "pad_rows", &[])?;
    let unpad = gpu.kernel(KernelSource::PadRows, "unpad_rows", &[])?;
    let copy = |f: &cudarc::driver::CudaFunction,
                src: u64,
                dst: u64,
                m: RowMap,
                rows: usize,
                per_row: usize,
                what: &str|
     -> Result<()> {
        let n = (rows * per_row) as u64;
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(THREADS as u64).min(MAX_BLOCKS) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rows, d, dp) = (rows as i64, s.head_dim as i32, dp as i32);
        let mut lb = stream.launch_builder(f);
        lb.arg(&src).arg(&dst).arg(&m).arg(&rows).arg(&d).arg(&dp);
        // SAFETY: src and dst hold every element the row map and the dense side address
        // (the caller checked the strided buffers against `p`; the dense ones were
        // allocated for `rows * dp` elements above).
        unsafe { lb.launch(cfg) }.map_err(cuda_err(format!("{ctx}: {what}")))?;
        Ok(())
    };
    {
        use cudarc::driver::DevicePtrMut;
        let (q2p, _g1) = q2.device_ptr_mut(stream);
        let (k2p, _g2) = k2.device_ptr_mut(stream);
        let (v2p, _g3) = v2.device_ptr_mut(stream);
        copy(
            &pad.function,
            b.q,
            q2p,
            RowMap::new(p.q_strides, s.seqlen_q, s.heads_q),
            rows_q,
            dp,
            "padding q",
        )?;
        copy(
            &pad.function,
            b.k,
            k2p,
            RowMap::new(p.k_strides, s.seqlen_k, s.heads_kv),
            rows_k,
            dp,
            "padding k",
        )?;
        copy(
            &pad.function,
            b.v,
            v2p,
            RowMap::new(p.v_strides, s.seqlen_k, s.heads_kv),
            rows_k,
            dp,
            "padding v",
        )?;
    }
    let mut info =
        super::attention::forward_device(gpu, kernel, tile, &pp, &q2, &k2, &v2, &mut o2, lse)?;
    {
        use cudarc::driver::DevicePtr;
        let (o2p, _g) = o2.device_ptr(stream);
        copy(
            &unpad.function,
            o2p,
            b.o,
            RowMap::new(p.o_strides, s.seqlen_q, s.heads_q),
            rows_q,
            s.head_dim,
            "copying o back",
        )?;
    }
    // The padded buffers are freed stream-ordered, after the kernels above.
    drop((q2, k2, v2, o2));
    info.why = format!(
        "{}; head_dim {} padded to {dp} with zero channels (FlashAttention's wrapper does the same)",
        info.why, s.head_dim
    );
    Ok(info)
}
