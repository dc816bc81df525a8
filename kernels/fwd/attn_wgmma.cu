// attn_wgmma.cu: FlashAttention forward for Hopper (sm_90a) with wgmma, TMA and warp
// specialisation, in the structure of FlashAttention-3 (Shah et al. 2024).
//
// A block works on tiles of BR = 64 * CONSUMERS query rows of one (batch, head) and runs
// CONSUMERS + 1 warpgroups:
// - warpgroup 0, the producer: gives most of its registers away (setmaxnreg.dec) and one thread
//   issues every TMA load: each tile's Q, then its K and V tiles of BC keys into a ring of STAGES
//   shared-memory stages; each load completes on a "full" mbarrier, and a stage is reused only
//   after every consumer has arrived on its "empty" mbarrier;
// - warpgroups 1.., the consumers (2, or 3 for d64 as FA3 does): 64 query rows each
//   (setmaxnreg.inc). S = Q K^T is one
//   wgmma m64nBCk16 per 16 channels with Q and K read from shared memory through matrix
//   descriptors; the online softmax runs on the S accumulators; P, packed to 16-bit pairs, is
//   the register A operand of O += P V (V read MN-major through its descriptor). A consumer
//   computes only the key tiles its own rows see (none when it has no row in [0, seqlen_q)) and
//   passes the block's others (docs/perf-notes.md 38).
// Overlap (FA3's two kinds):
// - intra-warpgroup: iteration n issues S_n = Q K_n^T and then O += P_{n-1} V_{n-1}, and
//   computes the softmax of S_n while P_{n-1} V_{n-1} runs on the Tensor Cores;
// - pingpong (PINGPONG=1): the consumers take turns, in a ring, to issue their wgmmas (named
//   barriers 1..CONSUMERS), so one warpgroup's softmax runs under the others' GEMMs.
// Epilogue: O / row_sum is written as 16-bit pairs into a staging tile (its own buffer when
// shared memory allows, else the warpgroup's rows of the Q tile; same 128-byte swizzle) and
// stored with TMA; lse as in attn_mma.
//
// Layouts (proven by kernels/probe/wgmma_probe.cu against src/layout_wgmma.rs):
// - shared tiles are TMA boxes of 64 channels x rows, 128-byte swizzled: row r of a box is 128
//   bytes at r*128, its 16-byte chunk c stored at chunk c ^ (r % 8); a head_dim of DP channels
//   is DP/64 such boxes one after another (NSUB sub-tiles);
// - accumulator i of a lane: row 16*warp + g + 8*((i/2)%2), column 8*(i/4) + 2t + i%2
//   (g = lane/4, t = lane%4);
// - the A fragment of keys 16kk..16kk+15 is {pack(s[8kk],s[8kk+1]), pack(s[8kk+2],s[8kk+3]),
//   pack(s[8kk+4],s[8kk+5]), pack(s[8kk+6],s[8kk+7])}: P register r = pack(s[2r], s[2r+1]).
//
// Persistent: each block loops over tiles (the launcher starts one block per SM), so the next
// tile's Q and first K/V tiles load while this tile finishes; with DYNAMIC the tiles after the
// first come from an atomic counter (the producer hands each to the consumers through a
// shared slot and a named barrier per consumer, BAR_TILE below).
//
// Specialised at NVRTC time by HEAD_DIM (the padded head_dim DP: a multiple of 16 from 64 to
// 256; channels past the real head_dim are zero-filled by TMA and never stored), BC (keys per
// tile, a multiple of 16), STAGES (K/V ring depth), PINGPONG, RESCALE_SLACK (as attn_mma),
// IS_BF16, IS_CAUSAL, HEAD_MAJOR, DYNAMIC, SMEM_LIMIT (decides where O is staged), CONSUMERS
// (consumer warpgroups), CONSUMER_REGS / PRODUCER_REGS (setmaxnreg targets), ROWSUM_V,
// SPEC_MAX (below), the score modifiers of attn_common.cuh (IS_LOCAL, HAS_SOFTCAP,
// HAS_ALIBI), and HAS_SINK (a learnable sink: its logits are the kernel's second parameter,
// folded into each row's sum in the epilogue).
#include "ptx.cuh"
#include "attn_common.cuh"
#include "tile_scheduler.cuh"
#include "softmax.cuh"
#include "hopper.cuh"
#if IS_BF16
#define WG_AB "bf16"
#else
#define WG_AB "f16"
#endif
#include "wgmma_ops.cuh"
static_assert(!IS_VARLEN, "packed variable-length batches run on attn_mma (TMA boxes cross sequence ends)");

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
#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#ifndef TRACE
#define TRACE 0
#endif
// The row sums of P on the Tensor Cores, at no cost in instructions: each V stage carries one
// more 64-column sub-tile, all ones, so P V (N = head_dim + 8) also writes P's row sums into 4
// more accumulators and the softmax issues no FADD per score (docs/perf-notes.md 37). 0: the
// softmax sums them; the launcher's choice (WgmmaTile::row_sums_in_pv) for bf16 (whose P
// rounding, 2^-9, would reach lse), padded head dims not a multiple of 64, d256 (N > 256) and
// tiles whose ones sub-tiles would not fit.
#ifndef ROWSUM_V
#define ROWSUM_V 1
#endif

