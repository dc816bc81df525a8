// attn_mma.cu: FlashAttention forward on Tensor Cores with mma.sync.m16n8k16.
//
// One block owns BR = 16*MT*NWARPS query rows of one (batch, head); each warp owns 16*MT of
// them. K and V tiles of BC keys stream through a two-stage cp.async pipeline in shared memory
// that all warps share. S = Q K^T and O += P V are mma.sync with f32 accumulation; the online
// softmax runs on the C fragments, and P goes from the S accumulators to the A fragments of the
// P V product in registers (layouts proven by layout_probe.cu). Specialised at NVRTC time by:
//   HEAD_DIM (multiple of 8, <= 256), MT (m16 tiles per warp), NWARPS, BC (keys per tile,
//   multiple of 16), IS_BF16, IS_CAUSAL, Q_IN_REGS (keep Q's A fragments in registers),
//   RESCALE_SLACK (how far a row max may rise before O is rescaled; 0 = always),
//   HEAD_MAJOR (block order, see tile_scheduler.cuh), SMEM_EPILOGUE (write O through shared
//   memory in 16-byte pieces), MIN_BLOCKS (blocks per SM that the register allocation must
//   allow); the score modifiers of attn_common.cuh (IS_LOCAL, HAS_SOFTCAP, HAS_ALIBI); and
//   HAS_SINK (a learnable sink: its logits are the kernel's second parameter).
#include "ptx.cuh"
#include "attn_common.cuh"
#include "tile_scheduler.cuh"
#include "softmax.cuh"

#ifndef MT
#define MT 2
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef BC
#define BC 64
#endif
#ifndef Q_IN_REGS
#define Q_IN_REGS 0
#endif
#ifndef SMEM_EPILOGUE
#define SMEM_EPILOGUE 0
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 0
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

// ---- tile geometry --------------------------------------------------------------------------
constexpr int DP = (D + 15) / 16 * 16; // head_dim padded to the mma k-step; pad columns are zero
constexpr int CH = DP / 8;             // 16-byte chunks per row
// Shared-memory row stride: one spare chunk makes it an odd number of 16-byte slots, so the
// 8 row addresses of an ldmatrix (same column, consecutive rows) hit 8 distinct bank groups.
constexpr int RS = (CH + 1) * 8;
constexpr int WM = 16 * MT;      // query rows per warp
constexpr int BR = WM * NWARPS;  // query rows per block
constexpr int NT = NWARPS * 32;  // threads per block
constexpr int KS = DP / 16;      // k-steps of S = Q K^T
constexpr int NS = BC / 8;       // n8 tiles of S
constexpr int ND = DP / 8;       // n8 tiles of O
constexpr int PK = BC / 16;      // k-steps of O += P V
static_assert(BC % 16 == 0, "BC must be a multiple of 16");

// K/V tile loads when every thread's chunks of a tile sit in one column (NT a multiple of CH):
// rows r0, r0 + NT/CH, ... of column chunk c. The thread keeps one cursor, its chunk of row r0
// of the tile, advanced by a fixed step, instead of a 64-bit address per chunk; with the
// generic load_rows ptxas spills at d128 Bc64. Rows at or past rows_valid are zero-filled
// with the source `safe` (any valid address: 0 source bytes read nothing).
constexpr bool FAST_LOADS = NT % CH == 0 && (BC * CH) % NT == 0;
constexpr int LROWS = FAST_LOADS ? NT / CH : 1; // rows between one thread's chunks
FA_DEVICE void load_kv_tile(u32 dst, const u16 *g, const u16 *safe, i64 row_stride, int rows_valid) {
    const int r0 = (int)threadIdx.x / CH, c = (int)threadIdx.x % CH;
    dst += (u32)(r0 * RS + c * 8) * 2;
#pragma unroll
    for (int it = 0; it < BC / LROWS; ++it) {
        const bool ok = r0 + it * LROWS < rows_valid && c * 8 < D;
        cp_async_16(dst + (u32)(it * LROWS * RS) * 2, ok ? g : safe, ok ? 16 : 0);
        g += LROWS * row_stride;
    }
}

