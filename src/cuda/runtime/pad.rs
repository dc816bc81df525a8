//! head_dim padding: a problem whose head_dim is not a multiple of 8 runs on a copy padded to
//! the next multiple of 8, as FlashAttention's Python wrapper does (`kernels/fwd/pad_rows.cu`).
//!
//! Zero channels add nothing to `q . k`; the scale stays the problem's own (by default
//! 1/sqrt of the true head_dim); the extra channels of `o` are dropped when o is copied back
//! into the caller's strides. Costs: three dense copies in, one out, and the padded buffers
//! (freed stream-ordered when the call returns).

use crate::cuda::runtime::args::device_ptrs;
use crate::cuda::runtime::device::{Gpu, cuda_err};
use crate::cuda::runtime::launch::{GpuElement, LaunchInfo, launch_context};
use crate::cuda::sources::KernelSource;
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

/// The two copy kernels of one call: rows of `d` channels in and out of dense rows of `dp`.
struct Rows<'a> {
    gpu: &'a Gpu,
    ctx: &'a str,
    d: usize,
    dp: usize,
    pad: crate::cuda::runtime::device::LoadedKernel,
    unpad: crate::cuda::runtime::device::LoadedKernel,
}

impl<'a> Rows<'a> {
    fn new(gpu: &'a Gpu, ctx: &'a str, d: usize, dp: usize) -> Result<Self> {
        Ok(Rows {
            gpu,
            ctx,
            d,
            dp,
            pad: gpu.kernel(KernelSource::PadRows, "pad_rows", &[])?,
            unpad: gpu.kernel(KernelSource::PadRows, "unpad_rows", &[])?,
        })
    }

    /// Dense `dst` (dp channels per row, zero past d) <- strided `src`.
    fn pad(&self, src: u64, dst: u64, m: RowMap, rows: usize, what: &str) -> Result<()> {
        self.launch(&self.pad.function, src, dst, m, rows, self.dp, what)
    }

    /// Strided `dst` <- the first d channels of dense `src`.
    fn unpad(&self, src: u64, dst: u64, m: RowMap, rows: usize, what: &str) -> Result<()> {
        self.launch(&self.unpad.function, src, dst, m, rows, self.d, what)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        f: &cudarc::driver::CudaFunction,
        src: u64,
        dst: u64,
        m: RowMap,
        rows: usize,
        per_row: usize,
        what: &str,
    ) -> Result<()> {
        let n = (rows * per_row) as u64;
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(THREADS as u64).min(MAX_BLOCKS) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (rows, d, dp) = (rows as i64, self.d as i32, self.dp as i32);
        let mut lb = self.gpu.stream().launch_builder(f);
        lb.arg(&src).arg(&dst).arg(&m).arg(&rows).arg(&d).arg(&dp);
        // SAFETY: src and dst hold every element the row map and the dense side address
        // (the caller checked the strided buffers against its problem; the dense ones were
        // allocated for `rows * dp` elements).
        unsafe { lb.launch(cfg) }.map_err(cuda_err(format!("{}: {what}", self.ctx)))?;
        Ok(())
    }
}

/// The dense problem the kernels run: head_dim rounded up to 8, same mask and scale.
///
/// # Errors
/// Those of [`AttnProblem::new`] (none for a problem that passed validation).
pub fn padded_problem(p: &AttnProblem) -> Result<AttnProblem> {
    padded_problem_to(p, padded(p.shape.head_dim))
}

