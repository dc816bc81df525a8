//! The FP8 (e4m3) warpgroup probe of attn_wgmma_fp8: the layouts it relies on, stated as
//! functions, a CPU emulator built on them, and the experiments of
//! `kernels/probe/wgmma_probe.cu` (`wg_probe_fp8_*`) checked register by register.
//!
//! Layouts (PTX ISA 9.0, 9.7.15.5.1; the model this module states and the probe proves):
//! - 8-bit K-major operands (both A and B of `wgmma .m64nNk32` with e4m3): element `(mn, k)` of
//!   a k32 slab at `start + (mn%8)*128 + (mn/8)*SBO + k` before the 128-byte swizzle, i.e. the
//!   16-bit formula with one byte per element, so `desc_kmajor_sw128` serves both (a k32 step
//!   is 32 bytes, as a k16 step of 16-bit values);
//! - TMA boxes of 128 one-byte columns: row `r`, column `c` at `dst + 128r + c`, swizzled;
//! - the register A operand ([`a8_cell`]): register `j` of thread `tid` holds row `16w + g +
//!   8(j%2)`, byte `e` at `k = 16(j/2) + 4t + e`;
//! - P's fragment from the S accumulators ([`p_acc_index`], fp8.cuh `p_frag`) and V^T's key
//!   order ([`vt_slot`], fp8.cuh `vt_slot`): the key a byte of P holds is the key V^T stores at
//!   the position the hardware reads for it.
//!
//! Experiments (values are e4m3 codes chosen so that every cell names its source):
//! 1. **qk** (Q K^T): Q one-hot (`Q[i][i + 64H] = 1`), K 64 rows x 128 coded by channel
//!    (`K[n][c] = g(c)`) for H = 0 and 1, or by row (`K[n][c] = f(n)`): `S[i][n] = g(i + 64H)`
//!    or `f(n)`; plus the 8 descriptors.
//! 2. **pv** (P V, the kernel's path): `S = Q K^T` with Q one-hot (`Q[i][i] = 1`) and K 128
//!    keys x 128 coded by key (`K[k][c] = f(k)`) or by row (`K[k][c] = f(c)`), so `S[i][k] =
//!    f(k)` or `f(i)`; P packed to e4m3 by `p_frag`; V (128 keys x 128 channels, identity)
//!    through the kernel's pre-pass to V^T, TMA-loaded, 8 rows of ones after it; `O = P V`
//!    (m64n136k32) must be `O[i][n] = S[i][n]` for n < 128 and the row sum of S after.
//!
//! The fault (`PROBE_FAULT=1`, or `inject_fault`) gives the K-major descriptors (Q, K, V^T)
//! a 64-byte swizzle: qk and pv must fail.

use crate::layout_wgmma::{Descriptor, Swizzle, WARPGROUP, acc_cell};
use crate::probe::{ProbeReport, Section, show};
use crate::probe_wgmma::{check_acc, check_descs, floats, launch_maps};
use flashattn::cuda::fwd::wgmma_fp8::VtParams;
use flashattn::cuda::tma::{TiledMap, TmaMap};
use flashattn::cuda::{Gpu, KernelSource, device::cuda_err};
use flashattn::dtype::DType;
use flashattn::error::{AttnError, Result};
use flashattn::fp8::E4m3;
use flashattn::shape::Strides;

/// Words each thread dumps in wg_probe_fp8_qk.
pub const QK_WORDS: usize = 32;
/// s0..s63, p0..p15, o0..o67 per thread in wg_probe_fp8_pv.
pub const PV_WORDS: usize = 64 + 16 + 68;
/// Dynamic shared memory of the probe launches (the pv experiment stages 41 KB).
const SMEM: usize = 42 * 1024;

// ---- the model ----

