// attn_bwd_wgmma.cu: FlashAttention backward for Hopper (sm_90a) with wgmma and TMA, in the
// structure of FlashAttention-3's backward (Shah et al. 2024): P is recomputed from q, k and
// the forward's lse, never stored. The D = rowsum(dO O) and dQ-conversion kernels are
// bwd_common.cuh's; src/cuda/backward_wgmma.rs launches this kernel between them.
//
// One block per (key block of BC = 128 keys, kv head, batch), three warpgroups:
// - warpgroup 0, the producer: one warp; lane 0 loads K and V of the block once, then the Q
//   and dO tiles of each step (BR = 64 or 128 query rows of one query head) by TMA into a ring of
//   STAGES stages; its 32 lanes copy the step's lse (times log2 e) and D beside them. A stage
//   is "full" when the bytes have landed and the 32 lanes have arrived, "empty" when every
//   consumer warp has arrived after its last read of it.
// - warpgroups 1 and 2, the consumers: 64 keys each (the M side of every product), with dK
//   and dV of their keys in registers across every step of every query head of the group
//   (GQA sums inside the block). Per step:
//     S^T  = K Q^T      wgmma m64 nBR, A = K rows, B = Q rows, both K-major from shared memory
//     dP^T = V dO^T     the same with V and dO
//     P^T  = 2^(S^T scale_log2 - lse log2 e), masked (rows_of_key); dS^T = P^T (dP^T - D)
//     dV  += P^T dO     A = P^T from registers (the forward's P), B = dO MN-major (the forward's V)
//     dK  += dS^T Q     the same with dS^T and Q
//     dQ   = dS K       dS^T goes to shared memory transposed by stmatrix.trans (dS: BR rows x
//                       128 keys, K-major, the 128-byte swizzle); after a barrier of both consumers, consumer c
//                       computes channels [c DP/2, (c+1) DP/2) of dQ over all 128 keys
//                       (A = dS, B = K MN-major), stages them as an f32 tile in shared memory
//                       and adds it to the f32 workspace with one bulk reduction: the
//                       workspace is laid out tile by tile (dq_tile_index), so that the
//                       tile is one contiguous run; attn_bwd_dq_tiled turns it back.
//   dQ is issued before dK, so that its staging runs while dK's products do (FA3's order).
// - warps 1 and 2 of warpgroup 0, the dQ writers: writer c issues consumer c's bulk
//   reduction once the tile is staged (named barrier "full"), and frees the tile once the
//   copy engine has read it ("empty"), so that the consumer never waits on the reduction. In
//   the DETERMINISTIC mode the writer first waits until the key blocks above this one that
//   visit the step have added theirs (a counter per dQ tile), and counts itself once its
//   reduction is complete: the tiles are added in descending key-block order, the same bytes
//   every run.
//   dS^T has two buffers: a consumer writes step s+1's only after the barrier of step s, which
//   both passed after their dQ products of step s-1 (the last reads of that buffer).
// Layouts: shared tiles are TMA boxes of 64 channels x rows, 128-byte swizzled (hopper.cuh);
// accumulator i of a lane: row 16 warp + g + 8((i/2)%2), column 8(i/4) + 2t + i%2; the A
// fragment of k-step kk from an accumulator is {pack(a[8kk], a[8kk+1]), ..., pack(a[8kk+6],
// a[8kk+7])}: both proven by kernels/probe/wgmma_probe.cu and used by attn_wgmma.cu.
//
// BWD_PERSISTENT: min(tiles, SMs) blocks, block i taking the tiles (the non-persistent
// block indices: key block, kv head, batch) i, then those an atomic counter hands out. The stage ring,
// the dS buffers and the dQ writers' hand-offs run on across tiles (a running step count
// gs); kv_full and a kv_empty mbarrier complete once per tile: the consumers arrive on
// kv_empty after the last step's dQ (the last wgmma that reads K; V's is dP^T), and the
// producer, having already queued the next tile's first Q/dO stage, loads its K and V while
// the consumers finish dK and store dK and dV.
//
// Specialised at NVRTC time by HEAD_DIM (the real head_dim: 64, or 72..128 padded to 128 by
// TMA's zero fill), BWD_BR (rows per step), STAGES, IS_BF16, IS_CAUSAL, IS_LOCAL (attn_common.cuh's key range),
// CONSUMER_REGS, PRODUCER_REGS, DETERMINISTIC, BWD_PERSISTENT, HAS_SOFTCAP and HAS_ALIBI (the
// forward's score modifiers, applied to S^T before P^T as attn_bwd.cu applies them: a softcap's
// derivative 1 - tanh^2 goes into the 16-bit P that dS^T is formed from; ALiBi's bias is
// constant, dS passes through). Without them the kernel carries none of their code (the same
// SASS). Varlen and head_dim 256 stay on attn_bwd.cu (the host routes them there).
#include "ptx.cuh"
#include "attn_common.cuh"
#include "hopper.cuh"
#include "bwd_common.cuh"
#if IS_BF16
#define WG_AB "bf16"
#else
#define WG_AB "f16"
#endif
#include "wgmma_ops.cuh"
static_assert(!IS_VARLEN, "attn_bwd_wgmma: no varlen");

#ifndef STAGES
#define STAGES 2
#endif
#ifndef CONSUMER_REGS
#define CONSUMER_REGS 232
#endif
#ifndef PRODUCER_REGS
#define PRODUCER_REGS 40
#endif
#ifndef BWD_BR
#define BWD_BR 64
#endif
#ifndef DETERMINISTIC
#define DETERMINISTIC 0
#endif
#ifndef BWD_PERSISTENT
#define BWD_PERSISTENT 0
#endif