// 1: the running maxima kept without the quad's shuffles where the warp may (WgmmaTile::
// spec_max: the launcher's default except bf16 at d64; docs/perf-notes.md 38).
#ifndef SPEC_MAX
#define SPEC_MAX 0
#endif

// ---- geometry -------------------------------------------------------------------------------
constexpr int DP = D;                    // padded head_dim (HEAD_DIM)
constexpr int NSUB = (DP + 63) / 64;     // 64-channel, 128-byte-row sub-tiles (TMA boxes)
constexpr int NCONS = CONSUMERS;         // consumer warpgroups
constexpr int BR = 64 * NCONS;           // query rows per block: 64 per consumer warpgroup
constexpr int NT = 128 * (NCONS + 1);    // threads: producer + consumers
constexpr u32 SUB_Q = BR * 128;          // bytes of one Q sub-tile
constexpr u32 SUB_KV = BC * 128;         // bytes of one K or V sub-tile
constexpr u32 Q_BYTES = NSUB * SUB_Q;
constexpr u32 KV_BYTES = NSUB * SUB_KV;  // one K (or V) stage; also its TMA transaction bytes
constexpr int KSTEPS = DP / 16;          // k16 steps of S = Q K^T
constexpr int PSTEPS = BC / 16;          // k16 steps of O += P V
constexpr int NS = BC / 2;               // S accumulators per thread
constexpr int NO = DP / 2;               // O accumulators per thread
constexpr int NPV = DP + (ROWSUM_V ? 8 : 0); // N of P V: with ROWSUM_V, 8 columns of row sums
constexpr u32 V_STAGE_BYTES = (NSUB + (ROWSUM_V ? 1 : 0)) * SUB_KV; // V sub-tiles, then the ones
static_assert(NPV <= 256, "ROWSUM_V needs head_dim <= 248 (wgmma N <= 256)");
// The ones start at column DP, which must begin a sub-tile of their own: at DP 96 it would lie
// inside V's second TMA box, which TMA zero-fills past head_dim (the row sums came out 0).
static_assert(!ROWSUM_V || DP % 64 == 0, "ROWSUM_V needs a padded head_dim that is a multiple of 64");
static_assert(DP % 16 == 0 && DP >= 64 && DP <= 256, "HEAD_DIM (padded) must be a multiple of 16 in 64..256");
static_assert(BC % 16 == 0 && BC >= 16 && BC <= 256, "BC must be a multiple of 16 up to 256");
static_assert(STAGES >= 2 && STAGES <= 8, "STAGES in 2..8");
static_assert(NCONS == 2 || NCONS == 3, "CONSUMERS is 2 or 3");
// setmaxnreg moves registers inside the block's pool, the count ptxas gives each of the NT
// threads at launch (64K / NT, a multiple of 8: 168 for 384 threads, 128 for 512): an inc the
// pool cannot cover waits forever.
static_assert((NCONS * CONSUMER_REGS + PRODUCER_REGS) * 128 <= (65536 / NT / 8 * 8) * NT,
              "setmaxnreg targets exceed the block's register pool");

// Named barriers (0 is __syncthreads): the pingpong turns, then one per consumer epilogue.
constexpr u32 BAR_SCHED = 1;             // + consumer index: "consumer c may issue its wgmmas"
constexpr u32 BAR_EPI = BAR_SCHED + NCONS; // + consumer index: the consumer's 128 threads
// The producer's warp hands each round's tile to the consumers: it writes the tile slot and
// arrives; the consumer threads sync, then read. A named barrier rather than the q_full
// mbarrier's release/acquire (equally correct) so that compute-sanitizer's racecheck, which
// models bar.sync/bar.arrive, sees the order. One barrier per consumer (BAR_TILE + c: the
// producer's warp and that consumer), so a consumer starts its next tile while the others
// finish this one (one barrier for all, every tile started in lockstep, was 1-4 % slower at
// 1k-4k: run 74). The producer arrives for round r+1 only after the q_empty wait of round r,
// and every arrival that completes that phase comes from a consumer warp (or its storing
// thread) after the consumer's round-r sync on its barrier, so no barrier sees two rounds'
// arrivals; a consumer runs at most one round ahead of another. (A model of the protocol,
// run over 2-3 consumers, pingpong on and off, O in its own tile or in Q, and rounds without
// key tiles, found no deadlock, mixed barrier or stale read; session of runs 74-77.)
constexpr u32 BAR_TILE = BAR_EPI + NCONS;
constexpr u32 TILE_HANDOFF_THREADS = 32 + 128;
static_assert(BAR_TILE + NCONS <= 16, "named barriers 0..15");

