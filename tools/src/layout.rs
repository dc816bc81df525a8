//! Warp-level fragment layouts of `mma.m16n8k16` and `ldmatrix.m8n8`, as functions, and a CPU
//! warp emulator built on them.
//!
//! Everything here states the PTX ISA (version 9.0) in code:
//! - section 9.7.14.5.14, "Matrix Fragments for `mma.m16n8k16` with floating point type":
//!   which lane and register hold which cell of A (16x16), B (16x8) and C/D (16x8), for
//!   16-bit inputs (`.f16`/`.bf16`) and f32 accumulators;
//! - section 9.7.14.5.15, "ldmatrix": which lane receives which element of the 8x8
//!   tiles whose rows the lanes address, for `.x1`, `.x2`, `.x4`, with and without `.trans`.
//!
//! With `g = lane / 4` (group, 0..8) and `t = lane % 4` (thread in group, 0..4):
//!
//! | operand | register | half 0 (low 16 bits) | half 1 (high 16 bits) |
//! |---|---|---|---|
//! | A | a0 | `A[g][2t]`     | `A[g][2t+1]`   |
//! | A | a1 | `A[g+8][2t]`   | `A[g+8][2t+1]` |
//! | A | a2 | `A[g][2t+8]`   | `A[g][2t+9]`   |
//! | A | a3 | `A[g+8][2t+8]` | `A[g+8][2t+9]` |
//! | B | b0 | `B[2t][g]`     | `B[2t+1][g]`   |
//! | B | b1 | `B[2t+8][g]`   | `B[2t+9][g]`   |
//!
//! C/D (one f32 per register): `c0 = (g, 2t)`, `c1 = (g, 2t+1)`, `c2 = (g+8, 2t)`,
//! `c3 = (g+8, 2t+1)`. A packs its halves along a row (the k direction of A), B along a column
//! (the k direction of B): both pair up neighbours along the contracted dimension.
//!
//! The emulator ([`ldmatrix`], [`mma`]) never hard-codes these formulas a second time: it
//! scatters and gathers through the map functions, so a test of the emulator against a plain
//! matrix product is a test of the maps.

use flashattn::dtype::DType;

/// Lanes in a warp.
pub const WARP: usize = 32;

/// Per-lane registers of a whole warp: index by lane.
pub type Warp<T> = [T; WARP];

/// A fragment registers of one lane: four 32-bit registers, two 16-bit values each.
pub type ARegs = [u32; 4];
/// B fragment registers of one lane: two 32-bit registers, two 16-bit values each.
pub type BRegs = [u32; 2];
/// C/D fragment registers of one lane: four f32 accumulators.
pub type CRegs = [f32; 4];

/// A 16x16 matrix of 16-bit storage (A operand), row-major `[row][col]`.
pub type Mat16x16 = [[u16; 16]; 16];
/// A 16x8 matrix of 16-bit storage (B operand), `[k][n]`.
pub type Mat16x8 = [[u16; 8]; 16];
/// A 16x8 f32 matrix (C/D), `[row][col]`.
pub type Acc16x8 = [[f32; 8]; 16];

fn group(lane: usize) -> usize {
    lane / 4
}

fn thread(lane: usize) -> usize {
    lane % 4
}

/// Cell `(row, col)` of A (16x16) held by `lane`'s register `reg` (0..4), half `half` (0 = low
/// 16 bits, 1 = high). PTX ISA 9.0, 9.7.14.5.14, A fragment of `.m16n8k16` for `.f16`/`.bf16`.
pub fn a_cell(lane: usize, reg: usize, half: usize) -> (usize, usize) {
    debug_assert!(lane < WARP && reg < 4 && half < 2);
    let row = group(lane) + 8 * (reg & 1);
    let col = 2 * thread(lane) + half + 8 * (reg >> 1);
    (row, col)
}