// ---- geometry -------------------------------------------------------------------------------
constexpr int DP = D <= 64 ? 64 : 128;  // padded head_dim: one or two 64-channel boxes
constexpr int NSUB = DP / 64;
constexpr int BC = 128;                 // keys per block: 64 per consumer
constexpr int BR = BWD_BR;              // query rows per step: 64, or 128 (two m64 halves of dQ)
constexpr int MH = BR / 64;
constexpr int NT = 384;                 // producer + two consumers
constexpr u32 SUB_K = BC * 128;         // one 64-channel box of K or V
constexpr u32 SUB_Q = BR * 128;         // one 64-channel box of Q or dO; one 64-key box of dS
constexpr u32 KV_BYTES = NSUB * SUB_K;
constexpr u32 Q_BYTES = NSUB * SUB_Q;
constexpr u32 DS_BYTES = 2 * SUB_Q;     // dS: 64 rows x 128 keys
constexpr int HALF = DP / 2;            // dQ channels per consumer
constexpr u32 DQ_HALF_BYTES = BR * HALF * 4; // one consumer's dQ tile (f32)
constexpr int KSTEPS = DP / 16;         // k-steps of S^T and dP^T (channels)
constexpr int RSTEPS = BR / 16;         // k-steps of dV and dK (query rows)
constexpr int QSTEPS = BC / 16;         // k-steps of dQ (keys)
constexpr int NSC = BR / 2;             // S^T (and dP^T) accumulators per thread
constexpr int NACC = DP / 2;            // dK (and dV) accumulators per thread
constexpr int NQ = DP / 4;              // dQ accumulators per thread (DP/2 channels)
static_assert(D % 8 == 0 && (D == 64 || (D >= 72 && D <= 128)), "HEAD_DIM 64 or 72..128");
static_assert(STAGES >= 2 && STAGES <= 4, "STAGES in 2..4");
static_assert(BR == 64 || BR == 128, "BWD_BR is 64 or 128");
static_assert(D > DP / 2, "both consumers' dQ halves hold real channels (every tile is added)");
static_assert((2 * CONSUMER_REGS + PRODUCER_REGS) * 128 <= (65536 / NT / 8 * 8) * NT,
              "setmaxnreg targets exceed the block's register pool");

// Named barriers (0 is __syncthreads, used only before the roles split).
constexpr u32 BAR_DS = 1;               // both consumers: dS of the step written
constexpr u32 BAR_DQ_FULL = 2;          // + c: consumer c's dQ tile staged (c's 128 + writer)
constexpr u32 BAR_DQ_EMPTY = 4;         // + c: its reduction has read the tile
constexpr u32 DQ_BAR_THREADS = 128 + 32;

// Shared memory from a 1024-byte-aligned base (swizzle atoms): K | V | Q stages | dO stages |
// dS x2 | dQ staging (f32) | lse, D stages (f32) | mbarriers | the dQ hand-off words. src/cuda/backward_wgmma.rs
// sizes it the same way (smem_bytes).
constexpr u32 OFF_K = 0;
constexpr u32 OFF_V = OFF_K + KV_BYTES;
constexpr u32 OFF_Q = OFF_V + KV_BYTES;
constexpr u32 OFF_DO = OFF_Q + STAGES * Q_BYTES;
constexpr u32 OFF_DS = OFF_DO + STAGES * Q_BYTES;
constexpr u32 OFF_DQ = OFF_DS + 2 * DS_BYTES;
constexpr u32 OFF_L = OFF_DQ + 2 * DQ_HALF_BYTES;
constexpr u32 OFF_D = OFF_L + STAGES * BR * 4;
constexpr u32 OFF_BARS = OFF_D + STAGES * BR * 4;
// mbarriers: kv_full, full and empty per stage, kv_empty (BWD_PERSISTENT). (No constant of
// their own: every namespace constant is a global of the module, and the default's CUBIN
// stays the bytes it was.)
constexpr u32 OFF_HAND = OFF_BARS + 8 * (1 + 2 * STAGES + BWD_PERSISTENT); // per consumer: tile number, ahead
constexpr u32 SMEM_BYTES = OFF_HAND + 16 + 16 * BWD_PERSISTENT + 1024; // + the tile word, alignment slack

// The dQ workspace, tile by tile: for (batch b, query head h, step of rows m, consumer half)
// a contiguous [BR rows][HALF channels] f32 tile, channel c of row r at c ^ swz(r) (the
// staging tile's layout, copied as it is: float2 stores of a warp's 8 rows then hit every
// bank). Rows past seqlen_q and channels past head_dim hold zeros (dS and K are zero there).
FA_DEVICE int swz(int r) { return (r & 3) << 3; }
FA_DEVICE i64 dq_tile_index(const Params &p, int b, int h, int m, int half) {
    const int m_blocks = (p.seqlen_q + BR - 1) / BR;
    return ((((i64)b * p.heads_q + h) * m_blocks + m) * 2 + half) * (BR * HALF);
}

struct BwdWgmmaParams {
    TmaMap tq;  // q: dims (head_dim, seqlen_q, heads_q, batch), box (64, BR, 1, 1)
    TmaMap tk;  // k: dims (head_dim, seqlen_k, heads_kv, batch), box (64, BC, 1, 1)
    TmaMap tv;  // v: as k
    TmaMap tdo; // do: as q
    BwdParams bp;
};

