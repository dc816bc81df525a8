//! Warpgroup-level layouts of Hopper's `wgmma.mma_async` (m64nNk16, 16-bit inputs, f32
//! accumulators), the shared-memory matrix descriptor with its canonical layouts and swizzle
//! modes, and the 128-byte swizzle that the copy engine (TMA) writes; with a CPU emulator built
//! on them. The PTX ISA 9.0 sections stated in code:
//! - 9.7.15.5.1, register fragments of wgmma: accumulator `i` of thread `tid` (warp `w =
//!   tid / 32`, `g = lane / 4`, `t = lane % 4`) holds `D[16w + g + 8*((i/2)%2)][8*(i/4) + 2t +
//!   i%2]`; the register A operand (64x16 per k-step) gives each warp rows `16w..16w+16` in
//!   the `mma.m16n8k16` A layout: `a_r = {A[16w + g + 8*(r%2)][2t + 8*(r/2)], .. + 1}`;
//! - 9.7.15.5.1, "Matrix Descriptor Format" and the canonical layouts: start address, leading
//!   (LBO) and stride (SBO) byte offsets, swizzle mode (bits 62-63: 1 = 128-byte, 2 = 64-byte,
//!   3 = 32-byte). For a K-major operand with a W-byte swizzle, element `(mn, k)` of a k16 slab
//!   sits at `start + (mn%8)*W + (mn/8)*SBO + 2k`; for an MN-major one at `start + 2*(mn %
//!   (W/2)) + (mn / (W/2))*LBO + (k%8)*W + (k/8)*SBO`; the swizzle then XORs address bits 4..
//!   with bits 7.. (`Swizzle<3,4,3>` for 128 bytes), on the absolute shared-memory address;
//! - the CUDA driver's `CU_TENSOR_MAP_SWIZZLE_128B`: TMA writes row `r` of a box with 128-byte
//!   rows at `dst + 128r`, swizzled the same way.
//!
//! The emulator ([`tma_load`], [`wgmma`]) never restates these formulas: it writes and reads
//! shared memory through [`tma_box_addr`] and [`operand_addr`] and scatters registers through
//! [`acc_cell`] and [`a_cell`], so a test of the emulator against a plain matrix product is a
//! test of the maps, and the GPU probe (`src/probe_wgmma.rs`) tests them on the hardware.

use crate::layout::{Input16, cd_cell};

/// Threads in a warpgroup.
pub const WARPGROUP: usize = 128;

/// Cell `(row, col)` of the m64nN accumulator held by thread `tid` (0..128), register `reg`:
/// warp `w` holds rows `16w..16w+16` as N/8 side-by-side `mma.m16n8k16` C fragments, register
/// `reg` being C register `reg % 4` of n8 tile `reg / 4` ([`crate::layout::cd_cell`]).
pub fn acc_cell(tid: usize, reg: usize) -> (usize, usize) {
    let (r, c) = cd_cell(tid % 32, reg % 4);
    (16 * (tid / 32) + r, 8 * (reg / 4) + c)
}

/// Inverse of [`acc_cell`]: `(tid, reg)` holding `D[row][col]`.
pub fn acc_owner(row: usize, col: usize) -> (usize, usize) {
    let (warp, r) = (row / 16, row % 16);
    let lane = 4 * (r % 8) + (col % 8) / 2;
    (32 * warp + lane, 4 * (col / 8) + 2 * (r / 8) + col % 2)
}

/// Cell `(row, k)` of the 64x16 register A operand held by thread `tid`, register `reg`
/// (0..4), half `half` (0 = low 16 bits): warp `w` holds rows `16w..16w+16` as the
/// `mma.m16n8k16` A fragment ([`crate::layout::a_cell`]).
pub fn a_cell(tid: usize, reg: usize, half: usize) -> (usize, usize) {
    let (r, k) = crate::layout::a_cell(tid % 32, reg, half);
    (16 * (tid / 32) + r, k)
}

/// A shared-memory swizzle mode of a descriptor (and of TMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Swizzle {
    /// Interleaved core matrices, no swizzle.
    None,
    /// 32-byte swizzle.
    B32,
    /// 64-byte swizzle.
    B64,
    /// 128-byte swizzle.
    B128,
}

impl Swizzle {
    /// The descriptor's 2-bit code (bits 62-63).
    pub fn code(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }

