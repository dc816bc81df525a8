//! The fragment-layout probe: run the single-warp experiments of `kernels/probe/layout_probe.cu` on a
//! GPU or through the [`crate::layout`] emulator, and check every register of every lane
//! against the layout model.
//!
//! Two cases, each one warp:
//! - **probe**: `A[i][j] = i` (16x16), `B[k][j] = j` (16x8 row-major `[k][n]`), A through
//!   `ldmatrix.x4`, B through `ldmatrix.x4.trans`, one `mma.m16n8k16`: `D[i][j] = 16*i*j`.
//!   A register's value names the row of A it came from, a B value the column, a D value the
//!   products `i*j` that could give it; so a wrong register is reported as "lane 13 d1: got
//!   D[..] (value ..), expected D[3][3] (value 144)".
//! - **handoff** (S -> P in registers): `S = A1 B1` as two n=8 C fragments with
//!   `S[i][k] = 16*i + k` (each value names its cell), packed to 16-bit pairs that are used as
//!   the A fragment of `P` in a second `mma` with `B2[k][j] = [k == j] + 256*[k == j + 8]`, so
//!   `D2[i][j] = P[i][j] + 256*P[i][j+8]`. D2 is compared with the emulator's two-step product
//!   (emulated `mma` for S, rounding to 16 bits, emulated `mma` again).
//! - **transposed A** (the backward's dS read from dS^T): A stored as its transpose `[k][m]`
//!   and loaded with `ldmatrix.x4.trans` at the addresses attn_bwd.cu uses, with
//!   `A[i][j] = i + 16*j` (each value names its row and column, so a wrong k order shows) and
//!   B as in the probe case: `D[i][j] = 16*i*j + 1920*j`.
//! - **transposed store** (sm_90: attn_bwd_wgmma's dS^T accumulators stored as dS): each lane
//!   builds the C fragments of `X = A^T` from the accumulator layout, stores them with
//!   `stmatrix.x4.trans` at the kernel's address pattern, loads A back with `ldmatrix.x4` and
//!   multiplies as in the transposed-A case (the same expected registers). Skipped on GPUs
//!   below sm_90 (no `stmatrix`); the emulator always runs it.
//!
//! The GPU path ([`run_gpu`]) and the emulator path ([`run_emulated`]) fill the same
//! [`RegisterDump`], and one checker ([`check`]) judges both. The fault variant loads B of the
//! probe case and A^T of the transposed-A case without `.trans`, and stores the transposed-store
//! case's fragments without `.trans` (`-DPROBE_FAULT=1` on the GPU, `trans = false` in the
//! emulator): the checker must then fail and name the lanes.

use crate::layout::{
    self, Acc16x8, Input16, LdmatrixNum, Mat16x8, Mat16x16, WARP, Warp, a_cell, a_x4_addrs,
    a_x4_trans_addrs, b_cell, b_x4_trans_addrs, cd_cell, first_two, last_two,
};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use flashattn::cuda::{Gpu, KernelSource, device::cuda_err};
use flashattn::dtype::DType;
use flashattn::error::{AttnError, Result};
use std::fmt;

/// 32-bit words each lane writes in `layout_probe` and `layout_trans_a`: a0..a3, b0..b1,
/// d0..d3.
pub const PROBE_REGS: usize = 10;
/// 32-bit words each lane writes in `layout_handoff`: s0..s7, p0..p3, d0..d3.
pub const HANDOFF_REGS: usize = 16;

/// What one lane holds after the probe case.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProbeLane {
    /// A fragment (a0..a3), two 16-bit values each.
    pub a: [u32; 4],
    /// B fragment (b0, b1), two 16-bit values each.
    pub b: [u32; 2],
    /// D fragment (d0..d3).
    pub d: [f32; 4],
}

/// What one lane holds after the S -> P hand-off case.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HandoffLane {
    /// C fragments of S: s0..s3 cover columns 0..8, s4..s7 columns 8..16.
    pub s: [f32; 8],
    /// A fragment of P, packed from S (p0..p3).
    pub p: [u32; 4],
    /// D2 fragment (d0..d3) of the second `mma`.
    pub d: [f32; 4],
}

