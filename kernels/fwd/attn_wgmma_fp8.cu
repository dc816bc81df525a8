// attn_wgmma_fp8.cu: FP8 (e4m3) FlashAttention forward for Hopper (sm_90a), FlashAttention-3
// style: q, k, v in e4m3 with dequantisation factors (q_descale, k_descale, v_descale per
// tensor or per (batch, kv head)), f32 accumulation, o in bf16, lse in f32.
//
// The structure is attn_wgmma.cu's (read that file first): a producer warpgroup issues every TMA
// load into a ring of K/V stages, two consumer warpgroups of 64 query rows each run
// S = Q K^T, the online softmax, O += P V, with pingpong between the consumers and S_n issued
// before P_{n-1} V_{n-1} (intra-warpgroup overlap); persistent blocks over a dynamic tile
// scheduler; O staged in shared memory and stored with TMA. What differs:
// - operands: wgmma m64nNk32 .e4m3 (wgmma_fp8_ops.cuh). For 8-bit types both A and B must be
//   K-major, so P V reads V^T: a pre-pass (fp8_v_transpose below, fp8.cuh vt_block) writes V^T
//   [batch][heads_kv][head_dim][sk_pad] with the keys of each 16 permuted so that P's
//   e4m3 fragment can be packed from each thread's own S accumulators (fp8.cuh explains the
//   permutation; kernels/probe/wgmma_probe.cu proves it). Q and K rows are 128-byte TMA boxes
//   (128 e4m3 channels: one box per row at d128; at d64 the box's upper half is zero-filled
//   and never read). V^T stages are head_dim rows of Bc = 128 keys (128 bytes);
// - P: the f32 accumulators p = 2^(s * scale_log2 - m) (at most 2^RESCALE_SLACK = 256, inside
//   e4m3's 448) converted to e4m3 with cvt.rn.satfinite.e4m3x2.f32 (fp8.cuh p_frag);
// - row sums: always on the Tensor Cores (ROWSUM_V of attn_wgmma): 8 rows of e4m3 ones after
//   V^T in every stage make P V (N = head_dim + 8) sum the same quantised P that multiplies V,
//   so o stays a convex combination of V's rows (src/fp8/reference.rs derives the tolerance
//   from this);
// - descales: q_descale * k_descale folds into the tile's scale_log2, v_descale / l into the
//   output's final factor;
// - no score modifiers, no varlen, no timeline: the launcher refuses them.
//
// Specialised at NVRTC time by HEAD_DIM (64 or 128), BC (128), STAGES, PINGPONG, IS_CAUSAL,
// HEAD_MAJOR, DYNAMIC, CAUSAL_L2_MB, CONSUMER_REGS / PRODUCER_REGS.
#include "ptx.cuh"
#include "attn_common.cuh"
#include "tile_scheduler.cuh"
#include "softmax.cuh"
#include "hopper.cuh"
#include "fp8.cuh"
#include "wgmma_fp8_ops.cuh"
static_assert(!IS_VARLEN && !IS_LOCAL && !HAS_SOFTCAP && !HAS_ALIBI, "the FP8 kernel takes no varlen or score modifiers");

#ifndef BC
#define BC 128
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef PINGPONG
#define PINGPONG 1
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 8
#endif
#ifndef CONSUMER_REGS
#define CONSUMER_REGS 232
#endif
#ifndef PRODUCER_REGS
#define PRODUCER_REGS 40
#endif
#ifndef DYNAMIC
#define DYNAMIC 0
#endif