/// [`padded_problem`] at a given padded head_dim `dp` (at least the problem's).
fn padded_problem_to(p: &AttnProblem, dp: usize) -> Result<AttnProblem> {
    let shape = AttnShape {
        head_dim: dp,
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

/// Runs the forward of `p` (head_dim not a multiple of 8) through padded copies: `run` is the
/// forward on the padded problem and dense buffers `(pp, q, k, v, o)`, writing lse straight
/// into the caller's (it does not depend on head_dim's layout). The returned info names the
/// padding in `why`. The caller's entry point comes in as `run` so that this file does not
/// import the launchers that call it.
///
/// # Errors
/// Allocation, compile and launch errors ([`crate::AttnError::Cuda`],
/// [`crate::AttnError::Compile`]), and those of `run` on the padded problem.
pub fn forward_padded<T, F>(gpu: &Gpu, p: &AttnProblem, b: &Buffers, run: F) -> Result<LaunchInfo>
where
    T: GpuElement,
    F: FnOnce(
        &AttnProblem,
        &CudaSlice<T>,
        &CudaSlice<T>,
        &CudaSlice<T>,
        &mut CudaSlice<T>,
    ) -> Result<LaunchInfo>,
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
    let rows = Rows::new(gpu, &ctx, s.head_dim, dp)?;
    {
        use cudarc::driver::DevicePtrMut;
        device_ptrs!(stream; q2p = mut q2, k2p = mut k2, v2p = mut v2);
        let (sq, hq, sk, hk) = (s.seqlen_q, s.heads_q, s.seqlen_k, s.heads_kv);
        rows.pad(
            b.q,
            q2p,
            RowMap::new(p.q_strides, sq, hq),
            rows_q,
            "padding q",
        )?;
        rows.pad(
            b.k,
            k2p,
            RowMap::new(p.k_strides, sk, hk),
            rows_k,
            "padding k",
        )?;
        rows.pad(
            b.v,
            v2p,
            RowMap::new(p.v_strides, sk, hk),
            rows_k,
            "padding v",
        )?;
    }
    let mut info = run(&pp, &q2, &k2, &v2, &mut o2)?;
    {
        use cudarc::driver::DevicePtr;
        let (o2p, _g) = o2.device_ptr(stream);
        let map = RowMap::new(p.o_strides, s.seqlen_q, s.heads_q);
        rows.unpad(o2p, b.o, map, rows_q, "copying o back")?;
    }
    // The padded buffers are freed stream-ordered, after the kernels above.
    drop((q2, k2, v2, o2));
    info.why = format!(
        "{}; head_dim {} padded to {dp} with zero channels (FlashAttention's wrapper does the same)",
        info.why, s.head_dim
    );
    Ok(info)
}

/// Device pointers of one backward call (validated by the caller against `p`).
pub struct BwdBuffers {
    /// q, k, v, o and do: 16-bit elements laid out by the problem's strides (do as o).
    pub q: u64,
    /// See `q`.
    pub k: u64,
    /// See `q`.
    pub v: u64,
    /// See `q`.
    pub o: u64,
    /// See `q`.
    pub d_o: u64,
    /// The gradients, dense `[batch, seqlen, heads, head_dim]` at the real head_dim.
    pub dq: u64,
    /// See `dq`.
    pub dk: u64,
    /// See `dq`.
    pub dv: u64,
}

/// The padded, dense device copies of one backward call, `dp` channels per row: the inputs
/// (filled before `run`) and the gradients (`run` writes them; copied back after).
pub struct PaddedBwd<T> {
    /// q, k, v, o and do, padded.
    pub q: CudaSlice<T>,
    /// See `q`.
    pub k: CudaSlice<T>,
    /// See `q`.
    pub v: CudaSlice<T>,
    /// See `q`.
    pub o: CudaSlice<T>,
    /// See `q`.
    pub d_o: CudaSlice<T>,
    /// The padded gradients.
    pub dq: CudaSlice<T>,
    /// See `dq`.
    pub dk: CudaSlice<T>,
    /// See `dq`.
    pub dv: CudaSlice<T>,
}

/// The backward of `p` (a head_dim the kernels do not take as it is) through padded copies,
/// at head_dim `dp` (the backward's [`crate::cuda::bwd::backward::run_head_dim`]): q, k, v, o
/// and do padded with zero channels (they add nothing to any score, to D = rowsum(do o), or to
/// the real channels of any gradient; the pad channels of the gradients come out zero and are
/// dropped), `run` is the backward on the padded problem and buffers (lse the forward's, as
/// is, captured by `run`), the gradients copied back at the real head_dim. The caller's entry
/// point comes in as `run` so that this file does not import the launcher that calls it.
///
/// # Errors
/// Allocation, compile and launch errors, and those of `run` on the padded problem.
pub fn backward_padded<T, R, F>(
    gpu: &Gpu,
    p: &AttnProblem,
    dp: usize,
    b: &BwdBuffers,
    run: F,
) -> Result<R>
where
    T: GpuElement,
    F: FnOnce(&AttnProblem, &mut PaddedBwd<T>) -> Result<R>,
{
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = p.shape;
    let pp = padded_problem_to(p, dp)?;
    let ctx = launch_context("pad_rows (backward)", p);
    let stream = gpu.stream();
    let alloc = |n: usize, what: &str| -> Result<CudaSlice<T>> {
        // SAFETY: pad_rows writes every element of the inputs before any kernel reads them;
        // the backward writes every element of the gradients.
        unsafe { stream.alloc::<T>(n) }
            .map_err(cuda_err(format!("{ctx}: allocating padded {what}")))
    };
    let rows_q = s.batch * s.seqlen_q * s.heads_q;
    let rows_k = s.batch * s.seqlen_k * s.heads_kv;
    let mut d = PaddedBwd {
        q: alloc(rows_q * dp, "q")?,
        k: alloc(rows_k * dp, "k")?,
        v: alloc(rows_k * dp, "v")?,
        o: alloc(rows_q * dp, "o")?,
        d_o: alloc(rows_q * dp, "do")?,
        dq: alloc(rows_q * dp, "dq")?,
        dk: alloc(rows_k * dp, "dk")?,
        dv: alloc(rows_k * dp, "dv")?,
    };
    let rows = Rows::new(gpu, &ctx, s.head_dim, dp)?;
    let (sq, hq, sk, hk) = (s.seqlen_q, s.heads_q, s.seqlen_k, s.heads_kv);
    for (src, dst, st, n, what) in [
        (
            b.q,
            &mut d.q,
            RowMap::new(p.q_strides, sq, hq),
            rows_q,
            "padding q",
        ),
        (
            b.k,
            &mut d.k,
            RowMap::new(p.k_strides, sk, hk),
            rows_k,
            "padding k",
        ),
        (
            b.v,
            &mut d.v,
            RowMap::new(p.v_strides, sk, hk),
            rows_k,
            "padding v",
        ),
        (
            b.o,
            &mut d.o,
            RowMap::new(p.o_strides, sq, hq),
            rows_q,
            "padding o",
        ),
        (
            b.d_o,
            &mut d.d_o,
            RowMap::new(p.o_strides, sq, hq),
            rows_q,
            "padding do",
        ),
    ] {
        let (dst, _g) = dst.device_ptr_mut(stream);
        rows.pad(src, dst, st, n, what)?;
    }
    let info = run(&pp, &mut d)?;
    let (dense_q, dense_k) = (
        Strides::contiguous(sq, hq, s.head_dim),
        Strides::contiguous(sk, hk, s.head_dim),
    );
    for (src, dst, st, n, what) in [
        (
            &d.dq,
            b.dq,
            RowMap::new(dense_q, sq, hq),
            rows_q,
            "copying dq back",
        ),
        (
            &d.dk,
            b.dk,
            RowMap::new(dense_k, sk, hk),
            rows_k,
            "copying dk back",
        ),
        (
            &d.dv,
            b.dv,
            RowMap::new(dense_k, sk, hk),
            rows_k,
            "copying dv back",
        ),
    ] {
        let (src, _g) = src.device_ptr(stream);
        rows.unpad(src, dst, st, n, what)?;
    }
    // The padded buffers are freed stream-ordered, after the kernels above.
    drop(d);
    Ok(info)
}
