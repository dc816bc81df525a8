// kv_cache.cuh: where key j of sequence b sits in a KV cache (src/problem/kvcache states the
// same rule for the host), shared by the decode and append kernels. Included after ptx.cuh.
//   contiguous: [cache_batch, seqlen_cache, heads_kv, head_dim]: sequence b's keys are rows
//   start.. of cache sequence row_b (HAS_BATCH_IDX: cache_batch_idx[b], else b; HAS_LEFTPAD:
//   start = cache_leftpad[b], else 0), key j at row_b * sb + (start + j) * ss;
//   paged (IS_PAGED): [num_blocks, page_size, heads_kv, head_dim] with block_table
//   [batch, max_blocks] (i32): row block_table[b][j / page_size] * sb + (j % page_size) * ss,
//   sb being the page stride.
// The index arrays live on the device and are not validated (the host may never see them):
// every value read here is clamped (src/problem/kvcache/shape.rs states the rule), so that no
// value moves an access outside the cache: a length to capacity - seqlen_new, a first row to
// the length, a cache sequence to the cache, a page to the pool. Callers only ask for keys
// below the sequence's (clamped) length: block-table entries past the pages a sequence uses
// are never read.
#pragma once

#ifndef IS_PAGED
#define IS_PAGED 0
#endif
#ifndef HAS_BATCH_IDX
#define HAS_BATCH_IDX 0
#endif
#ifndef HAS_LEFTPAD
#define HAS_LEFTPAD 0
#endif

struct CacheMap {
    const int *cache_seqlens;   // [batch]: the end of each sequence's keys before this call
    const int *block_table;     // IS_PAGED: [batch, max_blocks]
    int max_blocks;             // IS_PAGED: columns of block_table
    int page_size;              // IS_PAGED: keys per page
    int seqlen_new;             // rows appended to every sequence by this call
    int capacity;               // keys a sequence can hold (>= seqlen_new)
    int num_blocks;             // IS_PAGED: pages in the pool (>= 1 when capacity > 0)
    int cache_batch;            // HAS_BATCH_IDX: sequences of the contiguous cache
    const int *cache_batch_idx; // HAS_BATCH_IDX: [batch]
    const int *cache_leftpad;   // HAS_LEFTPAD: [batch]
};

// One sequence of the call, its index values read once and clamped.
struct SeqMap {
    int len;   // cache_seqlens[b] in 0..=capacity - seqlen_new: where the new rows go
    int start; // HAS_LEFTPAD: cache_leftpad[b] in 0..=len: the first key's row (else 0)
    int row_b; // HAS_BATCH_IDX: cache_batch_idx[b] in 0..cache_batch (else b)
};

FA_DEVICE SeqMap seq_map(const CacheMap &c, int b) {
    SeqMap s;
    s.len = min(max(c.cache_seqlens[b], 0), c.capacity - c.seqlen_new);
#if HAS_LEFTPAD
    s.start = min(max(c.cache_leftpad[b], 0), s.len);
#else
    s.start = 0;
#endif
#if HAS_BATCH_IDX
    s.row_b = min(max(c.cache_batch_idx[b], 0), c.cache_batch - 1);
#else
    s.row_b = b;
#endif
    return s;
}

// Keys sequence s attends to: its cached ones from its first row, and the appended rows.
FA_DEVICE int seq_keys(const CacheMap &c, const SeqMap &s) { return s.len - s.start + c.seqlen_new; }

#if IS_PAGED
// The page holding key j of sequence b (clamped to the pool).
FA_DEVICE int cache_page(const CacheMap &c, int b, int j) {
    return min(max(c.block_table[(i64)b * c.max_blocks + j / c.page_size], 0), c.num_blocks - 1);
}
#endif

// Element offset of key j (head 0, channel 0) of sequence b (s = seq_map(c, b)); sb is the
// batch stride (contiguous) or the page stride (paged), ss the key (row) stride.
FA_DEVICE i64 cache_row(const CacheMap &c, const SeqMap &s, i64 sb, i64 ss, int b, int j) {
#if IS_PAGED
    return (i64)cache_page(c, b, j) * sb + (i64)(j % c.page_size) * ss;
#else
    return (i64)s.row_b * sb + (i64)(s.start + j) * ss;
#endif
}
