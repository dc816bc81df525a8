// attn_decode.cu: decoding against a KV cache (flash-decoding). Few query rows meet a long
// cache, so the work is reading K and V once at the memory bandwidth, and the grid is filled
// by splitting each sequence's keys across blocks (split-KV) rather than by query blocks.
//
// - GQA packing: a block owns 16 rows of (query i, head h) pairs of ONE kv head hk, row
//   r = i * group + (h - hk * group), so every K/V byte it loads serves all the query heads
//   of the group (FlashAttention-2's "seqlenq_ngroups_swapped", for any seqlen_q).
// - Split-KV: block (m_block, hk, split, b) attends to split `split` of sequence b's keys:
//   whole tiles (16 x NWARPS keys), ceil(tiles / num_splits) per split (src/kvcache.rs
//   split_range cuts the same way, but in 64-key blocks: with 128-key tiles the GPU's splits
//   differ from the CPU's, and the results only in rounding).
// - K/V tiles of 16 x NWARPS keys stream through an NSTAGES-deep cp.async pipeline; each
//   warp takes 16 keys of a tile with the 16 rows (mma.m16n8k16, the fragment layouts of
//   attn_mma.cu proven by layout_probe.cu) and keeps its own online softmax; the warps merge
//   through shared memory at the end.
// - The cache is contiguous or paged (kv_cache.cuh, which clamps every index value it reads:
//   they live on the device, unvalidated); rows past a sequence's length are zero-filled and
//   masked, never read. HAS_BATCH_IDX / HAS_LEFTPAD: contiguous caches whose sequences are
//   picked by cache_batch_idx and start at row cache_leftpad.
// - ROTARY: q's rows are rotated in shared memory once they land (rotary.cuh), before any
//   warp reads their fragments.
// - Output: with one split, o in the element type and lse (natural log) directly; with more,
//   f32 partials o_accum/lse_accum that attn_combine.cu merges.
// - BULK (sm_90, D a multiple of 64): a producer warp beside the NWARPS consumer warps streams
//   K/V with the copy engine: tensor maps over the cache (src/cuda/decode.rs), boxes of 64
//   channels x the tile's keys (or a page's, paged) with the 128-byte swizzle, completing on a
//   full mbarrier per stage; the consumers read through the swizzle and release each stage on
//   an empty mbarrier instead of meeting at a block barrier every tile.
// Specialised by HEAD_DIM (multiple of 8, <= 256), IS_BF16, IS_CAUSAL, IS_PAGED, NWARPS (4 or
// 8), NSTAGES, Q_IN_REGS, BULK, the score modifiers of attn_common.cuh (IS_LOCAL,
// HAS_SOFTCAP, HAS_ALIBI), HAS_BATCH_IDX, HAS_LEFTPAD, ROTARY, ROTARY_INTERLEAVED and HAS_SINK
// (a learnable sink, its logits the last kernel parameter: folded into each row here with one
// split, by attn_combine with more); each feature off compiles none of its code.
#include "ptx.cuh"
#include "attn_common.cuh"
#include "kv_cache.cuh"
#include "rotary.cuh"
#include "softmax.cuh"
#ifndef BULK
#define BULK 0
#endif
#if BULK
#include "hopper.cuh"
#endif

#ifndef NSTAGES
#define NSTAGES 3
#endif
#ifndef Q_IN_REGS
#define Q_IN_REGS 1
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 8
#endif

