//! The warpgroup layout probe of the Hopper kernel: the three experiments of
//! `kernels/probe/wgmma_probe.cu`, run on an sm_90 GPU or through the [`crate::layout_wgmma`]
//! emulator, every register of every thread checked against the layout model.
//!
//! 1. **acc** (accumulator layout): `A[i][k] = i`, `B[k][j] = j`, one m64n64k16, so
//!    `D[i][j] = 16*i*j`: each value names the cells that could hold it.
//! 2. **kmajor** (the Q K^T path): A 64x128 and B 64x128, both TMA-loaded as two 128-byte-
//!    swizzled boxes and read through the K-major descriptors attn_wgmma builds, over all 8
//!    k-steps. A is one-hot (`A[i][i] = A[i][i+64] = 1`), so `D[i][n] = B[n][i] + B[n][i+64]`:
//!    with `B[n][k] = k` every cell must be `2i + 64` (a wrong swizzle reads other k), with
//!    `B[n][k] = n` it must be `2n` (a wrong row stride reads other rows).
//! 3. **pv** (the P V path): `S = Q K^T` with `S[i][k] = 16*(i%16) + k%16`, P = S packed to
//!    16-bit pairs as the register A operand, `O = P V` with V (64 keys x 128) read MN-major
//!    through attn_wgmma's V descriptor, `V[k][j] = [k == j%64] * (1 + [j >= 64])`, so
//!    `O[i][j] = P[i][j%64] * (1 or 2)`: a wrong LBO repeats the first 64 columns, a wrong
//!    SBO or k-step reads other keys.
//!
//! The descriptors the GPU built are checked too (fields, relative to the tile base).
//! The fault (`-DPROBE_FAULT=1`, or `inject_fault` in the emulator) gives the K-major
//! descriptors a 64-byte swizzle and V's an SBO of 512: kmajor and pv must then fail.

use crate::layout::{Input16, pack};
use crate::layout_wgmma::{
    self as lw, AOperand, Descriptor, Major, Swizzle, WARPGROUP, a_cell, acc_cell,
};
use crate::probe::{ProbeReport, Section, show};
use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use flashattn::cuda::launch::set_dynamic_smem;
use flashattn::cuda::tma::{TiledMap, TmaMap};
use flashattn::cuda::{Gpu, KernelSource, device::cuda_err};
use flashattn::dtype::DType;
use flashattn::error::{AttnError, Result};

/// Words each thread dumps in wg_probe_acc / wg_probe_kmajor / wg_probe_pv.
pub const ACC_WORDS: usize = 32;
/// See [`ACC_WORDS`].
pub const KMAJOR_WORDS: usize = 32;
/// s0..s31, p0..p15, o0..o63.
pub const PV_WORDS: usize = 112;
/// Bytes of shared memory the probe kernels stage (plus 1 KB of alignment slack).
const SMEM: usize = 32 * 1024;

/// What a warpgroup holds after the three experiments, and the descriptors it built.
#[derive(Debug, Clone, PartialEq)]
pub struct WgmmaDump {
    /// Storage type of the inputs.
    pub input: Input16,
    /// acc: d0..d31 per thread.
    pub acc: Vec<Vec<f32>>,
    /// kmajor with `B[n][k] = k`: d0..d31 per thread.
    pub kmajor_k: Vec<Vec<f32>>,
    /// kmajor with `B[n][k] = n`.
    pub kmajor_n: Vec<Vec<f32>>,
    /// kmajor's descriptors: A k-steps 0..8, then B k-steps 0..8.
    pub kmajor_descs: Vec<u64>,
    /// pv: S accumulators s0..s31 per thread.
    pub pv_s: Vec<Vec<f32>>,
    /// pv: P registers p0..p15 per thread (A fragments of k-steps 0..4).
    pub pv_p: Vec<[u32; 16]>,
    /// pv: O accumulators o0..o63 per thread.
    pub pv_o: Vec<Vec<f32>>,
    /// pv: V descriptors of k-steps 0..4.
    pub pv_descs: Vec<u64>,
}

// ---- the experiments' data (mirrored by the expectations in `check`) ----

fn mat(input: Input16, rows: usize, cols: usize, f: impl Fn(usize, usize) -> f32) -> Vec<u16> {
    (0..rows * cols)
        .map(|e| input.encode(f(e / cols, e % cols)))
        .collect()
}