/// Every register of every lane in both cases: what the GPU wrote or the emulator computed.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisterDump {
    /// Storage type of the inputs.
    pub input: Input16,
    /// The probe case, by lane.
    pub probe: Warp<ProbeLane>,
    /// The hand-off case, by lane.
    pub handoff: Warp<HandoffLane>,
    /// The transposed-A case, by lane (registers as in the probe case).
    pub trans_a: Warp<ProbeLane>,
    /// The transposed-store case, by lane (registers as in the probe case); `None` where the
    /// GPU has no `stmatrix` (below sm_90).
    pub trans_store: Option<Warp<ProbeLane>>,
}

impl RegisterDump {
    /// Parses the kernels' output buffers (`out[lane * PROBE_REGS + r]` of `layout_probe`,
    /// `layout_trans_a` and `layout_trans_store`, `out[lane * HANDOFF_REGS + r]` of
    /// `layout_handoff`, f32 stored as bits).
    ///
    /// # Errors
    /// [`AttnError::ShapeMismatch`] when a buffer has the wrong length.
    pub fn from_words(
        input: Input16,
        probe: &[u32],
        handoff: &[u32],
        trans_a: &[u32],
        trans_store: Option<&[u32]>,
    ) -> Result<Self> {
        if probe.len() != WARP * PROBE_REGS
            || handoff.len() != WARP * HANDOFF_REGS
            || trans_a.len() != WARP * PROBE_REGS
            || trans_store.is_some_and(|w| w.len() != WARP * PROBE_REGS)
        {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "probe dumps hold {}, {}, {} and {:?} words, expected {}, {}, {} and {}",
                    probe.len(),
                    handoff.len(),
                    trans_a.len(),
                    trans_store.map(<[u32]>::len),
                    WARP * PROBE_REGS,
                    WARP * HANDOFF_REGS,
                    WARP * PROBE_REGS,
                    WARP * PROBE_REGS
                ),
            });
        }
        let f = f32::from_bits;
        let probe_lanes = |words: &[u32]| -> Warp<ProbeLane> {
            std::array::from_fn(|l| {
                let w = &words[l * PROBE_REGS..(l + 1) * PROBE_REGS];
                ProbeLane {
                    a: [w[0], w[1], w[2], w[3]],
                    b: [w[4], w[5]],
                    d: [f(w[6]), f(w[7]), f(w[8]), f(w[9])],
                }
            })
        };
        let probe = probe_lanes(probe);
        let handoff = std::array::from_fn(|l| {
            let w = &handoff[l * HANDOFF_REGS..(l + 1) * HANDOFF_REGS];
            HandoffLane {
                s: std::array::from_fn(|i| f(w[i])),
                p: [w[8], w[9], w[10], w[11]],
                d: std::array::from_fn(|i| f(w[12 + i])),
            }
        });
        Ok(Self {
            input,
            probe,
            handoff,
            trans_a: probe_lanes(trans_a),
            trans_store: trans_store.map(probe_lanes),
        })
    }
}

// ---- the experiments' data (mirrors kernels/probe/layout_probe.cu) ----

fn a1_value(i: usize, m: usize) -> f32 {
    if m < 8 { i as f32 } else { 1.0 }
}

fn b1_value(m: usize, k: usize) -> f32 {
    match m {
        0..8 => 2.0,
        8..12 => (k & (1 << (m - 8))) as f32,
        _ => 0.0,
    }
}

fn b2_value(k: usize, j: usize) -> f32 {
    if k == j {
        1.0
    } else if k == j + 8 {
        256.0
    } else {
        0.0
    }
}

/// Shared memory of `layout_probe`: sA (16x16, `A[i][j] = i`) at element 0, sB (16x8,
/// `B[k][j] = j`) at element 256.
fn probe_smem(input: Input16) -> Vec<u16> {
    let a = (0..256).map(|e| input.encode((e / 16) as f32));
    let b = (0..128).map(|e| input.encode((e % 8) as f32));
    a.chain(b).collect()
}

/// Shared memory of `layout_handoff`: A1 at 0, B1 at 256 (both 16x16), B2 (16x8) at 512.
fn handoff_smem(input: Input16) -> Vec<u16> {
    let a1 = (0..256).map(|e| input.encode(a1_value(e / 16, e % 16)));
    let b1 = (0..256).map(|e| input.encode(b1_value(e / 16, e % 16)));
    let b2 = (0..128).map(|e| input.encode(b2_value(e / 8, e % 8)));
    a1.chain(b1).chain(b2).collect()
}