/// `(row, k)` of the 64x32 e4m3 register A operand that byte `byte` of register `reg` (0..4) of
/// thread `tid` holds (PTX ISA 9.7.15.5.1, `wgmma .m64nNk32` A fragment for 8-bit types).
pub fn a8_cell(tid: usize, reg: usize, byte: usize) -> (usize, usize) {
    let (w, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    (16 * w + g + 8 * (reg % 2), 16 * (reg / 2) + 4 * t + byte)
}

/// The S accumulator that byte `byte` of register `j` of P V k-step `kk` is packed from
/// (fp8.cuh `p_frag`): `16kk + 8(j/2) + 2(j%2) + {0, 1, 4, 5}[byte]`.
pub fn p_acc_index(kk: usize, j: usize, byte: usize) -> usize {
    16 * kk + 8 * (j / 2) + 2 * (j % 2) + byte % 2 + 4 * (byte / 2)
}

/// The position of key `k` in a V^T row (fp8.cuh `vt_slot`): key `8h + 2t + e` of each 16 at
/// `4t + 2h + e`.
pub fn vt_slot(k: usize) -> usize {
    let j = k % 16;
    k - j + 4 * ((j % 8) / 2) + 2 * (j / 8) + j % 2
}

/// The key at position `x` of a V^T row (fp8.cuh `vt_key`, the inverse of [`vt_slot`]).
pub fn vt_key(x: usize) -> usize {
    let j = x % 16;
    x - j + 8 * ((j / 2) % 2) + 2 * (j / 4) + j % 2
}

/// Physical byte of element `(mn, k)` (k < 32) of the 8-bit K-major slab `d` describes.
pub fn operand_addr8(d: &Descriptor, mn: usize, k: usize) -> usize {
    let w = d.swizzle.row_bytes();
    d.swizzle
        .apply(d.start + (mn % 8) * w + (mn / 8) * d.sbo + k)
}

/// Physical byte where TMA (128-byte swizzle) puts element `(row, col)` (col < 128) of a box of
/// 128 one-byte columns written at `dst`.
pub fn tma_box_addr8(dst: usize, row: usize, col: usize) -> usize {
    Swizzle::B128.apply(dst + row * 128 + col)
}

// ---- the experiments' data ----

/// Distinct e4m3 codes for 0..128: `0.5 .. 120` for x < 64, `-(0.125 .. 30)` after (so that
/// every value names its index and sums of them stay exact in f32).
pub fn f_code(x: usize) -> E4m3 {
    if x < 64 {
        E4m3::from_bits(0x30 + x as u8)
    } else {
        E4m3::from_bits(0x80 | (0x20 + (x - 64) as u8))
    }
}

/// Distinct e4m3 codes for channels 0..128 (`f_code` again: distinct is all that matters).
fn g_code(c: usize) -> E4m3 {
    f_code(c)
}

/// The index whose code is `v` (`None` when no code of 0..128 is `v`).
fn f_index(v: f32) -> Option<usize> {
    (0..128).find(|&x| f_code(x).to_f32() == v)
}

fn mat(rows: usize, cols: usize, f: impl Fn(usize, usize) -> E4m3) -> Vec<u8> {
    (0..rows * cols)
        .map(|e| f(e / cols, e % cols).to_bits())
        .collect()
}

/// qk: Q one-hot at `i + 64h`; K coded by channel (`by_row` false) or by row.
fn qk_inputs(h: usize, by_row: bool) -> [Vec<u8>; 2] {
    let one = |b: bool| if b { E4m3::ONE } else { E4m3::default() };
    [
        mat(64, 128, |i, c| one(c == i + 64 * h)),
        mat(64, 128, |n, c| if by_row { f_code(n) } else { g_code(c) }),
    ]
}

/// pv: Q one-hot at `i`; K 128 keys coded by key (`by_row` false) or by row; V identity.
fn pv_inputs(by_row: bool) -> [Vec<u8>; 3] {
    let one = |b: bool| if b { E4m3::ONE } else { E4m3::default() };
    [
        mat(64, 128, |i, c| one(c == i)),
        mat(128, 128, |k, c| if by_row { f_code(c) } else { f_code(k) }),
        mat(128, 128, |k, n| one(k == n)),
    ]
}

/// `S[i][n]` of a qk run.
fn qk_expect(h: usize, by_row: bool, i: usize, n: usize) -> f32 {
    if by_row {
        f_code(n)
    } else {
        g_code(i + 64 * h)
    }
    .to_f32()
}

/// `S[i][k]` of a pv run.
fn pv_s(by_row: bool, i: usize, k: usize) -> f32 {
    if by_row { f_code(i) } else { f_code(k) }.to_f32()
}

// ---- the emulator ----

/// What the warpgroup holds after the experiments (empty by default, filled run by run).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fp8Dump {
    /// qk runs (H = 0 by channel, H = 1 by channel, by row): d0..d31 per thread.
    pub qk: Vec<Vec<Vec<f32>>>,
    /// qk's descriptors (first run): A k-steps 0..4, then B.
    pub qk_descs: Vec<u64>,
    /// pv runs (by key, by row): s0..s63 per thread.
    pub pv_s: Vec<Vec<Vec<f32>>>,
    /// pv runs: p0..p15 per thread.
    pub pv_p: Vec<Vec<[u32; 16]>>,
    /// pv runs: o0..o67 per thread.
    pub pv_o: Vec<Vec<Vec<f32>>>,
    /// pv's V^T descriptors (first run).
    pub pv_descs: Vec<u64>,
}

