// tile_scheduler.cuh: the tile scheduler, which (query block, head, batch) a block (or, in
// attn_wgmma's persistent loop, a tile index) takes: the order the forward kernels run their
// tiles in (FA3's tile_scheduler.hpp plays this role). Included after attn_common.cuh (Params,
// D, IS_CAUSAL, HEAD_MAJOR).
#pragma once

struct BlockCoords {
    int m_block, h, b, hk; // hk: the kv head of query head h (GQA)
};
// Causal: query blocks from last to first (the last see the most keys, so the heaviest work
// starts first). With CAUSAL_L2_MB > 0 that order runs within groups of (batch, head) pairs
// whose K and V fit in that many MiB of L2, group after group (FA3's scheduler does the
// same): otherwise the blocks resident at once belong to as many heads as there are SMs, and
// every block streams its K and V from HBM. HEAD_MAJOR (non-causal): consecutive blocks are
// consecutive query blocks of one head, so the blocks resident at once share K and V in L2.
#ifndef CAUSAL_L2_MB
#define CAUSAL_L2_MB 0
#endif
FA_DEVICE BlockCoords block_coords(const Params &p, unsigned block = blockIdx.x) {
    const int bh = p.batch * p.heads_q;
#if HEAD_MAJOR && !IS_CAUSAL
    const int m_block = (int)(block % p.num_m_blocks);
    const int rem = (int)(block / p.num_m_blocks);
#elif IS_CAUSAL && CAUSAL_L2_MB > 0
    // Pairs per group: K and V of one kv head are seqlen_k * D * 4 bytes, shared by the
    // p.group query heads next to each other in the pair order. The budget's keys per kv head
    // are a compile-time constant, so one 32-bit division remains (a 64-bit one is a called
    // routine, on every tile's path); any group size gives a permutation of the tiles.
    constexpr i64 KEYS_IN_BUDGET = ((i64)CAUSAL_L2_MB << 20) / (D * 4);
    const i64 keys = KEYS_IN_BUDGET * p.group;
    const int fit = (int)((unsigned)(keys < 0x7fffffff ? keys : 0x7fffffff) / (unsigned)max(p.seqlen_k, 1));
    const int g = fit < 1 ? 1 : (fit > bh ? bh : fit);
    const int m = p.num_m_blocks;
    const i64 full = (i64)(bh / g) * g * m; // tiles in full groups
    int m_block, rem;
    if ((i64)block < full) {
        const int grp = (int)(block / ((unsigned)g * m)), r = (int)(block % ((unsigned)g * m));
        m_block = m - 1 - r / g;
        rem = grp * g + r % g;
    } else {
        const int last = bh - bh / g * g, r = (int)((i64)block - full);
        m_block = m - 1 - r / last;
        rem = bh / g * g + r % last;
    }
#else
    const int m_block = p.num_m_blocks - 1 - (int)(block / bh);
    const int rem = (int)(block % bh);
#endif
    const int h = rem % p.heads_q;
    return BlockCoords{m_block, h, rem / p.heads_q, h / p.group};
}

// ---- persistent kernels: the tiles after a block's first (attn_wgmma) ----
// Block b runs tile b first, then with a counter (DYN; `counter` is two u32, zero at every
// launch) whichever tile the counter hands out next (FA3's dynamic scheduler: blocks that drew
// short causal tiles take more), else b + gridDim.x, b + 2 gridDim.x, ... (also DYN without a
// counter, as in a CUDA graph's capture). The tile indices are block_coords' order.
template <int DYN> FA_DEVICE int next_tile(u32 *counter, int tile) {
    if (DYN) return counter ? (int)gridDim.x + (int)atomicAdd(counter, 1u) : tile + (int)gridDim.x;
    return tile + gridDim.x;
}
// After a block's last draw (the one that failed), with a counter (DYN): the draws are ordered
// before its count, and the last block to count knows every draw is done and zeroes both for
// the next launch (CUDA Programming Guide, memory fence functions: the last-block pattern).
// (Templates, so that a kernel that never calls them instantiates no atomics.)
template <int DYN> FA_DEVICE void tile_counter_reset(u32 *counter) {
    if (DYN && counter) {
        __threadfence();
        if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
            atomicExch(counter, 0u);
            atomicExch(counter + 1, 0u);
        }
    }
}