/// Runs the three experiments through the warp emulator, step by step as the kernels do.
/// With `inject_fault`, B of the probe case and A^T of the transposed-A case are loaded
/// without `.trans`.
pub fn emulate(input: Input16, inject_fault: bool) -> RegisterDump {
    let zero = [[0f32; 4]; WARP];
    // Probe case.
    let smem = probe_smem(input);
    let a = layout::ldmatrix(&smem, &a_x4_addrs(0, 16), LdmatrixNum::X4, false);
    let b = layout::ldmatrix(
        &smem,
        &b_x4_trans_addrs(256, 8, 1),
        LdmatrixNum::X4,
        !inject_fault,
    );
    let d = layout::mma(input, &a, &first_two(&b), &zero);
    let probe = std::array::from_fn(|l| ProbeLane {
        a: a[l],
        b: [b[l][0], b[l][1]],
        d: d[l],
    });
    // Hand-off case.
    let smem = handoff_smem(input);
    let a = layout::ldmatrix(&smem, &a_x4_addrs(0, 16), LdmatrixNum::X4, false);
    let b = layout::ldmatrix(&smem, &b_x4_trans_addrs(256, 16, 2), LdmatrixNum::X4, true);
    let s0 = layout::mma(input, &a, &first_two(&b), &zero);
    let s1 = layout::mma(input, &a, &last_two(&b), &zero);
    let pk = |x: f32, y: f32| layout::pack(input.encode(x), input.encode(y));
    let p: Warp<[u32; 4]> = std::array::from_fn(|l| {
        let (u, v) = (s0[l], s1[l]);
        [
            pk(u[0], u[1]),
            pk(u[2], u[3]),
            pk(v[0], v[1]),
            pk(v[2], v[3]),
        ]
    });
    let b2_addrs = std::array::from_fn(|l| 512 + (l % 16) * 8);
    let b2 = layout::ldmatrix(&smem, &b2_addrs, LdmatrixNum::X2, true);
    let d = layout::mma(input, &p, &first_two(&b2), &zero);
    let handoff = std::array::from_fn(|l| {
        let mut s = [0f32; 8];
        s[..4].copy_from_slice(&s0[l]);
        s[4..].copy_from_slice(&s1[l]);
        HandoffLane {
            s,
            p: p[l],
            d: d[l],
        }
    });
    // Transposed-A case: At[k][m] = m + 16k (element e = 16k + m holds e) at element 0, B as
    // in the probe case at 256.
    let at = (0..256).map(|e| input.encode(e as f32));
    let bt = (0..128).map(|e| input.encode((e % 8) as f32));
    let smem: Vec<u16> = at.chain(bt).collect();
    let a = layout::ldmatrix(
        &smem,
        &a_x4_trans_addrs(0, 16),
        LdmatrixNum::X4,
        !inject_fault,
    );
    let b = layout::ldmatrix(&smem, &b_x4_trans_addrs(256, 8, 1), LdmatrixNum::X4, true);
    let d = layout::mma(input, &a, &first_two(&b), &zero);
    let trans_a = std::array::from_fn(|l| ProbeLane {
        a: a[l],
        b: [b[l][0], b[l][1]],
        d: d[l],
    });
    // Transposed-store case: the C fragments of X = A^T (X[k][i] = i + 16k) from the
    // accumulator layout, register m holding X's rows 8(m%2).. and columns 8(m/2)..; stored
    // with stmatrix at the transposed-A addresses into A (row-major, poisoned first), loaded
    // back with ldmatrix.x4; B at 256 as before.
    let x: Warp<[u32; 4]> = std::array::from_fn(|l| {
        std::array::from_fn(|m| {
            let (k, i) = cd_cell(l, 2 * (m % 2));
            let i = i + 8 * (m / 2);
            let v = |i: usize| input.encode((i + 16 * k) as f32);
            layout::pack(v(i), v(i + 1))
        })
    });
    let mut smem = vec![u16::MAX; 256];
    smem.extend((0..128).map(|e| input.encode((e % 8) as f32)));
    layout::stmatrix(
        &mut smem,
        &a_x4_trans_addrs(0, 16),
        &x,
        LdmatrixNum::X4,
        !inject_fault,
    );
    let a = layout::ldmatrix(&smem, &a_x4_addrs(0, 16), LdmatrixNum::X4, false);
    let b = layout::ldmatrix(&smem, &b_x4_trans_addrs(256, 8, 1), LdmatrixNum::X4, true);
    let d = layout::mma(input, &a, &first_two(&b), &zero);
    let trans_store = Some(std::array::from_fn(|l| ProbeLane {
        a: a[l],
        b: [b[l][0], b[l][1]],
        d: d[l],
    }));
    RegisterDump {
        input,
        probe,
        handoff,
        trans_a,
        trans_store,
    }
}