const QK_RUNS: [(usize, bool); 3] = [(0, false), (1, false), (0, true)];

fn kdesc(tile: usize, kk: usize, sub: usize, fault: bool) -> Descriptor {
    let d = Descriptor::kmajor_sw128(tile, kk, sub);
    if fault {
        Descriptor {
            swizzle: Swizzle::B64,
            ..d
        }
    } else {
        d
    }
}

fn load(smem: &mut [u8], dst: usize, m: &[u8], rows: usize) {
    for r in 0..rows {
        for c in 0..128 {
            smem[tma_box_addr8(dst, r, c)] = m[r * 128 + c];
        }
    }
}

/// One emulated e4m3 wgmma k32 step: A from shared memory (`a_desc`) or registers, B
/// K-major through `b`, N = `n`.
fn wgmma8(
    smem: &[u8],
    a_desc: Option<&Descriptor>,
    a_regs: &[[u32; 4]],
    b: &Descriptor,
    n: usize,
    d: &mut [Vec<f32>],
) {
    let dec = |x: u8| f64::from(E4m3::from_bits(x).to_f32());
    let mut am = [[0f64; 32]; 64];
    match a_desc {
        Some(ad) => {
            for (m, row) in am.iter_mut().enumerate() {
                for (k, x) in row.iter_mut().enumerate() {
                    *x = dec(smem[operand_addr8(ad, m, k)]);
                }
            }
        }
        None => {
            for (tid, regs) in a_regs.iter().enumerate() {
                for (j, &bits) in regs.iter().enumerate() {
                    for e in 0..4 {
                        let (m, k) = a8_cell(tid, j, e);
                        am[m][k] = dec((bits >> (8 * e)) as u8);
                    }
                }
            }
        }
    }
    for (tid, regs) in d.iter_mut().enumerate() {
        for (reg, x) in regs.iter_mut().enumerate() {
            let (m, col) = acc_cell(tid, reg);
            if col >= n {
                continue;
            }
            let mut sum = f64::from(*x);
            for k in 0..32 {
                sum += am[m][k] * dec(smem[operand_addr8(b, col, k)]);
            }
            *x = sum as f32;
        }
    }
}

