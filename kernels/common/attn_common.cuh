// attn_common.cuh: what every attention kernel shares: specialisation defaults, the parameter
// block (mirrored field by field by `FlashParams` in src/cuda/attention.rs), element
// conversion, the causal rule, the key ranges and score modifiers (the mask/score rules).
// The block -> (query block, head, batch) map is tile_scheduler.cuh, the online softmax
// softmax.cuh. Included after ptx.cuh.
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
// Score modifiers (FlashAttention-2's semantics, src/scores.rs states them for the host): a
// sliding window (IS_LOCAL), logit soft-capping (HAS_SOFTCAP), ALiBi (HAS_ALIBI). Kernels
// compiled without them carry none of their code.
#ifndef IS_LOCAL
#define IS_LOCAL 0
#endif
#ifndef HAS_SOFTCAP
#define HAS_SOFTCAP 0
#endif
#ifndef HAS_ALIBI
#define HAS_ALIBI 0
#endif
// A learnable attention sink (HAS_SINK; gpt-oss, src/scores.rs): one logit per query head joins
// every row's softmax denominator with no value row (softmax.cuh sink_fold). The forward kernels
// that serve it take the logits, f32 [heads_q], as one more kernel parameter after their own
// (SINK_PARAM; the host pushes it exactly when it sets HAS_SINK), so that the kernels compiled
// without it keep their parameters, and their machine code, as they were.
#ifndef HAS_SINK
#define HAS_SINK 0
#endif
#if HAS_SINK
#define SINK_PARAM , const float *__restrict__ sink_logits
#define SINK_LOGITS sink_logits
#else
#define SINK_PARAM
#define SINK_LOGITS nullptr
#endif
// The sink's logit of query head h (natural-log units), 0 without HAS_SINK.
FA_DEVICE float sink_logit(const float *sink, int h) {
#if HAS_SINK
    return sink[h];
#else
    return 0.f;
#endif
}
// Packed variable-length batches (FlashAttention-2's varlen; src/varlen.rs): batch entry b is
// the sequence of rows cu_seqlens_q[b].. of q and o and cu_seqlens_k[b].. of k and v, with its
// own lengths; lse is [heads_q, total_q].
#ifndef IS_VARLEN
#define IS_VARLEN 0
#endif
// The packed key rows (total_k), one more kernel parameter of the IS_VARLEN builds (after the
// sink's, VARLEN_PARAM), so that the dense builds keep their parameters and machine code: the
// offsets are read on the device as the caller gave them (a CUDA graph replays a call with new
// ones, so the host cannot check them), and a block clamps its sequence into the packed rows.
#if IS_VARLEN
#define VARLEN_PARAM , const int total_k
#define VARLEN_TOTAL_K total_k
#else
#define VARLEN_PARAM
#define VARLEN_TOTAL_K 0
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
    float scale_log2;      // softmax_scale * log2(e): exp(x*scale) = 2^(x*scale_log2);
                           // HAS_SOFTCAP: softcap * log2(e) (s is tanh(q.k * softcap_pre) then)
    int window_left;       // IS_LOCAL: keys visible before the diagonal (unbounded: 2^30)
    int window_right;      // IS_LOCAL: keys visible after it (unbounded: 2^30; causal: 0)
    float softcap_pre;     // HAS_SOFTCAP: 2 log2(e) softmax_scale / softcap (tanh_exp2's unit)
    float alibi_unit;      // HAS_ALIBI: log2(e) / scale_log2, a natural-log bias in S's units
    int total_q;           // IS_VARLEN: packed query rows (lse is [heads_q, total_q])
    const float *alibi;    // HAS_ALIBI: slopes, slope of (b, h) at alibi[b * alibi_sb + h]
    i64 alibi_sb;          // 0 for slopes per head, heads_q for slopes per (batch, head)
    const int *cu_seqlens_q; // IS_VARLEN: batch + 1 query offsets (seqlen_q is the longest)
    const int *cu_seqlens_k; // IS_VARLEN: batch + 1 key offsets (seqlen_k is the longest)
    i64 lse_sh;            // lse elements between heads: seqlen_q, or total_q when one sequence
                           // of a packed batch is launched alone (its lse in [heads_q, total_q])
};