/// acc: A 64x64 (`A[i][k] = i`), B as 64 rows n of 64 k (`B[n][k] = n`).
fn acc_inputs(input: Input16) -> [Vec<u16>; 2] {
    [
        mat(input, 64, 64, |i, _| i as f32),
        mat(input, 64, 64, |n, _| n as f32),
    ]
}

/// kmajor: A one-hot 64x128, B 64x128 with the code `k` (`by_n` false) or `n`.
fn kmajor_inputs(input: Input16, by_n: bool) -> [Vec<u16>; 2] {
    [
        mat(input, 64, 128, |i, k| f32::from(k % 64 == i)),
        mat(
            input,
            64,
            128,
            |n, k| if by_n { n as f32 } else { k as f32 },
        ),
    ]
}

/// pv: Q 64x64 one-hot on `i % 16`, K 64 keys x 64 (`K[k][c] = 16c + k%16` for c < 16), V
/// 64 keys x 128.
fn pv_inputs(input: Input16) -> [Vec<u16>; 3] {
    [
        mat(input, 64, 64, |i, c| f32::from(c == i % 16)),
        mat(input, 64, 64, |k, c| {
            if c < 16 {
                (16 * c + k % 16) as f32
            } else {
                0.0
            }
        }),
        mat(input, 64, 128, |k, j| {
            if k == j % 64 {
                if j < 64 { 1.0 } else { 2.0 }
            } else {
                0.0
            }
        }),
    ]
}

/// The probe's K-major descriptor, with the fault when asked (wgmma_probe.cu `kdesc`).
fn kdesc(tile: usize, kk: usize, fault: bool) -> Descriptor {
    let d = Descriptor::kmajor_sw128(tile, kk, 8192);
    if fault {
        Descriptor {
            swizzle: Swizzle::B64,
            ..d
        }
    } else {
        d
    }
}

/// The probe's V descriptor, with the fault when asked (wgmma_probe.cu `vdesc`).
fn vdesc(tile: usize, kk: usize, fault: bool) -> Descriptor {
    let d = Descriptor::mnmajor_sw128(tile, kk, 8192);
    if fault {
        Descriptor { sbo: 512, ..d }
    } else {
        d
    }
}

/// One emulated wgmma with both operands k-major in shared memory (A at `da`, B at `db`) into
/// the 64-column accumulator `d`: the S = Q K^T shape of the acc, kmajor and pv probes.
fn kmajor_wgmma(
    input: Input16,
    smem: &[u8],
    (da, db): (Descriptor, Descriptor),
    d: &mut [Vec<f32>],
    accumulate: bool,
) {
    lw::wgmma(
        input,
        smem,
        AOperand::Smem(da),
        &db,
        Major::K,
        64,
        d,
        accumulate,
    );
}

fn kmajor_emulated(input: Input16, by_n: bool, fault: bool) -> (Vec<Vec<f32>>, Vec<u64>) {
    let [a, b] = kmajor_inputs(input, by_n);
    let mut smem = vec![0u8; SMEM];
    lw::tma_load(&mut smem, 0, &a, 64, 128, 8192);
    lw::tma_load(&mut smem, 16384, &b, 64, 128, 8192);
    let mut d = lw::zero_acc(64);
    let mut descs = vec![0u64; 16];
    for kk in 0..8 {
        let (da, db) = (kdesc(0, kk, fault), kdesc(16384, kk, fault));
        kmajor_wgmma(input, &smem, (da, db), &mut d, kk > 0);
        descs[kk] = da.encode();
        descs[8 + kk] = db.encode();
    }
    (d, descs)
}