// O is staged for its TMA store in a buffer of its own when it fits beside Q and the K/V
// stages (then the next tile's Q loads while this tile's last P V and epilogue run);
// otherwise in the consumer's own rows of the Q tile (then the next Q waits for the store).
#ifndef SMEM_LIMIT
#define SMEM_LIMIT (227 * 1024)
#endif
constexpr u32 CORE_BYTES = Q_BYTES + STAGES * (KV_BYTES + V_STAGE_BYTES);
constexpr bool O_OWN = CORE_BYTES + Q_BYTES + 1024 + 8 * (3 + 4 * STAGES) <= SMEM_LIMIT;
// Arrivals that free the Q tile: every consumer warp after its last S = Q K^T (O_OWN), or
// each consumer's storing thread once its TMA store has read O out of the Q tile.
constexpr u32 Q_EMPTY_COUNT = O_OWN ? NCONS * 4 : NCONS;

// Shared memory: Q | K stages | V stages | [O] | mbarriers, from a 1024-byte-aligned base
// (the swizzle atoms must be 1024-byte aligned); src/cuda/wgmma.rs sizes it the same way.
// (Two Q buffers, so that the next tile's Q loads earlier, were level twice: runs 33, 75.)
struct Smem {
    u32 q, k, v, o, bars;
    FA_DEVICE u32 k_stage(int s) const { return k + (u32)s * KV_BYTES; }
    FA_DEVICE u32 v_stage(int s) const { return v + (u32)s * V_STAGE_BYTES; }
    FA_DEVICE u32 q_full() const { return bars; }
    FA_DEVICE u32 q_empty() const { return bars + 8; }
    FA_DEVICE u32 k_full(int s) const { return bars + 8 * (2 + s); }
    FA_DEVICE u32 v_full(int s) const { return bars + 8 * (2 + STAGES + s); }
    FA_DEVICE u32 k_empty(int s) const { return bars + 8 * (2 + 2 * STAGES + s); }
    FA_DEVICE u32 v_empty(int s) const { return bars + 8 * (2 + 3 * STAGES + s); }
    // The tile of round r in slot r % 2 (-1: no more tiles), written by the producer before it
    // arrives on BAR_TILE. Two slots: the producer writes round r+1's while the consumers may
    // still read round r's. It rewrites slot r % 2 in round r+2 only after the q_empty wait
    // that follows the consumers' reads of round r (release/acquire through the mbarrier;
    // racecheck, which does not model mbarriers, reports this WAR when a block runs 3+ tiles).
    FA_DEVICE u32 tile_slot(u32 round) const { return bars + 8 * (2 + 4 * STAGES) + 4 * (round & 1); }
};

struct WgmmaParams {
    TmaMap tq;  // q: dims (head_dim, seqlen_q, heads_q, batch), box (64, BR, 1, 1)
    TmaMap tk;  // k: dims (head_dim, seqlen_k, heads_kv, batch), box (64, BC, 1, 1)
    TmaMap tv;  // v: as k
    TmaMap to;  // o: dims (head_dim, seqlen_q, heads_q, batch), box (64, 64, 1, 1)
    Params p;
    // DYNAMIC: null (the static order), or two u32, zero at every launch: the tiles drawn past
    // the first grid, and the blocks done drawing (the last block zeroes both, so the next
    // launch on the stream starts from zero; a pair per stream: src/cuda/device.rs).
    u32 *tile_counter;
    // TRACE: the timeline buffer (below), else null.
    u32 *trace;
};

// The diagnostics build (TRACE=1; `trace` in FLASHATTN_WGMMA_TILE, read back by
// src/cuda/wgmma_trace.rs): thread 0 of each warpgroup writes the SM clock at fixed points of
// its block's first TRACE_ROUNDS tiles, TRACE_SLOTS u32 per (block, round, warpgroup; the
// producer is warpgroup 0). Slots: 0 the tile (consumers: 1 its key tiles), 2-3 the global
// timer at the hand-off (ns), 4.. the clock at the round's points, and from TRACE_ITER0 six
// per key tile for the first TRACE_ITERS key tiles. Stores only: the default build has none.
constexpr int TRACE_ROUNDS = 8, TRACE_ITERS = 16, TRACE_ITER0 = 16;
constexpr int TRACE_SLOTS = TRACE_ITER0 + 6 * TRACE_ITERS;
FA_DEVICE u32 *trace_row(u32 *base, u32 round, int role) {
    if (!TRACE || base == nullptr || round >= (u32)TRACE_ROUNDS) return nullptr;
    return base + ((blockIdx.x * TRACE_ROUNDS + round) * (NCONS + 1) + (u32)role) * TRACE_SLOTS;
}
FA_DEVICE void trace_put(u32 *tr, int slot, u32 v) {
    if (TRACE && tr != nullptr) tr[slot] = v;
}
FA_DEVICE void trace_clock(u32 *tr, int slot) {
    if (TRACE && tr != nullptr) tr[slot] = clock_lo(); // only the tracing thread reads the clock
}
FA_DEVICE void trace_iter(u32 *tr, int n, int e) {
    if (n < TRACE_ITERS) trace_clock(tr, TRACE_ITER0 + 6 * n + e);
}
FA_DEVICE void trace_start(u32 *tr, int tile) {
    trace_put(tr, 0, (u32)tile);
    if (TRACE && tr != nullptr) {
        const unsigned long long ns = global_ns();
        tr[2] = (u32)ns;
        tr[3] = (u32)(ns >> 32);
    }
}

