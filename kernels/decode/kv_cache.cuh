// kv_cache.cuh: where key j of sequence b sits in a KV cache (src/kvcache.rs states the same
// rule for the host), shared by the decode and append kernels. Included after ptx.cuh.
//   contiguous: [batch, seqlen_cache, heads_kv, head_dim], row b * sb + j * ss;
//   paged (IS_PAGED): [num_blocks, page_size, heads_kv, head_dim] with block_table
//   [batch, max_blocks] (i32): row block_table[b][j / page_size] * sb + (j % page_size) * ss,
//   sb being the page stride.
// Callers only ask for keys below the sequence's length: block-table entries past the pages a
// sequence uses are never read (the host validates only the used ones).
#pragma once

#ifndef IS_PAGED
#define IS_PAGED 0
#endif

struct CacheMap {
    const int *cache_seqlens; // [batch]: keys cached before this call
    const int *block_table;   // IS_PAGED: [batch, max_blocks]
    int max_blocks;           // IS_PAGED: columns of block_table
    int page_size;            // IS_PAGED: keys per page
    int seqlen_new;           // rows appended to every sequence by this call
};

// Element offset of key j (head 0, channel 0) of sequence b; sb is the batch stride
// (contiguous) or the page stride (paged), ss the key (row) stride.
FA_DEVICE i64 cache_row(const CacheMap &c, i64 sb, i64 ss, int b, int j) {
#if IS_PAGED
    const int page = c.block_table[(i64)b * c.max_blocks + j / c.page_size];
    return (i64)page * sb + (i64)(j % c.page_size) * ss;
#else
    return (i64)b * sb + (i64)j * ss;
#endif
}
