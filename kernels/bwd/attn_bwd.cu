// attn_bwd.cu: FlashAttention backward on Tensor Cores with mma.sync.m16n8k16
// (FlashAttention-2, Dao 2023, arXiv 2307.08691, Algorithm 2): P is recomputed from q, k and
// the forward's lse, never stored. Three kernels, launched in this order by
// src/cuda/backward.rs:
// - attn_bwd_dsum: D_i = do_i . o_i (f32, laid out as lse);
// - attn_bwd: one block per (key block of BC keys, kv head, batch). Its warps own KPW keys
//   (16 or 32) each and keep dK and dV of those keys in registers across every query block of
//   every query head of the group (GQA sums in the block: no atomics for dK, dV). Per step (BR query rows
//   of one head, their Q, dO, lse and D loaded by cp.async one step ahead, in two buffers):
//   S^T = K Q^T, P^T = 2^(S^T scale_log2 - lse log2 e), dV += P^T dO, dP^T = V dO^T,
//   dS^T = P^T (dP^T - D), dK += dS^T Q; dS^T goes through shared memory so that each warp
//   then takes 16 query rows and some channels of dQ = dS K, written as an f32 tile to shared
//   memory and added to an f32 workspace after the next barrier (add_dq_tile: bulk
//   reductions on sm_90, coalesced atomics before);
// - attn_bwd_dq: the workspace (softmax_scale already applied) converted to the element type.
// Every product keeps the forward's fragment discipline (ptx.cuh layouts, proven by
// layout_probe.cu); the A operands of S^T and dP^T are K and V rows (ldmatrix, as Q in the
// forward), P^T and dS^T go from C fragments to A fragments in registers (as P in the
// forward), and the A operand of dS K is read from dS^T with ldmatrix.trans.
// The tiling and masks (query_range, rows_of_key) are modelled on the CPU, with the same
// rounding of P and dS, in src/backward_tiles.rs, whose tests hold them against the exact
// gradients.
// Specialised at NVRTC time by HEAD_DIM (multiple of 8 up to 128, or 256), CH0, NWARPS, BWD_BR,
// KEYS_PER_WARP, DETERMINISTIC, IS_BF16, IS_CAUSAL, IS_LOCAL (attn_common.cuh's key range),
// HAS_SOFTCAP and HAS_ALIBI (the forward's score modifiers, applied to S^T before P^T as
// attn_common.cuh's score_row does: S^T becomes tanh(S^T softcap_pre), then the bias is
// subtracted). A softcap c multiplies dS by the derivative of c tanh(s / c), 1 - tanh^2
// (src/scores.rs score_grad): that factor goes into the 16-bit P that dS^T is formed from, so
// dS^T = (P^T (1 - tanh^2)) (dP^T - D), one rounding as without it; those pairs wait in the
// lane's own cells of the dS^T tile, not in registers (the kernel is at 255 registers at d128:
// 8 more live through dV spilled). ALiBi's bias is constant: dS passes through. Without them
// the kernel carries none of their code (scripts/sass-compare.sh: the same SASS).
// attn_bwd_wgmma applies them the same way; src/backward_tiles.rs models them.
// IS_VARLEN: packed variable-length batches in one launch (bwd_varlen.cuh: each block takes its
// sequence as a batch entry of its own; attn_bwd_dsum and attn_bwd_dq run over the packed rows).
#include "ptx.cuh"
#include "hopper.cuh"
#include "attn_common.cuh"
#include "bwd_common.cuh"
#include "bwd_varlen.cuh"

#ifndef NWARPS
#define NWARPS 8
#endif
#ifndef BWD_BR
#define BWD_BR 32
#endif
#ifndef KEYS_PER_WARP
#define KEYS_PER_WARP 16
#endif
// dQ leaves a step as an f32 tile in shared memory, added to the workspace by one bulk
// reduction per row (sm_90), or before sm_90 (or with DQ_BULK=0) by coalesced f32 atomics.
// DETERMINISTIC=1: the key blocks add their dQ tiles of a step of rows in key-block order
// (dq_order), so dQ is the same bytes run to run; warp 0 waits for the blocks it follows.
#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif
#ifndef DQ_BULK
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DQ_BULK 1
#else
#define DQ_BULK 0
#endif
#endif

