//! CPU backend: FlashAttention-2 forward on host memory, f32 accumulation, rayon.
//!
//! Work is split into independent items `(batch, query head, block of BR query rows)`, run
//! in parallel with rayon. Each item keeps its `BR x head_dim` Q tile, running row maximum
//! `m`, running sum `l` and output accumulator in a per-task workspace and walks the keys in
//! tiles of `BC`:
//!
//! 1. `S = softmax_scale * Q K^T` (`BR x BC`) with the `gemm` crate (Q, K and V tiles are
//!    widened to f32 once per tile; K^T is read through gemm's strides, not copied);
//! 2. per row: `m' = max(m, rowmax S)`, `P = exp(S - m')`, `l = l e^(m - m') + rowsum P`, the
//!    accumulator rescaled by `e^(m - m')`;
//! 3. `O += P V` with the `gemm` crate;
//!
//! and at the end writes `o = O / l` (through `o_strides`) and `lse = m + ln l` (a learnable
//! sink first adds `e^(sink - m')` to `l`, re-based on `m' = max(m, sink)`). Memory beyond
//! the inputs and outputs is one workspace of `O(BR*BC + (BR + 2 BC) * head_dim)` floats per
//! rayon task, never `O(seqlen_q * seqlen_k)`. Key tiles that a causal mask hides from every
//! row of the block are skipped; tiles that every row sees in full need no mask at all.
//!
//! # NaN / Inf policy
//! Inputs are not sanitised. IEEE arithmetic carries a NaN or infinity into the rows that
//! read it: a non-finite `q` element affects only its own row; a non-finite `k` or `v` row
//! affects only the query rows that see that key (masked keys never leak: when a V tile
//! holds a non-finite value and part of it is masked, `P V` for that tile is done row by
//! row over the visible keys only). Other rows are untouched and nothing panics.
//! Rows that see no key get `o = 0`, `lse = -inf` (with a sink, `lse = sink_h`).

use crate::dtype::Element;
use crate::error::Result;
use crate::shape::AttnProblem;
use gemm::{Parallelism, gemm};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;
use std::any::TypeId;

/// Query rows per tile (`Br`).
pub const BR: usize = 128;
/// Keys per tile (`Bc`).
pub const BC: usize = 128;

/// Exact attention on host buffers, tiled online softmax (see the module docs).
///
/// `q`, `k`, `v` are read and `o` is written through the problem's strides (`o` elements
/// that no `(b, s, h, d)` addresses are left untouched); `lse` is dense
/// `[batch, heads_q, seqlen_q]`, natural log, `-inf` for rows that see no key (the sink's
/// logit with a learnable sink).
///
/// # Errors
/// Any error of [`AttnProblem::validate`] and [`AttnProblem::check_lengths`]; nothing is
/// written when one is returned.
pub fn forward<T: Element>(
    p: &AttnProblem,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &mut [T],
    lse: &mut [f32],
) -> Result<()> {
    p.validate()?;
    p.check_lengths(q.len(), k.len(), v.len(), o.len(), lse.len())?;
    let s = p.shape;
    let blocks = s.seqlen_q.div_ceil(BR);
    let items = s.batch * s.heads_q * blocks;
    let out = Out {
        o: o.as_mut_ptr(),
        lse: lse.as_mut_ptr(),
    };
    (0..items).into_par_iter().for_each_init(
        || Workspace::new(s.head_dim),
        |ws, item| {
            let blk = item % blocks;
            let h = (item / blocks) % s.heads_q;
            let b = item / (blocks * s.heads_q);
            let rows = ws.run(p, q, k, v, b, h, blk * BR);
            // SAFETY: `validate` guarantees that distinct (b, i, h) rows of o do not overlap
            // and `check_lengths` that every addressed element is in bounds; each item owns
            // the rows (b, blk*BR.., h) of o and the matching lse entries exclusively.
            unsafe { ws.store(p, &out, b, h, blk * BR, rows) };
        },
    );
    Ok(())
}