// ---- geometry -------------------------------------------------------------------------------
constexpr int DP = D;                    // head_dim: 64 or 128
constexpr int NCONS = 2;                 // consumer warpgroups
constexpr int BR = 64 * NCONS;           // query rows per block
constexpr int NT = 128 * (NCONS + 1);    // threads
constexpr u32 Q_BYTES = BR * 128;        // Q: BR rows of 128 bytes (one TMA box)
constexpr u32 K_BYTES = BC * 128;        // a K stage: BC rows of 128 bytes
constexpr u32 VT_LOAD = DP * 128;        // a V^T stage as TMA writes it: DP rows of BC = 128 keys
constexpr u32 VT_BYTES = VT_LOAD + 1024; // ... then 8 rows of ones (the row sums)
constexpr int NSUB_O = DP / 64;          // bf16 O: boxes of 64 channels (128-byte rows)
constexpr u32 SUB_O = BR * 128;          // one O box of all BR rows
constexpr u32 O_BYTES = NSUB_O * SUB_O;
constexpr int KSTEPS = DP / 32;          // k32 steps of S = Q K^T
constexpr int PSTEPS = BC / 32;          // k32 steps of O += P V
constexpr int NS = BC / 2;               // S accumulators per thread
constexpr int NO = DP / 2;               // O accumulators per thread
constexpr int NPV = DP + 8;              // N of P V: 8 columns of row sums
static_assert(DP == 64 || DP == 128, "HEAD_DIM is 64 or 128");
static_assert(BC == 128, "Bc is 128 (one 128-byte V^T row per key tile)");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES in 2..4");
static_assert((NCONS * CONSUMER_REGS + PRODUCER_REGS) * 128 <= (65536 / NT / 8 * 8) * NT,
              "setmaxnreg targets exceed the block's register pool");

constexpr u32 BAR_SCHED = 1;
constexpr u32 BAR_EPI = BAR_SCHED + NCONS;
constexpr u32 BAR_TILE = BAR_EPI + NCONS;
constexpr u32 TILE_HANDOFF_THREADS = 32 + 128;
constexpr u32 CORE_BYTES = Q_BYTES + STAGES * (K_BYTES + VT_BYTES);
constexpr u32 Q_EMPTY_COUNT = NCONS * 4; // every consumer warp after its last S = Q K^T

// Shared memory: Q | K stages | V^T stages | O | mbarriers, 1024-byte aligned
// (src/cuda/fwd/wgmma_fp8.rs sizes it the same way).
struct Smem {
    u32 q, k, v, o, bars;
    FA_DEVICE u32 k_stage(int s) const { return k + (u32)s * K_BYTES; }
    FA_DEVICE u32 v_stage(int s) const { return v + (u32)s * VT_BYTES; }
    FA_DEVICE u32 q_full() const { return bars; }
    FA_DEVICE u32 q_empty() const { return bars + 8; }
    FA_DEVICE u32 k_full(int s) const { return bars + 8 * (2 + s); }
    FA_DEVICE u32 v_full(int s) const { return bars + 8 * (2 + STAGES + s); }
    FA_DEVICE u32 k_empty(int s) const { return bars + 8 * (2 + 2 * STAGES + s); }
    FA_DEVICE u32 v_empty(int s) const { return bars + 8 * (2 + 3 * STAGES + s); }
    FA_DEVICE u32 tile_slot(u32 round) const { return bars + 8 * (2 + 4 * STAGES) + 4 * (round & 1); }
};

struct Fp8Params {
    TmaMap tq;  // q: bytes (head_dim, seqlen_q, heads_q, batch), box (128, BR, 1, 1)
    TmaMap tk;  // k: bytes (head_dim, seqlen_k, heads_kv, batch), box (128, BC, 1, 1)
    TmaMap tv;  // V^T: bytes (sk_pad, head_dim, heads_kv, batch), box (BC, DP, 1, 1)
    TmaMap to;  // o: bf16 (head_dim, seqlen_q, heads_q, batch), box (64, 64, 1, 1)
    Params p;   // scale_log2 = softmax_scale * log2(e), without the descales
    u32 *tile_counter;
    // Descales: (q, k, v) at descale[0..3][b * heads_kv + hk] when per (batch, kv head)
    // (descale_per_head), else the three scalars.
    const float *descale;
    float q_descale, k_descale, v_descale;
    int descale_per_head, heads_kv;
};

