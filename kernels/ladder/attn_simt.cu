// attn_simt.cu: FlashAttention forward on CUDA cores (FFMA), online softmax, O(seqlen) memory.
//
// One block owns BR = RW * NWARPS query rows of one (batch, head); each warp owns RW of them.
// K and V tiles of BC = 32 * KPL keys are staged in shared memory as 16-bit values (cp.async,
// zero-filled past the sequence end); Q is staged once as f32.
//
//   S phase   lane j computes whole dot products for keys j, j+32, .. (KPL of them) against
//             the warp's RW rows: its K row is a 16-byte vector load (odd row stride in 16-byte
//             units: conflict-free), the Q row a broadcast float4 load.
//   softmax   per row: tile max over the warp (shfl.xor), running max m and per-lane partial
//             sums l (reduced once at the end), alpha = 2^(m_old - m_new) rescales O.
//   P V       P goes through a per-warp slice of shared memory ([key][row], float4 broadcast
//             reads); lane owns channels c = lane + 32 i of every row, so V is read as
//             contiguous 16-bit values of one key row (conflict-free).
//
// Specialised at NVRTC time by HEAD_DIM (multiple of 8, <= 256), IS_BF16, IS_CAUSAL, and the
// tile RW (rows per warp, multiple of 4), KPL (keys per lane), NWARPS. The launcher
// (src/cuda/simt.rs, SimtTile) computes the same shared-memory size.
#include "ptx.cuh"
#include "attn_common.cuh"
#include "tile_scheduler.cuh"
#include "softmax.cuh"

#ifndef RW
#define RW 8
#endif
#ifndef KPL
#define KPL 2
#endif
#ifndef NWARPS
#define NWARPS 4
#endif

// ---- tile geometry --------------------------------------------------------------------------
constexpr int CH = D / 8;                        // 16-byte chunks per row
constexpr int KRS = (CH % 2 == 1 ? CH : CH + 1) * 8; // K row stride (u16): odd 16-byte slots
constexpr int BR = RW * NWARPS;                  // query rows per block
constexpr int BC = 32 * KPL;                     // keys per tile
constexpr int NT = NWARPS * 32;                  // threads per block
constexpr int NCH = (D + 31) / 32;               // channels of O per lane
static_assert(RW % 4 == 0 && RW >= 4, "RW must be a multiple of 4");
static_assert(KPL >= 1 && KPL <= 4, "KPL must be 1..4");
static_assert(NT >= CH, "a K/V copy pass needs at least one thread per 16-byte chunk of a row");

// Shared memory (bytes, each part a multiple of 16):
//   sQ f32 [BR][D] | sK u16 [BC][KRS] | sV u16 [BC][D] | sP f32 [NWARPS][BC][RW]
constexpr int SQ_BYTES = BR * D * 4;
constexpr int SK_BYTES = BC * KRS * 2;
constexpr int SV_BYTES = BC * D * 2;
constexpr int SP_BYTES = NWARPS * BC * RW * 4;
constexpr int SMEM_BYTES = SQ_BYTES + SK_BYTES + SV_BYTES + SP_BYTES;
static_assert(SMEM_BYTES <= 227 * 1024, "tile needs more shared memory than any GPU has");

// Copies rows [row_begin, row_begin + BC) of a [seq, head_dim] slice into shared memory with
// row stride RS (u16). Rows at or past row_limit are zero-filled (0 source bytes: nothing is
// read), so masked keys contribute exact zeros to P V, never NaN. Thread t moves chunk t % CH of
// rows t / CH, + STEP, ..: one 64-bit pointer walks down the rows (a fully unrolled copy would
// keep one hoisted 64-bit offset per cp.async alive across the main loop).
template <int RS>
FA_DEVICE void load_kv_tile(u32 dst, const u16 *src, i64 row_stride, int row_begin, int row_limit) {
    constexpr int STEP = NT / CH; // rows per pass; CH <= 32 <= NT
    const int c = (int)threadIdx.x % CH, r0 = (int)threadIdx.x / CH;
    if (r0 >= STEP) return;
    const u16 *g = src + (i64)(row_begin + r0) * row_stride + c * 8;
    const i64 g_step = (i64)STEP * row_stride;
    u32 d = dst + (u32)(r0 * RS + c * 8) * 2;
#pragma unroll 1
    for (int r = r0; r < BC; r += STEP, g += g_step, d += STEP * RS * 2) {
        const bool ok = row_begin + r < row_limit;
        cp_async_16(d, ok ? g : src, ok ? 16 : 0);
    }
}