// ---- tile geometry --------------------------------------------------------------------------
constexpr int DP = (D + 15) / 16 * 16; // head_dim padded to the k-step; pad channels are zero
// Channels of dK, dV and dQ this launch computes: all of them up to 128; above, 128 of them,
// [CH0, CH0 + 128): the host launches CH0 = 0 and CH0 = 128, each pass recomputing S^T and
// dP^T over every channel (dK and dV of 16 keys x 256 channels would not fit a warp's
// registers). The host pads head dims between 128 and 256 to 256 (zero channels).
#ifndef CH0
#define CH0 0
#endif
constexpr int DKV = DP <= 128 ? DP : 128;
constexpr int NCH = D - CH0 < DKV ? D - CH0 : DKV; // real channels of this pass
constexpr int CH = DP / 8;             // 16-byte chunks per row
constexpr int RS = (CH + 1) * 8;       // row stride (elements): an odd number of 16-byte slots
constexpr int KPW = KEYS_PER_WARP;     // keys per warp: MT m-tiles of 16
constexpr int MT = KPW / 16;
constexpr int BC = KPW * NWARPS;       // keys per block
constexpr int BR = BWD_BR;             // query rows per step (S^T and dP^T are 16 x BR per warp)
constexpr int NT = 32 * NWARPS;        // threads
constexpr int KS = DP / 16;            // k-steps over channels (S^T, dP^T)
constexpr int NQ = BR / 8;             // n8 tiles over query rows (S^T, dP^T)
constexpr int ND = DKV / 8;            // n8 tiles over this pass's channels (dK, dV, dQ)
constexpr int PK = BR / 16;            // k-steps over query rows (dV, dK)
constexpr int KK = BC / 16;            // k-steps over keys (dQ)
constexpr int RSS = BR + 8;            // dS^T row stride (elements): an odd number of 16-byte slots
constexpr int DQS = DKV + 8;           // dQ tile row stride (f32): float2 stores of a quad free of conflicts
// dQ = dS K: warp w takes rows 16 (w % RG) .. + 15 of the step and the channel pairs (16
// channels each) of part w / RG.
constexpr int RG = BR / 16;                 // row groups of dQ
constexpr int QPARTS = NWARPS / RG;         // channel parts of dQ
constexpr int NP = ND / 2;                  // 16-channel pairs
constexpr int PP = (NP + QPARTS - 1) / QPARTS; // pairs per part (the last may have fewer)
static_assert(BR == 32 || BR == 64, "BWD_BR is 32 or 64");
static_assert(KPW == 16 || KPW == 32, "KEYS_PER_WARP is 16 or 32");
static_assert(NWARPS % RG == 0, "NWARPS must be a multiple of BR / 16");
static_assert(BR <= 32 * NWARPS, "one thread per row loads lse and D");
static_assert(DKV * MT <= 128, "attn_bwd keeps dK and dV of a warp's keys in registers: channels x keys per warp <= 128 x 16");
static_assert((DP <= 128 || DP == 256) && CH0 % 16 == 0 && CH0 < D,
              "HEAD_DIM up to 128, or 256 (the host pads 129..255 to 256); CH0 a pass's first channel");

// Shared memory (bytes from the base): K and V of the block's keys; two buffers each of Q, dO
// (the next step's rows load while this step computes), lse and D (f32); dS^T; the
// dQ tile (f32). src/cuda/backward.rs sizes it (BwdTile::smem_bytes).
constexpr u32 OFF_K = 0;
constexpr u32 OFF_V = OFF_K + BC * RS * 2;
constexpr u32 OFF_Q = OFF_V + BC * RS * 2;
constexpr u32 OFF_DO = OFF_Q + 2 * BR * RS * 2;
constexpr u32 OFF_DS = OFF_DO + 2 * BR * RS * 2;
constexpr u32 OFF_DQ = OFF_DS + BC * RSS * 2;
constexpr u32 OFF_L = OFF_DQ + BR * DQS * 4;
constexpr u32 OFF_D = OFF_L + 2 * BR * 4;
constexpr u32 SMEM_BYTES = OFF_D + 2 * BR * 4;
constexpr u32 QBUF = BR * RS * 2; // bytes of one Q (or dO) buffer