FA_DEVICE u64 q_desc(u32 sq_rows, int kk) { return desc_kmajor_sw128(sq_rows, kk, Q_BYTES); }
FA_DEVICE u64 k_desc(u32 sk, int kk) { return desc_kmajor_sw128(sk, kk, K_BYTES); }
FA_DEVICE u64 vt_desc(u32 sv, int kk) { return desc_kmajor_sw128(sv, kk, VT_BYTES); }

FA_DEVICE KeyTiles key_tiles(const Params &p, int row0) {
    const int first = max(row0, 0);
    return key_tiles_of(p, first, row0 + BR - first, BC);
}
FA_DEVICE int block_row0(const Params &p, int m_block) {
    const int shift = IS_CAUSAL ? (p.num_m_blocks * BR - p.seqlen_q) / 64 * 64 : 0;
    return m_block * BR - shift;
}
// The three descales of (b, hk).
FA_DEVICE void descales_of(const Fp8Params &w, int b, int hk, float &qd, float &kd, float &vd) {
    if (w.descale_per_head) {
        const int at = b * w.heads_kv + hk, n = w.p.batch * w.heads_kv;
        qd = w.descale[at];
        kd = w.descale[n + at];
        vd = w.descale[2 * n + at];
    } else {
        qd = w.q_descale;
        kd = w.k_descale;
        vd = w.v_descale;
    }
}

// ================================ producer =================================================
FA_DEVICE void producer(const Fp8Params &w, const Smem &sm, int tiles) {
    const Params &p = w.p;
    tma_prefetch(w.tq);
    tma_prefetch(w.tk);
    tma_prefetch(w.tv);
    int stage = 0;
    u32 use_parity = 0;
    bool wrapped = false;
    int tile = blockIdx.x;
    for (u32 round = 0;; ++round) {
        if (round > 0) mbar_wait(sm.q_empty(), (round - 1) & 1);
        st_shared_u32(sm.tile_slot(round), tile < tiles ? (u32)tile : 0xFFFFFFFFu);
#pragma unroll
        for (int c = 0; c < NCONS; ++c) named_arrive_unaligned(BAR_TILE + c, TILE_HANDOFF_THREADS);
        if (tile >= tiles) break;
        const BlockCoords bc = block_coords(p, (unsigned)tile);
        const int row0 = block_row0(p, bc.m_block);
        mbar_arrive_expect_tx(sm.q_full(), Q_BYTES);
        tma_load_4d(sm.q, w.tq, sm.q_full(), 0, row0, bc.h, bc.b);
        const KeyTiles kt = key_tiles(p, row0);
        for (int n = kt.begin; n < kt.end; ++n) {
            if (wrapped) mbar_wait(sm.k_empty(stage), use_parity ^ 1);
            mbar_arrive_expect_tx(sm.k_full(stage), K_BYTES);
            tma_load_4d(sm.k_stage(stage), w.tk, sm.k_full(stage), 0, n * BC, bc.hk, bc.b);
            if (wrapped) mbar_wait(sm.v_empty(stage), use_parity ^ 1);
            mbar_arrive_expect_tx(sm.v_full(stage), VT_LOAD);
            tma_load_4d(sm.v_stage(stage), w.tv, sm.v_full(stage), n * BC, 0, bc.hk, bc.b);
            if (++stage == STAGES) {
                stage = 0;
                use_parity ^= 1;
                wrapped = true;
            }
        }
        tile = next_tile<DYNAMIC>(w.tile_counter, tile);
    }
    tile_counter_reset<DYNAMIC>(w.tile_counter);
}