// Descriptors of this kernel's operands (hopper.cuh; the layouts the wgmma probe proves).
// Q (A, K-major): the consumer's 64 rows, k-step kk = 16 channels.
FA_DEVICE u64 q_desc(u32 sq_rows, int kk) { return desc_kmajor_sw128(sq_rows, kk, SUB_Q); }
// K (B, K-major): BC key rows of a stage.
FA_DEVICE u64 k_desc(u32 sk, int kk) { return desc_kmajor_sw128(sk, kk, SUB_KV); }
// V (B, MN-major): keys 16kk..16kk+15 of a stage, all DP channels.
FA_DEVICE u64 v_desc(u32 sv, int kk) { return desc_mnmajor_sw128(sv, kk, SUB_KV); }

// Key tiles a block of query rows starting at row0 needs (attn_common.cuh): from the window's
// start to the keys its last row sees. Every consumer takes a turn for each of them (pingpong
// needs the same count of turns on every side) and computes those its own rows see.
FA_DEVICE KeyTiles key_tiles(const Params &p, int row0) {
    const int first = max(row0, 0); // negative rows: only in the causal shift below
    return key_tiles_of(p, first, row0 + BR - first, BC);
}

// The first query row of block m_block. Causal: the blocks end at the last row and the
// partial one (seqlen_q not a multiple of BR) comes first, so that it is the block with the
// fewest keys; its empty consumers hold negative rows. (d64, Br 192, 1k: 1024 = 64 + 5 x 192;
// ending the blocks at 5 x 192 + 64 left the longest block 8 key tiles on one consumer of
// three.) The shift is whole consumers, a multiple of 64 rows, so no consumer straddles row 0:
// its rows are all negative (it computes and stores nothing) or none are. TMA zero-fills the
// negative rows of the Q box (out of bounds) and nothing stores them.
FA_DEVICE int block_row0(const Params &p, int m_block) {
    const int shift = IS_CAUSAL ? (p.num_m_blocks * BR - p.seqlen_q) / 64 * 64 : 0;
    return m_block * BR - shift;
}

// ================================ producer =================================================
// Thread 0 of the producer warpgroup: for each tile the block takes (the scheduler's order),
// the Q tile once and the K and V tiles its rows need into the stage ring, each behind the
// consumers' release of the stage; then the next tile.
FA_DEVICE void producer(const WgmmaParams &w, const Smem &sm, int tiles) {
    const Params &p = w.p;
    tma_prefetch(w.tq);
    tma_prefetch(w.tk);
    tma_prefetch(w.tv);
    // The K/V ring position as a stage index and the parity of its current use (kept
    // incrementally: the producer has PRODUCER_REGS registers). `wrapped` turns on once every stage
    // has been filled once, from then on each load waits for the stage's release.
    int stage = 0;
    u32 use_parity = 0;
    bool wrapped = false;
    int tile = blockIdx.x;
    for (u32 round = 0;; ++round) {
        // The previous round's consumers are done with the Q tile (and have read the
        // tile slot of two rounds ago).
        if (round > 0) mbar_wait(sm.q_empty(), (round - 1) & 1);
        u32 *tr = trace_row(w.trace, round, 0);
        trace_start(tr, tile);
        trace_clock(tr, 4);
        st_shared_u32(sm.tile_slot(round), tile < tiles ? (u32)tile : 0xFFFFFFFFu);
#pragma unroll
        for (int c = 0; c < NCONS; ++c) named_arrive_unaligned(BAR_TILE + c, TILE_HANDOFF_THREADS);
        if (tile >= tiles) break; // the consumers read -1 and stop
        const BlockCoords bc = block_coords(p, (unsigned)tile);
        const int row0 = block_row0(p, bc.m_block);
        mbar_arrive_expect_tx(sm.q_full(), Q_BYTES);
#pragma unroll
        for (int j = 0; j < NSUB; ++j) tma_load_4d(sm.q + j * SUB_Q, w.tq, sm.q_full(), 64 * j, row0, bc.h, bc.b);
        trace_clock(tr, 5);
        // Key tile n of K or V (`map`) into its stage at `dst`. This use of the stage waits for
        // the consumers' release (`empty`) of the previous one (whose phase had the other parity).
        const KeyTiles kt = key_tiles(p, row0);
        for (int n = kt.begin; n < kt.end; ++n) {
            // K, then V, of key tile n into the stage. A use of the stage waits for the
            // consumers' release of the previous one (whose phase had the other parity). (One
            // lambda for both loads changed ptxas's register allocation: written out twice.)
            if (wrapped) mbar_wait(sm.k_empty(stage), use_parity ^ 1);
            mbar_arrive_expect_tx(sm.k_full(stage), KV_BYTES);
#pragma unroll
            for (int j = 0; j < NSUB; ++j)
                tma_load_4d(sm.k_stage(stage) + j * SUB_KV, w.tk, sm.k_full(stage), 64 * j, n * BC, bc.hk, bc.b);
            trace_iter(tr, n - kt.begin, 0);
            if (wrapped) mbar_wait(sm.v_empty(stage), use_parity ^ 1);
            mbar_arrive_expect_tx(sm.v_full(stage), KV_BYTES);
#pragma unroll
            for (int j = 0; j < NSUB; ++j)
                tma_load_4d(sm.v_stage(stage) + j * SUB_KV, w.tv, sm.v_full(stage), 64 * j, n * BC, bc.hk, bc.b);
            trace_iter(tr, n - kt.begin, 1);
            if (++stage == STAGES) {
                stage = 0;
                use_parity ^= 1;
                wrapped = true;
            }
        }
        trace_clock(tr, 6);
        tile = next_tile<DYNAMIC>(w.tile_counter, tile);
    }
    tile_counter_reset<DYNAMIC>(w.tile_counter);
}