// acc (MT m-tiles of 16 rows x 8*NQ columns) += A (16 MT rows of `a_rows`, k = channels) B,
// B[c][n] = row n of `b_rows` (both [rows, DP] tiles): the forward's S = Q K^T pattern. Each B
// fragment serves the MT m-tiles.
FA_DEVICE void rows_rows_kstep(float (&acc)[MT][NQ][4], u32 a_rows, u32 b_rows, int lane, int kk) {
    u32 a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                    a_rows + (u32)((mt * 16 + lane % 16) * RS + (kk * 2 + lane / 16) * 8) * 2);
#pragma unroll
    for (int np = 0; np < NQ / 2; ++np) {
        const int r = np * 16 + (lane % 8) + (lane / 16) * 8;
        const int c = kk * 2 + (lane / 8) % 2;
        u32 b0, b1, b2, b3;
        ldmatrix_x4(b0, b1, b2, b3, b_rows + (u32)(r * RS + c * 8) * 2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma(acc[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b0, b1);
            mma(acc[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b2, b3);
        }
    }
}
// head_dim 256 before sm_90: the 16 k-steps unrolled 8 at a time (fully unrolled, ptxas
// spilled a pass on sm_80; sm_90 keeps the full unroll that ran on the H200, run 73).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool KS_HALF_UNROLL = KS > 8;
#else
constexpr bool KS_HALF_UNROLL = false;
#endif
FA_DEVICE void gemm_rows_rows(float (&acc)[MT][NQ][4], u32 a_rows, u32 b_rows, int lane) {
    if constexpr (KS_HALF_UNROLL) {
#pragma unroll 8
        for (int kk = 0; kk < KS; ++kk) rows_rows_kstep(acc, a_rows, b_rows, lane, kk);
    } else {
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) rows_rows_kstep(acc, a_rows, b_rows, lane, kk);
    }
}

// acc (MT m-tiles of 16 rows x DP channels) += A B with A the packed 16-bit C fragments of a
// (16 MT) x BR product (af[mt][nt][r]: row 16mt + g + 8r, columns 8nt + 2t, +1) and B = `rows`
// ([BR, DP] tile) read with ldmatrix.trans: the forward's O += P V pattern. Each B fragment
// serves the MT m-tiles.
FA_DEVICE void gemm_frags_rows(float (&acc)[MT][ND][4], const u32 (&af)[MT][NQ][2], u32 rows, int lane) {
#pragma unroll
    for (int kk = 0; kk < PK; ++kk) {
#pragma unroll
        for (int dp = 0; dp < ND / 2; ++dp) {
            const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
            const int c = dp * 2 + lane / 16;
            u32 b0, b1, b2, b3;
            ldmatrix_x4_trans(b0, b1, b2, b3, rows + (u32)(r * RS + c * 8) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const u32(&a)[NQ][2] = af[mt];
                mma(acc[mt][2 * dp], a[2 * kk][0], a[2 * kk][1], a[2 * kk + 1][0], a[2 * kk + 1][1], b0, b1);
                mma(acc[mt][2 * dp + 1], a[2 * kk][0], a[2 * kk][1], a[2 * kk + 1][0], a[2 * kk + 1][1], b2, b3);
            }
        }
    }
}

// Q and dO rows of step (h, row0) into buffer `buf`, with lse (natural log) and D of its rows (cp.async;
// rows past the end read as zero: the mask gives them P = 0, so their lse is never used).
FA_DEVICE void load_step(const BwdParams &bp, u32 base, int buf, int b, int h, int row0) {
    const Params &p = bp.p;
    load_rows<BR, RS, NT>(base + OFF_Q + buf * QBUF, p.q + b * p.q_sb + h * p.q_sh, p.q_ss, row0, p.seqlen_q);
    load_rows<BR, RS, NT>(base + OFF_DO + buf * QBUF, bp.d_o + b * bp.do_sb + h * bp.do_sh, bp.do_ss, row0,
                          p.seqlen_q);
    const int r = (int)threadIdx.x;
    if (r < BR) {
        const i64 at = lse_offset(p, b, h, 0) + row0 + r;
        const bool ok = row0 + r < p.seqlen_q;
        cp_async_4(base + OFF_L + (u32)(buf * BR + r) * 4, ok ? p.lse + at : p.lse, ok ? 4 : 0);
        cp_async_4(base + OFF_D + (u32)(buf * BR + r) * 4, ok ? bp.dsum + at : bp.dsum, ok ? 4 : 0);
    }
}