#ifndef NWARPS
#define NWARPS 4
#endif
constexpr int NT = NWARPS * 32;                  // consumer threads
constexpr int NT_ALL = NT + (BULK ? 32 : 0);     // and the producer warp
constexpr int BC = 16 * NWARPS;        // keys per tile: 16 per warp
constexpr int ROWS = 16;               // packed (query, head) rows per block
constexpr int DP = (D + 15) / 16 * 16; // head_dim padded to the mma k-step; pad columns zero
constexpr int CH = DP / 8;             // 16-byte chunks per row
constexpr int RS = (CH + 1) * 8;       // shared row stride: an odd count of 16-byte slots
constexpr int KS = DP / 16;            // k-steps of S = Q K^T
constexpr int ND = DP / 8;             // n8 tiles of O
// Bytes of one stage of K (or V): padded rows for ldmatrix; with BULK, D / 64 column blocks of
// BC rows x 128 bytes each, swizzled by the copy engine.
constexpr u32 STAGE = BULK ? BC * D * 2 : BC * RS * 2;
#if BULK
static_assert(D % 64 == 0, "BULK needs a head_dim that is a multiple of 64");
#endif
static_assert(NSTAGES >= 2, "NSTAGES must be at least 2");
// Shared memory: Q rows, then the K/V stages (or, after the loop, the warps' f32 partial
// results), then the staged page numbers (src/cuda/decode.rs DecodeTile::smem_bytes).
constexpr int SMEM_MERGE = NWARPS * ROWS * (DP + 2) * 4;
constexpr int SMEM_PAGES = ROWS * RS * 2 + (2 * NSTAGES * (int)STAGE > SMEM_MERGE ? 2 * NSTAGES * (int)STAGE : SMEM_MERGE);

struct DecodeParams {
    float *o_accum;   // [num_splits, batch, heads_q, seqlen_q, D] (num_splits > 1)
    float *lse_accum; // [num_splits, batch, heads_q, seqlen_q]
    int num_splits;
    CacheMap map;
    RotaryMap rot; // ROTARY
};

// A tile is BC / 16 groups of 16 keys. A group never crosses a page (page sizes are multiples
// of 16, groups start at multiples of 16), so its keys are consecutive rows of the cache: one
// offset per group locates all of them. Paged, the offsets of the next tile to load are staged
// in shared memory one tile ahead, so that the block-table reads never wait in front of a
// tile's copies.
constexpr int GROUPS = BC / 16;

// Copies keys [n0, n0 + BC) of sequence b (K and V: the caches share one layout) into a
// stage; group_off(m) is the element offset (head 0) of key n0 + 16 m. Keys at or past
// seqlen_k and the pad columns are zero-filled without a read.
template <class GroupOff>
FA_DEVICE void load_kv(u32 dK, u32 dV, const u16 *kb, const u16 *vb, i64 ss, int n0, int seqlen_k,
                       GroupOff &&group_off) {
    constexpr int TOTAL = BC * CH;
    const bool full = n0 + BC <= seqlen_k;
#pragma unroll
    for (int it = 0; it < (TOTAL + NT - 1) / NT; ++it) {
        const int n = it * NT + (int)threadIdx.x;
        if (TOTAL % NT == 0 || n < TOTAL) {
            const int r = n / CH, c = n % CH;
            const bool ok = (full || n0 + r < seqlen_k) && c * 8 < D;
            const i64 off = ok ? group_off(r >> 4) + (r & 15) * ss + c * 8 : 0;
            const u32 at = (u32)(r * RS + c * 8) * 2;
            cp_async_16(dK + at, kb + off, ok ? 16 : 0);
            cp_async_16(dV + at, vb + off, ok ? 16 : 0);
        }
    }
}

#if ROTARY
// Q's rows of this block (shared memory row r = packed row r0 + r, RS elements apart) rotated
// at their positions: query i at len + i (rot.per_row) or len, at most the tables' last row
// (a clamp for positions the host would refuse). One pair per thread.
FA_DEVICE void rotate_q(u16 *sq, const RotaryMap &rot, int r0, int nrows, int group, int len, int tid) {
    const int half = rot.dim / 2;
    for (int n = tid; n < ROWS * half; n += NT) {
        const int r = n / half, k = n % half, gr = r0 + r;
        if (gr >= nrows) continue;
        const int pos = min(len + (rot.per_row ? gr / group : 0), rot.seqlen_ro - 1);
        u16 *x0 = sq + r * RS + rotary_first(k, rot.dim), *x1 = sq + r * RS + rotary_second(k, rot.dim);
        const float a = to_f32(*x0), e = to_f32(*x1);
        const float c = to_f32(rot.cos[(i64)pos * half + k]), s = to_f32(rot.sin[(i64)pos * half + k]);
        *x0 = from_f32(rotary_apply(a, e, c, s, true));
        *x1 = from_f32(rotary_apply(e, a, c, s, false));
    }
}
#endif