// ================================ consumers ================================================
// A consumer warpgroup (64 query rows of each tile): S = Q K^T, the softmax, O += P V over the
// key tiles its rows see, then O and lse out. `sink`: HAS_SINK's logits (null without).
FA_DEVICE void consumer(const WgmmaParams &w, const Smem &sm, int tid, int wg, const float *sink) {
    const Params &p = w.p;
    // Rows 64*cons .. 64*cons+63 of the block. Broadcast from lane 0, so that ptxas knows it
    // is warp-uniform (as CUTLASS's canonical_warp_group_idx): without it, the d64
    // three-consumer kernels spilled 8-16 bytes with P packed inside the softmax (a
    // knob since removed).
    const int cons = shfl_lane0(wg) - 1;
    const int ctid = tid - 128 * wg;         // thread in the warpgroup
    const int warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const u32 sq_rows = sm.q + (u32)cons * 64 * 128; // this consumer's rows in every Q sub-tile
    const u32 so_rows = sm.o + (u32)cons * 64 * 128; // ... and in the O staging tile
    // seqlen_k - seqlen_q; with both below 2^30, the row limits below stay inside int.
    const int diag = p.seqlen_k - p.seqlen_q;
    // One arrival per warp on an empty barrier, after the warp's wgmma reads are complete
    // (every lane's wait_group, ordered before lane 0's arrive).
    auto release = [&](u32 bar) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };

#if PINGPONG
    // The turns run in one ring across tiles (every consumer takes the same number of turns
    // per tile: one per key tile of the block, computed or passed). Consumer 0 holds the first turn; the arrival
    // left over at the end (the last consumer's last hand-back, or this one) is taken below.
    if (cons == 0) named_arrive(BAR_SCHED + 0, 256);