/// Benchmark helper: runs only the two tile products of [`forward`] for `p`, with the same
/// tile shapes, strides, parallel split over rayon tasks and causal tile skipping, on f32
/// tiles of ones (no loads, no softmax, no stores; P is whatever S holds). Returns the wall
/// time in seconds, to state how close [`forward`] comes to the `gemm` crate's own rate on
/// these matrices (`flashattn cpu-gemm-rate`).
///
/// # Errors
/// Any error of [`AttnProblem::validate`].
pub fn tile_gemms_only(p: &AttnProblem) -> Result<f64> {
    p.validate()?;
    let s = p.shape;
    let blocks = s.seqlen_q.div_ceil(BR);
    let items = s.batch * s.heads_q * blocks;
    let t = std::time::Instant::now();
    (0..items).into_par_iter().for_each_init(
        || {
            let mut ws = Workspace::new(s.head_dim);
            ws.q.fill(1.0);
            ws.k.fill(1.0);
            ws.v.fill(1.0);
            ws
        },
        |ws, item| {
            let i0 = (item % blocks) * BR;
            let br = BR.min(s.seqlen_q - i0);
            let kv_end = p.key_range(i0 + br - 1).end;
            let mut j0 = 0;
            while j0 < kv_end {
                let bc = BC.min(kv_end - j0);
                ws.gemm_s(br, bc, p.softmax_scale);
                ws.gemm_pv(br, bc);
                j0 += bc;
            }
            std::hint::black_box(&ws.acc);
        },
    );
    Ok(t.elapsed().as_secs_f64())
}

/// Raw output pointers shared by the rayon tasks (each writes a disjoint part).
struct Out<T> {
    o: *mut T,
    lse: *mut f32,
}
// SAFETY: the tasks write disjoint elements only (see `forward`).
unsafe impl<T: Send> Sync for Out<T> {}
unsafe impl<T: Send> Send for Out<T> {}

/// Per-task scratch: one Q tile, one K and V tile, S/P, and the running statistics.
struct Workspace {
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    s: Vec<f32>,
    acc: Vec<f32>,
    m: [f32; BR],
    l: [f32; BR],
    /// Keys each row sees: `lo[r]..vis[r]` ([`AttnProblem::key_range`]).
    lo: [usize; BR],
    vis: [usize; BR],
}

impl Workspace {
    fn new(d: usize) -> Self {
        Self {
            d,
            q: vec![0.0; BR * d],
            k: vec![0.0; BC * d],
            v: vec![0.0; BC * d],
            s: vec![0.0; BR * BC],
            acc: vec![0.0; BR * d],
            m: [f32::NEG_INFINITY; BR],
            l: [0.0; BR],
            lo: [0; BR],
            vis: [0; BR],
        }
    }