/// Runs the three experiments through the emulator, step by step as the kernels do.
pub fn emulate(input: Input16, inject_fault: bool) -> WgmmaDump {
    // acc
    let [a, b] = acc_inputs(input);
    let mut smem = vec![0u8; SMEM];
    lw::tma_load(&mut smem, 0, &a, 64, 64, 8192);
    lw::tma_load(&mut smem, 8192, &b, 64, 64, 8192);
    let mut acc = lw::zero_acc(64);
    let descs = (
        Descriptor::kmajor_sw128(0, 0, 8192),
        Descriptor::kmajor_sw128(8192, 0, 8192),
    );
    kmajor_wgmma(input, &smem, descs, &mut acc, false);
    // kmajor, both codes
    let (kmajor_k, kmajor_descs) = kmajor_emulated(input, false, inject_fault);
    let (kmajor_n, _) = kmajor_emulated(input, true, inject_fault);
    // pv
    let [q, k, v] = pv_inputs(input);
    let mut smem = vec![0u8; SMEM];
    lw::tma_load(&mut smem, 0, &q, 64, 64, 8192);
    lw::tma_load(&mut smem, 8192, &k, 64, 64, 8192);
    lw::tma_load(&mut smem, 16384, &v, 64, 128, 8192);
    let mut s = lw::zero_acc(64);
    for kk in 0..4 {
        let descs = (
            Descriptor::kmajor_sw128(0, kk, 8192),
            Descriptor::kmajor_sw128(8192, kk, 8192),
        );
        kmajor_wgmma(input, &smem, descs, &mut s, kk > 0);
    }
    let pv_p: Vec<[u32; 16]> = s
        .iter()
        .map(|r| std::array::from_fn(|i| pack(input.encode(r[2 * i]), input.encode(r[2 * i + 1]))))
        .collect();
    let mut o = lw::zero_acc(128);
    let mut pv_descs = Vec::new();
    for kk in 0..4 {
        let frag: Vec<[u32; 4]> = pv_p
            .iter()
            .map(|p| [p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]])
            .collect();
        let dv = vdesc(16384, kk, inject_fault);
        lw::wgmma(
            input,
            &smem,
            AOperand::Regs(&frag),
            &dv,
            Major::MN,
            128,
            &mut o,
            true,
        );
        pv_descs.push(dv.encode());
    }
    WgmmaDump {
        input,
        acc,
        kmajor_k,
        kmajor_n,
        kmajor_descs,
        pv_s: s,
        pv_p,
        pv_o: o,
        pv_descs,
    }
}

// ---- the checker ----

fn reg_name(prefix: &str, tid: usize, reg: usize) -> String {
    format!("(warp {}) {prefix}{reg}", tid / 32)
}

/// The cells of `D[i][j] = 16*i*j` (64x64) that could hold `v`.
fn describe_acc(v: f32) -> String {
    let n = if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && (v as usize).is_multiple_of(16) {
        v as usize / 16
    } else {
        return format!("value {} (no cell holds it)", show(v));
    };
    let cands: Vec<String> = (0..64)
        .flat_map(|i| (0..64).map(move |j| (i, j)))
        .filter(|&(i, j)| i * j == n)
        .map(|(i, j)| format!("D[{i}][{j}]"))
        .collect();
    match cands.len() {
        0 => format!("value {} (no cell holds it)", show(v)),
        1..=4 => format!("{} (value {})", cands.join(" or "), show(v)),
        c => format!("value {} ({c} cells hold it)", show(v)),
    }
}

/// One section titled `title` comparing the descriptors the kernel built (`got`) with the
/// model's (`want`, each with its name), relative to the first one's start (the tile base
/// differs between the GPU and the emulator). Shared with [`crate::probe_wgmma_fp8`].
pub(crate) fn check_descs(
    report: &mut ProbeReport,
    title: &str,
    got: &[u64],
    want: &[(String, Descriptor)],
) {
    let mut sec = Section::new(title);
    let base_got = Descriptor::decode(got[0]).start;
    let base_want = want[0].1.start;
    for (&g, (name, w)) in got.iter().zip(want) {
        let gd = Descriptor::decode(g);
        let rel = Descriptor {
            start: gd.start.wrapping_sub(base_got) + base_want,
            ..gd
        };
        sec.cell(
            rel == *w,
            0,
            name.clone(),
            || rel.to_string(),
            w.to_string(),
        );
    }
    sec.finish(report);
}

/// One section over a warpgroup's accumulators `regs` (by thread, then register): the cell
/// (i, j) a register holds ([`acc_cell`]) must equal `expect(i, j)`; `got(i, j, v)` describes a
/// wrong value, `want(i, j, e)` the expected one, and registers are named `prefix` + index.
/// Shared with [`crate::probe_wgmma_fp8`].
pub(crate) fn check_acc(
    report: &mut ProbeReport,
    title: &str,
    regs: &[Vec<f32>],
    prefix: &str,
    expect: impl Fn(usize, usize) -> f32,
    got: impl Fn(usize, usize, f32) -> String,
    want: impl Fn(usize, usize, f32) -> String,
) {
    let mut sec = Section::threads(title);
    for (tid, thread) in regs.iter().enumerate() {
        for (reg, &v) in thread.iter().enumerate() {
            let (i, j) = acc_cell(tid, reg);
            let e = expect(i, j);
            sec.cell(
                v == e,
                tid,
                reg_name(prefix, tid, reg),
                || got(i, j, v),
                want(i, j, e),
            );
        }
    }
    sec.finish(report);
}