#endif
    int it = 0; // K/V tiles consumed so far (all tiles)
    for (u32 round = 0;; ++round) {
        named_sync(BAR_TILE + cons, TILE_HANDOFF_THREADS);
        const int tile = (int)ld_shared_u32(sm.tile_slot(round));
        if (tile < 0) {
#if PINGPONG
            if (cons == 0) named_sync(BAR_SCHED + 0, 256);
#endif
            break;
        }
        u32 *tr = ctid == 0 ? trace_row(w.trace, round, cons + 1) : nullptr;
        trace_start(tr, tile);
        trace_clock(tr, 4);
        mbar_wait(sm.q_full(), round & 1);
        trace_clock(tr, 5);
        const BlockCoords tc = block_coords(p, (unsigned)tile);
        const int row0 = block_row0(p, tc.m_block);
        const float coef = alibi_coef(p, tc.b, tc.h);
        const KeyTiles kt = key_tiles(p, row0);
        // Tiles run: n_blocks of them from kt.begin (relative index n below, tile nb + n).
        const int nb = kt.begin, n_blocks = kt.end - kt.begin;
        // The first row of this lane's accumulator rows (g and g + 8 follow).
        const int wrow = row0 + cons * 64 + warp * 16 + g;

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

        // O, then (ROWSUM_V) o[NO..NO+3]: every column of rows g and g + 8 the row's sum of P.
        float o[NPV / 2];
#pragma unroll
        for (int i = 0; i < NPV / 2; ++i) o[i] = 0.f;
        float s[NS];
        u32 pf[NS / 2];
        float row_max[2] = {neg_inf(), neg_inf()}, row_sum[2] = {0.f, 0.f}, alpha[2] = {1.f, 1.f};
        bool moved = false;

        auto gemm_s = [&](int stage) {
            const u32 sk = sm.k_stage(stage);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) wgmma_ss<BC, 0>(s, q_desc(sq_rows, kk), k_desc(sk, kk), kk > 0);
            wgmma_commit();
        };
        auto gemm_pv = [&](int stage) {
            const u32 sv = sm.v_stage(stage);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < PSTEPS; ++kk)
                wgmma_rs<NPV, 1>(o, pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3], v_desc(sv, kk), 1);
            wgmma_commit();
        };
        auto rescale_o = [&]() {
            if (vote_any(moved)) {
#pragma unroll
                for (int i = 0; i < NPV / 2; ++i) o[i] *= alpha[(i / 2) % 2];
            }
        };
        // Score modifiers, mask and online softmax of key tile n (absolute index) in s[];
        // leaves p = 2^(s*scale - m) in s[] and the rescale factor of O in alpha[]. Only the
        // tiles outside [kt.inner_begin, kt.inner_end) pay for the mask.
        auto softmax = [&](int n) {
            const int n0 = n * BC;
            constexpr bool MODS = HAS_SOFTCAP || HAS_ALIBI;
            const bool mask_tile = n < kt.inner_begin || n >= kt.inner_end;
            if (MODS || mask_tile) {
                // Row r of the block sees keys [lo_block + r, min(lim_block + r, seqlen_k)),
                // recomputed per tile from the parameters rather than held in registers.
                const int lim_block = key_hi(p, row0);
                const int lo_block = key_lo(p, row0);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int off = wrow + 8 * h - row0; // the row in the block
                    const int col0 = n0 + 2 * t;         // the lane's first key in the tile
                    // keys this row sees, counted from the lane's first key
                    const int hi = ((IS_CAUSAL || IS_LOCAL) ? min(lim_block + off, p.seqlen_k) : p.seqlen_k) - col0;
                    const int lo = IS_LOCAL ? lo_block + off - col0 : -(1 << 30);
                    const int center = wrow + 8 * h + diag - col0;
                    auto at = [&](int nt, int e) -> float & { return s[4 * nt + 2 * h + e]; };
                    if (mask_tile)
                        score_row<BC / 8, true>(p, at, lo, hi, center, coef);
                    else
                        score_row<BC / 8, false>(p, at, lo, hi, center, coef);
                }
            }
            // Both accumulator rows at once, so that ptxas can interleave their dependency
            // chains: the row maxima as trees, their quad shuffles side by side, and one
            // branch (for huge logits) around both rows' exponentials. (Row by row, with a
            // branch per row, the softmax ran as one serial chain: docs/perf-notes.md 33-34.)
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
            float m_use[2];
            moved = false;
            // SPEC_MAX: where every lane's own maximum (x scale) stays within the slack of its
            // row's running maximum, so does the row's (the quad's maximum of them), and the
            // exact path below would keep the running maxima: the warp keeps them without the
            // two shuffle rounds, their FMNMX and the rescale factor's ex2 (the same p bit for
            // bit). vote.all makes the choice the warp's, as the shuffles need.
            bool keep = SPEC_MAX;
            if (SPEC_MAX) {
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    keep = keep && row_max[h] > neg_inf() && fmul_rn(mx[h], p.scale_log2) <= row_max[h] + (float)RESCALE_SLACK;
                keep = vote_all(keep);
            }
            if (keep) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    m_use[h] = row_max[h];
                    alpha[h] = 1.f;
                }
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 1));
#pragma unroll
                for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 2));
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    m_use[h] = row_max_step<RESCALE_SLACK>(row_max[h], mx[h], p.scale_log2, alpha[h], moved);
            }
            // Two partial sums per row: shorter FADD chains.
            float sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
            // p = 2^(s*scale - m) in one FFMA per element. For the row's largest s this
            // leaves the rounding error of round(s_max*scale) = m (at most half an ulp of
            // m: below 1 while |m| < 2^22, so p <= 2^0.5; the lazy rescale already allows
            // 2^8), a factor common to the whole row. Larger |m| (logits near 1e7 and beyond)
            // take the exact two-step path, whose max element gives exactly 2^0. The choice is
            // per thread (its two rows), so the branch can diverge.
            const bool fused = fabsf(m_use[0]) < 4194304.f && fabsf(m_use[1]) < 4194304.f;
            // The exponentials of every score, by the formula of the path taken. (Both loops
            // stand inside one lambda: with the branch around two calls of a lambda that takes
            // the formula, or with no lambda, ptxas lays the branch out differently.)
            auto exps = [&]() {
                if (fused) {
#pragma unroll
                    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                const int i = 4 * nt + 2 * h + e;
                                s[i] = ex2(fmaf(s[i], p.scale_log2, -m_use[h]));
                                if (!ROWSUM_V) sum[h][e] += s[i];
                            }
                } else {
#pragma unroll
                    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
#pragma unroll
                            for (int e = 0; e < 2; ++e) {
                                const int i = 4 * nt + 2 * h + e;
                                s[i] = exp_scaled(s[i], p.scale_log2, m_use[h]);
                                if (!ROWSUM_V) sum[h][e] += s[i];
                            }
                }
            };
            exps();
            if (!ROWSUM_V) {
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    row_sum[h] = row_sum[h] * alpha[h] + (sum[h][0] + sum[h][1]); // per-lane partial; the quad sums it at the end
            }
        };
        // P into pf after the softmax: the A operand of P V.
        auto pack_p = [&]() {
#pragma unroll
            for (int r = 0; r < NS / 2; ++r) pf[r] = pack2(s[2 * r], s[2 * r + 1]);
        };
        auto stage_of = [&](int n) { return (it + n) % STAGES; };
        auto parity_of = [&](int n) { return (u32)((it + n) / STAGES) & 1; };

        // Key tiles this consumer runs: its own 64 rows' range inside the block's. The rest
        // of the block's tiles (under the causal mask, the last one where Bc is not a multiple
        // of 64 x consumers, or a window's first; every tile for a consumer whose rows all lie
        // past seqlen_q, or before row 0 in the causal shift of block_row0) would
        // hold only masked scores, p = 0: the same result without them, bit for bit for finite V
        // (an Inf or NaN in a key no row of ours sees no longer reaches o as 0 x Inf). A tile
        // passed is waited for and released (an early arrival would count toward the stage's
        // previous use) and takes its turn, so that the ring and the K/V stages stay in step.
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
        const int nc = nb + lead; // this consumer's first key tile
        // The timeline's key tiles are this consumer's (run 115's d64 causal timeline, traced
        // with the block's count, read unwritten entries past them).
        trace_put(tr, 1, (u32)n_mine);

        if (n_mine > 0) {
            // ---- prologue: S_0 and its softmax
            mbar_wait(sm.k_full(stage_of(0)), parity_of(0));
            trace_iter(tr, 0, 0);
            turn_wait();
            trace_iter(tr, 0, 1);
            gemm_s(stage_of(0));
            turn_pass();
            trace_iter(tr, 0, 2);
            wgmma_wait<0>();
            fence_regs(s);
            trace_iter(tr, 0, 3);
            release(sm.k_empty(stage_of(0)));
            // The tile's last S = Q K^T is complete: with its own O buffer, the Q tile is
            // free, and the next tile's Q loads under this softmax, the last P V and the
            // epilogue (released after them, it arrived late at 1k: docs/perf-notes.md 34).
            if (O_OWN && n_mine == 1) release(sm.q_empty());
            softmax(nc);
            pack_p();
            trace_iter(tr, 0, 4);
            // ---- main loop: S_n with P_{n-1} V_{n-1} in flight
            for (int n = 1; n < n_mine; ++n) {
                mbar_wait(sm.k_full(stage_of(n)), parity_of(n));
                trace_iter(tr, n, 0);
                turn_wait();
                trace_iter(tr, n, 1);
                gemm_s(stage_of(n));
                rescale_o(); // by the factor of tile n-1, while S_n runs
                mbar_wait(sm.v_full(stage_of(n - 1)), parity_of(n - 1));
                gemm_pv(stage_of(n - 1));
                turn_pass();
                trace_iter(tr, n, 2);
                wgmma_wait<1>(); // S_n done (P V_{n-1} is the one group left)
                fence_regs(s);
                trace_iter(tr, n, 3);
                release(sm.k_empty(stage_of(n)));
                if (O_OWN && n == n_mine - 1) release(sm.q_empty());
                softmax(nc + n);
                trace_iter(tr, n, 4);
                wgmma_wait<0>(); // P_{n-1} V_{n-1} done
                fence_regs(o);
                trace_iter(tr, n, 5);
                release(sm.v_empty(stage_of(n - 1)));
                pack_p();
            }
        }
        trace_clock(tr, 6);
        // A tile without key tiles frees its Q tile here.
        if (O_OWN && n_mine == 0) release(sm.q_empty());
        if (n_mine > 0) {
            // ---- tail: the last P V
            rescale_o();
            mbar_wait(sm.v_full(stage_of(n_mine - 1)), parity_of(n_mine - 1));
            gemm_pv(stage_of(n_mine - 1));
            wgmma_wait<0>();
            fence_regs(o);
            release(sm.v_empty(stage_of(n_mine - 1)));
        }
        trace_clock(tr, 7);
        it += n_mine;
        pass_tiles(n_blocks - lead - n_mine);
        if (!has_rows) {
            // No row to store (TMA would drop every one); the Q tile holds nothing of ours.
            if (!O_OWN && ctid == 0) mbar_arrive(sm.q_empty());
            continue;
        }

        // ---- epilogue: O / row_sum staged as TMA expects (128-byte swizzle), TMA store.
        // The tile's coordinates are recomputed here rather than held through the loop.
        const BlockCoords bc = block_coords(p, (unsigned)tile);
        float inv[2], l[2];
        if (ROWSUM_V) {
            // The sums of the same 16-bit P that multiplied V, over every key.
            l[0] = o[NO];
            l[1] = o[NO + 2];
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) l[h] = row_sum[h] + shfl_xor(row_sum[h], 1);
#pragma unroll
            for (int h = 0; h < 2; ++h) l[h] += shfl_xor(l[h], 2);
        }