// Shared address of 16-byte chunk c of row `row` in a K or V stage at `base`.
#if BULK
// The copy engine's 128-byte swizzle: chunk c % 8 of a 128-byte row sits at (c % 8) ^ (row % 8)
// (row counted in 128-byte lines from a 1024-byte aligned base), column block c / 8 after the
// previous block's BC rows.
FA_DEVICE u32 kv_at(u32 base, int row, int c) {
    return base + (u32)(c >> 3) * (BC * 128) + (u32)row * 128 + (u32)(((c & 7) ^ (row & 7)) << 4);
}
#else
FA_DEVICE u32 kv_at(u32 base, int row, int c) { return base + (u32)(row * RS + c * 8) * 2; }
#endif

#if BULK
extern "C" __global__ void __launch_bounds__(NT_ALL)
    attn_decode(const Params p_in, const DecodeParams dp, const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv SINK_PARAM) {
#else
extern "C" __global__ void __launch_bounds__(NT_ALL) attn_decode(const Params p_in, const DecodeParams dp SINK_PARAM) {
#endif
    extern __shared__ __align__(16) u16 smem[];
    const u32 sQ = smem_u32(smem);
    // the stages (1024-byte aligned for the swizzle with BULK; the host adds the slack)
    const u32 sK = BULK ? (sQ + ROWS * RS * 2 + 1023) & ~1023u : sQ + ROWS * RS * 2;
    const u32 sV = sK + NSTAGES * STAGE;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    const int m_block = blockIdx.x % p_in.num_m_blocks, hk = blockIdx.x / p_in.num_m_blocks;
    const int split = blockIdx.y, b = blockIdx.z;
    Params p = p_in;
    const SeqMap sm = seq_map(dp.map, b); // the sequence's clamped index values
    p.seqlen_k = seq_keys(dp.map, sm);
    const int nrows = p.seqlen_q * p.group; // packed rows of this kv head
    const int r0 = m_block * ROWS;
    const int i_first = r0 / p.group, i_last = (min(r0 + ROWS, nrows) - 1) / p.group;

    // The split's tiles, cut to the tiles the block's rows see (causal, window).
    const int tiles = (p.seqlen_k + BC - 1) / BC;
    const int per = (tiles + dp.num_splits - 1) / dp.num_splits;
    const int t_split0 = min(split * per, tiles), t_split1 = min(t_split0 + per, tiles);
    const int hi_first = max(key_hi(p, i_first), 0), hi_last = max(key_hi(p, i_last), 0);
    const int lo_first = max(key_lo(p, i_first), 0), lo_last = max(key_lo(p, i_last), 0);
    const int t_begin = max(t_split0, lo_first / BC);
    const int t_end = max(min(t_split1, (hi_last + BC - 1) / BC), t_begin);

    const u16 *kb = p.k + hk * p.k_sh;
    const u16 *vb = p.v + hk * p.v_sh;

    // ---- prologue: Q rows, and the first NSTAGES - 1 tiles ----
    for (int n = tid; n < ROWS * CH && tid < NT; n += NT) {
        const int r = n / CH, c = n % CH, gr = r0 + r;
        const bool ok = gr < nrows && c * 8 < D;
        const int i = gr / p.group, h = hk * p.group + gr % p.group;
        const u16 *g = ok ? p.q + b * p.q_sb + i * p.q_ss + h * p.q_sh + c * 8 : p.q;
        cp_async_16(sQ + (u32)(r * RS + c * 8) * 2, g, ok ? 16 : 0);
    }
#if ROTARY && !BULK
    cp_async_commit(); // Q alone, rotated once it lands
#endif
    // Element offset of key j's group (j < seqlen_k), straight from the map (cache_row).
    auto direct = [&](int n0) {
        return [&, n0](int m) { return cache_row(dp.map, sm, p.k_sb, p.k_ss, b, n0 + 16 * m); };
    };
#if BULK
    // full[s] (one arrival, the producer's, plus the stage's bytes), empty[s] (one arrival per
    // consumer warp), after the stages' region (where paged offsets are staged without BULK).
    const u32 bars = sK + (u32)(2 * NSTAGES * (int)STAGE > SMEM_MERGE ? 2 * NSTAGES * (int)STAGE : SMEM_MERGE);
    auto full_bar = [&](int s) { return bars + 8u * (u32)s; };
    auto empty_bar = [&](int s) { return bars + 8u * (u32)(NSTAGES + s); };
    cp_async_commit();
    cp_async_wait<0>(); // this thread's Q chunks; the block barrier below publishes them
    if (tid == 0) {
        for (int s = 0; s < NSTAGES; ++s) {
            mbar_init(full_bar(s), 1);
            mbar_init(empty_bar(s), NWARPS);
        }
        fence_mbar_init();
    }
    if (tid == NT) {
        tma_prefetch(tk);
        tma_prefetch(tv);
    }
    __syncthreads();
    if (warp == NWARPS) {
        // ---- the producer warp: tile j into stage (j - t_begin) % NSTAGES once the consumers
        // released that stage's previous tile. Lane c copies chunk c of the tile: the whole
        // tile (contiguous: box_rows = BC), or the keys of one page (paged, pages shorter than
        // the tile), each as D / 64 boxes of K and of V. Chunks past the sequence's end are not
        // read; rows there hold stale data, which the consumers zero in V (K's scores there
        // are masked).
        const int box_rows = IS_PAGED ? min(dp.map.page_size, BC) : BC;
        const int chunks = BC / box_rows;
        for (int j = t_begin; j < t_end; ++j) {
            const int it = j - t_begin, st = it % NSTAGES;
            const int key = j * BC + lane * box_rows;
            const bool mine = lane < chunks && key < p.seqlen_k;
            int row = sm.start + key, blk = sm.row_b; // contiguous: (row, cache sequence)
#if IS_PAGED
            if (mine) {
                blk = cache_page(dp.map, b, key);
                row = key % dp.map.page_size;
            }
#endif
            const u32 issued = __popc(__ballot_sync(0xffffffffu, mine));
            if (it >= NSTAGES) mbar_wait(empty_bar(st), (u32)(it / NSTAGES - 1) & 1);
            if (lane == 0) mbar_arrive_expect_tx(full_bar(st), issued * (u32)(box_rows * 128 * (D / 64) * 2));
            if (mine) {
                const u32 at = (u32)st * STAGE + (u32)(lane * box_rows) * 128;
#pragma unroll
                for (int h = 0; h < D / 64; ++h) {
                    tma_load_4d(sK + at + (u32)h * (BC * 128), tk, full_bar(st), h * 64, row, hk, blk);
                    tma_load_4d(sV + at + (u32)h * (BC * 128), tv, full_bar(st), h * 64, row, hk, blk);
                }
            }
        }
        return;
    }
#if ROTARY
    rotate_q(smem, dp.rot, r0, nrows, p.group, sm.len, tid);
    named_sync(1, NT); // the consumers' rotated rows, before any warp reads Q's fragments
#endif
#else
#pragma unroll
    for (int s = 0; s < NSTAGES - 1; ++s) {
        const int j = t_begin + s;
        if (j < t_end)
            load_kv(sK + s * STAGE, sV + s * STAGE, kb, vb, p.k_ss, j * BC, p.seqlen_k, direct(j * BC));
        cp_async_commit();
    }
#if ROTARY
    cp_async_wait<NSTAGES - 1>(); // Q's group (the stages' may still be in flight)
    __syncthreads();
    rotate_q(smem, dp.rot, r0, nrows, p.group, sm.len, tid);
    // the loop's first barrier publishes the rotated rows before Q's fragments are read
#endif
#endif
#if IS_PAGED && !BULK
    // Group offsets of the first tile the loop loads, staged; the loop reads the block table
    // two tiles ahead (a whole iteration for the read to land) and stores each value one
    // iteration later, into a ring of three tiles. Groups past the sequence's end are never
    // read (0). (With one block per SM, a read one tile ahead stalled every iteration: run 48.)
    i64 *sGroups = (i64 *)((char *)smem + SMEM_PAGES); // [3][GROUPS]
    auto group_of = [&](int n0, int m) -> i64 {
        const int key = n0 + 16 * m;
        return key < p.seqlen_k ? cache_row(dp.map, sm, p.k_sb, p.k_ss, b, key) : 0;
    };
    if (tid < GROUPS) sGroups[((t_begin + NSTAGES - 1) % 3) * GROUPS + tid] = group_of((t_begin + NSTAGES - 1) * BC, tid);
    // the tile after it, in flight through the first iteration
    i64 pending_group = tid < GROUPS && t_begin + NSTAGES < t_end ? group_of((t_begin + NSTAGES) * BC, tid) : 0;
#endif

    float acc_o[ND][4];
#pragma unroll
    for (int nd = 0; nd < ND; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[nd][e] = 0.f;
    float row_max[2] = {neg_inf(), neg_inf()}, row_sum[2] = {0.f, 0.f};
#if Q_IN_REGS
    u32 qf[KS][4];
#endif

    for (int j = t_begin; j < t_end; ++j) {
#if BULK
        mbar_wait(full_bar((j - t_begin) % NSTAGES), (u32)((j - t_begin) / NSTAGES) & 1);
        if (j * BC + warp * 16 + 16 > p.seqlen_k) {
            // this warp's V rows past the sequence's end: zero (P is 0 there; V must be finite)
            const u32 vbase = sV + (u32)((j - t_begin) % NSTAGES) * STAGE;
            for (int n = lane; n < 16 * (D / 8); n += 32) {
                const int r = warp * 16 + n / (D / 8);
                if (j * BC + r >= p.seqlen_k)
                    *(uint4 *)((char *)smem + (kv_at(vbase, r, n % (D / 8)) - sQ)) = make_uint4(0, 0, 0, 0);
            }
            __syncwarp();
        }
#else
        cp_async_wait<NSTAGES - 2>();
        __syncthreads(); // tile j landed; every warp is done with tile j-1's stage
        const int jn = j + NSTAGES - 1;
#endif
#if IS_PAGED && !BULK
        const i64 *staged = sGroups + (jn % 3) * GROUPS;
        // the group offsets two tiles ahead: read now, stored after the next tile's math
        const i64 fresh_group = tid < GROUPS && jn + 2 < t_end ? group_of((jn + 2) * BC, tid) : 0;
        auto offsets = [&](int m) { return staged[m]; };
#elif !BULK
        auto offsets = direct(jn * BC);
#endif
#if !BULK
        {
            const u32 st = (u32)((jn - t_begin) % NSTAGES) * STAGE;
            if (jn < t_end) load_kv(sK + st, sV + st, kb, vb, p.k_ss, jn * BC, p.seqlen_k, offsets);
            cp_async_commit();
        }
#endif
        const u32 st = (u32)((j - t_begin) % NSTAGES) * STAGE;
        const u32 cK = sK + st, cV = sV + st; // the stage; this warp's keys are rows warp * 16 + r
#if Q_IN_REGS
        if (j == t_begin)
#pragma unroll
            for (int kk = 0; kk < KS; ++kk)
                ldmatrix_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                            sQ + (u32)((lane % 16) * RS + (kk * 2 + lane / 16) * 8) * 2);
#endif
        // S = Q K^T over the warp's 16 keys (two n8 tiles).
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            u32 a0, a1, a2, a3;
#if Q_IN_REGS
            a0 = qf[kk][0], a1 = qf[kk][1], a2 = qf[kk][2], a3 = qf[kk][3];
#else
            ldmatrix_x4(a0, a1, a2, a3, sQ + (u32)((lane % 16) * RS + (kk * 2 + lane / 16) * 8) * 2);
#endif
            u32 b0, b1, b2, b3;
            const int r = (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
            ldmatrix_x4(b0, b1, b2, b3, kv_at(cK, warp * 16 + r, c));
            mma(s[0], a0, a1, a2, a3, b0, b1);
            mma(s[1], a0, a1, a2, a3, b2, b3);
        }

        // Modifiers and mask (attn_common.cuh score_row), per row: the rows of a block are
        // (query, head) pairs, so each has its own key range and ALiBi slope.
        const int n0 = j * BC + warp * 16;
        const int col0 = n0 + 2 * (lane % 4);
        const bool mask_tile = j * BC + BC > min(hi_first, p.seqlen_k) || (IS_LOCAL && j * BC < lo_last);
        if (mask_tile || HAS_SOFTCAP || HAS_ALIBI) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // this lane's row g + 8r of the block: its query, head, key range, slope
                const int gr = r0 + lane / 4 + 8 * r, qi = gr / p.group;
                const float coef = alibi_coef(p, b, hk * p.group + gr % p.group);
                const int hi = min(key_hi(p, qi), p.seqlen_k) - col0, lo = key_lo(p, qi) - col0;
                const int center = qi + (p.seqlen_k - p.seqlen_q) - col0;
                auto at = [&](int nt, int e) -> float & { return s[nt][2 * r + e]; };
                if (mask_tile)
                    score_row<2, true>(p, at, lo, hi, center, coef);
                else
                    score_row<2, false>(p, at, lo, hi, center, coef);
            }
        }
        // Online softmax of the warp's keys; P packed to the A fragment of O += P V. As in
        // attn_mma, a row's running max only moves when the tile's max passes it by more than
        // RESCALE_SLACK (log2 units; p <= 2^8 then, exact in f16/bf16 and f32 sums), so that
        // most tiles of a long cache skip rescaling O (a warp-uniform vote).
        u32 pf[2][2];
        float alpha[2];
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
            mx = quad_max(mx);
            const float m_use = row_max_step<RESCALE_SLACK>(row_max[r], mx, p.scale_log2, alpha[r], moved);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const float p0 = exp_scaled(s[nt][2 * r], p.scale_log2, m_use);
                const float p1 = exp_scaled(s[nt][2 * r + 1], p.scale_log2, m_use);
                sum += p0 + p1;
                pf[nt][r] = pack2(p0, p1);
            }
            row_sum[r] = row_sum[r] * alpha[r] + sum;
        }
        if (vote_any(moved)) {
#pragma unroll
            for (int nd = 0; nd < ND; ++nd)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_o[nd][e] *= alpha[e >> 1];
        }
        // O += P V: one k-step of 16 keys; V read transposed (two keys of a column per register).