/// Cell `(k, n)` of B (16x8) held by `lane`'s register `reg` (0..2), half `half`.
/// PTX ISA 9.0, 9.7.14.5.14, B fragment of `.m16n8k16` for `.f16`/`.bf16`.
pub fn b_cell(lane: usize, reg: usize, half: usize) -> (usize, usize) {
    debug_assert!(lane < WARP && reg < 2 && half < 2);
    (2 * thread(lane) + half + 8 * reg, group(lane))
}

/// Cell `(row, col)` of C or D (16x8, f32) held by `lane`'s register `reg` (0..4).
/// PTX ISA 9.0, 9.7.14.5.14, C/D fragment of `.m16n8k16` with `.f32` accumulators.
pub fn cd_cell(lane: usize, reg: usize) -> (usize, usize) {
    debug_assert!(lane < WARP && reg < 4);
    (group(lane) + 8 * (reg >> 1), 2 * thread(lane) + (reg & 1))
}

/// Inverse of [`a_cell`]: `(lane, reg, half)` holding `A[row][col]`.
pub fn a_owner(row: usize, col: usize) -> (usize, usize, usize) {
    debug_assert!(row < 16 && col < 16);
    let lane = 4 * (row % 8) + (col % 8) / 2;
    (lane, (row / 8) | ((col / 8) << 1), col % 2)
}

/// Inverse of [`b_cell`]: `(lane, reg, half)` holding `B[k][n]`.
pub fn b_owner(k: usize, n: usize) -> (usize, usize, usize) {
    debug_assert!(k < 16 && n < 8);
    (4 * n + (k % 8) / 2, k / 8, k % 2)
}

/// Inverse of [`cd_cell`]: `(lane, reg)` holding `D[row][col]`.
pub fn cd_owner(row: usize, col: usize) -> (usize, usize) {
    debug_assert!(row < 16 && col < 8);
    (4 * (row % 8) + col / 2, 2 * (row / 8) + col % 2)
}

/// How many 8x8 tiles one `ldmatrix` moves: `.x1`, `.x2` or `.x4`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LdmatrixNum {
    /// One tile; lanes 0..8 give row addresses.
    X1,
    /// Two tiles; lanes 0..16 give row addresses.
    X2,
    /// Four tiles; all 32 lanes give row addresses.
    X4,
}

impl LdmatrixNum {
    /// All three forms.
    pub const ALL: [LdmatrixNum; 3] = [LdmatrixNum::X1, LdmatrixNum::X2, LdmatrixNum::X4];

    /// Tiles moved = destination registers per lane.
    pub fn tiles(self) -> usize {
        match self {
            LdmatrixNum::X1 => 1,
            LdmatrixNum::X2 => 2,
            LdmatrixNum::X4 => 4,
        }
    }
}

/// Element `(row, col)` of 8x8 tile `reg` that `ldmatrix` hands to `lane`'s register `reg`,
/// half `half`. `row` is the tile row whose 16-byte address lane `8 * reg + row` supplied, `col`
/// the 16-bit element within that row. PTX ISA 9.0, 9.7.14.5.15 "ldmatrix":
/// - without `.trans`: row `lane / 4`, columns `2 * (lane % 4) + half`;
/// - with `.trans`: rows `2 * (lane % 4) + half`, column `lane / 4` (the tile is handed out
///   transposed).
///
/// The same map holds for `.x1`, `.x2` and `.x4`; they differ only in how many tiles (registers)
/// there are ([`LdmatrixNum::tiles`]).
pub fn ldmatrix_cell(lane: usize, reg: usize, half: usize, trans: bool) -> (usize, usize) {
    debug_assert!(lane < WARP && reg < 4 && half < 2);
    let (g, t) = (group(lane), thread(lane));
    if trans {
        (2 * t + half, g)
    } else {
        (g, 2 * t + half)
    }
}