// Min 1 block per SM: without it ptxas caps registers at 128 on sm_86/89/120 (to fit 4 blocks)
// and spills for head_dim 80-128; with it the kernel takes 118-198 registers and never spills.
extern "C" __global__ void __launch_bounds__(NT, 1) attn_simt(const Params p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *sQ = (float *)smem_raw;
    u16 *sK = (u16 *)(smem_raw + SQ_BYTES);
    u16 *sV = (u16 *)(smem_raw + SQ_BYTES + SK_BYTES);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float *sP = (float *)(smem_raw + SQ_BYTES + SK_BYTES + SV_BYTES) + warp * BC * RW; // this warp's [BC][RW]

    const BlockCoords coords = block_coords(p); // heaviest (last) query blocks first
    const int m_block = coords.m_block, h = coords.h, b = coords.b, hk = coords.hk;
    const u16 *qb = p.q + b * p.q_sb + h * p.q_sh;
    const u16 *kb = p.k + b * p.k_sb + hk * p.k_sh;
    const u16 *vb = p.v + b * p.v_sb + hk * p.v_sh;
    const int row0 = m_block * BR;
    const int wrow0 = row0 + warp * RW;
    // Causal, bottom-right: row i sees keys j < i + 1 + (seqlen_k - seqlen_q).
    const i64 diag = (i64)p.seqlen_k - p.seqlen_q;

    const int n_end = visible_keys((i64)row0 + BR - 1, diag, p.seqlen_k); // the block's last row
    const int n_blocks = (n_end + BC - 1) / BC;
    // Keys visible to this warp's first row; row r of the warp sees min(wlim0 + r, seqlen_k).
    const int wlim0 = row_limit(wrow0, diag, p.seqlen_k);

    // ---- prologue: Q as f32 (rows past seqlen_q are zero and never written back) ----
    for (int x = tid; x < BR * CH; x += NT) {
        const int r = x / CH, c = (x % CH) * 8;
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (row0 + r < p.seqlen_q) raw = *(const uint4 *)(qb + (i64)(row0 + r) * p.q_ss + c);
        float f[8];
        unpack8(raw, f);
        *(float4 *)(sQ + r * D + c) = make_float4(f[0], f[1], f[2], f[3]);
        *(float4 *)(sQ + r * D + c + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }

    float acc_o[RW][NCH];
    float row_max[RW], row_sum[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
#pragma unroll
        for (int i = 0; i < NCH; ++i) acc_o[r][i] = 0.f;
        row_max[r] = neg_inf();
        row_sum[r] = 0.f;
    }
    const float *wq = sQ + warp * RW * D;

    // ---- main loop over key tiles (one stage: load, barrier, compute) ----
    for (int j = 0; j < n_blocks; ++j) {
        const int n0 = j * BC;
        __syncthreads(); // every warp is done with tile j-1 (and sQ is written, for j = 0)
        load_kv_tile<KRS>(smem_u32(sK), kb, p.k_ss, n0, p.seqlen_k);
        load_kv_tile<D>(smem_u32(sV), vb, p.v_ss, n0, p.seqlen_k);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        // Causal: a warp whose rows see none of this tile's keys has nothing to add.
        if (IS_CAUSAL && (i64)n0 >= (i64)wrow0 + RW + diag) continue;

        // S = Q K^T: lane owns keys n0 + lane + 32 kp.
        float s[RW][KPL];
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int kp = 0; kp < KPL; ++kp) s[r][kp] = 0.f;
#pragma unroll 2
        for (int c = 0; c < CH; ++c) {
            float kf[KPL][8];
#pragma unroll
            for (int kp = 0; kp < KPL; ++kp)
                unpack8(*(const uint4 *)(sK + (lane + 32 * kp) * KRS + c * 8), kf[kp]);
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const float4 q0 = *(const float4 *)(wq + r * D + c * 8);
                const float4 q1 = *(const float4 *)(wq + r * D + c * 8 + 4);
#pragma unroll
                for (int kp = 0; kp < KPL; ++kp) {
                    float a = s[r][kp];
                    a = fmaf(q0.x, kf[kp][0], a);
                    a = fmaf(q0.y, kf[kp][1], a);
                    a = fmaf(q0.z, kf[kp][2], a);
                    a = fmaf(q0.w, kf[kp][3], a);
                    a = fmaf(q1.x, kf[kp][4], a);
                    a = fmaf(q1.y, kf[kp][5], a);
                    a = fmaf(q1.z, kf[kp][6], a);
                    a = fmaf(q1.w, kf[kp][7], a);
                    s[r][kp] = a;
                }
            }
        }

        // Mask keys past the sequence end and, under causal, past each row's limit. Only tiles
        // that cross the end or this warp's diagonal pay for it.
        const bool tail = n0 + BC > p.seqlen_k;
        const bool diag_cross = IS_CAUSAL && (i64)n0 + BC - 1 > (i64)wrow0 + diag;
        if (tail || diag_cross) {
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int kp = 0; kp < KPL; ++kp) {
                    const int col = n0 + lane + 32 * kp;
                    int lim = p.seqlen_k;
                    if (IS_CAUSAL) lim = min(wlim0 + r, lim);
                    if (col >= lim) s[r][kp] = neg_inf();
                }
        }

        // Online softmax, row by row.
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            float mx = s[r][0];
#pragma unroll
            for (int kp = 1; kp < KPL; ++kp) mx = fmaxf(mx, s[r][kp]);