template <bool B> struct Bool {
    static constexpr bool value = B;
};

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS) attn_mma(const Params p_in SINK_PARAM VARLEN_PARAM) {
    extern __shared__ __align__(16) u16 smem[];
    const u32 sQ = smem_u32(smem);
    const u32 sK = sQ + BR * RS * 2;          // two stages of BC rows
    const u32 sV = sK + 2 * BC * RS * 2;      // two stages of BC rows
    // Lane coordinates g = lane / 4 (fragment row) and t = lane % 4 (quad position) are
    // derived where used (mask, epilogue) from fresh reads of %tid; see below.
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    const BlockCoords bc = block_coords(p_in);
    const int m_block = bc.m_block, h = bc.h, b = bc.b, hk = bc.hk;
    // The block's sequence (its own lengths with IS_VARLEN).
    Params p = p_in;
    const SeqOffsets so = sequence_offsets(p, b, VARLEN_TOTAL_K);
    const int row0 = m_block * BR;
    if (IS_VARLEN && row0 >= p.seqlen_q) return; // block-uniform, before any barrier
    const u16 *qb = p.q + so.q + h * p.q_sh;
    const u16 *kb = p.k + so.k + hk * p.k_sh;
    const u16 *vb = p.v + so.v + hk * p.v_sh;

    // The key tiles the block's rows see (attn_common.cuh): tiles before the window's start
    // and past the last row's keys are skipped.
    const KeyTiles kt = key_tiles_of(p, row0, BR, BC);
    const float coef = alibi_coef(p, b, h); // 0 without ALiBi
    const int n_begin = kt.begin, n_blocks = kt.end;

    // ---- prologue: Q, and the first K/V tile ----
    // kg, vg: this thread's chunk of the next K/V tile to load (used when FAST_LOADS).
    // Tile j sits in stage j % 2, from the first tile of the window on.
    const u16 *kg = kb + ((i64)n_begin * BC + tid / CH) * p.k_ss + (tid % CH) * 8;
    const u16 *vg = vb + ((i64)n_begin * BC + tid / CH) * p.v_ss + (tid % CH) * 8;
    load_rows<BR, RS, NT>(sQ, qb, p.q_ss, row0, p.seqlen_q);
    if (n_blocks > n_begin) {
        const u32 st = (u32)(n_begin & 1) * BC * RS * 2;
        if constexpr (FAST_LOADS) {
            load_kv_tile(sK + st, kg, p.k, p.k_ss, p.seqlen_k - n_begin * BC);
            load_kv_tile(sV + st, vg, p.v, p.v_ss, p.seqlen_k - n_begin * BC);
            kg += (i64)BC * p.k_ss;
            vg += (i64)BC * p.v_ss;
        } else {
            load_rows<BC, RS, NT>(sK + st, kb, p.k_ss, n_begin * BC, p.seqlen_k);
            load_rows<BC, RS, NT>(sV + st, vb, p.v_ss, n_begin * BC, p.seqlen_k);
        }
    }
    cp_async_commit();

    float acc_o[MT][ND][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nd = 0; nd < ND; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][nd][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = neg_inf();
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
#if Q_IN_REGS
    u32 qf[MT][KS][4];
#endif

    // ---- main loop over key tiles ----
    // One key tile. `masked` is Bool<true> or Bool<false>: the tiles that no row of the block
    // needs masked run in their own loop, compiled without the mask code.
    auto tile_step = [&](const int j, auto masked) {
        cp_async_wait<0>();
        __syncthreads(); // tile j landed; every warp is done with tile j-1's stage
        if (j + 1 < n_blocks) {
            const u32 st = (u32)((j + 1) & 1) * BC * RS * 2;
            if constexpr (FAST_LOADS) {
                load_kv_tile(sK + st, kg, p.k, p.k_ss, p.seqlen_k - (j + 1) * BC);
                load_kv_tile(sV + st, vg, p.v, p.v_ss, p.seqlen_k - (j + 1) * BC);
                kg += (i64)BC * p.k_ss;
                vg += (i64)BC * p.v_ss;
            } else {
                load_rows<BC, RS, NT>(sK + st, kb, p.k_ss, (j + 1) * BC, p.seqlen_k);
                load_rows<BC, RS, NT>(sV + st, vb, p.v_ss, (j + 1) * BC, p.seqlen_k);
            }
        }
        cp_async_commit();
        const u32 cK = sK + (u32)(j & 1) * BC * RS * 2;
        const u32 cV = sV + (u32)(j & 1) * BC * RS * 2;

#if Q_IN_REGS
        if (j == n_begin) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < KS; ++kk) {
                    const int r = warp * WM + mt * 16 + (lane % 16);
                    const int c = kk * 2 + lane / 16;
                    ldmatrix_x4(qf[mt][kk][0], qf[mt][kk][1], qf[mt][kk][2], qf[mt][kk][3],
                                sQ + (u32)(r * RS + c * 8) * 2);
                }
        }
#endif

        // S = Q K^T: A = Q rows (ldmatrix), B = K rows read non-transposed (a K row is a
        // column of K^T, contiguous along k, which is what the B fragment packs).
        float s[MT][NS][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NS; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#if Q_IN_REGS
#pragma unroll
                for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kk][e];
#else
                const int r = warp * WM + mt * 16 + (lane % 16);
                const int c = kk * 2 + lane / 16;
                ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], sQ + (u32)(r * RS + c * 8) * 2);