/// Inverse of [`ldmatrix_cell`]: `(lane, half)` receiving element `(row, col)` of a tile (the
/// register is the tile index).
pub fn ldmatrix_owner(row: usize, col: usize, trans: bool) -> (usize, usize) {
    debug_assert!(row < 8 && col < 8);
    let (r, c) = if trans { (col, row) } else { (row, col) };
    (4 * r + c / 2, c % 2)
}

/// The lane whose address names row `row` (0..8) of tile `tile` in an `ldmatrix`.
pub fn ldmatrix_addr_lane(tile: usize, row: usize) -> usize {
    8 * tile + row
}

/// The 16-bit element type of an `mma` operand: the `.f16` or `.bf16` variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input16 {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
}

impl Input16 {
    /// The 16-bit input type for a [`DType`]; `None` for f32 (no `mma.m16n8k16` takes f32).
    pub fn from_dtype(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F16 => Some(Input16::F16),
            DType::BF16 => Some(Input16::BF16),
            DType::F32 => None,
        }
    }

    /// The NVRTC defines of a probe kernel: `bf16_define` (the kernel's name for "inputs are
    /// bf16") and `PROBE_FAULT`, each "1" or "0".
    pub fn probe_defines(self, bf16_define: &str, inject_fault: bool) -> Vec<(String, String)> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        vec![
            (bf16_define.to_string(), flag(self == Input16::BF16)),
            ("PROBE_FAULT".to_string(), flag(inject_fault)),
        ]
    }

    /// The matching [`DType`].
    pub fn dtype(self) -> DType {
        match self {
            Input16::F16 => DType::F16,
            Input16::BF16 => DType::BF16,
        }
    }

    /// Widens stored bits to f32 (exact).
    pub fn decode(self, bits: u16) -> f32 {
        match self {
            Input16::F16 => half::f16::from_bits(bits).to_f32(),
            Input16::BF16 => half::bf16::from_bits(bits).to_f32(),
        }
    }

    /// Rounds f32 to nearest even 16-bit storage, as `cvt.rn.f16.f32` / `cvt.rn.bf16.f32`.
    pub fn encode(self, x: f32) -> u16 {
        match self {
            Input16::F16 => half::f16::from_f32(x).to_bits(),
            Input16::BF16 => half::bf16::from_f32(x).to_bits(),
        }
    }
}

