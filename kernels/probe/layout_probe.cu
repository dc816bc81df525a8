// layout_probe.cu: single-warp experiments that dump every lane's fragment registers, so the
// host can check them cell by cell against the layout model (src/layout.rs).
//
// Launch each kernel with exactly one block of 32 threads.
//
// layout_probe: A[i][j] = i (16x16), B[k][j] = j (16x8, stored row-major [k][n]); A loaded with
//   ldmatrix.x4, B with ldmatrix.x4.trans, one mma.m16n8k16 with f32 accumulation, so
//   D[i][j] = 16*i*j. Lane l writes out[l*10 + r]: r=0..3 a0..a3, r=4..5 b0..b1,
//   r=6..9 the bits of d0..d3.
// layout_handoff: the S -> P hand-off of flash attention. S = A1 B1 (16x16, two n=8 C
//   fragments), S[i][k] = 16*i + k by construction; the two C fragments are packed to 16-bit
//   pairs and used directly as the A fragment of P in a second mma with B2 (16x8,
//   B2[k][j] = [k == j] + 256*[k == j + 8], loaded with ldmatrix.x2.trans), so
//   D2[i][j] = P[i][j] + 256*P[i][j+8]. Lane l writes out[l*16 + r]: r=0..7 the bits of
//   s0..s3 (S[:, 0:8]) and s4..s7 (S[:, 8:16]), r=8..11 p0..p3, r=12..15 the bits of d0..d3.
// layout_trans_a: the A operand read from its transpose, as the backward's dQ = dS K reads dS
//   from dS^T: A^T is stored row-major [k][m] with At[k][m] = m + 16k (so A[i][j] = i + 16j
//   names both its row and its column, and a wrong k order shows) and loaded with
//   ldmatrix.x4.trans, lane l addressing row k = l%8 + 8*(t/2) at column m = 8*(t%2) of tile
//   t = l/8; B (B[k][j] = j) and the output words as in layout_probe, so D[i][j] = 16*i*j +
//   1920*j (every value exact in f16, bf16 and f32).
// layout_trans_store (sm_90): the backward's dS^T accumulators stored transposed as dS with
//   stmatrix.x4.trans (kernels/bwd/attn_bwd_wgmma.cu). Each lane builds the C fragments of
//   X = A^T (16x16, X[k][i] = A[i][k] = i + 16k) from the accumulator layout (g = lane/4,
//   t = lane%4: rows g, g+8, columns 2t, 2t+1) as the kernel's pairs (register m: X rows
//   8(m%2).., columns 8(m/2)..), stores them with .trans to A row-major, lane l addressing
//   row l%8 + 8((l/8)/2) at column 8((l/8)%2); then A is loaded with ldmatrix.x4 and
//   multiplied as in layout_trans_a (the same expected registers: D[i][j] = 16*i*j + 1920*j).
//
// Defines: PROBE_BF16=1 stores the inputs as bf16 (default f16); PROBE_FAULT=1 loads B of
// layout_probe and A^T of layout_trans_a WITHOUT .trans (deliberate layout bugs the host
// checker must catch), and stores layout_trans_store's fragments WITHOUT .trans.
#include "ptx.cuh"

#ifndef PROBE_BF16
#define PROBE_BF16 0
#endif
#ifndef PROBE_FAULT
#define PROBE_FAULT 0
#endif

// Registers dumped per lane by each kernel (mirrored in src/probe.rs).
#define PROBE_REGS 10
#define HANDOFF_REGS 16

FA_DEVICE u16 to16(float x) { return elem_from_f32<PROBE_BF16>(x); }
FA_DEVICE u32 pack16(float lo, float hi) { return elem_pack2<PROBE_BF16>(lo, hi); }
FA_DEVICE void mma16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    elem_mma<PROBE_BF16>(d, a0, a1, a2, a3, b0, b1);
}

// Row address for ldmatrix.x4 of a row-major 16x16 tile as A fragments a0..a3: lane l gives
// row l%8 of tile l/8; tile bit 0 selects the lower 8 rows, bit 1 the right 8 columns.
FA_DEVICE u32 a_x4_addr(const u16 *tile16x16, int lane) {
    const int t = lane / 8, r = lane % 8;
    return smem_u32(tile16x16 + (r + 8 * (t & 1)) * 16 + 8 * (t >> 1));
}

