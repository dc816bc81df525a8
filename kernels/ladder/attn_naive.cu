// attn_naive.cu: the baseline of the kernel ladder. Three launches, O(seqlen^2) memory:
//   attn_naive_scores   S = softmax_scale * Q K^T, f32 [batch, heads_q, seqlen_q, seqlen_k] in
//                       global memory; masked entries are -inf.
//   attn_naive_softmax  P = softmax(S) row by row, written over S in place, and lse (natural log).
//   attn_naive_pv       O = P V with f32 accumulation, written as 16-bit through o's strides.
// Every kernel walks its tiles with a grid-stride loop over a 64-bit tile index, so any grid
// size works for any batch * heads * seqlen. Specialised at NVRTC time by HEAD_DIM (multiple
// of 8, <= 256), IS_BF16 and IS_CAUSAL. Same Params and masking rules as attn_mma.cu.
#include "ptx.cuh"
#include "attn_common.cuh"

constexpr int CH = D / 8; // 16-byte chunks per row

// ---- (a) S = softmax_scale * Q K^T ----------------------------------------------------------
// One 16x16 tile of S per block iteration, one element per thread. The Q and K rows of the tile
// are staged in shared memory as f32 with an odd row stride (D + 1), so the 16 K rows that a
// warp reads at one channel fall in distinct banks (the Q read is a broadcast).
constexpr int TS = 16;
constexpr int SQS = D + 1;