/// The experiments on the emulator (the fault as the kernel injects it).
pub fn emulate(inject_fault: bool) -> Fp8Dump {
    let mut dump = Fp8Dump::default();
    for (h, by_row) in QK_RUNS {
        let [q, k] = qk_inputs(h, by_row);
        let mut smem = vec![0u8; SMEM];
        load(&mut smem, 0, &q, 64);
        load(&mut smem, 8192, &k, 64);
        let mut d = vec![vec![0f32; 32]; WARPGROUP];
        let mut descs = Vec::new();
        for kk in 0..4 {
            let (da, db) = (
                kdesc(0, kk, 8192, inject_fault),
                kdesc(8192, kk, 8192, inject_fault),
            );
            wgmma8(&smem, Some(&da), &[], &db, 64, &mut d);
            descs.push((da.encode(), db.encode()));
        }
        if dump.qk_descs.is_empty() {
            dump.qk_descs = descs
                .iter()
                .map(|x| x.0)
                .chain(descs.iter().map(|x| x.1))
                .collect();
        }
        dump.qk.push(d);
    }
    for by_row in [false, true] {
        let [q, k, v] = pv_inputs(by_row);
        let mut smem = vec![0u8; SMEM];
        load(&mut smem, 0, &q, 64);
        load(&mut smem, 8192, &k, 128);
        // The pre-pass: V^T row n, position x = V[vt_key(x)][n].
        let vt: Vec<u8> = (0..128 * 128)
            .map(|e| v[vt_key(e % 128) * 128 + e / 128])
            .collect();
        load(&mut smem, 24576, &vt, 128);
        smem[24576 + 16384..24576 + 17408].fill(E4m3::ONE.to_bits());
        let mut s = vec![vec![0f32; 64]; WARPGROUP];
        for kk in 0..4 {
            let (da, db) = (
                Descriptor::kmajor_sw128(0, kk, 8192),
                Descriptor::kmajor_sw128(8192, kk, 16384),
            );
            wgmma8(&smem, Some(&da), &[], &db, 128, &mut s);
        }
        let p: Vec<[u32; 16]> = s
            .iter()
            .map(|sr| {
                std::array::from_fn(|r| {
                    (0..4).fold(0u32, |w, e| {
                        let x = E4m3::from_f32(sr[p_acc_index(r / 4, r % 4, e)]).to_bits();
                        w | u32::from(x) << (8 * e)
                    })
                })
            })
            .collect();
        let mut o = vec![vec![0f32; 68]; WARPGROUP];
        let mut descs = Vec::new();
        for kk in 0..4 {
            let dv = kdesc(24576, kk, 16384, inject_fault);
            let regs: Vec<[u32; 4]> = p
                .iter()
                .map(|pr| std::array::from_fn(|j| pr[4 * kk + j]))
                .collect();
            wgmma8(&smem, None, &regs, &dv, 136, &mut o);
            descs.push(dv.encode());
        }
        if dump.pv_descs.is_empty() {
            dump.pv_descs = descs;
        }
        dump.pv_s.push(s);
        dump.pv_p.push(p);
        dump.pv_o.push(o);
    }
    dump
}

// ---- the checker ----

fn name_f(v: f32, what: &str) -> String {
    match f_index(v) {
        Some(x) => format!("the code of {what} {x} (value {})", show(v)),
        None => format!("value {} (no code)", show(v)),
    }
}

