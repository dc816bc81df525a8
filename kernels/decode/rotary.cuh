// rotary.cuh: rotary position embedding (RoPE) as FlashAttention-2's flash_attn_with_kvcache
// applies it to the new keys (kv_append.cu) and the queries (attn_decode.cu), the operations
// of src/problem/kvcache/rotary.rs in the same order, so that both round alike. With tables
// cos, sin [seqlen_ro, dim / 2] (the element type) and a position pos, the pair (x0, x1) of
// table column k, channels (2k, 2k + 1) with ROTARY_INTERLEAVED or (k, k + dim / 2) without,
// becomes x0' = x0 c - x1 s, x1' = x1 c + x0 s (c = cos[pos][k], s = sin[pos][k]), each one fma
// of x c and the rounded product of the other term, in f32, rounded to the element type.
// Channels from dim on are left as they are. Included after ptx.cuh (and kv_cache.cuh).
#pragma once

#ifndef ROTARY
#define ROTARY 0
#endif
#ifndef ROTARY_INTERLEAVED
#define ROTARY_INTERLEAVED 0
#endif

struct RotaryMap {
    const u16 *cos, *sin; // ROTARY: [seqlen_ro, dim / 2]
    int dim;              // rotated channels (even, <= head_dim)
    int seqlen_ro;        // rows of the tables (>= the cache's capacity)
    int per_row;          // queries at len + i (causal or local), else all at len
};

// The channels of table column k.
FA_DEVICE int rotary_first(int k, int dim) { return ROTARY_INTERLEAVED ? 2 * k : k; }
FA_DEVICE int rotary_second(int k, int dim) { return ROTARY_INTERLEAVED ? 2 * k + 1 : k + dim / 2; }

// x0' (first) or x1' (!first) of a pair: x rotated with its partner by (c, s).
FA_DEVICE float rotary_apply(float x, float partner, float c, float s, bool first) {
    const float t = fmul_rn(partner, s);
    return fmaf(x, c, first ? -t : t);
}