struct Smem {
    u32 base;
    FA_DEVICE u32 k() const { return base + OFF_K; }
    FA_DEVICE u32 v() const { return base + OFF_V; }
    FA_DEVICE u32 q(int s) const { return base + OFF_Q + (u32)s * Q_BYTES; }
    FA_DEVICE u32 d_o(int s) const { return base + OFF_DO + (u32)s * Q_BYTES; }
    FA_DEVICE u32 ds(int b) const { return base + OFF_DS + (u32)b * DS_BYTES; }
    FA_DEVICE u32 dq() const { return base + OFF_DQ; }
    FA_DEVICE u32 lse(int s) const { return base + OFF_L + (u32)s * BR * 4; }
    FA_DEVICE u32 dsum(int s) const { return base + OFF_D + (u32)s * BR * 4; }
    FA_DEVICE u32 kv_full() const { return base + OFF_BARS; }
    FA_DEVICE u32 full(int s) const { return base + OFF_BARS + 8 * (1 + s); }
    FA_DEVICE u32 empty(int s) const { return base + OFF_BARS + 8 * (1 + STAGES + s); }
    FA_DEVICE u32 kv_empty() const { return base + OFF_BARS + 8 * (1 + 2 * STAGES); } // BWD_PERSISTENT
    FA_DEVICE u32 hand(int c) const { return base + OFF_HAND + 4 * (u32)c; }
    FA_DEVICE u32 tile_word() const { return base + OFF_HAND + 16; } // BWD_PERSISTENT
};

// x, through an empty asm the compiler cannot see into: a value made from it inside the step
// loop cannot be hoisted out (ptxas otherwise keeps loop-invariant descriptors and addresses
// live across the loop, and spills at head_dim 128).
FA_DEVICE u32 in_loop(u32 x) {
    asm volatile("" : "+r"(x));
    return x;
}

// wgmma descriptors (hopper.cuh make_desc) of the 128-byte-swizzled boxes as a low word made
// once per operand and step, plus each k-step's byte offset / 16: the start address field
// (bits 0-13 of the low word, address / 16) cannot carry into the LBO field above it, as every
// shared address is below 256 KB. The high word (SBO 1024, SWIZZLE_128B) is a constant. Saves
// the mask, shift and or of every descriptor (32 a step).
constexpr u32 DESC_HI_SW128 = (1024u >> 4) | ((u32)SWIZZLE_128B << 30);
FA_DEVICE u32 desc_lo(u32 addr, u32 lbo_bytes) { return ((addr & 0x3FFFF) >> 4) | ((lbo_bytes >> 4) << 16); }
FA_DEVICE u64 desc_at(u32 lo, u32 off_bytes) { return ((u64)DESC_HI_SW128 << 32) | (u64)(lo + (off_bytes >> 4)); }
// The k-step offsets of desc_kmajor_sw128 and desc_mnmajor_sw128 (hopper.cuh).
FA_DEVICE constexpr u32 kmajor_off(int kk, u32 sub_bytes) { return (u32)(kk / 4) * sub_bytes + (u32)(kk % 4) * 32; }
FA_DEVICE constexpr u32 mnmajor_off(int kk) { return (u32)kk * 16 * 128; }

// ================================ producer =================================================
// The producer warp (the first of warpgroup 0): K and V of the key block once, then each
// step's Q and dO (lane 0, TMA) and its rows' lse and D (every lane) into the stage ring,
// each behind the consumers' release of the stage.

// Lane 0: K and V of the key block into their buffers, completing kv_full.
FA_DEVICE void load_kv(const BwdWgmmaParams &w, const Smem &sm, const KeyBlock<BR, BC> &kb) {
    mbar_arrive_expect_tx(sm.kv_full(), 2 * KV_BYTES);
#pragma unroll
    for (int j = 0; j < NSUB; ++j) {
        tma_load_4d(sm.k() + j * SUB_K, w.tk, sm.kv_full(), 64 * j, kb.key0, kb.hk, kb.b);
        tma_load_4d(sm.v() + j * SUB_K, w.tv, sm.kv_full(), 64 * j, kb.key0, kb.hk, kb.b);
    }
}

// Step s of the key block (batch b) into stage `stage` of the ring, its use number `use`
// (the block's step gs: stage gs % STAGES, use gs / STAGES; gs = s but in a persistent block,
// whose ring runs on across its tiles): Q and dO (lane 0), lse and D (every lane), once the
// consumers have released the stage's previous use.
FA_DEVICE void load_step(const BwdWgmmaParams &w, const Smem &sm, const KeyBlock<BR, BC> &kb, int b, int s, int stage, int use,
                          int lane) {
    const BwdParams &bp = w.bp;
    const Params &p = bp.p;
    if (use > 0) mbar_wait(sm.empty(stage), (u32)(use - 1) & 1);
    const int h = kb.head_of(p, s), row0 = kb.row0_of(s);
    if (lane == 0) {
        mbar_arrive_expect_tx(sm.full(stage), 2 * Q_BYTES);
#pragma unroll
        for (int j = 0; j < NSUB; ++j) {
            tma_load_4d(sm.q(stage) + j * SUB_Q, w.tq, sm.full(stage), 64 * j, row0, h, b);
            tma_load_4d(sm.d_o(stage) + j * SUB_Q, w.tdo, sm.full(stage), 64 * j, row0, h, b);
        }
    }
    // lse in log2 units and D of the step's rows (rows past the end: 0, and masked).
    // Ordinary stores after the empty mbarrier's wait: each consumer warp's lane 0
    // arrives on it after the warp's reads of this stage (release / acquire).
    // compute-sanitizer's racecheck does not model mbarriers: its `hazard` report mode
    // lists these stores as WAR hazards; the default `analysis` mode reports none
    // (docs/perf-notes.md 40).
    // (b and lane through in_loop: hoisted out of the step loop, their products spill
    // from the warpgroup's 24 registers.)
    const i64 at = lse_offset(p, (int)in_loop((u32)b), h, 0);
    for (int r = (int)in_loop((u32)lane); r < BR; r += 32) {
        const bool ok = row0 + r < p.seqlen_q;
        st_shared_u32(sm.lse(stage) + r * 4, __float_as_uint(ok ? p.lse[at + row0 + r] * LOG2E : 0.f));
        st_shared_u32(sm.dsum(stage) + r * 4, __float_as_uint(ok ? bp.dsum[at + row0 + r] : 0.f));
    }
    mbar_arrive(sm.full(stage));
}