/// Packs two 16-bit values into one register, `lo` in bits 0..16 (half 0), as `cvt.rn.f16x2`.
pub fn pack(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

/// Half `half` (0 = low, 1 = high) of a packed register.
pub fn unpack(reg: u32, half: usize) -> u16 {
    (reg >> (16 * half)) as u16
}

/// Emulates `ldmatrix.sync.aligned.m8n8.{num}{.trans}.shared.b16` for a whole warp.
///
/// `smem` is shared memory as 16-bit elements; `row_addr[lane]` is the element index (byte
/// address / 2) of the 8-element row that `lane` supplies. Only lanes `0..8 * num.tiles()` are
/// read, as on the hardware. Returns each lane's destination registers; registers past
/// `num.tiles()` are 0.
///
/// # Panics
/// When an addressed row runs past the end of `smem` (an out-of-bounds shared access).
pub fn ldmatrix(
    smem: &[u16],
    row_addr: &Warp<usize>,
    num: LdmatrixNum,
    trans: bool,
) -> Warp<[u32; 4]> {
    let mut out = [[0u32; 4]; WARP];
    for (lane, regs) in out.iter_mut().enumerate() {
        for (tile, reg) in regs.iter_mut().enumerate().take(num.tiles()) {
            let mut halves = [0u16; 2];
            for (half, h) in halves.iter_mut().enumerate() {
                let (row, col) = ldmatrix_cell(lane, tile, half, trans);
                *h = smem[row_addr[ldmatrix_addr_lane(tile, row)] + col];
            }
            *reg = pack(halves[0], halves[1]);
        }
    }
    out
}

/// Emulates `stmatrix.sync.aligned.m8n8.{num}{.trans}.shared.b16` for a whole warp: the
/// inverse of [`ldmatrix`] with the same `trans` (PTX ISA 9.0, 9.7.14.5.16 "stmatrix": the
/// fragment of each 8x8 tile held by the lanes is the one `ldmatrix` would hand out). Half
/// `half` of `regs[lane][tile]` goes to the cell [`ldmatrix_cell`] names, in the row whose
/// address lane `8 * tile + row` supplies.
///
/// # Panics
/// When an addressed row runs past the end of `smem` (an out-of-bounds shared access).
pub fn stmatrix(
    smem: &mut [u16],
    row_addr: &Warp<usize>,
    regs: &Warp<[u32; 4]>,
    num: LdmatrixNum,
    trans: bool,
) {
    for (lane, lane_regs) in regs.iter().enumerate() {
        for (tile, &reg) in lane_regs.iter().enumerate().take(num.tiles()) {
            for half in 0..2 {
                let (row, col) = ldmatrix_cell(lane, tile, half, trans);
                smem[row_addr[ldmatrix_addr_lane(tile, row)] + col] = unpack(reg, half);
            }
        }
    }
}

/// Emulates `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`: `D = A B + C`.
///
/// Each lane's A, B and C registers are scattered to matrices through [`a_cell`], [`b_cell`]
/// and [`cd_cell`], multiplied (products exact, sums in f64, one rounding to f32 per cell; the
/// hardware agrees whenever every partial sum is exact in f32, as for small integers), and D
/// is gathered back through [`cd_cell`].
pub fn mma(input: Input16, a: &Warp<ARegs>, b: &Warp<BRegs>, c: &Warp<CRegs>) -> Warp<CRegs> {
    let am = scatter_a(a);
    let bm = scatter_b(b);
    let cm = scatter_cd(c);
    let mut d: Acc16x8 = [[0.0; 8]; 16];
    for (i, drow) in d.iter_mut().enumerate() {
        for (j, dij) in drow.iter_mut().enumerate() {
            let mut sum = f64::from(cm[i][j]);
            for k in 0..16 {
                sum += f64::from(input.decode(am[i][k])) * f64::from(input.decode(bm[k][j]));
            }
            *dij = sum as f32;
        }
    }
    gather_cd(&d)
}

/// Distributes a 16x16 matrix into A fragments via [`a_cell`] (what a correct load produces).
pub fn gather_a(m: &Mat16x16) -> Warp<ARegs> {
    let mut out = [[0u32; 4]; WARP];
    for (lane, regs) in out.iter_mut().enumerate() {
        for (reg, r) in regs.iter_mut().enumerate() {
            let (r0, c0) = a_cell(lane, reg, 0);
            let (r1, c1) = a_cell(lane, reg, 1);
            *r = pack(m[r0][c0], m[r1][c1]);
        }
    }
    out
}

/// Distributes a 16x8 `[k][n]` matrix into B fragments via [`b_cell`].
pub fn gather_b(m: &Mat16x8) -> Warp<BRegs> {
    let mut out = [[0u32; 2]; WARP];
    for (lane, regs) in out.iter_mut().enumerate() {
        for (reg, r) in regs.iter_mut().enumerate() {
            let (k0, n0) = b_cell(lane, reg, 0);
            let (k1, n1) = b_cell(lane, reg, 1);
            *r = pack(m[k0][n0], m[k1][n1]);
        }
    }
    out
}

/// Distributes a 16x8 f32 matrix into C/D fragments via [`cd_cell`].
pub fn gather_cd(m: &Acc16x8) -> Warp<CRegs> {
    let mut out = [[0f32; 4]; WARP];
    for (lane, regs) in out.iter_mut().enumerate() {
        for (reg, r) in regs.iter_mut().enumerate() {
            let (i, j) = cd_cell(lane, reg);
            *r = m[i][j];
        }
    }
    out
}

/// Reassembles A fragments into the 16x16 matrix via [`a_cell`].
pub fn scatter_a(regs: &Warp<ARegs>) -> Mat16x16 {
    let mut m = [[0u16; 16]; 16];
    for (lane, lane_regs) in regs.iter().enumerate() {
        for (reg, &r) in lane_regs.iter().enumerate() {
            for half in 0..2 {
                let (i, j) = a_cell(lane, reg, half);
                m[i][j] = unpack(r, half);
            }
        }
    }
    m
}

/// Reassembles B fragments into the 16x8 `[k][n]` matrix via [`b_cell`].
pub fn scatter_b(regs: &Warp<BRegs>) -> Mat16x8 {
    let mut m = [[0u16; 8]; 16];
    for (lane, lane_regs) in regs.iter().enumerate() {
        for (reg, &r) in lane_regs.iter().enumerate() {
            for half in 0..2 {
                let (k, n) = b_cell(lane, reg, half);
                m[k][n] = unpack(r, half);
            }
        }
    }
    m
}

/// Reassembles C/D fragments into the 16x8 matrix via [`cd_cell`].
pub fn scatter_cd(regs: &Warp<CRegs>) -> Acc16x8 {
    let mut m = [[0f32; 8]; 16];
    for (lane, lane_regs) in regs.iter().enumerate() {
        for (reg, &x) in lane_regs.iter().enumerate() {
            let (i, j) = cd_cell(lane, reg);
            m[i][j] = x;
        }
    }
    m
}

/// Row addresses for loading a row-major 16x16 A tile (row stride `ld` elements, starting at
/// element `base`) with `ldmatrix.x4`, so that registers 0..4 are a0..a3: lane `l` supplies
/// row `l % 8 + 8 * (tile & 1)`, column block `8 * (tile >> 1)` with `tile = l / 8`.
pub fn a_x4_addrs(base: usize, ld: usize) -> Warp<usize> {
    std::array::from_fn(|l| {
        let tile = l / 8;
        base + (l % 8 + 8 * (tile & 1)) * ld + 8 * (tile >> 1)
    })
}

/// Row addresses for loading the A fragments of a 16x16 A from its transpose, stored row-major
/// `[k][m]` with row stride `ld`, with `ldmatrix.x4.trans`: lane `l` supplies k-row
/// `l % 8 + 8 * (tile >> 1)` at m block `8 * (tile & 1)` (the backward's dQ = dS K reads dS
/// from dS^T this way; kernels/bwd/attn_bwd.cu).
pub fn a_x4_trans_addrs(base: usize, ld: usize) -> Warp<usize> {
    std::array::from_fn(|l| {
        let tile = l / 8;
        base + (l % 8 + 8 * (tile >> 1)) * ld + 8 * (tile & 1)
    })
}

/// Row addresses for loading B fragments of a row-major `[k][n]` tile (16 rows of k, row stride
/// `ld`) with `ldmatrix.x4.trans`: lane `l` supplies k-row `l % 8 + 8 * (tile & 1)`, n block
/// `8 * (tile >> 1)` (pass `n_blocks = 1` for a 16x8 tile: tiles 2 and 3 repeat 0 and 1;
/// `n_blocks = 2` for 16x16, whose registers are then b0, b1 of columns 0..8 and b0, b1 of
/// columns 8..16).
pub fn b_x4_trans_addrs(base: usize, ld: usize, n_blocks: usize) -> Warp<usize> {
    std::array::from_fn(|l| {
        let tile = l / 8;
        base + (l % 8 + 8 * (tile & 1)) * ld + 8 * ((tile >> 1) % n_blocks.max(1))
    })
}

/// The first two registers of each lane (a B fragment out of an `ldmatrix` result).
pub fn first_two(regs: &Warp<[u32; 4]>) -> Warp<BRegs> {
    std::array::from_fn(|l| [regs[l][0], regs[l][1]])
}

/// Registers 2 and 3 of each lane.
pub fn last_two(regs: &Warp<[u32; 4]>) -> Warp<BRegs> {
    std::array::from_fn(|l| [regs[l][2], regs[l][3]])
}