// One mma.m16n8k16 of the loaded fragments, then the lane's words: a0..a3, b0..b1, d0..d3
// (layout_probe and layout_trans_a).
FA_DEVICE void mma_and_dump(u32 *out, int lane, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma16(d, a0, a1, a2, a3, b0, b1);
    u32 *o = out + lane * PROBE_REGS;
    o[0] = a0;
    o[1] = a1;
    o[2] = a2;
    o[3] = a3;
    o[4] = b0;
    o[5] = b1;
    for (int i = 0; i < 4; ++i) o[6 + i] = __float_as_uint(d[i]);
}

extern "C" __global__ void __launch_bounds__(32) layout_probe(u32 *out) {
    __shared__ __align__(16) u16 sA[16 * 16];
    __shared__ __align__(16) u16 sB[16 * 8];
    const int lane = threadIdx.x;
    for (int e = lane; e < 16 * 16; e += 32) sA[e] = to16((float)(e / 16)); // A[i][j] = i
    for (int e = lane; e < 16 * 8; e += 32) sB[e] = to16((float)(e % 8));   // B[k][j] = j
    __syncthreads();

    u32 a0, a1, a2, a3;
    ldmatrix_x4(a0, a1, a2, a3, a_x4_addr(sA, lane));

    // B is 16x8: two 8x8 tiles (k rows 0..8 and 8..16). x4 needs four addresses; tiles 2 and 3
    // repeat 0 and 1, and b2, b3 are not used.
    const int t = lane / 8, r = lane % 8;
    const u32 baddr = smem_u32(sB + (r + 8 * (t & 1)) * 8);
    u32 b0, b1, b2, b3;
#if PROBE_FAULT
    ldmatrix_x4(b0, b1, b2, b3, baddr); // the bug: B fragments need the transposed hand-out
#else
    ldmatrix_x4_trans(b0, b1, b2, b3, baddr);
#endif
    (void)b2;
    (void)b3;

    mma_and_dump(out, lane, a0, a1, a2, a3, b0, b1);
}

extern "C" __global__ void __launch_bounds__(32) layout_handoff(u32 *out) {
    __shared__ __align__(16) u16 sA1[16 * 16];
    __shared__ __align__(16) u16 sB1[16 * 16];
    __shared__ __align__(16) u16 sB2[16 * 8];
    const int lane = threadIdx.x;
    for (int e = lane; e < 16 * 16; e += 32) {
        const int row = e / 16, col = e % 16;
        // A1[i][m] = i for m < 8, else 1.
        sA1[e] = to16(col < 8 ? (float)row : 1.f);
        // B1[m][k] = 2 for m < 8 (column sum 16), the value of bit m-8 of k for m in 8..12
        // (column sum k), 0 for m >= 12: so S[i][k] = 16*i + k.
        sB1[e] = to16(row < 8 ? 2.f : (row < 12 ? (float)(col & (1 << (row - 8))) : 0.f));
    }
    for (int e = lane; e < 16 * 8; e += 32) {
        const int k = e / 8, j = e % 8;
        sB2[e] = to16(k == j ? 1.f : (k == j + 8 ? 256.f : 0.f));
    }
    __syncthreads();

    u32 a0, a1, a2, a3;
    ldmatrix_x4(a0, a1, a2, a3, a_x4_addr(sA1, lane));
    // B1 row-major [k][n] 16x16: tile bit 0 selects k rows 8..16, bit 1 n columns 8..16, so
    // (b0, b1) feed S[:, 0:8] and (b2, b3) feed S[:, 8:16].
    const int t = lane / 8, r = lane % 8;
    u32 b0, b1, b2, b3;
    ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sB1 + (r + 8 * (t & 1)) * 16 + 8 * (t >> 1)));

    float s0[4] = {0.f, 0.f, 0.f, 0.f};
    float s1[4] = {0.f, 0.f, 0.f, 0.f};
    mma16(s0, a0, a1, a2, a3, b0, b1);
    mma16(s1, a0, a1, a2, a3, b2, b3);

    // C fragments (g, 2t..2t+1) and (g+8, 2t..2t+1) of S0 and S1 are exactly the pairs of the
    // A fragment of P: p0 = P[g][2t..], p1 = P[g+8][2t..], p2 = P[g][8+2t..], p3 = P[g+8][8+2t..].
    const u32 p0 = pack16(s0[0], s0[1]);
    const u32 p1 = pack16(s0[2], s0[3]);
    const u32 p2 = pack16(s1[0], s1[1]);
    const u32 p3 = pack16(s1[2], s1[3]);

    // B2 16x8 row-major: x2.trans, lanes 0..16 give k rows 0..16 (lanes 16..32 are ignored by
    // the hardware; they repeat valid addresses anyway).
    u32 c0, c1;
    ldmatrix_x2_trans(c0, c1, smem_u32(sB2 + (lane % 16) * 8));
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma16(d, p0, p1, p2, p3, c0, c1);

    u32 *o = out + lane * HANDOFF_REGS;
    for (int i = 0; i < 4; ++i) {
        o[i] = __float_as_uint(s0[i]);
        o[4 + i] = __float_as_uint(s1[i]);
        o[12 + i] = __float_as_uint(d[i]);
    }
    o[8] = p0;
    o[9] = p1;
    o[10] = p2;
    o[11] = p3;
}