// Adds the dQ tile of a finished step (rows row0 = m BR.., head h; softmax_scale applied) to
// the f32 workspace, after the barrier that follows every warp's writes of it (and, for the
// bulk path, their proxy fences).
// - sm_90: warp 0 issues one bulk reduction per row and commits them (one L2 request per row).
// - Before: every thread adds 4 consecutive floats at a time, a warp covering 128 consecutive
//   floats of a row (coalesced atomics, unlike the fragments').
// - DETERMINISTIC: warp 0 alone, in descending key-block order: it waits until the key blocks
//   after this one that visit step m (n+1..n_last: a contiguous run, step_range being
//   monotone) have added theirs, adds its tile, waits for the additions to complete, then
//   counts itself. Descending, because a higher key block reaches a given step of rows in
//   fewer steps of its own (it starts later in the rows under a causal mask or a window), so
//   the blocks rarely wait. The grid maps its first blocks to the highest key blocks, blocks
//   start in index order, and a block waits only for blocks that started before it: no block
//   waits for one that cannot run.
FA_DEVICE void add_dq_tile(const BwdParams &bp, u32 sDQ, const float *tile, int b, int h, int m, int n) {
    const Params &p = bp.p;
    const int row0 = m * BR;
    float *dqb = bp.dq_accum + ((i64)b * p.seqlen_q * p.heads_q + h) * D + CH0;
#if DETERMINISTIC
    if (threadIdx.x >= 32) return;
    int *order = bp.dq_order + ((i64)b * p.heads_q + h) * ((p.seqlen_q + BR - 1) / BR) + m;
    if (threadIdx.x == 0) {
        // n_last: the last key block that visits step m (of the sequence's own, IS_VARLEN)
        int lo = n, hi = IS_VARLEN ? (p.seqlen_k + BC - 1) / BC - 1 : bp.num_k_blocks - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            int mb, me;
            step_range<BR, BC>(p, mid, mb, me);
            if (mb <= m && me > m) lo = mid;
            else hi = mid - 1;
        }
        while (ld_acquire_gpu(order) != lo - n) {
        }
    }
    __syncwarp();
#if DQ_BULK
    // The acquired count (generic proxy) before this block's bulk reductions (async proxy).
    fence_proxy_async_global();
#endif
#endif
#if DQ_BULK
    if (threadIdx.x < 32) {
        for (int r = (int)threadIdx.x; r < BR; r += 32)
            if (row0 + r < p.seqlen_q)
                bulk_reduce_add_f32(dqb + (i64)(row0 + r) * p.heads_q * D, sDQ + (u32)(r * DQS) * 4, NCH * 4);
        bulk_commit();
#if DETERMINISTIC
        bulk_wait0();
        fence_proxy_async_global();
#endif
    }
#else
    (void)sDQ;
    constexpr int ADDERS = DETERMINISTIC ? 32 : NT;
    for (int i = (int)threadIdx.x; i < BR * (NCH / 4); i += ADDERS) {
        const int r = i / (NCH / 4), c = i % (NCH / 4) * 4;
        if (row0 + r < p.seqlen_q) {
            float *dst = dqb + (i64)(row0 + r) * p.heads_q * D + c;
#pragma unroll
            for (int e = 0; e < 4; ++e) atomicAdd(dst + e, tile[r * DQS + c + e]);
        }
    }
#endif
#if DETERMINISTIC
    __syncwarp();
    if (threadIdx.x == 0) red_release_gpu_add(order, 1);
#endif
}

extern "C" __global__ void __launch_bounds__(NT, 1) attn_bwd(const BwdParams bp_in VARLEN_PARAM) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 base = smem_u32(smem_raw);
    const u32 sK = base + OFF_K, sV = base + OFF_V, sDS = base + OFF_DS;