#if HAS_SINK
        // The sink joins each row's sum (softmax.cuh sink_fold): row_max and l become the
        // sink-aware ones (lse below follows), O scales by o_scale / l.
        float o_scale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) o_scale[h] = sink_fold(row_max[h], l[h], sink_log2(sink, bc.h));
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) inv[h] = row_inv(l[h]);
#if HAS_SINK
#pragma unroll
        for (int h = 0; h < 2; ++h) inv[h] *= o_scale[h];
#endif
        if (O_OWN) {
            // The previous tile's store must have read the staging tile before it is rewritten.
            if (ctid == 0) bulk_wait_read0();
            named_sync(BAR_EPI + cons, 128);
        }
        {
            // Lane coordinates re-read from %tid: the compiler would otherwise hoist the NO/2
            // staging addresses out of the tile loop and keep them live (spilled at d256).
            const int etid = (int)fresh_tid_x() % 128, ew = etid / 32, eg = (etid % 32) / 4, et = etid % 4;
            // Accumulator i sits at row r = 16 ew + eg + 8h (h = (i/2) % 2) and channels
            // c = 8j + 2et, 8j + 2et + 1 (j = i/4): sub-tile j/8, 16-byte chunk j%8, bytes 4et
            // into it. The swizzle XORs the chunk with r % 8, which is eg for both rows, so the
            // address is a per-lane base, a per-chunk XOR and a constant (folded into the
            // store's offset): a few integer operations for all NO/2 stores.
            const u32 base = so_rows + (u32)(ew * 16 + eg) * 128 + (u32)et * 4;
            const u32 swz = (u32)eg * 16;
#pragma unroll
            for (int i = 0; i < NO; i += 2) {
                const int h = (i / 2) % 2, j = i / 4;
                const u32 addr = base + (((u32)(j % 8) * 16) ^ swz) + (u32)(h * 8 * 128) + (u32)(j / 8) * SUB_Q;
                st_shared_u32(addr, pack2(o[i] * inv[h], o[i + 1] * inv[h]));
            }
        }
        fence_proxy_async();
        named_sync(BAR_EPI + cons, 128);
        if (ctid == 0) {
#pragma unroll
            for (int j = 0; j < NSUB; ++j) tma_store_4d(w.to, so_rows + j * SUB_Q, 64 * j, row0 + cons * 64, bc.h, bc.b);
            bulk_commit();
            trace_clock(tr, 8);
            if (!O_OWN) {
                // O sits in the Q tile: free it for the next tile's Q once the store has read it.
                bulk_wait_read0();
                mbar_arrive(sm.q_empty());
            }
        }
        // lse after the store is issued, so that its global writes are not outstanding at the
        // proxy fence above (compiled to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S; measured level).
        float *lse = p.lse + lse_offset(p, bc.b, bc.h, 0);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = wrow + 8 * h;
            if (t == 0 && row < p.seqlen_q) lse[row] = row_lse(row_max[h], l[h]);
        }
    }
    if (ctid == 0) bulk_wait_read0(); // the last store has read shared memory before exit
}