/// Checks every register of `dump`; `source` names where it came from.
pub fn check(dump: &Fp8Dump, source: impl Into<String>) -> ProbeReport {
    let mut report = ProbeReport::new(DType::BF16, source.into());
    for (run, (h, by_row)) in QK_RUNS.iter().copied().enumerate() {
        let title = format!(
            "e4m3 K-major descriptors (Q K^T, m64n64k32 x 4): S[i][n] = {}",
            if by_row {
                "f(n): every K row read where TMA put it".to_string()
            } else {
                format!("g(i + {}): every channel read where TMA put it", 64 * h)
            }
        );
        let what = if by_row { "row" } else { "channel" };
        check_acc(
            &mut report,
            &title,
            &dump.qk[run],
            "d",
            |i, n| qk_expect(h, by_row, i, n),
            |_, _, v| name_f(v, what),
            |i, n, e| format!("S[{i}][{n}] = {}", name_f(e, what)),
        );
    }
    let want: Vec<(String, Descriptor)> = (0..8)
        .map(|x| {
            (
                format!("desc {} k-step {}", if x < 4 { "A" } else { "B" }, x % 4),
                Descriptor::kmajor_sw128(if x < 4 { 0 } else { 8192 }, x % 4, 8192),
            )
        })
        .collect();
    check_descs(
        &mut report,
        "e4m3 K-major descriptors built by the kernel (A, B; 4 k-steps each)",
        &dump.qk_descs,
        &want,
    );

    for (run, by_row) in [false, true].into_iter().enumerate() {
        let what = if by_row { "row" } else { "key" };
        check_acc(
            &mut report,
            &format!(
                "S = Q K^T (m64n128k32 x 4): S[i][k] = f({})",
                if by_row { "i" } else { "k" }
            ),
            &dump.pv_s[run],
            "s",
            |i, k| pv_s(by_row, i, k),
            |_, _, v| name_f(v, what),
            |i, k, e| format!("S[{i}][{k}] = {}", name_f(e, what)),
        );
        let mut ps = Section::threads(
            "P packed to e4m3 (p_frag): byte e of register j of k-step kk = S accumulator 16kk + 8(j/2) + 2(j%2) + {0,1,4,5}[e]",
        );
        for (tid, regs) in dump.pv_p[run].iter().enumerate() {
            for (r, &bits) in regs.iter().enumerate() {
                for e in 0..4 {
                    let (i, k) = acc_cell(tid, p_acc_index(r / 4, r % 4, e));
                    let v = E4m3::from_bits((bits >> (8 * e)) as u8).to_f32();
                    let want = pv_s(by_row, i, k);
                    ps.cell(
                        v == want,
                        tid,
                        format!("(warp {}) p{r}.b{e}", tid / 32),
                        || name_f(v, what),
                        format!("P[{i}][key {k}] = {}", name_f(want, what)),
                    );
                }
            }
        }
        ps.finish(&mut report);
        let row_sum =
            |i: usize| (0..128).map(|k| f64::from(pv_s(by_row, i, k))).sum::<f64>() as f32;
        let mut os = Section::threads(format!(
            "O = P V^T (register A, V^T K-major after the pre-pass, m64n136k32 x 4): O[i][n] = P[i][key n] = f({}), O[i][128..136] = row sums",
            if by_row { "i" } else { "n" }
        ));
        for (tid, regs) in dump.pv_o[run].iter().enumerate() {
            for (reg, &v) in regs.iter().enumerate() {
                let (i, n) = acc_cell(tid, reg);
                // The row sums add 128 keys on the Tensor Cores, whose e4m3 products are
                // accumulated with fewer bits than f32 (the H100 gave 1100.75 for 1099.6875,
                // 2^-10 of it): judged to 2^-9 of the sum, still far below one key's share
                // (~2^-7), so a key lost or counted twice fails. Every other cell is exact.
                let (want, ok) = if n < 128 {
                    let e = pv_s(by_row, i, n);
                    (format!("O[{i}][{n}] = {}", name_f(e, what)), v == e)
                } else {
                    let e = row_sum(i);
                    let ok = (v - e).abs() <= e.abs() / 512.0;
                    (
                        format!("the row sum of P[{i}] (value {}, to 2^-9)", show(e)),
                        ok,
                    )
                };
                os.cell(
                    ok,
                    tid,
                    format!("(warp {}) o{reg}", tid / 32),
                    || name_f(v, what),
                    want,
                );
            }
        }
        os.finish(&mut report);
    }
    let want: Vec<(String, Descriptor)> = (0..4)
        .map(|x| {
            (
                format!("desc V^T k-step {x}"),
                Descriptor::kmajor_sw128(24576, x, 16384),
            )
        })
        .collect();
    check_descs(
        &mut report,
        "V^T descriptors built by the kernel (4 k-steps)",
        &dump.pv_descs,
        &want,
    );
    report
}

/// Runs the emulator and checks it.
pub fn run_emulated(inject_fault: bool) -> ProbeReport {
    check(&emulate(inject_fault), "emulator")
}

/// The 2-D map of a `rows x 128` byte matrix at `addr`, one box of all rows.
fn map8(addr: u64, rows: usize) -> std::result::Result<TmaMap, String> {
    TiledMap {
        dtype: DType::F16, // unused by encode_bytes
        addr,
        dims: vec![128, rows as u64],
        strides: vec![128],
        boxes: vec![128, rows as u32],
    }
    .encode_bytes()
}