#pragma unroll
            for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, shfl_xor(mx, off));
            // The plain rule here (fmaxf, no slack): the running max always follows the data.
            const float m_new = fmaxf(row_max[r], fmul_rn(mx, p.scale_log2));
            const float m_use = exp_offset(m_new);
            const float alpha = ex2(row_max[r] - m_use);
            row_max[r] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int kp = 0; kp < KPL; ++kp) {
                const float pe = exp_scaled(s[r][kp], p.scale_log2, m_use);
                s[r][kp] = pe;
                sum += pe;
            }
            row_sum[r] = row_sum[r] * alpha + sum; // per-lane partial; reduced at the end
#pragma unroll
            for (int i = 0; i < NCH; ++i) acc_o[r][i] *= alpha;
        }

        // P to this warp's shared slice, [key][row]: lane writes its keys' RW values.
#pragma unroll
        for (int kp = 0; kp < KPL; ++kp)
#pragma unroll
            for (int r4 = 0; r4 < RW / 4; ++r4)
                *(float4 *)(sP + (lane + 32 * kp) * RW + 4 * r4) =
                    make_float4(s[4 * r4][kp], s[4 * r4 + 1][kp], s[4 * r4 + 2][kp], s[4 * r4 + 3][kp]);
        __syncwarp();

        // O += P V: lane owns channels lane + 32 i.
#pragma unroll 2
        for (int kk = 0; kk < BC; ++kk) {
            float pr[RW];
#pragma unroll
            for (int r4 = 0; r4 < RW / 4; ++r4) {
                const float4 x = *(const float4 *)(sP + kk * RW + 4 * r4);
                pr[4 * r4] = x.x;
                pr[4 * r4 + 1] = x.y;
                pr[4 * r4 + 2] = x.z;
                pr[4 * r4 + 3] = x.w;
            }
#pragma unroll
            for (int i = 0; i < NCH; ++i) {
                const int c = lane + 32 * i;
                const float v = (D % 32 == 0 || c < D) ? to_f32(sV[kk * D + c]) : 0.f;
#pragma unroll
                for (int r = 0; r < RW; ++r) acc_o[r][i] = fmaf(pr[r], v, acc_o[r][i]);
            }
        }
        // sP is rewritten only after the next iteration's __syncthreads.
    }
    cp_async_wait<0>();

    // ---- epilogue: O / row_sum as 16-bit, lse = ln(sum exp) in f32 ----
    u16 *ob = p.o + b * p.o_sb + h * p.o_sh;
    float *lse = p.lse + ((i64)b * p.heads_q + h) * p.seqlen_q;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        float l = row_sum[r];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) l += shfl_xor(l, off);
        const int row = wrow0 + r;
        if (row >= p.seqlen_q) continue;
        const float inv = row_inv(l);
        u16 *orow = ob + (i64)row * p.o_ss;
#pragma unroll
        for (int i = 0; i < NCH; ++i) {
            const int c = lane + 32 * i;
            if (D % 32 == 0 || c < D) orow[c] = from_f32(acc_o[r][i] * inv);
        }
        if (lane == 0) lse[row] = row_lse(row_max[r], l);
    }
}