/// Checks every register of `dump` against the layout model; `source` names where it came from.
pub fn check(dump: &WgmmaDump, source: impl Into<String>) -> ProbeReport {
    let input = dump.input;
    let mut report = ProbeReport::new(input.dtype(), source.into());

    check_acc(
        &mut report,
        "wgmma accumulators: D[i][j] = 16*i*j (m64n64k16)",
        &dump.acc,
        "d",
        |i, j| (16 * i * j) as f32,
        |_, _, v| describe_acc(v),
        |i, j, e| format!("D[{i}][{j}] (value {})", show(e)),
    );
    check_acc(
        &mut report,
        "K-major descriptors, 128-byte swizzle (Q K^T path): every k read where TMA put it, D = 2i+64",
        &dump.kmajor_k,
        "d",
        |i, _| (2 * i + 64) as f32,
        |_, n, v| {
            if v.fract() == 0.0 && v >= 64.0 && (v as usize - 64).is_multiple_of(2) && v < 192.0 {
                format!(
                    "k = {} and {} of row n={n} (value {})",
                    (v as usize - 64) / 2,
                    (v as usize - 64) / 2 + 64,
                    show(v)
                )
            } else {
                format!("value {} (not the sum of k and k+64)", show(v))
            }
        },
        |i, n, e| format!("k = {i} and {} of row {n} (value {})", i + 64, show(e)),
    );
    check_acc(
        &mut report,
        "K-major descriptors, 128-byte swizzle: every row n read where TMA put it, D = 2n",
        &dump.kmajor_n,
        "d",
        |_, n| (2 * n) as f32,
        |_, _, v| {
            if v.fract() == 0.0 && v >= 0.0 && (v as usize).is_multiple_of(2) && v < 128.0 {
                format!("B row {} (value {})", v as usize / 2, show(v))
            } else {
                format!("value {} (rows mixed)", show(v))
            }
        },
        |i, n, e| format!("B row {n} for D[{i}][{n}] (value {})", show(e)),
    );
    let want: Vec<(String, Descriptor)> = (0..16)
        .map(|x| {
            (
                format!("desc {} k-step {}", if x < 8 { "A" } else { "B" }, x % 8),
                Descriptor::kmajor_sw128(if x < 8 { 0 } else { 16384 }, x % 8, 8192),
            )
        })
        .collect();
    check_descs(
        &mut report,
        "K-major descriptors built by the kernel (A, B; 8 k-steps each)",
        &dump.kmajor_descs,
        &want,
    );

    let s_val = |i: usize, k: usize| (16 * (i % 16) + k % 16) as f32;
    let describe_s = |v: f32| match v {
        x if x.fract() == 0.0 && (0.0..256.0).contains(&x) => {
            format!(
                "S[i%16 = {}][k%16 = {}] (value {})",
                x as usize / 16,
                x as usize % 16,
                show(x)
            )
        }
        x => format!("value {} (no cell holds it)", show(x)),
    };
    check_acc(
        &mut report,
        "S = Q K^T accumulators (m64n64, 4 k-steps): S[i][k] = 16*(i%16) + k%16",
        &dump.pv_s,
        "s",
        s_val,
        |_, _, v| describe_s(v),
        |i, k, e| format!("S[{i}][{k}] (value {})", show(e)),
    );
    let mut ps = Section::threads(format!(
        "P = S packed to {} pairs as the register A operand (4 k-steps)",
        input.dtype()
    ));
    for (tid, regs) in dump.pv_p.iter().enumerate() {
        for (r, &bits) in regs.iter().enumerate() {
            for half in 0..2 {
                let (i, kl) = a_cell(tid, r % 4, half);
                let k = 16 * (r / 4) + kl;
                let v = input.decode((bits >> (16 * half)) as u16);
                let e = s_val(i, k);
                let name = format!(
                    "(warp {}) p{r}.{}",
                    tid / 32,
                    if half == 0 { "lo" } else { "hi" }
                );
                ps.cell(
                    v == e,
                    tid,
                    name,
                    || describe_s(v),
                    format!("P[{i}][{k}] (value {})", show(e)),
                );
            }
        }
    }
    ps.finish(&mut report);
    let weight = |j: usize| if j < 64 { 1.0 } else { 2.0 };
    check_acc(
        &mut report,
        "O = P V, V MN-major through its descriptor (LBO = next 64 columns): O[i][j] = P[i][j%64] * (1 or 2)",
        &dump.pv_o,
        "o",
        |i, j| s_val(i, j % 64) * weight(j),
        |_, j, v| {
            let w = weight(j);
            if v.fract() == 0.0 && v >= 0.0 && v < 256.0 * w {
                format!(
                    "value {} (= {} x P[i][k] with k%16 = {})",
                    show(v),
                    show(w),
                    (v / w) as usize % 16
                )
            } else {
                format!("value {} (keys mixed)", show(v))
            }
        },
        |i, j, e| format!("O[{i}][{j}] (value {})", show(e)),
    );
    let want: Vec<(String, Descriptor)> = (0..4)
        .map(|x| {
            (
                format!("desc V k-step {x}"),
                Descriptor::mnmajor_sw128(16384, x, 8192),
            )
        })
        .collect();
    check_descs(
        &mut report,
        "V descriptors built by the kernel (4 k-steps)",
        &dump.pv_descs,
        &want,
    );
    report
}