    /// Runs one item: rows `i0..i0+br` of (batch `b`, query head `h`). Returns `br`.
    #[allow(clippy::too_many_arguments)]
    fn run<T: Element>(
        &mut self,
        p: &AttnProblem,
        q: &[T],
        k: &[T],
        v: &[T],
        b: usize,
        h: usize,
        i0: usize,
    ) -> usize {
        let sh = p.shape;
        let d = self.d;
        let br = BR.min(sh.seqlen_q - i0);
        let kvh = h / sh.group_size();
        for r in 0..br {
            let off = p.q_strides.offset(b, i0 + r, h);
            load_row(&q[off..off + d], &mut self.q[r * d..(r + 1) * d]);
            let keys = p.key_range(i0 + r);
            (self.lo[r], self.vis[r]) = (keys.start, keys.end);
        }
        self.m[..br].fill(f32::NEG_INFINITY);
        self.l[..br].fill(0.0);
        self.acc[..br * d].fill(0.0);
        // Both ends of the key range are non-decreasing in the row (an empty range is 0..0, so
        // take the first non-empty row's start): keys lo_min..kv_end hold every visible key;
        // tiles inside lo_max..kv_all are seen in full by every row.
        let kv_end = self.vis[br - 1];
        let lo_min = (0..br)
            .find(|&r| self.lo[r] < self.vis[r])
            .map_or(kv_end, |r| self.lo[r]);
        let (lo_max, kv_all) = (self.lo[br - 1], self.vis[0]);
        let slope = p
            .scores
            .alibi
            .as_ref()
            .map_or(0.0, |a| a.slope(b, h, sh.heads_q));
        let plain_scores = p.scores.softcap.is_none() && slope == 0.0;
        let mut j0 = lo_min;
        while j0 < kv_end {
            let bc = BC.min(kv_end - j0);
            for c in 0..bc {
                let ko = p.k_strides.offset(b, j0 + c, kvh);
                load_row(&k[ko..ko + d], &mut self.k[c * d..(c + 1) * d]);
                let vo = p.v_strides.offset(b, j0 + c, kvh);
                load_row(&v[vo..vo + d], &mut self.v[c * d..(c + 1) * d]);
            }
            self.gemm_s(br, bc, p.softmax_scale);
            let masked = j0 + bc > kv_all || j0 < lo_max;
            let cols = |r: usize| {
                if masked {
                    let n = self.vis[r].saturating_sub(j0).min(bc);
                    (self.lo[r].saturating_sub(j0).min(n), n)
                } else {
                    (0, bc)
                }
            };
            let a: [usize; BR] = std::array::from_fn(|r| if r < br { cols(r).0 } else { 0 });
            let n: [usize; BR] = std::array::from_fn(|r| if r < br { cols(r).1 } else { 0 });
            if !plain_scores {
                for r in 0..br {
                    let row = &mut self.s[r * BC..r * BC + bc];
                    for (c, x) in row.iter_mut().enumerate().take(n[r]).skip(a[r]) {
                        // The one rule of crate::scores (in f64, then rounded back).
                        *x = p.scores.score(
                            f64::from(*x),
                            f64::from(slope),
                            i0 + r,
                            j0 + c,
                            sh.seqlen_q,
                            sh.seqlen_k,
                        ) as f32;
                    }
                }
            }
            let t = Tile {
                s: &mut self.s,
                m: &mut self.m,
                l: &mut self.l,
                acc: &mut self.acc,
            };
            t.online_softmax(&a[..br], &n[..br], bc, d);
            if masked && !all_finite(&self.v[..bc * d]) {
                // Row by row over visible keys only, so that a masked non-finite V never
                // turns 0 * inf into NaN in a row that does not see it.
                for r in 0..br {
                    let acc = &mut self.acc[r * d..(r + 1) * d];
                    for c in a[r]..n[r] {
                        let pc = self.s[r * BC + c];
                        let vr = &self.v[c * d..(c + 1) * d];
                        acc.iter_mut().zip(vr).for_each(|(a, x)| *a += pc * x);
                    }
                }
            } else {
                self.gemm_pv(br, bc);
            }
            j0 += bc;
        }
        br
    }