// The kernel wires the roles: shared memory and barriers, then the producer and the consumers.
// Persistent: block b runs tile b first, then the tiles tile_scheduler.cuh's next_tile hands it
// (with DYNAMIC from an atomic counter), in block_coords' order (causal: longest first;
// non-causal head-major: the resident blocks share K/V in L2). The launcher sizes the grid to
// the SMs (or to the tile count for a one-tile-per-block launch).
extern "C" __global__ void __launch_bounds__(NT, 1) attn_wgmma(const __grid_constant__ WgmmaParams w SINK_PARAM) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    Smem sm;
    sm.q = (smem_u32(smem_raw) + 1023u) & ~1023u;
    sm.k = sm.q + Q_BYTES;
    sm.v = sm.k + STAGES * KV_BYTES;
    sm.o = O_OWN ? sm.v + STAGES * V_STAGE_BYTES : sm.q;
    sm.bars = sm.q + CORE_BYTES + (O_OWN ? Q_BYTES : 0);

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
            mbar_init(sm.k_empty(s), NCONS * 4); // one arrival per consumer warp
            mbar_init(sm.v_empty(s), NCONS * 4);
        }
        fence_mbar_init();
    }
    if (ROWSUM_V && tid >= 128) {
        // The ones sub-tile of every V stage (TMA never writes it), by the consumers.
#if IS_BF16
        constexpr u32 ONE_PAIR = 0x3F803F80u; // bf16 1.0, twice
#else
        constexpr u32 ONE_PAIR = 0x3C003C00u; // f16 1.0, twice
#endif
        for (u32 i = 4 * (u32)(tid - 128); i < STAGES * SUB_KV; i += 4 * (NT - 128))
            st_shared_u32(sm.v + (i / SUB_KV) * V_STAGE_BYTES + NSUB * SUB_KV + i % SUB_KV, ONE_PAIR);
        fence_proxy_async(); // written by the generic proxy, read by wgmma (the async proxy)
    }
    __syncthreads();

    // The roles: the producer warpgroup (one thread issues every copy), then the consumers.
    if (wg == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (tid == 0) producer(w, sm, tiles);
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
    consumer(w, sm, tid, wg, SINK_LOGITS);
}