/// Runs the experiments on an sm_90 GPU and checks every register.
///
/// # Errors
/// [`AttnError::BackendUnavailable`] below sm_90; compile, load and launch errors.
pub fn run_gpu(gpu: &Gpu, inject_fault: bool) -> Result<ProbeReport> {
    let info = gpu.info();
    if info.compute_capability != (9, 0) {
        return Err(AttnError::BackendUnavailable {
            backend: "cuda",
            reason: format!(
                "the e4m3 wgmma probe needs sm_90 (Hopper); this GPU is {}",
                info.arch
            ),
        });
    }
    let defines = crate::probe_wgmma::defines(crate::layout::Input16::F16, inject_fault);
    let stream = gpu.stream();
    let what = |s: &str| format!("{s} (e4m3 probe)");
    let up = |m: &[u8]| stream.clone_htod(m).map_err(cuda_err(what("uploading")));
    let run = |function: &str,
               mats: &[(&cudarc::driver::CudaSlice<u8>, usize)],
               words: usize,
               ndesc: usize|
     -> Result<(Vec<u32>, Vec<u64>)> {
        use cudarc::driver::DevicePtr;
        let k = gpu.kernel(KernelSource::WgmmaProbe, function, &defines)?;
        let mut maps = [TmaMap([0; 16]); 3];
        for (i, (buf, rows)) in mats.iter().enumerate() {
            let (ptr, _g) = buf.device_ptr(stream);
            maps[i] = map8(ptr, *rows).map_err(|m| AttnError::Cuda {
                context: what("building tensor maps"),
                message: m,
            })?;
        }
        let what = |step: &str| what(&format!("{step} {function}"));
        launch_maps(gpu, &k.function, SMEM + 1024, maps, words, ndesc, &what)
    };
    let mut dump = Fp8Dump::default();
    for (h, by_row) in QK_RUNS {
        let [q, k] = qk_inputs(h, by_row);
        let (q, k) = (up(&q)?, up(&k)?);
        let (regs, descs) = run(
            "wg_probe_fp8_qk",
            &[(&q, 64), (&k, 64), (&q, 64)],
            QK_WORDS,
            8,
        )?;
        if dump.qk_descs.is_empty() {
            dump.qk_descs = descs;
        }
        dump.qk.push(floats(&regs, QK_WORDS, 0..32));
    }
    for by_row in [false, true] {
        let [q, k, v] = pv_inputs(by_row);
        let (q, k, v) = (up(&q)?, up(&k)?, up(&v)?);
        // The kernel's pre-pass (fp8.cuh vt_block): V (1 batch, 128 keys, 1 head, 128 channels).
        let mut vt = stream
            .alloc_zeros::<u8>(128 * 128)
            .map_err(cuda_err(what("allocating V^T")))?;
        {
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let pre = gpu.kernel(KernelSource::WgmmaProbe, "wg_probe_fp8_vt", &defines)?;
            let (vp, _g1) = v.device_ptr(stream);
            let (vtp, _g2) = vt.device_ptr_mut(stream);
            let v_strides = Strides::contiguous(128, 1, 128);
            let params = VtParams::new(vp, vtp, v_strides, 128, 128, 1);
            // SAFETY: V holds 128 x 128 bytes, V^T 128 x 128; the pre-pass reads and writes
            // exactly those (2 blocks of 64 keys, 128 channels).
            unsafe { params.launch(stream, &pre.function, 1) }
                .map_err(cuda_err(what("the V^T pre-pass")))?;
        }
        let (regs, descs) = run(
            "wg_probe_fp8_pv",
            &[(&q, 64), (&k, 128), (&vt, 128)],
            PV_WORDS,
            4,
        )?;
        if dump.pv_descs.is_empty() {
            dump.pv_descs = descs;
        }
        dump.pv_s.push(floats(&regs, PV_WORDS, 0..64));
        dump.pv_p.push(
            regs.chunks(PV_WORDS)
                .map(|w| std::array::from_fn(|i| w[64 + i]))
                .collect(),
        );
        dump.pv_o.push(floats(&regs, PV_WORDS, 80..148));
    }
    Ok(check(&dump, format!("{} ({})", info.name, info.arch)))
}