#endif
            }
#pragma unroll
            for (int np = 0; np < NS / 2; ++np) {
                // tiles: 0 = keys n..n+7 / k lo, 1 = same keys / k hi, 2-3 = keys n+8..n+15
                const int r = np * 16 + (lane % 8) + (lane / 16) * 8;
                const int c = kk * 2 + (lane / 8) % 2;
                u32 b0, b1, b2, b3;
                ldmatrix_x4(b0, b1, b2, b3, cK + (u32)(r * RS + c * 8) * 2);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma(s[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                    mma(s[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                }
            }
        }

        // Score modifiers and mask from C-fragment coordinates (attn_common.cuh score_row):
        // element e of n-tile nt sits at row g + 8*(e/2), column 8*nt + 2t + (e%2). Only tiles
        // that cross the sequence end, the causal diagonal or the window's edges of the
        // block's rows pay for the mask; the lane's coordinates are re-read here (fresh %tid)
        // so that nothing of it stays live through the other tiles.
        const int n0 = j * BC;
        constexpr bool MODS = HAS_SOFTCAP || HAS_ALIBI;
        // Row r of the block sees keys [lo_block + r, min(lim_block + r, seqlen_k)) (causal and
        // window; the clamp below -2^30 keeps fully masked rows masked). Block-uniform, and
        // recomputed per tile from the parameters rather than held through the loop.
        const int lim_block = key_hi(p, row0);
        const int lo_block = key_lo(p, row0);

        const bool mask_tile = decltype(masked)::value && (n0 + BC > lim_block || (IS_LOCAL && n0 < lo_block + BR - 1));
        if (MODS || mask_tile) {
            const int mtid = (int)fresh_tid_x(), mg = (mtid % 32) / 4, mtq = mtid % 4;
            const int woff = (mtid / 32) * WM; // this warp's first row in the block
            const int col0 = n0 + 2 * mtq;     // this lane's first key in the tile
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int off = woff + mt * 16 + mg + 8 * r; // the row in the block
                    // keys this row sees, counted from this lane's first key
                    const int hi = ((IS_CAUSAL || IS_LOCAL) ? min(lim_block + off, p.seqlen_k) : p.seqlen_k) - col0;
                    const int lo = IS_LOCAL ? lo_block + off - col0 : -(1 << 30);
                    const int center = row0 + off + (p.seqlen_k - p.seqlen_q) - col0;
                    auto at = [&](int nt, int e) -> float & { return s[mt][nt][2 * r + e]; };
                    if (mask_tile)
                        score_row<NS, true>(p, at, lo, hi, center, coef);
                    else
                        score_row<NS, false>(p, at, lo, hi, center, coef);
                }
        }

        // Online softmax on the fragments. Row r of m-tile mt lives in the 4 lanes of a quad;
        // each lane holds 2*NS of its values. Max and sum reduce with shfl.xor 1 and 2.
        // The running max only moves when a row's new max exceeds it by more than
        // RESCALE_SLACK (log2 units): with slack 8, p = 2^(s - m) <= 256, exact enough in
        // f16/bf16 and f32 sums, and most tiles then skip rescaling O (a warp-uniform vote).
        bool moved = false;
        float alpha[MT][2];
        // P packed to 16-bit pairs as soon as it is computed: pf[mt][nt][r] holds row g + 8r,
        // columns 2t and 2t+1 of n-tile nt. Half the registers of f32 P while O is rescaled
        // and P V runs (this is what lets Bc 64 fit at d128).
        u32 pf[MT][NS][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = neg_inf();
#pragma unroll
                for (int nt = 0; nt < NS; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                mx = quad_max(mx);
                const float m_use =
                    row_max_step<RESCALE_SLACK>(row_max[mt][r], mx, p.scale_log2, alpha[mt][r], moved);
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NS; ++nt) {
                    const float p0 = exp_scaled(s[mt][nt][2 * r], p.scale_log2, m_use);
                    const float p1 = exp_scaled(s[mt][nt][2 * r + 1], p.scale_log2, m_use);
                    sum += p0 + p1;
                    pf[mt][nt][r] = pack2(p0, p1);
                }
                // per-lane partial sum; the quad reduces it once, in the epilogue
                row_sum[mt][r] = row_sum[mt][r] * alpha[mt][r] + sum;
            }
        if (vote_any(moved)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nd = 0; nd < ND; ++nd)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc_o[mt][nd][e] *= alpha[mt][e >> 1];
        }

        // O += P V. The C fragments of S n-tiles 2kk and 2kk+1, packed to 16-bit pairs, are
        // exactly the A fragment of keys 16kk..16kk+15: a0 = (g, 2t..), a1 = (g+8, 2t..),
        // a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). V is read with ldmatrix.trans so that each
        // B register packs two consecutive keys of one column.