// ================================ consumers ================================================
FA_DEVICE void consumer(const Fp8Params &w, const Smem &sm, int tid, int wg) {
    const Params &p = w.p;
    const int cons = shfl_lane0(wg) - 1;
    const int ctid = tid - 128 * wg;
    const int warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const u32 sq_rows = sm.q + (u32)cons * 64 * 128;
    const u32 so_rows = sm.o + (u32)cons * 64 * 128;
    const int diag = p.seqlen_k - p.seqlen_q;
    auto release = [&](u32 bar) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };
#if PINGPONG
    if (cons == 0) named_arrive(BAR_SCHED + 0, 256);
#endif
    int it = 0;
    for (u32 round = 0;; ++round) {
        named_sync(BAR_TILE + cons, TILE_HANDOFF_THREADS);
        const int tile = (int)ld_shared_u32(sm.tile_slot(round));
        if (tile < 0) {
#if PINGPONG
            if (cons == 0) named_sync(BAR_SCHED + 0, 256);
#endif
            break;
        }
        mbar_wait(sm.q_full(), round & 1);
        const BlockCoords tc = block_coords(p, (unsigned)tile);
        const int row0 = block_row0(p, tc.m_block);
        const KeyTiles kt = key_tiles(p, row0);
        const int nb = kt.begin, n_blocks = kt.end - kt.begin;
        const int wrow = row0 + cons * 64 + warp * 16 + g;
        float qd, kd, vd;
        descales_of(w, tc.b, tc.hk, qd, kd, vd);
        const float scale_log2 = p.scale_log2 * (qd * kd);

        auto turn_wait = [&]() {
#if PINGPONG
            named_sync(BAR_SCHED + cons, 256);
#endif
        };
        auto turn_pass = [&]() {
#if PINGPONG
            named_arrive(BAR_SCHED + (cons + 1) % NCONS, 256);
#endif
        };

        float o[NPV / 2];
#pragma unroll
        for (int i = 0; i < NPV / 2; ++i) o[i] = 0.f;
        float s[NS];
        u32 pf[NS / 4];
        float row_max[2] = {neg_inf(), neg_inf()}, alpha[2] = {1.f, 1.f};
        bool moved = false;

        auto gemm_s = [&](int stage) {
            const u32 sk = sm.k_stage(stage);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) wgmma_fp8_ss<BC>(s, q_desc(sq_rows, kk), k_desc(sk, kk), kk > 0);
            wgmma_commit();
        };
        auto gemm_pv = [&](int stage) {
            const u32 sv = sm.v_stage(stage);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < PSTEPS; ++kk)
                wgmma_fp8_rs<NPV>(o, pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3], vt_desc(sv, kk), 1);
            wgmma_commit();
        };
        auto rescale_o = [&]() {
            if (vote_any(moved)) {
#pragma unroll
                for (int i = 0; i < NPV / 2; ++i) o[i] *= alpha[(i / 2) % 2];
            }
        };
        // Mask and online softmax of key tile n (as attn_wgmma's, without score modifiers and
        // with the row sums left to P V): p = 2^(s * scale_log2 - m) in s[].
        auto softmax = [&](int n) {
            const int n0 = n * BC;
            const bool mask_tile = n < kt.inner_begin || n >= kt.inner_end;
            if (mask_tile) {
                const int lim_block = key_hi(p, row0);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int off = wrow + 8 * h - row0;
                    const int col0 = n0 + 2 * t;
                    const int hi = (IS_CAUSAL ? min(lim_block + off, p.seqlen_k) : p.seqlen_k) - col0;
                    const int center = wrow + 8 * h + diag - col0;
                    auto at = [&](int nt, int e) -> float & { return s[4 * nt + 2 * h + e]; };
                    score_row<BC / 8, true>(p, at, -(1 << 30), hi, center, 0.f);
                }
            }
            float mx[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v[BC / 8];
#pragma unroll
                for (int nt = 0; nt < BC / 8; ++nt) v[nt] = fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]);
#pragma unroll
                for (int step = 1; step < BC / 8; step *= 2)