/// The expected D2 of the hand-off case, in two emulated steps from the matrices (fragments
/// built directly through the layout maps, no `ldmatrix`): S = A1 B1, P = 16-bit(S), D2 = P B2.
pub fn expected_handoff(input: Input16) -> Acc16x8 {
    let zero = [[0f32; 4]; WARP];
    let a1: Mat16x16 =
        std::array::from_fn(|i| std::array::from_fn(|m| input.encode(a1_value(i, m))));
    let b1_half = |n0: usize| -> Mat16x8 {
        std::array::from_fn(|m| std::array::from_fn(|k| input.encode(b1_value(m, n0 + k))))
    };
    let a1f = layout::gather_a(&a1);
    let s0 = layout::scatter_cd(&layout::mma(
        input,
        &a1f,
        &layout::gather_b(&b1_half(0)),
        &zero,
    ));
    let s1 = layout::scatter_cd(&layout::mma(
        input,
        &a1f,
        &layout::gather_b(&b1_half(8)),
        &zero,
    ));
    let p: Mat16x16 = std::array::from_fn(|i| {
        std::array::from_fn(|k| input.encode(if k < 8 { s0[i][k] } else { s1[i][k - 8] }))
    });
    let b2: Mat16x8 =
        std::array::from_fn(|k| std::array::from_fn(|j| input.encode(b2_value(k, j))));
    layout::scatter_cd(&layout::mma(
        input,
        &layout::gather_a(&p),
        &layout::gather_b(&b2),
        &zero,
    ))
}

// ---- the report ----

/// One wrong register (or one wrong half of a packed register).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Lane 0..32.
    pub lane: usize,
    /// Register name as in the kernel: `a1.hi`, `b0.lo`, `d3`, `s5`, `p2.lo`, ...
    pub register: String,
    /// The report line.
    pub line: String,
}

/// The verdict of one probe run.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Input storage type.
    pub dtype: DType,
    /// Where the registers came from: `emulator` or the GPU's name and arch.
    pub source: String,
    /// Every checked cell was right.
    pub passed: bool,
    /// Cells (16-bit halves or f32 accumulators) checked.
    pub checked: usize,
    /// Cells that were wrong.
    pub wrong: usize,
    /// `[PASS]`/`[FAIL]` lines per check, each `[FAIL]` followed by one line per wrong cell.
    pub lines: Vec<String>,
    /// The wrong cells, structured.
    pub mismatches: Vec<Mismatch>,
}

impl ProbeReport {
    /// The report as text, one line per entry of [`ProbeReport::lines`].
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }

    /// Sorted, deduplicated lanes that hold a wrong cell.
    pub fn wrong_lanes(&self) -> Vec<usize> {
        let mut l: Vec<usize> = self.mismatches.iter().map(|m| m.lane).collect();
        l.sort_unstable();
        l.dedup();
        l
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl ProbeReport {
    /// An empty, passing report (sections add to it).
    pub fn new(dtype: DType, source: String) -> Self {
        ProbeReport {
            dtype,
            source,
            passed: true,
            checked: 0,
            wrong: 0,
            lines: Vec::new(),
            mismatches: Vec::new(),
        }
    }

    /// A failed report saying why the dtype cannot be probed.
    pub fn unsupported(dtype: DType, source: &str, why: &str) -> Self {
        ProbeReport {
            lines: vec![format!("[FAIL] {dtype}: {why}")],
            passed: false,
            ..Self::new(dtype, source.to_string())
        }
    }
}

/// Collects one check: a title, a cell count, and the wrong cells.
pub(crate) struct Section {
    title: String,
    /// What the index of a cell counts: `lane` (a warp's) or `thread` (a warpgroup's).
    who: &'static str,
    cells: usize,
    wrong: Vec<Mismatch>,
}

impl Section {
    pub(crate) fn new(title: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            who: "lane",
            cells: 0,
            wrong: Vec::new(),
        }
    }

    /// A section whose cells are indexed by warpgroup thread (0..128).
    pub(crate) fn threads(title: impl Into<String>) -> Self {
        Self {
            who: "thread",
            ..Self::new(title)
        }
    }

    /// Counts one cell; when `ok` is false records `lane REG: got GOT, expected EXPECTED`.
    pub(crate) fn cell(
        &mut self,
        ok: bool,
        lane: usize,
        register: String,
        got: impl FnOnce() -> String,
        expected: String,
    ) {
        self.cells += 1;
        if !ok {
            let line = format!(
                "  {} {lane} {register}: got {}, expected {expected}",
                self.who,
                got()
            );
            self.wrong.push(Mismatch {
                lane,
                register,
                line,
            });
        }
    }

    pub(crate) fn finish(self, report: &mut ProbeReport) {
        report.checked += self.cells;
        report.wrong += self.wrong.len();
        if self.wrong.is_empty() {
            report
                .lines
                .push(format!("[PASS] {}: all {} cells", self.title, self.cells));
        } else {
            report.passed = false;
            report.lines.push(format!(
                "[FAIL] {}: {} of {} cells wrong",
                self.title,
                self.wrong.len(),
                self.cells
            ));
            report
                .lines
                .extend(self.wrong.iter().map(|m| m.line.clone()));
            report.mismatches.extend(self.wrong);
        }
    }
}