#pragma unroll
        for (int kk = 0; kk < PK; ++kk) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                a[mt][0] = pf[mt][2 * kk][0];
                a[mt][1] = pf[mt][2 * kk][1];
                a[mt][2] = pf[mt][2 * kk + 1][0];
                a[mt][3] = pf[mt][2 * kk + 1][1];
            }
#pragma unroll
            for (int dp = 0; dp < ND / 2; ++dp) {
                // tiles: 0 = keys lo / cols c, 1 = keys hi / cols c, 2-3 = same for cols c+8
                const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                const int c = dp * 2 + lane / 16;
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(b0, b1, b2, b3, cV + (u32)(r * RS + c * 8) * 2);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma(acc_o[mt][2 * dp], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
                    mma(acc_o[mt][2 * dp + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
                }
            }
        }
    };
    // Tiles inside every row's key range need no mask for any row of the block; the window's
    // first tiles and the tiles at the diagonal or the sequence end do.
    int j = n_begin;
    if (IS_LOCAL)
        for (; j < kt.inner_begin; ++j) tile_step(j, Bool<true>());
    for (; j < kt.inner_end; ++j) tile_step(j, Bool<false>());
    for (; j < n_blocks; ++j) tile_step(j, Bool<true>());
    cp_async_wait<0>();

    // ---- epilogue: O / row_sum as 16-bit pairs, lse = ln(sum exp) in f32 (a sink's term
    // folded in first) ----
    // Coordinates recomputed from fresh reads of %tid and %ctaid rather than kept live
    // through the loop: that frees the registers for the loop (zero spills at d64 with three
    // blocks per SM).
    const int etid = (int)fresh_tid_x(), ewarp = etid / 32, elane = etid % 32;
    const int eg = elane / 4, et = elane % 4;
    const BlockCoords ec = block_coords(p_in, fresh_ctaid_x());
    const int ewrow0 = ec.m_block * BR + ewarp * WM;
    Params pe = p_in;
    const SeqOffsets eo = sequence_offsets(pe, ec.b, VARLEN_TOTAL_K);
    u16 *ob = p.o + eo.o + ec.h * p.o_sh;
    float *lse = p.lse + lse_offset(p_in, ec.b, ec.h, eo.q0);
    const float sink = sink_log2(SINK_LOGITS, ec.h);
#if SMEM_EPILOGUE
    // Stage this warp's rows of O in shared memory (its own slice of the Q tile, free once
    // every warp is past the loop), then write whole 16-byte pieces of each row: coalesced
    // stores instead of 4-byte ones scattered over 8 rows.
    __syncthreads();
    const u32 sO = sQ + (u32)(ewarp * WM * RS) * 2;
#endif
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = quad_sum(row_sum[mt][r]), m = row_max[mt][r];
            const int row = ewrow0 + mt * 16 + eg + 8 * r;
            const float alpha = HAS_SINK ? sink_fold(m, l, sink) : 1.f;
            const float inv = HAS_SINK ? alpha / l : row_inv(l);
#if SMEM_EPILOGUE
            const int rl = mt * 16 + eg + 8 * r;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd)
                st_shared_u32(sO + (u32)(rl * RS + nd * 8 + 2 * et) * 2,
                              pack2(acc_o[mt][nd][2 * r] * inv, acc_o[mt][nd][2 * r + 1] * inv));
            if (row >= pe.seqlen_q) continue;
#else
            if (row >= pe.seqlen_q) continue;
            u16 *orow = ob + (i64)row * p.o_ss;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd) {
                const int col = nd * 8 + 2 * et;
                if (col < D)
                    *(u32 *)(orow + col) = pack2(acc_o[mt][nd][2 * r] * inv, acc_o[mt][nd][2 * r + 1] * inv);
            }
#endif
            if (et == 0)
                lse[row] = row_lse(m, l);
        }
#if SMEM_EPILOGUE
    __syncwarp();
#pragma unroll
    for (int i = elane; i < WM * CH; i += 32) {
        const int rl = i / CH, c = i % CH;
        const int row = ewrow0 + rl;
        if (row < pe.seqlen_q && c * 8 < D) {
            u32 x0, x1, x2, x3;
            ld_shared_v4(x0, x1, x2, x3, sO + (u32)(rl * RS + c * 8) * 2);
            st_global_v4(ob + (i64)row * p.o_ss + c * 8, x0, x1, x2, x3);
        }
    }
#endif
}