extern "C" __global__ void __launch_bounds__(TS * TS) attn_naive_scores(const Params p, float *S) {
    __shared__ float sQ[TS * SQS];
    __shared__ float sK[TS * SQS];
    const int tid = threadIdx.x, tx = tid % TS, ty = tid / TS;
    const i64 m_tiles = (p.seqlen_q + TS - 1) / TS;
    const i64 n_tiles = (p.seqlen_k + TS - 1) / TS;
    const i64 total = m_tiles * n_tiles * p.batch * p.heads_q;
    const float scale = p.scale_log2 * LN2; // softmax_scale
    const i64 diag = (i64)p.seqlen_k - p.seqlen_q;

    for (i64 tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const int nt = (int)(tile % n_tiles);
        i64 rest = tile / n_tiles;
        const int mt = (int)(rest % m_tiles);
        rest /= m_tiles;
        const int h = (int)(rest % p.heads_q), b = (int)(rest / p.heads_q);
        const int hk = h / p.group;
        const int row0 = mt * TS, col0 = nt * TS;
        const int i = row0 + ty, j = col0 + tx;
        // Under the causal mask a tile whose first key is past every row's limit is all -inf:
        // skip its loads (block-uniform, so the barriers below stay uniform too).
        const int last_row = min(row0 + TS, p.seqlen_q) - 1;
        const bool dead = IS_CAUSAL && (i64)col0 >= (i64)last_row + 1 + diag;
        float acc = 0.f;
        if (!dead) {
            const u16 *qb = p.q + b * p.q_sb + h * p.q_sh;
            const u16 *kb = p.k + b * p.k_sb + hk * p.k_sh;
            __syncthreads(); // the previous tile's readers are done
            for (int x = tid; x < TS * CH; x += TS * TS) {
                const int r = x / CH, c = (x % CH) * 8;
                uint4 rq = make_uint4(0, 0, 0, 0), rk = make_uint4(0, 0, 0, 0);
                if (row0 + r < p.seqlen_q) rq = *(const uint4 *)(qb + (i64)(row0 + r) * p.q_ss + c);
                if (col0 + r < p.seqlen_k) rk = *(const uint4 *)(kb + (i64)(col0 + r) * p.k_ss + c);
                float fq[8], fk[8];
                unpack8(rq, fq);
                unpack8(rk, fk);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    sQ[r * SQS + c + e] = fq[e];
                    sK[r * SQS + c + e] = fk[e];
                }
            }
            __syncthreads();
#pragma unroll 8
            for (int c = 0; c < D; ++c) acc = fmaf(sQ[ty * SQS + c], sK[tx * SQS + c], acc);
        }
        if (i < p.seqlen_q && j < p.seqlen_k) {
            const bool vis = j < visible_keys(i, diag, p.seqlen_k);
            S[(((i64)b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k + j] = vis ? acc * scale : neg_inf();
        }
    }
}

// ---- (b) P = softmax(S) in place, and lse ----------------------------------------------------
// One warp per row. Pass 1: each lane keeps a running (max, sum) over its strided share of the
// visible keys (log2 domain), merged across the warp with shfl.xor. Pass 2 writes P (zeros for
// masked keys). A row that sees no key writes all zeros and lse = -inf, never NaN.
constexpr int SM_WARPS = 8;

extern "C" __global__ void __launch_bounds__(SM_WARPS * 32) attn_naive_softmax(const Params p, float *S) {
    const int lane = threadIdx.x % 32;
    const i64 rows = (i64)p.batch * p.heads_q * p.seqlen_q;
    const i64 diag = (i64)p.seqlen_k - p.seqlen_q;
    const i64 stride = (i64)gridDim.x * SM_WARPS;
    for (i64 row = (i64)blockIdx.x * SM_WARPS + threadIdx.x / 32; row < rows; row += stride) {
        float *s = S + row * p.seqlen_k;
        const int i = (int)(row % p.seqlen_q);
        const int n_vis = visible_keys(i, diag, p.seqlen_k);
        float m = neg_inf(), l = 0.f;
        for (int j = lane; j < n_vis; j += 32) {
            const float x = fmul_rn(s[j], LOG2E); // finite: visible entries are scaled dot products
            const float m_new = fmaxf(m, x);
            l = l * ex2(m - m_new) + ex2(x - m_new); // ex2(-inf) = 0 on a lane's first key
            m = m_new;
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            const float m2 = shfl_xor(m, off), l2 = shfl_xor(l, off);
            const float mx = fmaxf(m, m2);
            // Lanes that saw no key hold (-inf, 0); subtract 0 then so -inf - -inf never happens.
            const float mu = mx == neg_inf() ? 0.f : mx;
            l = l * ex2(m - mu) + l2 * ex2(m2 - mu);
            m = mx;
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        for (int j = lane; j < p.seqlen_k; j += 32)
            s[j] = j < n_vis ? ex2(fmul_rn(s[j], LOG2E) - m) * inv : 0.f;
        if (lane == 0) p.lse[row] = l > 0.f ? (m + lg2(l)) * LN2 : neg_inf();
    }
}

// ---- (c) O = P V -----------------------------------------------------------------------------
// One tile of 16 rows x 64 channels per block iteration; keys in steps of 16 staged in shared
// memory (P tile f32, V tile converted to f32). Thread (ty, tx) accumulates row ty, channels
// tx + 16e (e < 4). Under the causal mask key steps past the tile's last row are skipped
// (their P entries are zero).
constexpr int PM = 16; // rows per tile
constexpr int PN = 64; // channels per tile
constexpr int PK = 16; // keys per step
constexpr int D_TILES = (D + PN - 1) / PN;

extern "C" __global__ void __launch_bounds__(PM * PK) attn_naive_pv(const Params p, const float *P) {
    __shared__ float sP[PM][PK + 1];
    __shared__ float sV[PK][PN];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const i64 m_tiles = (p.seqlen_q + PM - 1) / PM;
    const i64 total = m_tiles * D_TILES * p.batch * p.heads_q;
    const i64 diag = (i64)p.seqlen_k - p.seqlen_q;

    for (i64 tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const int dt = (int)(tile % D_TILES);
        i64 rest = tile / D_TILES;
        const int mt = (int)(rest % m_tiles);
        rest /= m_tiles;
        const int h = (int)(rest % p.heads_q), b = (int)(rest / p.heads_q);
        const int hk = h / p.group;
        const int row0 = mt * PM, ch0 = dt * PN;
        const int n_end = visible_keys(min(row0 + PM, p.seqlen_q) - 1, diag, p.seqlen_k);
        const float *pb = P + (((i64)b * p.heads_q + h) * p.seqlen_q) * p.seqlen_k;
        const u16 *vb = p.v + b * p.v_sb + hk * p.v_sh;
        float acc[PN / 16] = {0.f, 0.f, 0.f, 0.f};

        for (int k0 = 0; k0 < n_end; k0 += PK) {
            __syncthreads(); // the previous step's readers are done
            {
                const int r = row0 + ty, kk = k0 + tx;
                sP[ty][tx] = (r < p.seqlen_q && kk < p.seqlen_k) ? pb[(i64)r * p.seqlen_k + kk] : 0.f;
            }
#pragma unroll
            for (int e = 0; e < PK * PN / (PM * PK); ++e) {
                const int x = tid + e * PM * PK;
                const int kr = x / PN, c = x % PN;
                const int key = k0 + kr, ch = ch0 + c;
                sV[kr][c] = (key < p.seqlen_k && ch < D) ? to_f32(vb[(i64)key * p.v_ss + ch]) : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < PK; ++kk) {
                const float pv = sP[ty][kk];
#pragma unroll
                for (int e = 0; e < PN / 16; ++e) acc[e] = fmaf(pv, sV[kk][tx + 16 * e], acc[e]);
            }
        }

        const int r = row0 + ty;
        if (r < p.seqlen_q) {
            u16 *orow = p.o + b * p.o_sb + h * p.o_sh + (i64)r * p.o_ss;
#pragma unroll
            for (int e = 0; e < PN / 16; ++e) {
                const int ch = ch0 + tx + 16 * e;
                if (ch < D) orow[ch] = from_f32(acc[e]);
            }
        }
    }
}
