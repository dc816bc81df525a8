// attn_common.cuh: what every attention kernel shares: specialisation defaults, the parameter
// block (mirrored field by field by `FlashParams` in src/cuda/attention.rs), element
// conversion, the causal rule, and the block -> (query block, head, batch) map.
// Included after ptx.cuh.
#pragma once

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef IS_BF16
#define IS_BF16 0
#endif
#ifndef IS_CAUSAL
#define IS_CAUSAL 0
#endif
#ifndef HEAD_MAJOR
#define HEAD_MAJOR 0
#endif

constexpr int D = HEAD_DIM;
static_assert(D % 8 == 0 && D >= 8 && D <= 256, "HEAD_DIM must be a multiple of 8, at most 256");
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

struct Params {
    const u16 *q, *k, *v;
    u16 *o;
    float *lse;
    i64 q_sb, q_ss, q_sh; // element strides: batch, seq, head
    i64 k_sb, k_ss, k_sh;
    i64 v_sb, v_ss, v_sh;
    i64 o_sb, o_ss, o_sh;
    int seqlen_q, seqlen_k;
    int heads_q, group;    // group = heads_q / heads_kv
    int batch, num_m_blocks;
    float scale_log2;      // softmax_scale * log2(e): exp(x*scale) = 2^(x*scale_log2)
    int pad_;
};

// ---- 16-bit elements (f16 or bf16 by IS_BF16) ----
FA_DEVICE float to_f32(u16 x) {
#if IS_BF16
    return bf16_to_f32(x);
#else
    return f16_to_f32(x);
#endif
}
FA_DEVICE u16 from_f32(float x) {
#if IS_BF16
    return f32_to_bf16(x);
#else
    return f32_to_f16(x);
#endif
}
// Two floats as one register of 16-bit pairs, `lo` in the low half (an A-fragment pair).
FA_DEVICE u32 pack2(float lo, float hi) {
#if IS_BF16
    return pack_bf16x2(lo, hi);
#else
    return pack_f16x2(lo, hi);
#endif
}
// Eight 16-bit values (one 16-byte chunk) as floats.
FA_DEVICE void unpack8(const uint4 &raw, float (&f)[8]) {
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        f[2 * e] = to_f32((u16)(w[e] & 0xffff));
        f[2 * e + 1] = to_f32((u16)(w[e] >> 16));
    }
}

// ---- causal rule, bottom-right aligned: row i sees keys j < i + 1 + diag, with
// diag = seqlen_k - seqlen_q. Returns the number of visible keys, in [0, seqlen_k].
FA_DEVICE int visible_keys(i64 i, i64 diag, int seqlen_k) {
    if (!IS_CAUSAL) return seqlen_k;
    const i64 lim = i + 1 + diag;
    return (int)(lim < 0 ? 0 : (lim > seqlen_k ? seqlen_k : lim));
}
// visible_keys clamped below at -2^30 instead of 0, for per-row limits computed as
// `first_row_limit + row_offset` (offset < 2^10): a clamped value still masks everything.
FA_DEVICE int row_limit(i64 i, i64 diag, int seqlen_k) {
    const i64 lim = i + 1 + diag;
    return (int)(lim < -(1ll << 30) ? -(1ll << 30) : (lim > seqlen_k ? seqlen_k : lim));
}

// ---- which (query block, head, batch) this block owns ----
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
    // p.group query heads next to each other in the pair order.
    const i64 kv_bytes = (i64)p.seqlen_k * D * 4;
    const i64 fit = ((i64)CAUSAL_L2_MB << 20) * p.group / (kv_bytes > 0 ? kv_bytes : 1);
    const int g = (int)(fit < 1 ? 1 : (fit > bh ? bh : fit));
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