extern "C" __global__ void __launch_bounds__(32) layout_trans_a(u32 *out) {
    __shared__ __align__(16) u16 sAt[16 * 16];
    __shared__ __align__(16) u16 sB[16 * 8];
    const int lane = threadIdx.x;
    for (int e = lane; e < 16 * 16; e += 32) sAt[e] = to16((float)e); // At[k][m] = m + 16k
    for (int e = lane; e < 16 * 8; e += 32) sB[e] = to16((float)(e % 8));    // B[k][j] = j
    __syncthreads();

    // Tile t of the x4 load is a_t: bit 0 selects rows m 8..16 (columns of At), bit 1 the
    // k half (rows of At).
    const int t = lane / 8, r = lane % 8;
    const u32 aaddr = smem_u32(sAt + (r + 8 * (t >> 1)) * 16 + 8 * (t & 1));
    u32 a0, a1, a2, a3;
#if PROBE_FAULT
    ldmatrix_x4(a0, a1, a2, a3, aaddr); // the bug: a transposed store needs the .trans hand-out
#else
    ldmatrix_x4_trans(a0, a1, a2, a3, aaddr);
#endif
    u32 b0, b1, b2, b3;
    ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sB + (r + 8 * (t & 1)) * 8));
    (void)b2;
    (void)b3;

    mma_and_dump(out, lane, a0, a1, a2, a3, b0, b1);
}

extern "C" __global__ void __launch_bounds__(32) layout_trans_store(u32 *out) {
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(16) u16 sA[16 * 16];
    __shared__ __align__(16) u16 sB[16 * 8];
    const int lane = threadIdx.x;
    for (int e = lane; e < 16 * 16; e += 32) sA[e] = 0xffff;                // poison (NaN)
    for (int e = lane; e < 16 * 8; e += 32) sB[e] = to16((float)(e % 8)); // B[k][j] = j
    const int g = lane / 4, t = lane % 4;
    u32 x[4];
    for (int m = 0; m < 4; ++m) {
        const int k = 8 * (m % 2) + g, i = 8 * (m / 2) + 2 * t; // X[k][i] = i + 16k
        x[m] = pack16((float)(i + 16 * k), (float)(i + 1 + 16 * k));
    }
    __syncthreads();
    const int tile = lane / 8, r = lane % 8;
    const u32 addr = smem_u32(sA + (r + 8 * (tile >> 1)) * 16 + 8 * (tile & 1));
#if PROBE_FAULT
    stmatrix_x4(addr, x[0], x[1], x[2], x[3]); // the bug: the fragments are of A^T
#else
    stmatrix_x4_trans(addr, x[0], x[1], x[2], x[3]);
#endif
    __syncthreads();
    u32 a0, a1, a2, a3;
    ldmatrix_x4(a0, a1, a2, a3, a_x4_addr(sA, lane));
    u32 b0, b1, b2, b3;
    ldmatrix_x4_trans(b0, b1, b2, b3, smem_u32(sB + (r + 8 * (tile & 1)) * 8));
    (void)b2;
    (void)b3;
    mma_and_dump(out, lane, a0, a1, a2, a3, b0, b1);
#endif
}