#if IS_VARLEN
    // The block's sequence alone, as batch entry 0 (bwd_varlen.cuh); a block past its keys
    // leaves here, before any barrier. Its parameters are read from shared memory (static: the
    // host adds their size, src/cuda/bwd/varlen.rs): kept in a local copy, their lengths and
    // shifted addresses took registers the kernel has not got (ptxas spilled the d64 f16
    // sm_90 and d256 ALiBi builds at 255); in shared memory they cost about none. (After the
    // tile's dynamic shared memory instead, 10 builds of sm_120 spilled.)
    __shared__ BwdParams seq_bp;
    {
        BwdParams t = bp_in;
        if (!varlen_sequence<BC>(t, DETERMINISTIC, total_k)) return;
        if (threadIdx.x == 0) seq_bp = t;
        __syncthreads();
    }
    const BwdParams &bp = seq_bp;
#else
    const BwdParams &bp = bp_in;
#endif
    const Params &p = bp.p;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;

    // Key blocks in index order; in the deterministic mode from the last (add_dq_tile). Steps
    // take the two buffers in turn.
    const KeyBlock<BR, BC> kb(bp, DETERMINISTIC);
    // (IS_VARLEN: the sequence is batch entry 0 of the block's parameters.)
    const int n_block = kb.n_block, hk = kb.hk, b = IS_VARLEN ? 0 : kb.b, key0 = kb.key0;
    // The diagonal, seqlen_k - seqlen_q. IS_VARLEN at head_dim 256: re-read from the
    // sequence's lengths in shared memory where it is used (unlike a dense launch's, it cannot
    // be recomputed from constants; kept in a register, ptxas spilled it at d256 bf16 on sm_90,
    // while re-read at d128 it spilled other values on sm_120: the choice is by measurement).
    const auto diag = [&] { return IS_VARLEN && DP > 128 ? p.seqlen_k - p.seqlen_q : kb.diag; };
    const int steps = kb.steps;
    const auto head_of = [&](int s) { return kb.head_of(p, s); };
    const auto row0_of = [&](int s) { return kb.row0_of(s); };

    load_rows<BC, RS, NT>(sK, p.k + b * p.k_sb + hk * p.k_sh, p.k_ss, key0, p.seqlen_k);
    load_rows<BC, RS, NT>(sV, p.v + b * p.v_sb + hk * p.v_sh, p.v_ss, key0, p.seqlen_k);
    if (steps > 0) load_step(bp, base, 0, b, head_of(0), row0_of(0));
    cp_async_commit();

    float dk[MT][ND][4], dv[MT][ND][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nd = 0; nd < ND; ++nd)