#if !BWD_PERSISTENT
FA_DEVICE void producer(const BwdWgmmaParams &w, const Smem &sm, const KeyBlock<BR, BC> &kb, int tid) {
    const int b = kb.b;
    const int lane = tid;
    if (lane == 0) {
        tma_prefetch(w.tq);
        tma_prefetch(w.tdo);
        load_kv(w, sm, kb);
    }
    for (int s = 0; s < kb.steps; ++s) load_step(w, sm, kb, b, s, s % STAGES, s / STAGES, lane);
}
#else
// Persistent: block i takes tile i first, then the tiles an atomic counter hands out
// (gridDim.x + its count: FA3's dynamic scheduler; blocks that drew short causal tiles take
// more, and the tiles run in about the order the one-block-per-tile grid runs them, the key
// blocks of a head side by side: their Q and dO shared in L2). The counter is the word after
// the deterministic mode's counters in dq_order (zeroed by the host every call). Each block's
// tiles increase. The stage ring's count gs runs on across them. Tile j's number goes to the
// consumers in tile_word, ahead of kv_full's phase j (its K and V: loaded after its first
// step's Q and dO, whose stage tile j - 1 released a step earlier, and after the consumers'
// arrival on kv_empty, their last wgmma that reads tile j - 1's K and V: they land while the
// consumers finish tile j - 1, its last dK, the dK and dV stores). A number past the last
// tile completes kv_full without a load and ends the block. kv_full and kv_empty complete once
// per tile (a tile without steps loads its K and V too: rare, and the phases stay one per
// tile).
FA_DEVICE u32 *tile_counter(const BwdParams &bp) {
    const Params &p = bp.p;
    const i64 det = DETERMINISTIC ? (i64)p.batch * p.heads_q * ((p.seqlen_q + BR - 1) / BR) * 2 : 0;
    return (u32 *)(bp.dq_order + det);
}

// Lane 0: tile j's number to the consumers, once they have released tile j - 1's K and V;
// then its K and V, unless past the last tile (then kv_full completes without a load).
FA_DEVICE void next_kv(const BwdWgmmaParams &w, const Smem &sm, const KeyBlock<BR, BC> *kb, u32 j, u32 tile) {
    if (j > 0) mbar_wait(sm.kv_empty(), (j - 1) & 1);
    st_shared_u32(sm.tile_word(), tile);
    if (kb) load_kv(w, sm, *kb);
    else mbar_arrive(sm.kv_full());
}

FA_DEVICE void producer(const BwdWgmmaParams &w, const Smem &sm, int tid) {
    const BwdParams &bp = w.bp;
    const int lane = tid;
    if (lane == 0) {
        tma_prefetch(w.tq);
        tma_prefetch(w.tdo);
    }
    const u32 tiles = (u32)(bp.num_k_blocks * bp.heads_kv * bp.p.batch); // < 2^31 (the host)
    u32 tile = blockIdx.x;
    int gs = 0;
#pragma unroll 1
    for (u32 j = 0;; ++j) {
        if (tile >= tiles) {
            if (lane == 0) next_kv(w, sm, nullptr, j, tile);
            break;
        }
        const KeyBlock<BR, BC> kb(bp, DETERMINISTIC, tile);
        // (The first step peeled: the K/V load's operands are not live in the step loop.)
        if (kb.steps > 0) load_step(w, sm, kb, kb.b, 0, gs % STAGES, gs / STAGES, lane);
        if (lane == 0) next_kv(w, sm, &kb, j, tile);
        for (int s = 1; s < kb.steps; ++s) load_step(w, sm, kb, kb.b, s, (gs + s) % STAGES, (gs + s) / STAGES, lane);
        gs += kb.steps;
        const u32 drawn = lane == 0 ? atomicAdd(tile_counter(bp), 1u) : 0u;
        tile = gridDim.x + __shfl_sync(0xffffffffu, drawn, 0);
    }
}
#endif

// ================================ dQ writers ===============================================
// Writer warp `cons` (warp 1 + cons of warpgroup 0): each dQ tile of consumer cons, once
// staged, added to the workspace tile whose number (dq_tile_index / tile size) the consumer
// left in hand(cons), by one bulk reduction; the staging tile is released once read
// (DETERMINISTIC: once the reduction is complete and counted). Number -1 ends the block.
// The consumer computes the number: the producer warpgroup runs on 24 registers.
FA_DEVICE void dq_writer(const BwdWgmmaParams &w, const Smem &sm, int cons, int lane) {
    const BwdParams &bp = w.bp;
    const u32 sdq = sm.dq() + (u32)cons * DQ_HALF_BYTES;
#pragma unroll 1
    for (;;) {
        named_sync(BAR_DQ_FULL + cons, DQ_BAR_THREADS);
        const int tile = (int)ld_shared_u32(sm.hand(cons));
        if (tile < 0) break;
        if (lane == 0) {
#if DETERMINISTIC
            // One counter per dQ tile: the key blocks n + 1 .. n_last that visit its step of
            // rows add theirs before this block (the consumer's tile number carries ahead =
            // n_last - n in its own word, below).
            int *order = bp.dq_order + tile;
            const int ahead = (int)ld_shared_u32(sm.hand(2 + cons));
            while (ld_acquire_gpu(order) != ahead) {
            }
            // The acquired count (generic proxy) before the reduction (async proxy).
            fence_proxy_async_global();
#endif
            bulk_reduce_add_f32(bp.dq_accum + (i64)tile * (BR * HALF), sdq, DQ_HALF_BYTES);
            bulk_commit();
#if DETERMINISTIC
            bulk_wait0();
            fence_proxy_async_global();
            red_release_gpu_add(order, 1);
#else
            bulk_wait_read0();
#endif
        }
        __syncwarp();
        named_arrive(BAR_DQ_EMPTY + cons, DQ_BAR_THREADS);
    }
    if (lane == 0) bulk_wait0();
}