#pragma unroll
                    for (int i = 0; i + step < BC / 8; i += 2 * step) v[i] = fmaxf(v[i], v[i + step]);
                mx[h] = v[0];
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 1));
#pragma unroll
            for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 2));
            float m_use[2];
            moved = false;
#pragma unroll
            for (int h = 0; h < 2; ++h) m_use[h] = row_max_step<RESCALE_SLACK>(row_max[h], mx[h], scale_log2, alpha[h], moved);
            const bool fused = fabsf(m_use[0]) < 4194304.f && fabsf(m_use[1]) < 4194304.f;
            if (fused) {
#pragma unroll
                for (int i = 0; i < NS; ++i) s[i] = ex2(fmaf(s[i], scale_log2, -m_use[(i / 2) % 2]));
            } else {
#pragma unroll
                for (int i = 0; i < NS; ++i) s[i] = exp_scaled(s[i], scale_log2, m_use[(i / 2) % 2]);
            }
        };
        // P to e4m3 in the A fragments of P V (fp8.cuh p_frag; V^T's key order matches).
        auto pack_p = [&]() {
#pragma unroll
            for (int r = 0; r < NS / 4; ++r) pf[r] = p_frag(s, r / 4, r % 4);
        };
        auto stage_of = [&](int n) { return (it + n) % STAGES; };
        auto parity_of = [&](int n) { return (u32)((it + n) / STAGES) & 1; };

        const int crow0 = row0 + cons * 64;
        const bool has_rows = crow0 >= 0 && crow0 < p.seqlen_q;
        int lead = 0, n_mine = 0;
        if (has_rows) {
            const KeyTiles ck = key_tiles_of(p, crow0, min(64, p.seqlen_q - crow0), BC);
            lead = min(ck.begin - nb, n_blocks);
            n_mine = max(min(ck.end, kt.end) - nb - lead, 0);
        }
        auto pass_tiles = [&](int count) {
            for (int n = 0; n < count; ++n) {
                mbar_wait(sm.k_full(stage_of(n)), parity_of(n));
                turn_wait();
                turn_pass();
                release(sm.k_empty(stage_of(n)));
                mbar_wait(sm.v_full(stage_of(n)), parity_of(n));
                release(sm.v_empty(stage_of(n)));
            }
            it += count;
        };
        pass_tiles(lead);
        const int nc = nb + lead;

        if (n_mine > 0) {
            mbar_wait(sm.k_full(stage_of(0)), parity_of(0));
            turn_wait();
            gemm_s(stage_of(0));
            turn_pass();
            wgmma_wait<0>();
            fence_regs(s);
            release(sm.k_empty(stage_of(0)));
            if (n_mine == 1) release(sm.q_empty());
            softmax(nc);
            pack_p();
            for (int n = 1; n < n_mine; ++n) {
                mbar_wait(sm.k_full(stage_of(n)), parity_of(n));
                turn_wait();
                gemm_s(stage_of(n));
                rescale_o();
                mbar_wait(sm.v_full(stage_of(n - 1)), parity_of(n - 1));
                gemm_pv(stage_of(n - 1));
                turn_pass();
                wgmma_wait<1>();
                fence_regs(s);
                release(sm.k_empty(stage_of(n)));
                if (n == n_mine - 1) release(sm.q_empty());
                softmax(nc + n);
                wgmma_wait<0>();
                fence_regs(o);
                release(sm.v_empty(stage_of(n - 1)));
                pack_p();
            }
        }
        if (n_mine == 0) release(sm.q_empty());
        if (n_mine > 0) {
            rescale_o();
            mbar_wait(sm.v_full(stage_of(n_mine - 1)), parity_of(n_mine - 1));
            gemm_pv(stage_of(n_mine - 1));
            wgmma_wait<0>();
            fence_regs(o);
            release(sm.v_empty(stage_of(n_mine - 1)));
        }
        it += n_mine;
        pass_tiles(n_blocks - lead - n_mine);
        if (!has_rows) continue;

        // ---- epilogue: O * v_descale / l as bf16, staged (128-byte swizzle), TMA store.
        const BlockCoords bc = block_coords(p, (unsigned)tile);
        float inv[2], l[2] = {o[NO], o[NO + 2]}; // the sums of the quantised P, over every key