#pragma unroll
            for (int e = 0; e < 4; ++e) dk[mt][nd][e] = dv[mt][nd][e] = 0.f;

    const u32 kw = sK + (u32)(warp * KPW * RS) * 2; // this warp's keys
    const u32 vw = sV + (u32)(warp * KPW * RS) * 2;
    const u32 sDQ = base + OFF_DQ;
    float *dq_tile = (float *)(smem_raw + OFF_DQ);
    int pend_h = -1, pend_m = 0; // the dQ tile written but not yet added
    for (int s = 0; s < steps; ++s) {
        const int buf = s & 1;
        const int h = head_of(s), row0 = row0_of(s);
        // The other buffer was last read before the previous step's second barrier.
        if (s + 1 < steps) load_step(bp, base, buf ^ 1, b, head_of(s + 1), row0_of(s + 1));
        cp_async_commit();
        cp_async_wait<1>(); // this step's rows (and K, V) have landed for this thread
        __syncthreads();    // ... and for every thread; the previous step's dQ reads of dS^T are done
        if (pend_h >= 0) add_dq_tile(bp, sDQ, dq_tile, b, pend_h, pend_m, n_block);
        const u32 sQ = base + OFF_Q + buf * QBUF, sDO = base + OFF_DO + buf * QBUF;
        const float *sL = (const float *)(smem_raw + OFF_L) + buf * BR;
        const float *sD = (const float *)(smem_raw + OFF_D) + buf * BR;
#if HAS_ALIBI
        // The bias of (row i, key j) in S's units: coef |i + diag - j|. Loaded here, before
        // S^T: loaded after it, ptxas spilled the d128 causal build on sm_120 (255 registers).
        const float coef = alibi_coef(p, b, h);
#endif

        // S^T = K Q^T (this warp's KPW keys x BR rows), then P^T in place. Element e of
        // n-tile nt of m-tile mt: key key0 + KPW warp + 16mt + g + 8(e/2), row row0 + 8nt +
        // 2t + e%2.
        float st[MT][NQ][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) st[mt][nt][e] = 0.f;
        gemm_rows_rows(st, kw, sQ, lane);
        u32 pf[MT][NQ][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            // The rows that see the lane's keys (rows past seqlen_q, whose lse and D were read
            // as zeros, see none).
            int rmin[2], rmax[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) rows_of_key(p, diag(), key0 + warp * KPW + mt * 16 + g + 8 * r, row0, rmin[r], rmax[r]);
#if HAS_ALIBI
            // i + diag - j of the lane's first row and key; element e of n-tile nt is
            // 8nt + e%2 rows and 8(e/2) keys on. In f32: exact below 2^24, as the forward's
            // score_row (one value, not one per key: the kernel is at 255 registers at d128).
            const float center = (float)((i64)row0 + 2 * t + diag() - (key0 + warp * KPW + mt * 16 + g));
#endif
#if HAS_SOFTCAP
            float gt[NQ][4]; // 1 - tanh^2 of each element
#endif
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int rl = 8 * nt + 2 * t + e % 2;
                    const bool seen = rl >= rmin[e / 2] && rl <= rmax[e / 2];
#if HAS_SOFTCAP
                    const float tc = tanh_exp2(st[mt][nt][e] * p.softcap_pre);
                    st[mt][nt][e] = tc;
                    gt[nt][e] = 1.f - tc * tc;
#endif
#if HAS_ALIBI
                    st[mt][nt][e] -= coef * fabsf(center + (float)(8 * nt + e % 2 - 8 * (e / 2)));
#endif
                    st[mt][nt][e] = seen ? ex2(fmaf(st[mt][nt][e], p.scale_log2, -LOG2E * sL[rl])) : 0.f;
                }
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    pf[mt][nt][r] = pack2(st[mt][nt][2 * r], st[mt][nt][2 * r + 1]);
#if HAS_SOFTCAP
                    // P^T (1 - tanh^2), what dS^T is formed from, into the cells of dS^T that
                    // this lane writes later (free since this step's first barrier; read back
                    // by the same lane only).
                    const int key = warp * KPW + mt * 16 + g + 8 * r;
                    st_shared_u32(sDS + (u32)(key * RSS + 8 * nt + 2 * t) * 2,
                                  pack2(st[mt][nt][2 * r] * gt[nt][2 * r], st[mt][nt][2 * r + 1] * gt[nt][2 * r + 1]));
#endif
                }
        }
        // dV += P^T dO
        gemm_frags_rows(dv, pf, sDO + CH0 * 2, lane);
        // dP^T = V dO^T, then dS^T = P^T (dP^T - D) in its place
        float dpt[MT][NQ][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dpt[mt][nt][e] = 0.f;
        gemm_rows_rows(dpt, vw, sDO, lane);
        // P from its 16-bit pairs (the f32 values are not kept live through dP^T: at d128
        // they pushed the kernel past 255 registers); P V used the same rounded values. With a
        // softcap, P (1 - tanh^2) from the dS^T cells it waited in.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#if HAS_SOFTCAP
            u32 pg[NQ][2];
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int key = warp * KPW + mt * 16 + g + 8 * r;
                    pg[nt][r] = ld_shared_u32(sDS + (u32)(key * RSS + 8 * nt + 2 * t) * 2);
                }
#endif
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
#if HAS_SOFTCAP
                    const u32 pair = pg[nt][e / 2];
#else
                    const u32 pair = pf[mt][nt][e / 2];
#endif
                    const float pe = to_f32((u16)(e % 2 ? pair >> 16 : pair & 0xffff));
                    dpt[mt][nt][e] = pe * (dpt[mt][nt][e] - sD[8 * nt + 2 * t + e % 2]);
                }