#pragma unroll
        for (int d2 = 0; d2 < ND / 2; ++d2) {
            const int r = (lane % 8) + ((lane / 8) % 2) * 8, c = d2 * 2 + lane / 16;
            u32 b0, b1, b2, b3;
            ldmatrix_x4_trans(b0, b1, b2, b3, kv_at(cV, warp * 16 + r, c));
            mma(acc_o[2 * d2], pf[0][0], pf[0][1], pf[1][0], pf[1][1], b0, b1);
            mma(acc_o[2 * d2 + 1], pf[0][0], pf[0][1], pf[1][0], pf[1][1], b2, b3);
        }
#if BULK
        __syncwarp(); // every lane's reads of the stage before the warp's release
        if (lane == 0) mbar_arrive(empty_bar((j - t_begin) % NSTAGES));
#elif IS_PAGED
        if (tid < GROUPS) sGroups[((jn + 1) % 3) * GROUPS + tid] = pending_group;
        pending_group = fresh_group;
#endif
    }
#if BULK
    named_sync(1, NT); // the consumers only (the producer warp has returned); every copy landed
#else
    cp_async_wait<0>();
    __syncthreads(); // the stages are free: they hold the warps' partial results now
#endif

    // ---- merge the four warps' (max, sum, o) per row, through shared memory ----
    // sO[w][row][DP] f32 (unnormalised o), sM[w][row] (max, log2 units), sL[w][row] (sum).
    float *sO = (float *)((char *)smem + (sK - sQ));
    float *sM = sO + NWARPS * ROWS * DP;
    float *sL = sM + NWARPS * ROWS;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(row_sum[r]);
        const int row = lane / 4 + 8 * r;
        if (lane % 4 == 0) {
            sM[warp * ROWS + row] = row_max[r];
            sL[warp * ROWS + row] = l;
        }