    /// `S[..br, ..bc] = scale * Q K^T`: `[br x d] x [d x bc]`, K^T read through strides
    /// (`K^T(kk, j) = k[j*d + kk]`), S row-major with row stride `BC`.
    #[inline]
    fn gemm_s(&mut self, br: usize, bc: usize, scale: f32) {
        let d = self.d;
        debug_assert!(br <= BR && bc <= BC);
        // SAFETY: q holds BR*d, k BC*d and s BR*BC f32s, all owned by self and distinct;
        // every index gemm forms is below (br-1)*stride + bc or (bc-1)*d + d.
        unsafe {
            gemm(
                br,
                bc,
                d,
                self.s.as_mut_ptr(),
                1,
                BC as isize,
                false,
                self.q.as_ptr(),
                1,
                d as isize,
                self.k.as_ptr(),
                d as isize,
                1,
                0.0,
                scale,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    }

    /// `acc[..br] += P V`: `[br x bc] x [bc x d]`, P = S's first `bc` columns.
    #[inline]
    fn gemm_pv(&mut self, br: usize, bc: usize) {
        let d = self.d;
        debug_assert!(br <= BR && bc <= BC);
        // SAFETY: as in gemm_s; acc holds BR*d and v BC*d f32s.
        unsafe {
            gemm(
                br,
                d,
                bc,
                self.acc.as_mut_ptr(),
                1,
                d as isize,
                true,
                self.s.as_ptr(),
                1,
                BC as isize,
                self.v.as_ptr(),
                1,
                d as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    }

    /// Writes rows `i0..i0+br` of (b, h): `o = acc / l` through `o_strides`, `lse = m + ln l`.
    ///
    /// # Safety
    /// `out` must point to buffers that passed `check_lengths` for `p`, and no other thread
    /// may write these rows concurrently.
    unsafe fn store<T: Element>(
        &self,
        p: &AttnProblem,
        out: &Out<T>,
        b: usize,
        h: usize,
        i0: usize,
        br: usize,
    ) {
        let sh = p.shape;
        let d = self.d;
        let sink = p.scores.sink.as_ref().map(|s| s[h]);
        for r in 0..br {
            let i = i0 + r;
            let dst = p.o_strides.offset(b, i, h);
            let acc = &self.acc[r * d..(r + 1) * d];
            let lse_at = (b * sh.heads_q + h) * sh.seqlen_q + i;
            // SAFETY: in bounds by check_lengths; exclusive by the caller's contract.
            unsafe {
                let o = std::slice::from_raw_parts_mut(out.o.add(dst), d);
                if self.lo[r] >= self.vis[r] {
                    o.fill(T::from_f32(0.0));
                    *out.lse.add(lse_at) = sink.unwrap_or(f32::NEG_INFINITY);
                } else {
                    let (m, l, alpha) = fold_sink(self.m[r], self.l[r], sink);
                    let inv = alpha / l;
                    o.iter_mut()
                        .zip(acc)
                        .for_each(|(x, a)| *x = T::from_f32(a * inv));
                    *out.lse.add(lse_at) = m + l.ln();
                }
            }
        }
    }
}

/// A row's final max `m` and sum `l` (relative to `m`) with a learnable sink's term added:
/// `(m', l', alpha)` with `m' = max(m, sink)`, `l' = l e^(m - m') + e^(sink - m')` and `alpha =
/// e^(m - m')`, the factor of the row's accumulator; without a sink `(m, l, 1)`. A NaN `m`
/// stays NaN in `l'` (`f32::max` would drop it from `m'`).
pub(crate) fn fold_sink(m: f32, l: f32, sink: Option<f32>) -> (f32, f32, f32) {
    match sink {
        None => (m, l, 1.0),
        Some(s) => {
            let top = m.max(s);
            let alpha = if m == f32::NEG_INFINITY {
                0.0
            } else {
                (m - top).exp()
            };
            (top, l * alpha + (s - top).exp(), alpha)
        }
    }
}

/// The running state of one work item that step 2 of the algorithm updates.
struct Tile<'a> {
    s: &'a mut [f32],
    m: &'a mut [f32; BR],
    l: &'a mut [f32; BR],
    acc: &'a mut [f32],
}

impl Tile<'_> {
    /// Step 2 for one key tile: row `r` sees columns `a[r]..n[r]` of the `bc` columns of S.
    /// Turns S into P in place (0 in masked columns) and updates `m`, `l` and `acc`.
    /// Dispatches at run time to an AVX-512 or AVX2 build of the same code.
    fn online_softmax(self, a: &[usize], n: &[usize], bc: usize, d: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { self.online_softmax_avx512(a, n, bc, d) };
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: as above.
                return unsafe { self.online_softmax_avx2(a, n, bc, d) };
            }
        }
        self.online_softmax_generic(a, n, bc, d)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn online_softmax_avx512(self, a: &[usize], n: &[usize], bc: usize, d: usize) {
        self.online_softmax_generic(a, n, bc, d)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn online_softmax_avx2(self, a: &[usize], n: &[usize], bc: usize, d: usize) {
        self.online_softmax_generic(a, n, bc, d)
    }

    #[inline(always)]
    fn online_softmax_generic(self, a: &[usize], n: &[usize], bc: usize, d: usize) {
        for (r, (&a, &n)) in a.iter().zip(n).enumerate() {
            let row = &mut self.s[r * BC..r * BC + bc];
            row[n..].fill(0.0);
            row[..a.min(n)].fill(0.0);
            if a >= n {
                continue; // this row sees none of these keys: no update
            }
            let row = &mut row[a..n];
            let m_new = self.m[r].max(row_max(row));
            let alpha = exp_f32(self.m[r] - m_new);
            for x in row.iter_mut() {
                *x = exp_f32(*x - m_new);
            }
            self.l[r] = self.l[r] * alpha + row_sum(row);
            self.m[r] = m_new;
            if alpha != 1.0 {
                self.acc[r * d..(r + 1) * d]
                    .iter_mut()
                    .for_each(|x| *x *= alpha);
            }
        }
    }
}

/// Widens one row of `T` into f32 (vectorised conversions for f16/bf16).
#[inline]
fn load_row<T: Element>(src: &[T], dst: &mut [f32]) {
    let id = TypeId::of::<T>();
    // SAFETY: the TypeId checks prove T is exactly the type the slice is reinterpreted as.
    unsafe {
        if id == TypeId::of::<f16>() {
            let s = std::slice::from_raw_parts(src.as_ptr() as *const f16, src.len());
            s.convert_to_f32_slice(dst);
        } else if id == TypeId::of::<bf16>() {
            let s = std::slice::from_raw_parts(src.as_ptr() as *const bf16, src.len());
            s.convert_to_f32_slice(dst);
        } else {
            dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
        }
    }
}

/// `true` when no element is NaN or infinite (branch-free, vectorises).
#[inline]
fn all_finite(x: &[f32]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    x.iter()
        .fold(0u32, |a, v| a | u32::from(v.to_bits() & EXP == EXP))
        == 0
}

/// Maximum ignoring NaN (a NaN still poisons the row through `exp(NaN - m)`).
#[inline]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i].max(c[i]);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    acc.into_iter().fold(tail, f32::max)
}

/// Sum with eight independent lanes (vectorises; order differs from a serial sum).
#[inline]
fn row_sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// `e^x` for `x <= 0` (and NaN), branch-free so that loops over it vectorise.
///
/// Cephes' `expf`: `n = round(x log2 e)` by the 1.5*2^23 trick, `r = x - n ln 2` with ln 2
/// split in two (Cody-Waite, so `r` is exact), `e^r` by a degree-7 polynomial on
/// `|r| <= ln2 / 2`, times `2^n`. Relative error below 2e-7. Returns 0 for `x < -87.33` (and
/// for -inf), NaN for NaN. Not for `x > 0`.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = if x < -87.33 { -87.33 } else { x }; // NaN stays NaN
    let nr = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = nr.to_bits() as i32 - MAGIC.to_bits() as i32; // round(x log2 e)
    let nf = nr - MAGIC;
    let r = xc - nf * LN2_HI - nf * LN2_LO;
    let poly = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let er = poly * r * r + r + 1.0;
    let y = er * f32::from_bits((n.wrapping_add(127) as u32) << 23);
    if x < -87.33 { 0.0 } else { y }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_on_its_domain() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -87.33 {
            let e = (x as f64).exp();
            let rel = ((exp_f32(x) as f64 - e) / e).abs();
            worst = worst.max(rel);
            x -= 0.001_37;
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn max_and_sum() {
        let x: Vec<f32> = (0..21).map(|i| i as f32 - 5.0).collect();
        assert_eq!(row_max(&x), 15.0);
        assert_eq!(row_sum(&x), x.iter().sum::<f32>());
        assert_eq!(row_max(&[f32::NAN, 1.0]), 1.0);
        assert!(all_finite(&x));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut y = x.clone();
            y[13] = bad;
            assert!(!all_finite(&y));
        }
    }
}