// ================================ consumers ================================================
// The end of the block for consumer cons's writer: the last dQ tile read, then number -1.
FA_DEVICE void end_dq_writer(const Smem &sm, int cons, int ctid, bool any_steps) {
    if (any_steps) named_sync(BAR_DQ_EMPTY + cons, DQ_BAR_THREADS);
    if (ctid == 0) st_shared_u32(sm.hand(cons), 0xffffffffu);
    named_arrive(BAR_DQ_FULL + cons, DQ_BAR_THREADS);
}

// A consumer warpgroup (64 keys of the block): over the steps, S^T and dP^T, P^T and dS^T,
// dV += P^T dO and dK += dS^T Q, dQ += dS K into the dQ tiles; then dK and dV out.
// gs0: the block's steps before this key block's (the stage ring's and the dS buffers' count,
// the dQ writer's hand-offs); j: its tiles before this one (kv_full's phase). Both 0 but in a
// persistent block.
FA_DEVICE void consumer_tile(const BwdWgmmaParams &w, const Smem &sm, const KeyBlock<BR, BC> &kb, int tid, int wg, int gs0,
                             u32 j) {
    const BwdParams &bp = w.bp;
    const Params &p = bp.p;
    const int hk = kb.hk, b = kb.b, key0 = kb.key0;
    const int steps = kb.steps;
    const auto head_of = [&](int s) { return kb.head_of(p, s); };
    const auto row0_of = [&](int s) { return kb.row0_of(s); };
    const int diag = kb.diag;
    const int cons = wg - 1;          // keys 64 cons .. 64 cons + 63 of the block
    const int ctid = tid - 128 * wg;
    const int warp = ctid / 32, lane = ctid % 32;
    const int g = lane / 4, t = lane % 4;
    const u32 sk_rows = sm.k() + (u32)cons * 64 * 128; // this consumer's keys in each K box
    const u32 sv_rows = sm.v() + (u32)cons * 64 * 128;
    const int c0 = cons * (DP / 2);   // this consumer's dQ channels: [c0, c0 + DP/2)
    // B of dQ = dS K: K MN-major from channel c0 (a whole box at DP 128, half a box at 64:
    // the swizzle is a function of the address, as for the K-major k-steps inside a box).
    const u32 sk_cols = sm.k() + (u32)(c0 / 64) * SUB_K + (u32)(c0 % 64) * 2;
    // The lane's two keys (accumulator rows g and g + 8 of its warp).
    const int kw = key0 + cons * 64 + warp * 16 + g;

    float dk[NACC], dv[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) dk[i] = dv[i] = 0.f;

    mbar_wait(sm.kv_full(), j & 1);
    for (int s = 0; s < steps; ++s) {
        const int gs = gs0 + s;
        const int stage = gs % STAGES;
        const int h = head_of(s), row0 = row0_of(s);
#if HAS_ALIBI
        // The slope's load issued before the stage's wait and the products (S's units).
        const float coef = alibi_coef(p, b, h);
#endif
        mbar_wait(sm.full(stage), (u32)(gs / STAGES) & 1);
        const u32 sq = sm.q(stage), sdo = sm.d_o(stage);
        // Descriptor low words (K-major: LBO 16; MN-major: LBO = the next 64 columns).
        const u32 k_lo = in_loop(desc_lo(sk_rows, 16)), v_lo = in_loop(desc_lo(sv_rows, 16));
        const u32 q_lo = desc_lo(sq, 16), do_lo = desc_lo(sdo, 16);

        // S^T = K Q^T and dP^T = V dO^T, two groups.
        float st[NSC], dpt[NSC];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk)
            wgmma_ss<BR, 0>(st, desc_at(k_lo, kmajor_off(kk, SUB_K)), desc_at(q_lo, kmajor_off(kk, SUB_Q)), kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk)
            wgmma_ss<BR, 0>(dpt, desc_at(v_lo, kmajor_off(kk, SUB_K)), desc_at(do_lo, kmajor_off(kk, SUB_Q)), kk > 0);
        wgmma_commit();

        // P^T while dP^T runs: element i is key kw + 8((i/2)%2), row row0 + 8(i/4) + 2t + i%2.
        wgmma_wait<1>();
        fence_regs(st);
        int rmin[2], rmax[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) rows_of_key(p, diag, kw + 8 * r, row0, rmin[r], rmax[r]);
        const u32 sl = sm.lse(stage), sd = sm.dsum(stage);
        const float scale_log2 = p.scale_log2;
        // Steps where every row sees both of every lane's keys (most, without a mask) skip the
        // per-element test.
        const bool all_seen = !vote_any(rmin[0] > 0 || rmin[1] > 0 || rmax[0] < BR - 1 || rmax[1] < BR - 1);
#if HAS_ALIBI
        // i + diag - j of the lane's first row and key; element i is 8(i/4) + i%2 rows and
        // 8((i/2)%2) keys on (exact in f32 below 2^24, as the forward's score_row).
        const float center = (float)((i64)row0 + 2 * t + diag - kw);
#endif
#if HAS_SOFTCAP
        // P (1 - tanh^2), what dS^T is formed from (the softcap's derivative, src/scores.rs
        // score_grad), waits in this warp's own cells of the step's dS tile, which it
        // overwrites later in the step (stmatrix below): in registers, it spilled. Lane
        // 8q + 2i + e keeps pairs 4c .. 4c + 3 as 16 bytes in row 16c + 8(q/2) + 2i + q%2,
        // chunk 2 warp + e of the row's keys (swizzled): a quarter-warp's 8 stores hit the 8
        // chunk positions of 128 bytes, no bank conflict.
        const u32 sg_at = [&] {
            const int q = lane / 8, i2 = (lane / 2) % 4, e = lane % 2;
            const u32 row = (u32)(8 * (q / 2) + 2 * i2 + q % 2);
            return sm.ds(gs & 1) + (u32)cons * SUB_Q + row * 128 + ((((u32)(2 * warp + e)) ^ (row % 8)) * 16);
        }();
        u32 sg[4];
#endif
#pragma unroll
        for (int i = 0; i < NSC; i += 2) {
            const int rl = 8 * (i / 4) + 2 * t, r = (i / 2) % 2;
            float l0, l1; // lse of rows rl, rl + 1 (log2 units)
            ld_shared_f32x2(sl + rl * 4, l0, l1);
            if (!all_seen) {
                // An unseen element gets lse +inf: P = 2^-inf = 0 (S is finite: never NaN).
                l0 = rl >= rmin[r] && rl <= rmax[r] ? l0 : __int_as_float(0x7f800000);
                l1 = rl + 1 >= rmin[r] && rl + 1 <= rmax[r] ? l1 : __int_as_float(0x7f800000);
            }
#if HAS_SOFTCAP
            // S^T = softcap tanh(S^T / softcap), in scale_log2's units (attn_common.cuh's
            // score_row).
            const float tc0 = tanh_exp2(st[i] * p.softcap_pre), tc1 = tanh_exp2(st[i + 1] * p.softcap_pre);
            st[i] = tc0;
            st[i + 1] = tc1;
#endif
#if HAS_ALIBI
            const float at = center + (float)(8 * (i / 4) - 8 * r);
            st[i] -= coef * fabsf(at);
            st[i + 1] -= coef * fabsf(at + 1.f);
#endif
            st[i] = ex2(fmaf(st[i], scale_log2, -l0));
            st[i + 1] = ex2(fmaf(st[i + 1], scale_log2, -l1));
#if HAS_SOFTCAP
            sg[(i / 2) % 4] = pack2(st[i] * (1.f - tc0 * tc0), st[i + 1] * (1.f - tc1 * tc1));
            if ((i / 2) % 4 == 3) st_shared_v4(sg_at + (u32)(i / 8) * 2048, sg[0], sg[1], sg[2], sg[3]);
#endif
        }
        u32 pf[NSC / 2];
#pragma unroll
        for (int r = 0; r < NSC / 2; ++r) pf[r] = pack2(st[2 * r], st[2 * r + 1]);
#if !HAS_SOFTCAP
        // dS reads P from a copy: the registers of a running wgmma's A operand may not be
        // accessed before the wait_group that covers it (PTX ISA, wgmma.wait_group).
        u32 pd[NSC / 2];
#pragma unroll
        for (int r = 0; r < NSC / 2; ++r) pd[r] = in_loop(pf[r]);
#endif
        wgmma_wait<0>();
        fence_regs(dpt);

        // dV += P^T dO
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < RSTEPS; ++kk)
            wgmma_rs<DP, 1>(dv, pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3], desc_at(desc_lo(sdo, SUB_Q), mnmajor_off(kk)), 1);
        wgmma_commit();

        // dS^T = P^T (dP^T - D), as 16-bit pairs: pair 2j + r holds keys 16 warp + g + 8r,
        // rows 8j + 2t, +1 (the accumulator layout).
        u32 dsf[NSC / 2];
