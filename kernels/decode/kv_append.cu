// kv_append.cu: writes the new rows k_new/v_new [batch, seqlen_new, heads_kv, head_dim] into
// the caches at cache_seqlens[b].. (in place, as FlashAttention-2's flash_attn_with_kvcache
// does before attending), contiguous or paged (kv_cache.cuh). One thread per 16-byte chunk of
// one row of k and the same chunk of v. Specialised by HEAD_DIM (a multiple of 8) and IS_PAGED.
#include "ptx.cuh"
#include "kv_cache.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
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
};

extern "C" __global__ void __launch_bounds__(256) kv_append(const AppendParams p) {
    const i64 n = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= p.chunks) return;
    const int c = (int)(n % CH);
    const i64 row = n / CH; // (b, t, hk) in that order, hk fastest
    const int hk = (int)(row % p.heads_kv);
    const i64 bt = row / p.heads_kv;
    const int t = (int)(bt % p.map.seqlen_new), b = (int)(bt / p.map.seqlen_new);
    const int j = p.map.cache_seqlens[b] + t;
    const uint4 *ks = (const uint4 *)(p.k_new + b * p.kn_sb + t * p.kn_ss + hk * p.kn_sh + c * 8);
    const uint4 *vs = (const uint4 *)(p.v_new + b * p.vn_sb + t * p.vn_ss + hk * p.vn_sh + c * 8);
    uint4 *kd = (uint4 *)(p.k_cache + cache_row(p.map, p.kc_sb, p.kc_ss, b, j) + hk * p.kc_sh + c * 8);
    uint4 *vd = (uint4 *)(p.v_cache + cache_row(p.map, p.vc_sb, p.vc_ss, b, j) + hk * p.vc_sh + c * 8);
    *kd = *ks;
    *vd = *vs;
}