    /// The mode of a 2-bit code.
    pub fn from_code(code: u64) -> Self {
        match code & 3 {
            1 => Swizzle::B128,
            2 => Swizzle::B64,
            3 => Swizzle::B32,
            _ => Swizzle::None,
        }
    }

    /// Row width of the swizzle atom in bytes (16 for no swizzle: one core-matrix row).
    pub fn row_bytes(self) -> usize {
        match self {
            Swizzle::None => 16,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// The physical byte address of logical address `addr`: bits 4.. XOR bits 7.. (1, 2 or 3
    /// bits for 32, 64, 128 bytes).
    pub fn apply(self, addr: usize) -> usize {
        let bits = match self {
            Swizzle::None => return addr,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        };
        let mask = (1usize << bits) - 1;
        addr ^ (((addr >> 7) & mask) << 4)
    }
}

/// A shared-memory matrix descriptor, its fields in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// Start address (bytes, shared window).
    pub start: usize,
    /// Leading-dimension byte offset.
    pub lbo: usize,
    /// Stride-dimension byte offset.
    pub sbo: usize,
    /// Swizzle mode.
    pub swizzle: Swizzle,
}

impl Descriptor {
    /// The 64-bit encoding (hopper.cuh `make_desc`).
    pub fn encode(&self) -> u64 {
        ((self.start as u64 & 0x3FFFF) >> 4)
            | ((((self.lbo as u64) >> 4) & 0x3FFF) << 16)
            | ((((self.sbo as u64) >> 4) & 0x3FFF) << 32)
            | (self.swizzle.code() << 62)
    }

    /// The fields of an encoding.
    pub fn decode(bits: u64) -> Self {
        Descriptor {
            start: ((bits & 0x3FFF) << 4) as usize,
            lbo: (((bits >> 16) & 0x3FFF) << 4) as usize,
            sbo: (((bits >> 32) & 0x3FFF) << 4) as usize,
            swizzle: Swizzle::from_code(bits >> 62),
        }
    }

    /// hopper.cuh `desc_kmajor_sw128`: k-step `kk` of a K-major operand stored as TMA boxes of
    /// 64 columns (`sub_bytes` apart) with 128-byte rows.
    pub fn kmajor_sw128(tile: usize, kk: usize, sub_bytes: usize) -> Self {
        Descriptor {
            start: tile + (kk / 4) * sub_bytes + (kk % 4) * 32,
            lbo: 16,
            sbo: 1024,
            swizzle: Swizzle::B128,
        }
    }

    /// hopper.cuh `desc_mnmajor_sw128`: keys `16kk..16kk+16` of an MN-major B operand stored
    /// as TMA boxes of 64 columns (`sub_bytes` apart, the LBO) with 128-byte rows.
    pub fn mnmajor_sw128(tile: usize, kk: usize, sub_bytes: usize) -> Self {
        Descriptor {
            start: tile + kk * 16 * 128,
            lbo: sub_bytes,
            sbo: 1024,
            swizzle: Swizzle::B128,
        }
    }
}

impl std::fmt::Display for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "start {:#x}, LBO {}, SBO {}, swizzle {:?}",
            self.start, self.lbo, self.sbo, self.swizzle
        )
    }
}

/// Which dimension of an operand is contiguous in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Major {
    /// The contracted dimension k (A: rows of k; B: its transpose stored as rows of k).
    K,
    /// The M (A) or N (B) dimension (`imm-trans = 1`).
    MN,
}