#pragma unroll
        for (int i = 0; i < NSC; i += 2) {
            const int rl = 8 * (i / 4) + 2 * t;
            // P from its 16-bit pair, the values dV used (the f32 ones are not kept live
            // through dP^T: registers); with a softcap, P (1 - tanh^2) from its cells.
#if HAS_SOFTCAP
            if ((i / 2) % 4 == 0) ld_shared_v4(sg[0], sg[1], sg[2], sg[3], sg_at + (u32)(i / 8) * 2048);
            const u32 pair = sg[(i / 2) % 4];
#else
            const u32 pair = pd[i / 2];
#endif
            const float p0 = to_f32((u16)(pair & 0xffff)), p1 = to_f32((u16)(pair >> 16));
            float D0, D1;
            ld_shared_f32x2(sd + rl * 4, D0, D1);
            const float d0 = p0 * (dpt[i] - D0);
            const float d1 = p1 * (dpt[i + 1] - D1);
            dsf[i / 2] = pack2(d0, d1);
        }
#if HAS_SOFTCAP
        __syncwarp(); // every lane's cells read before the warp's stmatrix overwrites them
#endif
        // To shared memory transposed, dS[row][key] (K-major for dQ = dS K), by
        // stmatrix.x4.trans: x4 number q stores the 8x8 tiles of pairs 4q .. 4q + 3 (rows
        // 16q + 8(m/2).., keys 16 warp + 8(m%2).. for tile m); lane 8m + i addresses row
        // 16q + 8(m/2) + i, whose 16-byte chunk of keys 2 warp + m%2 sits at that chunk ^ i
        // (the row's index mod 8) in the 128-byte swizzle. (layout_probe.cu's
        // layout_trans_store proves the store at this address pattern, unswizzled.)
        {
            const int m = lane / 8, i8 = lane % 8;
            const u32 chunk = (u32)(2 * warp + (m & 1));
            const u32 at = sm.ds(gs & 1) + (u32)cons * SUB_Q + (u32)(8 * (m >> 1) + i8) * 128 + ((chunk ^ (u32)i8) * 16);
#pragma unroll
            for (int q = 0; q < BR / 16; ++q)
                stmatrix_x4_trans(at + (u32)q * 2048, dsf[4 * q], dsf[4 * q + 1], dsf[4 * q + 2], dsf[4 * q + 3]);
        }

        // dS of both consumers written (generic stores, read by wgmma: proxy fence first).
        fence_proxy_async();
        named_sync(BAR_DS, 256);

        // dQ = dS K for this consumer's channels, over all 128 keys (rows in m64 halves), then
        // dK += dS^T Q (softmax_scale applied at the end): dQ first, so that its staging
        // below runs while dK's products do (FlashAttention-3's order).
        float dq[MH][NQ];
        const u32 kc_lo = in_loop(desc_lo(sk_cols, SUB_K)), ds_lo = desc_lo(sm.ds(gs & 1), 16);
        wgmma_fence();