#pragma unroll
        for (int nd = 0; nd < ND; ++nd) {
            float *o = sO + (warp * ROWS + row) * DP + nd * 8 + 2 * (lane % 4);
            o[0] = acc_o[nd][2 * r];
            o[1] = acc_o[nd][2 * r + 1];
        }
    }
#if BULK
    named_sync(1, NT);
#else
    __syncthreads();
#endif
    const bool partial = dp.num_splits > 1;
    const i64 rows_all = (i64)p.batch * p.heads_q * p.seqlen_q;
    for (int n = tid; n < ROWS * (D / 4); n += NT) {
        const int row = n / (D / 4), c = (n % (D / 4)) * 4;
        const int gr = r0 + row;
        if (gr >= nrows) continue;
        float m = neg_inf();
        bool nan = false; // some warp's sum is NaN: the row read a NaN or an Inf
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            m = fmaxf(m, sM[w * ROWS + row]);
            nan |= sL[w * ROWS + row] != sL[w * ROWS + row];
        }
        float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
        if (m != neg_inf()) {
#pragma unroll
            for (int w = 0; w < NWARPS; ++w) {
                const float e = ex2(sM[w * ROWS + row] - m);
                l += e * sL[w * ROWS + row];
#pragma unroll
                for (int x = 0; x < 4; ++x) o[x] += e * sO[(w * ROWS + row) * DP + c + x];
            }
        }
        // A row that saw no key (in this split): o = 0 and lse = -inf, never NaN. A row that
        // read a NaN or Inf: o and lse NaN, as on every backend (src/check/inputs.rs), so that
        // the combine propagates it instead of weighing it 0 (fmaxf skips a NaN max, which
        // would otherwise leave such a row looking empty).
        const float qnan = __int_as_float(0x7fc00000);