/// A value as it reads best: integers without a fraction, NaN/inf as such.
pub(crate) fn show(x: f32) -> String {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e9 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// `x` as an integer in `0..limit`, if it is one.
fn small_int(x: f32, limit: usize) -> Option<usize> {
    (x.is_finite() && x.fract() == 0.0 && x >= 0.0 && (x as usize) < limit).then_some(x as usize)
}

fn half_name(half: usize) -> &'static str {
    if half == 0 { "lo" } else { "hi" }
}

/// The cell(s) of `D[i][j] = 16*i*j` (16x8) that could hold `v`.
fn describe_d(v: f32) -> String {
    let cands: Vec<(usize, usize)> = match small_int(v, 16 * 15 * 7 + 1) {
        Some(n) if n.is_multiple_of(16) => (0..16)
            .flat_map(|i| (0..8).map(move |j| (i, j)))
            .filter(|&(i, j)| 16 * i * j == n)
            .collect(),
        _ => Vec::new(),
    };
    let cells = |c: &[(usize, usize)]| {
        c.iter()
            .map(|(i, j)| format!("D[{i}][{j}]"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match cands.len() {
        0 => format!("value {} (no cell holds it)", show(v)),
        1 => format!("{} (value {})", cells(&cands), show(v)),
        2..=4 => format!("one of {} (value {})", cells(&cands), show(v)),
        n => format!("value {} ({n} cells hold it)", show(v)),
    }
}

/// The cell of `S` or `P` (`16*i + k`, 16x16) that holds `v`.
fn describe_sp(name: &str, v: f32) -> String {
    match small_int(v, 256) {
        Some(n) => format!("{name}[{}][{}] (value {n})", n / 16, n % 16),
        None => format!("value {} (no cell holds it)", show(v)),
    }
}

/// The cells of `D2[i][j] = P[i][j] + 256*P[i][j+8]` behind `v`.
fn describe_d2(v: f32) -> String {
    let Some(n) = small_int(v, 65536) else {
        return format!("value {} (no cell holds it)", show(v));
    };
    let (lo, hi) = (n % 256, n / 256);
    if hi == lo + 8 && lo % 16 < 8 {
        format!("D2[{}][{}] (value {n})", lo / 16, lo % 16)
    } else {
        format!(
            "P[{}][{}] + 256*P[{}][{}] (value {n})",
            lo / 16,
            lo % 16,
            hi / 16,
            hi % 16
        )
    }
}

/// The checks of a probe-case dump (`A[i][j] = i`, `B[k][j] = j`, `D[i][j] = 16*i*j`), with
/// `suffix` added to the section titles.
fn check_probe_lanes(
    report: &mut ProbeReport,
    input: Input16,
    lanes: &Warp<ProbeLane>,
    col_weight: usize,
    suffix: &str,
) {
    // A[i][j] = i + col_weight * j; with B[k][j] = j, D[i][j] = 16*i*j + col_weight*120*j.
    let w = col_weight;
    let dec = |r: u32, half| input.decode(layout::unpack(r, half));
    let (a_rule, d_rule) = if w == 0 {
        ("A[i][j] = i".to_string(), "D[i][j] = 16*i*j".to_string())
    } else {
        (
            format!("A[i][j] = i + {w}*j"),
            format!("D[i][j] = 16*i*j + {}*j", 120 * w),
        )
    };
    let mut a = Section::new(format!("{a_rule}{suffix}"));
    let mut b = Section::new(format!("B[k][j] = j{suffix}"));
    let mut d = Section::new(format!("{d_rule}{suffix}"));
    for (lane, regs) in lanes.iter().enumerate() {
        for reg in 0..4 {
            for half in 0..2 {
                let (i, j) = a_cell(lane, reg, half);
                let v = dec(regs.a[reg], half);
                let want = (i + w * j) as f32;
                let got = || match small_int(v, if w == 0 { 16 } else { 16 + 15 * w }) {
                    Some(x) if w == 0 => format!("A[{x}][*] (value {x})"),
                    Some(x) => format!("A[{}][{}] (value {x})", x % w, x / w),
                    None => format!("value {} (no cell holds it)", show(v)),
                };
                a.cell(
                    v == want,
                    lane,
                    format!("a{reg}.{}", half_name(half)),
                    got,
                    format!("A[{i}][{j}] (value {})", show(want)),
                );
            }
        }
        for reg in 0..2 {
            for half in 0..2 {
                let (k, n) = b_cell(lane, reg, half);
                let v = dec(regs.b[reg], half);
                let got = || match small_int(v, 8) {
                    Some(c) => format!("B[*][{c}] (value {c})"),
                    None => format!("value {} (no cell holds it)", show(v)),
                };
                b.cell(
                    v == n as f32,
                    lane,
                    format!("b{reg}.{}", half_name(half)),
                    got,
                    format!("B[{k}][{n}] (value {n})"),
                );
            }
        }
        for reg in 0..4 {
            let (i, j) = cd_cell(lane, reg);
            let (v, e) = (regs.d[reg], (16 * i * j + 120 * w * j) as f32);
            d.cell(
                v == e,
                lane,
                format!("d{reg}"),
                || {
                    if w == 0 {
                        describe_d(v)
                    } else {
                        format!("value {}", show(v))
                    }
                },
                format!("D[{i}][{j}] (value {})", show(e)),
            );
        }
    }
    a.finish(report);
    b.finish(report);
    d.finish(report);
}

/// Checks every register of `dump` against the layout model and the emulator's product.
/// `source` names where the registers came from (it goes into the report).
pub fn check(dump: &RegisterDump, source: impl Into<String>) -> ProbeReport {
    let input = dump.input;
    let dec = |r: u32, half| input.decode(layout::unpack(r, half));
    let mut report = ProbeReport::new(input.dtype(), source.into());

    check_probe_lanes(&mut report, input, &dump.probe, 0, "");
    check_probe_lanes(
        &mut report,
        input,
        &dump.trans_a,
        16,
        " (A from A^T, ldmatrix.trans)",
    );
    if let Some(lanes) = &dump.trans_store {
        check_probe_lanes(
            &mut report,
            input,
            lanes,
            16,
            " (A stored from A^T's fragments, stmatrix.trans)",
        );
    }

    let mut s = Section::new("S = A1*B1 = 16*i+k (two C fragments)");
    let mut p = Section::new(format!(
        "P = S packed to {} pairs as an A fragment",
        input.dtype()
    ));
    let mut d2 = Section::new("D2 = P*B2 (emulator, two steps)");
    let want = expected_handoff(input);
    for (lane, regs) in dump.handoff.iter().enumerate() {
        for (idx, &v) in regs.s.iter().enumerate() {
            let (i, j) = cd_cell(lane, idx % 4);
            let k = j + 8 * (idx / 4);
            let e = (16 * i + k) as f32;
            s.cell(
                v == e,
                lane,
                format!("s{idx}"),
                || describe_sp("S", v),
                format!("S[{i}][{k}] (value {})", show(e)),
            );
        }
        for reg in 0..4 {
            for half in 0..2 {
                let (i, k) = a_cell(lane, reg, half);
                let (v, e) = (dec(regs.p[reg], half), (16 * i + k) as f32);
                let name = format!("p{reg}.{}", half_name(half));
                p.cell(
                    v == e,
                    lane,
                    name,
                    || describe_sp("P", v),
                    format!("P[{i}][{k}] (value {})", show(e)),
                );
            }
        }
        for reg in 0..4 {
            let (i, j) = cd_cell(lane, reg);
            let (v, e) = (regs.d[reg], want[i][j]);
            d2.cell(
                v == e,
                lane,
                format!("d{reg}"),
                || describe_d2(v),
                format!("D2[{i}][{j}] (value {})", show(e)),
            );
        }
    }
    s.finish(&mut report);
    p.finish(&mut report);
    d2.finish(&mut report);
    report
}

/// Runs the probe on the CPU emulator (no GPU needed) and checks it.
/// With `inject_fault`, B is loaded without `.trans` and the report must fail.
/// f32 gives a failed report saying that only f16 and bf16 can be probed.
pub fn run_emulated(dtype: DType, inject_fault: bool) -> ProbeReport {
    emulated(dtype, "mma.m16n8k16", |input| {
        check(&emulate(input, inject_fault), "emulator")
    })
}

/// `run(input)` for a 16-bit dtype; for f32 a failed report saying that `instruction` takes
/// only f16 and bf16 (the emulators of both probes).
pub(crate) fn emulated(
    dtype: DType,
    instruction: &str,
    run: impl FnOnce(Input16) -> ProbeReport,
) -> ProbeReport {
    match Input16::from_dtype(dtype) {
        Some(input) => run(input),
        None => ProbeReport::unsupported(
            dtype,
            "emulator",
            &format!("{instruction} takes f16 or bf16 inputs; probe one of those"),
        ),
    }
}

/// The NVRTC defines of `kernels/probe/layout_probe.cu` for a dtype and fault switch.
pub fn defines(input: Input16, inject_fault: bool) -> Vec<(String, String)> {
    input.probe_defines("PROBE_BF16", inject_fault)
}

/// Launches `function` of the probe module with one warp on a buffer of `words` u32 that is
/// poisoned first (all ones: NaN as f32 and as 16-bit halves), and reads it back.
fn launch_dump(
    gpu: &Gpu,
    input: Input16,
    inject_fault: bool,
    function: &str,
    words: usize,
) -> Result<Vec<u32>> {
    let kernel = gpu.kernel(
        KernelSource::LayoutProbe,
        function,
        &defines(input, inject_fault),
    )?;
    let stream = gpu.stream();
    let what = |step: &str| format!("{step} {function} ({})", input.dtype());
    let mut out = stream
        .clone_htod(&vec![u32::MAX; words])
        .map_err(cuda_err(what("allocating the output of")))?;
    let mut builder = stream.launch_builder(&kernel.function);
    builder.arg(&mut out);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (WARP as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel takes one `u32*` with room for 32 * its register count, which `out` has;
    // it is launched with exactly the one warp it is written for.
    unsafe { builder.launch(cfg) }.map_err(cuda_err(what("launching")))?;
    stream.synchronize().map_err(cuda_err(what("running")))?;
    stream
        .clone_dtoh(&out)
        .map_err(cuda_err(what("reading the output of")))
}

/// Runs the probe kernels on `gpu` (the transposed-store one on sm_90 and above) and checks every lane's registers.
///
/// # Errors
/// [`AttnError::DTypeMismatch`] for f32; compile, load and launch errors from the driver.
pub fn run_gpu(gpu: &Gpu, dtype: DType, inject_fault: bool) -> Result<ProbeReport> {
    let input = Input16::from_dtype(dtype).ok_or_else(|| AttnError::DTypeMismatch {
        what: format!("the layout probe runs mma.m16n8k16 with f16 or bf16 inputs, not {dtype}"),
    })?;
    let probe = launch_dump(gpu, input, inject_fault, "layout_probe", WARP * PROBE_REGS)?;
    let handoff = launch_dump(
        gpu,
        input,
        inject_fault,
        "layout_handoff",
        WARP * HANDOFF_REGS,
    )?;
    let trans_a = launch_dump(
        gpu,
        input,
        inject_fault,
        "layout_trans_a",
        WARP * PROBE_REGS,
    )?;
    // stmatrix is sm_90's.
    let trans_store = if gpu.info().compute_capability.0 >= 9 {
        Some(launch_dump(
            gpu,
            input,
            inject_fault,
            "layout_trans_store",
            WARP * PROBE_REGS,
        )?)
    } else {
        None
    };
    let dump = RegisterDump::from_words(input, &probe, &handoff, &trans_a, trans_store.as_deref())?;
    let info = gpu.info();
    Ok(check(&dump, format!("{} ({})", info.name, info.arch)))
}