/// Runs the emulator and checks it (f32 is reported as unsupported).
pub fn run_emulated(dtype: DType, inject_fault: bool) -> ProbeReport {
    crate::probe::emulated(dtype, "wgmma", |input| {
        check(&emulate(input, inject_fault), "emulator")
    })
}

/// The NVRTC defines of `kernels/probe/wgmma_probe.cu`.
pub fn defines(input: Input16, inject_fault: bool) -> Vec<(String, String)> {
    input.probe_defines("IS_BF16", inject_fault)
}

/// The probe kernels' tensor-map parameter (`ProbeMaps`).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbeMaps {
    pub a: TmaMap,
    pub b: TmaMap,
    pub c: TmaMap,
}
// SAFETY: plain old data with C layout, mirrored by the kernel's struct.
unsafe impl DeviceRepr for ProbeMaps {}

/// One probe launch: uploads the matrices, builds their 2-D maps (boxes of 64 columns x all
/// rows), runs `function` with one warpgroup, and returns (registers, descriptors).
fn launch(
    gpu: &Gpu,
    input: Input16,
    inject_fault: bool,
    function: &str,
    mats: &[(&[u16], usize, usize)],
    words: usize,
    descs: usize,
) -> Result<(Vec<u32>, Vec<u64>)> {
    let kernel = gpu.kernel(
        KernelSource::WgmmaProbe,
        function,
        &defines(input, inject_fault),
    )?;
    let stream = gpu.stream();
    let what = |step: &str| format!("{step} {function} ({})", input.dtype());
    let mut bufs = Vec::new();
    for (m, _, _) in mats {
        bufs.push(
            stream
                .clone_htod(*m)
                .map_err(cuda_err(what("uploading the inputs of")))?,
        );
    }
    let mut maps = [TmaMap([0; 16]); 3];
    for (i, ((_, rows, cols), buf)) in mats.iter().zip(&bufs).enumerate() {
        use cudarc::driver::DevicePtr;
        let (ptr, _g) = buf.device_ptr(stream);
        let map = TiledMap {
            dtype: input.dtype(),
            addr: ptr,
            dims: vec![*cols as u64, *rows as u64],
            strides: vec![*cols as u64 * 2],
            boxes: vec![64, *rows as u32],
        };
        maps[i] = map.encode().map_err(|why| AttnError::Cuda {
            context: what("building the tensor maps of"),
            message: why,
        })?;
    }
    launch_maps(
        gpu,
        &kernel.function,
        SMEM + 1024,
        maps,
        words,
        descs,
        &what,
    )
}