#if HAS_SINK
        // With one split the sink joins the row here (softmax.cuh sink_fold: every row then
        // has l > 0); with more, attn_combine adds it once to the merged row.
        float alpha = 1.f;
        if (!partial) alpha = sink_fold(m, l, sink_log2(SINK_LOGITS, hk * p.group + gr % p.group));
        const float inv = nan ? qnan : alpha * row_inv(l);
#else
        const float inv = nan ? qnan : row_inv(l);
#endif
        const float lse = nan ? qnan : row_lse(m, l);
        const int i = gr / p.group, h = hk * p.group + gr % p.group;
        const i64 lrow = ((i64)b * p.heads_q + h) * p.seqlen_q + i; // [batch, heads_q, seqlen_q]
        if (partial) {
            float *oa = dp.o_accum + ((i64)split * rows_all + lrow) * D + c;
            *(float4 *)oa = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
            if (c == 0) dp.lse_accum[(i64)split * rows_all + lrow] = lse;
        } else {
            u16 *orow = p.o + b * p.o_sb + i * p.o_ss + h * p.o_sh + c;
            *(u32 *)orow = pack2(o[0] * inv, o[1] * inv);
            *(u32 *)(orow + 2) = pack2(o[2] * inv, o[3] * inv);
            if (c == 0) p.lse[lrow] = lse;
        }
    }
}