/// Physical byte address of element `(mn, k)` (`k` in 0..16) of the k16 slab a descriptor
/// describes, in the canonical layout of its major-ness and swizzle (module docs).
pub fn operand_addr(d: &Descriptor, major: Major, mn: usize, k: usize) -> usize {
    let w = d.swizzle.row_bytes();
    let logical = match (major, d.swizzle) {
        (Major::K, Swizzle::None) => {
            d.start + (mn % 8) * 16 + (mn / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo
        }
        (Major::K, _) => d.start + (mn % 8) * w + (mn / 8) * d.sbo + 2 * k,
        (Major::MN, Swizzle::None) => {
            d.start + (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo
        }
        (Major::MN, _) => {
            d.start + 2 * (mn % (w / 2)) + (mn / (w / 2)) * d.lbo + (k % 8) * w + (k / 8) * d.sbo
        }
    };
    d.swizzle.apply(logical)
}

/// Physical byte address where TMA (`CU_TENSOR_MAP_SWIZZLE_128B`) puts element `(row, col)`
/// (`col` < 64) of a box written at `dst` (1024-byte aligned).
pub fn tma_box_addr(dst: usize, row: usize, col: usize) -> usize {
    Swizzle::B128.apply(dst + row * 128 + col * 2)
}

/// Emulates the TMA loads of a row-major `[rows][cols]` matrix of 16-bit values as
/// `cols / 64` boxes of 64 columns x `rows`, box `j` at `dst + j * box_bytes`.
///
/// # Panics
/// When `cols` is not a multiple of 64 or a box runs past `smem`.
pub fn tma_load(
    smem: &mut [u8],
    dst: usize,
    mat: &[u16],
    rows: usize,
    cols: usize,
    box_bytes: usize,
) {
    assert!(cols.is_multiple_of(64) && mat.len() == rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let a = tma_box_addr(dst + (c / 64) * box_bytes, r, c % 64);
            smem[a..a + 2].copy_from_slice(&mat[r * cols + c].to_le_bytes());
        }
    }
}

fn read16(smem: &[u8], addr: usize) -> u16 {
    u16::from_le_bytes([smem[addr], smem[addr + 1]])
}

/// The A operand of an emulated wgmma.
#[derive(Debug, Clone, Copy)]
pub enum AOperand<'a> {
    /// From shared memory through a K-major descriptor.
    Smem(Descriptor),
    /// From registers: each thread's four 32-bit registers (two 16-bit values each).
    Regs(&'a [[u32; 4]]),
}

/// Emulates `wgmma.mma_async.m64nNk16.f32` (one k16 step) for a warpgroup: `d[tid][reg]`
/// becomes `A * B` (+ its old value when `accumulate`), A 64x16, B 16xN from shared memory
/// through `b` (K-major: stored as N rows of k; MN-major: `imm-trans-b = 1`). Products are
/// exact and summed in f64, one rounding to f32 per cell (the hardware agrees when every
/// partial sum is exact in f32, as for the probe's small integers).
///
/// # Panics
/// When `d` does not hold 128 threads of `n / 2` registers, or an address leaves `smem`.
#[allow(clippy::too_many_arguments)] // the instruction's own operands, one by one
pub fn wgmma(
    input: Input16,
    smem: &[u8],
    a: AOperand,
    b: &Descriptor,
    b_major: Major,
    n: usize,
    d: &mut [Vec<f32>],
    accumulate: bool,
) {
    assert!(d.len() == WARPGROUP && d.iter().all(|r| r.len() == n / 2));
    let mut am = [[0f64; 16]; 64];
    match a {
        AOperand::Smem(desc) => {
            for (m, row) in am.iter_mut().enumerate() {
                for (k, x) in row.iter_mut().enumerate() {
                    *x = f64::from(input.decode(read16(smem, operand_addr(&desc, Major::K, m, k))));
                }
            }
        }
        AOperand::Regs(regs) => {
            for (tid, r) in regs.iter().enumerate() {
                for (reg, &bits) in r.iter().enumerate() {
                    for half in 0..2 {
                        let (m, k) = a_cell(tid, reg, half);
                        am[m][k] = f64::from(input.decode((bits >> (16 * half)) as u16));
                    }
                }
            }
        }
    }
    let bm: Vec<[f64; 16]> = (0..n)
        .map(|col| {
            std::array::from_fn(|k| {
                f64::from(input.decode(read16(smem, operand_addr(b, b_major, col, k))))
            })
        })
        .collect();
    for (tid, regs) in d.iter_mut().enumerate() {
        for (reg, x) in regs.iter_mut().enumerate() {
            let (m, col) = acc_cell(tid, reg);
            let mut sum = if accumulate { f64::from(*x) } else { 0.0 };
            for k in 0..16 {
                sum += am[m][k] * bm[col][k];
            }
            *x = sum as f32;
        }
    }
}

/// A warpgroup's accumulators of an m64nN product, zeroed.
pub fn zero_acc(n: usize) -> Vec<Vec<f32>> {
    vec![vec![0f32; n / 2]; WARPGROUP]
}

/// The 64xN matrix held by accumulators `d` (through [`acc_cell`]).
pub fn scatter_acc(d: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let n = d[0].len() * 2;
    let mut m = vec![vec![0f32; n]; 64];
    for (tid, regs) in d.iter().enumerate() {
        for (reg, &x) in regs.iter().enumerate() {
            let (r, c) = acc_cell(tid, reg);
            m[r][c] = x;
        }
    }
    m
}