#pragma unroll
            for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    pf[mt][nt][r] = pack2(dpt[mt][nt][2 * r], dpt[mt][nt][2 * r + 1]);
                    // dS^T to shared memory: row = key (in the block), column = query row
                    const int key = warp * KPW + mt * 16 + g + 8 * r;
                    st_shared_u32(sDS + (u32)(key * RSS + 8 * nt + 2 * t) * 2, pf[mt][nt][r]);
                }
        }
        // dK += dS^T Q (softmax_scale applied at the end)
        gemm_frags_rows(dk, pf, sQ + CH0 * 2, lane);
#if DQ_BULK
        if (warp == 0) bulk_wait_read0(); // the bulk reductions have read the previous dQ tile
#endif
        __syncthreads(); // dS^T of every warp written

        // dQ = dS K for rows 16 (warp % RG) + 0..15 and this warp's channel pairs: A = dS
        // (rows, keys) read from dS^T with ldmatrix.trans (tile i of lane l: keys 16kk +
        // 8(i/2) + l%8, rows 16 (warp % RG) + 8(i%2)); B = K rows read transposed.
        {
            const int rg = warp % RG, part = warp / RG;
            float dq[2 * PP][4];
#pragma unroll
            for (int nd = 0; nd < 2 * PP; ++nd)
#pragma unroll
                for (int e = 0; e < 4; ++e) dq[nd][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                const int ti = lane / 8;
                const int key = kk * 16 + (ti / 2) * 8 + lane % 8;
                const int col = rg * 16 + (ti % 2) * 8;
                u32 a0, a1, a2, a3;
                ldmatrix_x4_trans(a0, a1, a2, a3, sDS + (u32)(key * RSS + col) * 2);
#pragma unroll
                for (int pp = 0; pp < PP; ++pp) {
                    const int dp = part * PP + pp;
                    if (dp < NP) {
                        const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                        const int c = dp * 2 + lane / 16;
                        u32 b0, b1, b2, b3;
                        ldmatrix_x4_trans(b0, b1, b2, b3, sK + (u32)(r * RS + CH0 + c * 8) * 2);
                        mma(dq[2 * pp], a0, a1, a2, a3, b0, b1);
                        mma(dq[2 * pp + 1], a0, a1, a2, a3, b2, b3);
                    }
                }
            }
            // To the dQ tile (times softmax_scale), added to the workspace after the next
            // barrier. Pad channels (c >= D) are written but never added.
#pragma unroll
            for (int nd = 0; nd < 2 * PP; ++nd)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int row = rg * 16 + g + 8 * r;
                    const int c = (part * PP * 2 + nd) * 8 + 2 * t;
                    if (c < DKV) {
                        *(float2 *)(dq_tile + row * DQS + c) = make_float2(dq[nd][2 * r] * bp.scale, dq[nd][2 * r + 1] * bp.scale);
                    }
                }
#if DQ_BULK
            fence_proxy_async();
#endif
            pend_h = h;
            pend_m = row0 / BR;
        }
    }
    cp_async_wait<0>(); // (a block with no query rows never waited for its K/V loads)
    __syncthreads(); // the last dQ tile written by every warp
    if (pend_h >= 0) add_dq_tile(bp, sDQ, dq_tile, b, pend_h, pend_m, n_block);
#if DQ_BULK
    if (warp == 0) bulk_wait0();
#endif

    // dK (times softmax_scale) and dV of this warp's keys, as 16-bit pairs, dense.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int j = key0 + warp * KPW + mt * 16 + g + 8 * r;
            if (j >= p.seqlen_k) continue;
            const i64 at = (((i64)b * p.seqlen_k + j) * bp.heads_kv + hk) * D;
#pragma unroll
            for (int nd = 0; nd < ND; ++nd) {
                const int c = CH0 + nd * 8 + 2 * t;
                if (c < D) {
                    *(u32 *)(bp.dk + at + c) = pack2(dk[mt][nd][2 * r] * bp.scale, dk[mt][nd][2 * r + 1] * bp.scale);
                    *(u32 *)(bp.dv + at + c) = pack2(dv[mt][nd][2 * r], dv[mt][nd][2 * r + 1]);
                }
            }
        }
}