#pragma unroll
        for (int mh = 0; mh < MH; ++mh)
#pragma unroll
            for (int kk = 0; kk < QSTEPS; ++kk)
                wgmma_ss<HALF, 1>(dq[mh], desc_at(ds_lo, (u32)mh * 64 * 128 + kmajor_off(kk, SUB_Q)),
                                  desc_at(kc_lo, mnmajor_off(kk)), kk > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < RSTEPS; ++kk)
            wgmma_rs<DP, 1>(dk, dsf[4 * kk], dsf[4 * kk + 1], dsf[4 * kk + 2], dsf[4 * kk + 3], desc_at(desc_lo(sq, SUB_Q), mnmajor_off(kk)), 1);
        wgmma_commit();
        // dV and dQ done (groups complete in order); dK may still run.
        wgmma_wait<1>();
        fence_regs(dv);
#pragma unroll
        for (int mh = 0; mh < MH; ++mh) fence_regs(dq[mh]);
#if BWD_PERSISTENT
        // The key block's last read of K (dQ; of V: dP^T) done: the producer may load the
        // next tile's K and V (kv_empty, one arrival per consumer warp) while dK runs.
        if (s + 1 == steps) {
            __syncwarp();
            if (lane == 0) mbar_arrive(sm.kv_empty());
        }
#endif

        // dQ to this consumer's staging tile, for its writer warp to add (softmax_scale is
        // applied once, by attn_bwd_dq_tiled). The previous step's reduction must have read the tile first.
        const u32 sdq = sm.dq() + (u32)cons * DQ_HALF_BYTES;
        if (gs > 0) named_sync(BAR_DQ_EMPTY + cons, DQ_BAR_THREADS);
        // Element i of dQ half mh: row mh 64 + 16 warp + g + 8((i/2)%2), channel c = 8(i/4) + 2t
        // at c ^ swz(row), where swz(row) = 8(g % 4) for every row of the lane: with i/4 = 4a + j,
        // the channel's 8-block is 4a + (j ^ g % 4). So four lane addresses (one per j) and
        // immediate offsets for a, the row half and mh. (g through in_loop: the four are
        // made here, not kept across the loop: registers.)
        {
            const u32 gl = in_loop((u32)g);
            const u32 row_at = sdq + ((u32)(warp * 16) + gl) * (HALF * 4) + (u32)t * 8;
            u32 at_j[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) at_j[j] = row_at + (((u32)j ^ (gl & 3u)) * 32);
#pragma unroll
            for (int mh = 0; mh < MH; ++mh)
#pragma unroll
                for (int i = 0; i < NQ; i += 2) {
                    const int q = i / 4, r = (i / 2) % 2;
                    const u32 imm = (u32)((mh * 64 + 8 * r) * HALF * 4 + (q / 4) * 128);
                    st_shared_f32x2(at_j[q % 4] + imm, dq[mh][i], dq[mh][i + 1]);
                }
        }
        if (ctid == 0) {
            const int m = row0 / BR;
            st_shared_u32(sm.hand(cons), (u32)(dq_tile_index(p, b, h, m, cons) / (BR * HALF)));
#if DETERMINISTIC
            const int last = last_block_of_step<BR, BC>(p, bp.num_k_blocks, kb.n_block, m);
            st_shared_u32(sm.hand(2 + cons), (u32)(last - kb.n_block));
#endif
        }
        fence_proxy_async();
        named_arrive(BAR_DQ_FULL + cons, DQ_BAR_THREADS);

        // dK done: Q, dO, lse and D of the stage are read; every lane's reads before lane
        // 0's arrive.
        wgmma_wait<0>();
        fence_regs(dk);
        __syncwarp();
        if (lane == 0) mbar_arrive(sm.empty(stage));
    }
#if BWD_PERSISTENT
    // (A tile without steps: K and V unread.)
    if (steps == 0 && lane == 0) mbar_arrive(sm.kv_empty());
#else
    end_dq_writer(sm, cons, ctid, steps > 0);