/// Launches a probe kernel `function` with one warpgroup and `smem` bytes of dynamic shared
/// memory on `maps` (a, b, c), `words` u32 registers per thread and `descs` u64 descriptors
/// poisoned before, and returns (registers, descriptors) after the stream synchronised.
/// `what(step)` names each step in errors. Shared with [`crate::probe_wgmma_fp8`].
pub(crate) fn launch_maps(
    gpu: &Gpu,
    function: &CudaFunction,
    smem: usize,
    [a, b, c]: [TmaMap; 3],
    words: usize,
    descs: usize,
    what: &dyn Fn(&str) -> String,
) -> Result<(Vec<u32>, Vec<u64>)> {
    let stream = gpu.stream();
    let maps = ProbeMaps { a, b, c };
    let mut out = stream
        .clone_htod(&vec![u32::MAX; WARPGROUP * words])
        .map_err(cuda_err(what("allocating the output of")))?;
    let mut dout = stream
        .clone_htod(&vec![u64::MAX; descs.max(1)])
        .map_err(cuda_err(what("allocating the descriptors of")))?;
    set_dynamic_smem(function, smem, &what("configuring"))?;
    let mut b = stream.launch_builder(function);
    b.arg(&mut out);
    if descs > 0 {
        b.arg(&mut dout);
    }
    b.arg(&maps);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (WARPGROUP as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: the kernel writes 128 * words u32 and `descs` u64 (both allocated), reads only
    // through the maps, which describe the uploaded matrices; one warpgroup as it is written for.
    unsafe { b.launch(cfg) }.map_err(cuda_err(what("launching")))?;
    stream.synchronize().map_err(cuda_err(what("running")))?;
    let regs = stream
        .clone_dtoh(&out)
        .map_err(cuda_err(what("reading the output of")))?;
    let d = stream
        .clone_dtoh(&dout)
        .map_err(cuda_err(what("reading the descriptors of")))?;
    Ok((regs, d))
}

/// The f32 registers `take` of each thread's `per` dumped words. Shared with
/// [`crate::probe_wgmma_fp8`].
pub(crate) fn floats(words: &[u32], per: usize, take: std::ops::Range<usize>) -> Vec<Vec<f32>> {
    words
        .chunks(per)
        .map(|w| w[take.clone()].iter().map(|&x| f32::from_bits(x)).collect())
        .collect()
}

/// Runs the three experiments on an sm_90 GPU and checks every register.
///
/// # Errors
/// [`AttnError::DTypeMismatch`] for f32, [`AttnError::BackendUnavailable`] on a GPU without
/// wgmma; compile, load and launch errors from the driver.
pub fn run_gpu(gpu: &Gpu, dtype: DType, inject_fault: bool) -> Result<ProbeReport> {
    let input = Input16::from_dtype(dtype).ok_or_else(|| AttnError::DTypeMismatch {
        what: format!("the wgmma probe takes f16 or bf16 inputs, not {dtype}"),
    })?;
    let info = gpu.info();
    if info.compute_capability != (9, 0) {
        return Err(AttnError::BackendUnavailable {
            backend: "cuda",
            reason: format!(
                "the wgmma probe needs sm_90 (Hopper); this GPU is {}",
                info.arch
            ),
        });
    }
    // Every probe launch shares the GPU, the inputs' dtype and the fault switch.
    let run = |function: &str, mats: &[(&[u16], usize, usize)], words: usize, descs: usize| {
        launch(gpu, input, inject_fault, function, mats, words, descs)
    };
    let [a, b] = acc_inputs(input);
    let (acc, _) = run("wg_probe_acc", &[(&a, 64, 64), (&b, 64, 64)], ACC_WORDS, 0)?;
    // The k-major probe twice: B coded with `k`, then with `n` (one kernel).
    let kmajor = |by_n| {
        let [a, b] = kmajor_inputs(input, by_n);
        run(
            "wg_probe_kmajor",
            &[(&a, 64, 128), (&b, 64, 128)],
            KMAJOR_WORDS,
            16,
        )
    };
    let (kk, kmajor_descs) = kmajor(false)?;
    let (kn, _) = kmajor(true)?;
    let [q, k, v] = pv_inputs(input);
    let mats = [(&q[..], 64, 64), (&k[..], 64, 64), (&v[..], 64, 128)];
    let (pv, pv_descs) = run("wg_probe_pv", &mats, PV_WORDS, 4)?;
    let dump = WgmmaDump {
        input,
        acc: floats(&acc, ACC_WORDS, 0..32),
        kmajor_k: floats(&kk, KMAJOR_WORDS, 0..32),
        kmajor_n: floats(&kn, KMAJOR_WORDS, 0..32),
        kmajor_descs,
        pv_s: floats(&pv, PV_WORDS, 0..32),
        pv_p: pv
            .chunks(PV_WORDS)
            .map(|w| std::array::from_fn(|i| w[32 + i]))
            .collect(),
        pv_o: floats(&pv, PV_WORDS, 48..112),
        pv_descs,
    };
    Ok(check(&dump, format!("{} ({})", info.name, info.arch)))
}