// Element offsets of batch entry b in q, o, k and v, and its first packed query row. With
// IS_VARLEN it also sets p.seqlen_q / p.seqlen_k to the sequence's own lengths (the grid
// covers the longest; blocks past a shorter sequence's end have nothing to do), its rows
// clamped into the packed tensors (packed_range; `total_k`: VARLEN_TOTAL_K).
struct SeqOffsets {
    i64 q, o, k, v;
    int q0;
};
// Packed rows cu[b]..cu[b + 1] of a tensor of `total` rows, clamped: the start to [0, total],
// the end to [start, total], the length to `longest` (the launch's, the caller's max_seqlen).
// Valid offsets pass unchanged; bad ones give wrong rows but no access outside the packed
// tensors, the grid or the per-sequence workspaces. Returns (first row, length).
FA_DEVICE int2 packed_range(const int *cu, int b, int total, int longest) {
    const int r0 = min(max(cu[b], 0), total);
    const int r1 = min(max(cu[b + 1], r0), total);
    return make_int2(r0, min(r1 - r0, longest));
}
FA_DEVICE SeqOffsets sequence_offsets(Params &p, int b, int total_k) {
#if IS_VARLEN
    const int2 rq = packed_range(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
    const int2 rk = packed_range(p.cu_seqlens_k, b, total_k, p.seqlen_k);
    const int q0 = rq.x, k0 = rk.x;
    p.seqlen_q = rq.y;
    p.seqlen_k = rk.y;
    return SeqOffsets{q0 * p.q_ss, q0 * p.o_ss, k0 * p.k_ss, k0 * p.v_ss, q0};
#else
    (void)total_k;
    return SeqOffsets{b * p.q_sb, b * p.o_sb, b * p.k_sb, b * p.v_sb, 0};
#endif
}
// Where the lse of (b, h) starts: dense [batch, heads_q, seqlen_q] (heads lse_sh apart),
// varlen [heads_q, total_q].
FA_DEVICE i64 lse_offset(const Params &p, int b, int h, int q0) {
    return IS_VARLEN ? (i64)h * p.total_q + q0 : (i64)b * p.heads_q * p.seqlen_q + h * p.lse_sh;
}

// ---- 16-bit elements (f16 or bf16 by IS_BF16) ----
FA_DEVICE float to_f32(u16 x) { return elem_to_f32<IS_BF16>(x); }
FA_DEVICE u16 from_f32(float x) { return elem_from_f32<IS_BF16>(x); }
// Two floats as one register of 16-bit pairs, `lo` in the low half (an A-fragment pair).
FA_DEVICE u32 pack2(float lo, float hi) { return elem_pack2<IS_BF16>(lo, hi); }
// d += a b, mma.m16n8k16 with f32 accumulators, on the element type.
FA_DEVICE void mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    elem_mma<IS_BF16>(d, a0, a1, a2, a3, b0, b1);
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

// ---- rows of a [seq, head_dim] slice into shared memory (attn_mma, attn_bwd) ----
// Rows [row_begin, row_begin + ROWS) of `src` (row_stride elements apart) go to `dst` with
// RS elements per row (the caller's padded stride), by NT threads in 16-byte cp.async pieces.
// Rows at or past row_limit and the channels past D up to the k-step are zero-filled (cp.async
// reading 0 bytes), so tails never read out of bounds.
template <int ROWS, int RS, int NT>
FA_DEVICE void load_rows(u32 dst, const u16 *src, i64 row_stride, int row_begin, int row_limit) {
    constexpr int CH = (D + 15) / 16 * 2; // 16-byte chunks per padded row
    constexpr int TOTAL = ROWS * CH;
#pragma unroll
    for (int it = 0; it < (TOTAL + NT - 1) / NT; ++it) {
        const int i = it * NT + (int)threadIdx.x;
        if (TOTAL % NT == 0 || i < TOTAL) {
            const int r = i / CH, c = i % CH;
            const int gr = row_begin + r;
            const bool ok = gr < row_limit && c * 8 < D;
            const u16 *g = ok ? src + (i64)gr * row_stride + c * 8 : src;
            cp_async_16(dst + (u32)(r * RS + c * 8) * 2, g, ok ? 16 : 0);
        }
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

// ---- key range of a row under the causal mask and the window ----
// Row i sees keys [key_lo(i), key_hi(i)): i + diag - left <= j <= i + diag + right, with
// diag = seqlen_k - seqlen_q and right = 0 when causal. Both are clamped to [-2^30, seqlen_k],
// so that a block's value plus a row offset (< 2^10) keeps its meaning (a per-row hi still
// needs min(.., seqlen_k)).
FA_DEVICE int clamp_keys(i64 x, int seqlen_k) {
    return (int)(x < -(1ll << 30) ? -(1ll << 30) : (x > seqlen_k ? (i64)seqlen_k : x));
}
FA_DEVICE int key_hi(const Params &p, i64 i) {
    if (!IS_CAUSAL && !IS_LOCAL) return p.seqlen_k;
    const i64 right = IS_CAUSAL ? 0 : p.window_right;
    return clamp_keys(i + (i64)p.seqlen_k - p.seqlen_q + 1 + right, p.seqlen_k);
}
FA_DEVICE int key_lo(const Params &p, i64 i) {
    if (!IS_LOCAL) return -(1 << 30);
    return clamp_keys(i + (i64)p.seqlen_k - p.seqlen_q - p.window_left, p.seqlen_k);
}

// The key tiles of BC keys a block of `rows` query rows from row0 needs, [begin, end), and
// those inside them that no row of the block needs masked, [inner_begin, inner_end): every
// tile outside the window of every row is skipped, so the work shrinks with the window.
struct KeyTiles {
    int begin, end, inner_begin, inner_end;
};
FA_DEVICE KeyTiles key_tiles_of(const Params &p, int row0, int rows, int bc) {
    const int lo_first = max(key_lo(p, row0), 0), lo_last = max(key_lo(p, (i64)row0 + rows - 1), 0);
    const int hi_first = max(key_hi(p, row0), 0), hi_last = max(key_hi(p, (i64)row0 + rows - 1), 0);
    KeyTiles t;
    t.begin = lo_first / bc;
    t.end = max((hi_last + bc - 1) / bc, t.begin);
    t.inner_begin = min(max((lo_last + bc - 1) / bc, t.begin), t.end);
    t.inner_end = max(min(hi_first / bc, t.end), t.inner_begin);
    return t;
}

// ---- score modifiers and the key range on the S values of one row held by a lane ----
// A lane holds columns c = 8*nt + e (nt < NT8, e < 2) of a row, counted from the key of its
// first column (the C-fragment layout of mma.m16n8k16 and of wgmma's accumulators alike).
// `lo`/`hi` are the row's key range and `center` its diagonal (i + diag), all relative to that
// first key; `coef` is slope * alibi_unit. Soft-capping and ALiBi change every tile; the key
// range is applied where MASKED. The order is src/scores.rs's: tanh cap, bias, mask.
template <int NT8, bool MASKED, class At>
FA_DEVICE void score_row(const Params &p, At &&at, int lo, int hi, int center, float coef) {
    // The distance |center - c| as center_f - c in f32 (c is a constant after unrolling): one
    // conversion per row instead of one per element (exact below 2^24 keys, and beyond that
    // off by less than the bias's own f32 rounding).
    const float center_f = (float)center;
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float &x = at(nt, e);
            const int c = 8 * nt + e;
            if (HAS_SOFTCAP) x = tanh_exp2(x * p.softcap_pre);
            if (HAS_ALIBI) x -= coef * fabsf(center_f - (float)c);
            if (MASKED && (c < lo || c >= hi)) x = neg_inf();
        }
}
// The ALiBi coefficient of (batch b, head h) in S's units (0 without ALiBi).
FA_DEVICE float alibi_coef(const Params &p, int b, int h) {
    if (!HAS_ALIBI) return 0.f;
    return p.alibi[(i64)b * p.alibi_sb + h] * p.alibi_unit;
}
