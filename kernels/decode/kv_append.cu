// kv_append.cu: writes the new rows k_new/v_new [batch, seqlen_new, heads_kv, head_dim] into
// the caches at rows cache_seqlens[b].. of each sequence (in place, as FlashAttention-2's
// flash_attn_with_kvcache does before attending), contiguous or paged (kv_cache.cuh: the
// index values are clamped there, so that every row lands inside its sequence's capacity),
// the keys rotated first with ROTARY (rotary.cuh), new row t at position cache_seqlens[b] + t.
// One thread per 16-byte chunk of one row of k and the same chunk of v. Specialised by
// HEAD_DIM (a multiple of 8), IS_PAGED, HAS_BATCH_IDX, HAS_LEFTPAD, ROTARY (with IS_BF16 and
// ROTARY_INTERLEAVED).
#include "ptx.cuh"
#include "kv_cache.cuh"
#include "rotary.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef IS_BF16
#define IS_BF16 0
#endif
constexpr int CH = HEAD_DIM / 8; // 16-byte chunks per row
static_assert(HEAD_DIM % 8 == 0, "HEAD_DIM must be a multiple of 8");

struct AppendParams {
    const u16 *k_new, *v_new;
    u16 *k_cache, *v_cache;
    i64 kn_sb, kn_ss, kn_sh; // element strides of k_new: batch, seq, head
    i64 vn_sb, vn_ss, vn_sh;
    i64 kc_sb, kc_ss, kc_sh; // of the caches (sb: batch or page stride)
    i64 vc_sb, vc_ss, vc_sh;
    int batch, heads_kv;
    i64 chunks; // batch * seqlen_new * heads_kv * CH
    CacheMap map;
    RotaryMap rot; // ROTARY
};

#if ROTARY
// Chunk c of one key row `row` (head_dim channels) rotated at table row pos: the channels of
// the chunk below rot.dim, each with its pair's other channel (read from the row).
FA_DEVICE uint4 rotated_chunk(const AppendParams &p, const u16 *row, int c, int pos) {
    uint4 out = *(const uint4 *)(row + c * 8);
    u16 *e = (u16 *)&out;
    const int half = p.rot.dim / 2;
    const u16 *cs = p.rot.cos + (i64)pos * half, *sn = p.rot.sin + (i64)pos * half;
#pragma unroll
    for (int x = 0; x < 8; ++x) {
        const int ch = c * 8 + x;
        if (ch < p.rot.dim) {
            const bool first = ROTARY_INTERLEAVED ? (ch & 1) == 0 : ch < half;
            const int k = ROTARY_INTERLEAVED ? ch >> 1 : (first ? ch : ch - half);
            const int partner = first ? rotary_second(k, p.rot.dim) : rotary_first(k, p.rot.dim);
            const float y = rotary_apply(elem_to_f32<IS_BF16>(row[ch]), elem_to_f32<IS_BF16>(row[partner]),
                                         elem_to_f32<IS_BF16>(cs[k]), elem_to_f32<IS_BF16>(sn[k]), first);
            e[x] = elem_from_f32<IS_BF16>(y);
        }
    }
    return out;
}
#endif

extern "C" __global__ void __launch_bounds__(256) kv_append(const AppendParams p) {
    const i64 n = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= p.chunks) return;
    const int c = (int)(n % CH);
    const i64 row = n / CH; // (b, t, hk) in that order, hk fastest
    const int hk = (int)(row % p.heads_kv);
    const i64 bt = row / p.heads_kv;
    const int t = (int)(bt % p.map.seqlen_new), b = (int)(bt / p.map.seqlen_new);
    const SeqMap s = seq_map(p.map, b);
    const int j = s.len - s.start + t; // the key index of the row
    const u16 *krow = p.k_new + b * p.kn_sb + t * p.kn_ss + hk * p.kn_sh;
    const uint4 *vs = (const uint4 *)(p.v_new + b * p.vn_sb + t * p.vn_ss + hk * p.vn_sh + c * 8);
    uint4 *kd = (uint4 *)(p.k_cache + cache_row(p.map, s, p.kc_sb, p.kc_ss, b, j) + hk * p.kc_sh + c * 8);
    uint4 *vd = (uint4 *)(p.v_cache + cache_row(p.map, s, p.vc_sb, p.vc_ss, b, j) + hk * p.vc_sh + c * 8);
#if ROTARY
    *kd = rotated_chunk(p, krow, c, s.len + t);
#else
    *kd = *(const uint4 *)(krow + c * 8);
#endif
    *vd = *vs;
}