#pragma unroll
        for (int h = 0; h < 2; ++h) inv[h] = row_inv(l[h]) * vd;
        if (ctid == 0) bulk_wait_read0();
        named_sync(BAR_EPI + cons, 128);
        {
            const int etid = (int)fresh_tid_x() % 128, ew = etid / 32, eg = (etid % 32) / 4, et = etid % 4;
            const u32 base = so_rows + (u32)(ew * 16 + eg) * 128 + (u32)et * 4;
            const u32 swz = (u32)eg * 16;
#pragma unroll
            for (int i = 0; i < NO; i += 2) {
                const int h = (i / 2) % 2, j = i / 4;
                const u32 addr = base + (((u32)(j % 8) * 16) ^ swz) + (u32)(h * 8 * 128) + (u32)(j / 8) * SUB_O;
                st_shared_u32(addr, elem_pack2<1>(o[i] * inv[h], o[i + 1] * inv[h]));
            }
        }
        fence_proxy_async();
        named_sync(BAR_EPI + cons, 128);
        if (ctid == 0) {
#pragma unroll
            for (int j = 0; j < NSUB_O; ++j) tma_store_4d(w.to, so_rows + j * SUB_O, 64 * j, row0 + cons * 64, bc.h, bc.b);
            bulk_commit();
        }
        float *lse = p.lse + lse_offset(p, bc.b, bc.h, 0);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = wrow + 8 * h;
            if (t == 0 && row < p.seqlen_q) lse[row] = row_lse(row_max[h], l[h]);
        }
    }
    if (ctid == 0) bulk_wait_read0();
}

extern "C" __global__ void __launch_bounds__(NT, 1) attn_wgmma_fp8(const __grid_constant__ Fp8Params w) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    Smem sm;
    sm.q = (smem_u32(smem_raw) + 1023u) & ~1023u;
    sm.k = sm.q + Q_BYTES;
    sm.v = sm.k + STAGES * K_BYTES;
    sm.o = sm.v + STAGES * VT_BYTES;
    sm.bars = sm.o + O_BYTES;

    const Params &p = w.p;
    const int tid = threadIdx.x, wg = tid / 128;
    const int tiles = p.num_m_blocks * p.heads_q * p.batch;
    if (tid == 0) {
        mbar_init(sm.q_full(), 1);
        mbar_init(sm.q_empty(), Q_EMPTY_COUNT);
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(sm.k_full(s), 1);
            mbar_init(sm.v_full(s), 1);
            mbar_init(sm.k_empty(s), NCONS * 4);
            mbar_init(sm.v_empty(s), NCONS * 4);
        }
        fence_mbar_init();
    }
    if (tid >= 128) {
        // The 8 rows of ones after every V^T stage (TMA never writes them): e4m3 1.0 = 0x38.
        for (u32 i = 4 * (u32)(tid - 128); i < STAGES * 1024; i += 4 * (NT - 128))
            st_shared_u32(sm.v_stage(i / 1024) + VT_LOAD + i % 1024, 0x38383838u);
        fence_proxy_async();
    }
    __syncthreads();
    if (wg == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (tid == 0) producer(w, sm, tiles);
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
    consumer(w, sm, tid, wg);
}

// The V^T pre-pass (fp8.cuh vt_block): grid (sk_pad / 64, heads_kv, batch), 256 threads.
extern "C" __global__ void __launch_bounds__(VT_THREADS) fp8_v_transpose(const __grid_constant__ VtParams p) {
    __shared__ __align__(16) u8 tile[VT_KEYS * (DP + 4)];
    vt_block(p, tile, blockIdx.x, blockIdx.y, blockIdx.z);
}