#endif

    // dK (times softmax_scale) and dV of the lane's keys, as 16-bit pairs, dense.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int j = kw + 8 * r;
        if (j >= p.seqlen_k) continue;
        const i64 at = (((i64)b * p.seqlen_k + j) * bp.heads_kv + hk) * D;
#pragma unroll
        for (int i = 2 * r; i < NACC; i += 4) {
            const int c = 8 * (i / 4) + 2 * t;
            if (c < D) {
                *(u32 *)(bp.dk + at + c) = pack2(dk[i] * bp.scale, dk[i + 1] * bp.scale);
                *(u32 *)(bp.dv + at + c) = pack2(dv[i], dv[i + 1]);
            }
        }
    }
}

#if BWD_PERSISTENT
// Persistent: the tiles the producer draws (their numbers in tile_word, behind kv_full's
// phase j), then the end for the writer. Between tiles only gs and j carry over: the writer's
// hand-offs, the named barriers and the dS buffers continue from step to step as inside a
// key block. (tile_word is read before the arrival on kv_empty that lets the producer write
// the next number.)
FA_DEVICE void consumer(const BwdWgmmaParams &w, const Smem &sm, int tid, int wg) {
    const BwdParams &bp = w.bp;
    const u32 tiles = (u32)(bp.num_k_blocks * bp.heads_kv * bp.p.batch);
    int gs = 0;
#pragma unroll 1
    for (u32 j = 0;; ++j) {
        mbar_wait(sm.kv_full(), j & 1);
        const u32 tile = ld_shared_u32(sm.tile_word());
        if (tile >= tiles) break;
        const KeyBlock<BR, BC> kb(bp, DETERMINISTIC, tile);
        consumer_tile(w, sm, kb, tid, wg, gs, j);
        gs += kb.steps;
    }
    end_dq_writer(sm, wg - 1, tid - 128 * wg, gs > 0);
}
#endif

extern "C" __global__ void __launch_bounds__(NT, 1) attn_bwd_wgmma(const __grid_constant__ BwdWgmmaParams w) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const Smem sm{(smem_u32(smem_raw) + 1023u) & ~1023u};
    // The warpgroup through a broadcast: the compiler then knows it is warp-uniform and keeps
    // what derives from it (the consumers' shared addresses, their descriptors) in uniform
    // registers.
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);

    // Key blocks in index order; the last first when DETERMINISTIC (dq_writer's descending
    // order: a block waits only for blocks launched before it). Persistent, the waits of tile t
    // are on tiles of smaller index (key blocks above, same kv head and batch) and stay
    // deadlock-free: every block is resident (grid <= SMs at one block per SM) and takes its
    // tiles in increasing index order (its first is blockIdx.x < gridDim.x, the counter's are
    // gridDim.x + an increasing count), so the smallest unfinished tile is the one its block
    // is on (the block's earlier tiles are smaller, hence finished), and everything it waits
    // for (smaller tiles: finished; its own block's producer and writer: no wait on later
    // tiles) lets it finish. (Starting each key block at a
    // different step, so that the blocks of a head add to different dQ tiles at any one time,
    // measured the same within 2 %, run 70.)
#if !BWD_PERSISTENT
    const KeyBlock<BR, BC> kb(w.bp, DETERMINISTIC);
#endif

    if (tid == 0) {
        mbar_init(sm.kv_full(), 1);
#if BWD_PERSISTENT
        mbar_init(sm.kv_empty(), 8); // one arrival per consumer warp
#endif
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(sm.full(s), 1 + 32); // lane 0's expect_tx, then every lane after lse/D
            mbar_init(sm.empty(s), 8);     // one arrival per consumer warp
        }
        fence_mbar_init();
    }
    __syncthreads();

    // The roles: the producer warp, the two dQ writer warps, then the consumer warpgroups.
    if (wg == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
#if BWD_PERSISTENT
        if (tid < 32) producer(w, sm, tid);
#else
        if (tid < 32) producer(w, sm, kb, tid);
#endif
        else if (tid < 96) dq_writer(w, sm, tid / 32 - 1, tid % 32);
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
#if BWD_PERSISTENT
    consumer(w, sm, tid, wg);
#else
    consumer_tile(w, sm, kb, tid, wg, 0, 0);
#endif
}

// The tiled dQ workspace (dq_tile_index) times softmax_scale to the element type, dense
// [batch, seqlen_q, heads_q, head_dim]: one thread per 8 channels (the swizzle moves 8-channel runs whole: two
// 16-byte loads, one 16-byte store).
extern "C" __global__ void attn_bwd_dq_tiled(const BwdParams bp, u16 *dq) {
    const Params &p = bp.p;
    constexpr int C8 = D / 8;
    const i64 n = (i64)p.batch * p.seqlen_q * p.heads_q * C8;
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n) return;
    const int c = (int)(idx % C8) * 8;
    const int h = (int)(idx / C8 % p.heads_q);
    const int row = (int)(idx / C8 / p.heads_q % p.seqlen_q);
    const int b = (int)(idx / C8 / p.heads_q / p.seqlen_q);
    const int r = row % BR, half = c / HALF, cc = c % HALF;
    const float4 *src = (const float4 *)(bp.dq_accum + dq_tile_index(p, b, h, row / BR, half) + r * HALF + (cc ^ swz(r)));
    const float4 x = src[0], y = src[1];
    const float sc = bp.scale;
    st_global_v4(dq + idx * 8, pack2(x.x * sc, x.y * sc), pack2(x.z * sc, x.w * sc), pack2(y.x * sc, y.y * sc), pack2(y.z * sc, y.w * sc));
}
