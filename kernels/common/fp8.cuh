// fp8.cuh: what the FP8 (e4m3) forward kernel and the wgmma probe share: packing P from the f32
// S accumulators into the e4m3 register A operand of P V, and the transposed, key-permuted V
// (V^T) that P V reads as its K-major B operand, with the pre-pass that writes it. Included
// after ptx.cuh.
//
// Why V^T is permuted (PTX ISA 9.0, 9.7.15.5.1, register fragments of wgmma .m64nNk32): for 8-bit
// A from registers, register j (0..3) of a thread (g = lane/4, t = lane%4) holds row
// 16*warp + g + 8*(j%2), k = 16*(j/2) + 4t .. +3, byte e at k = 16*(j/2) + 4t + e. The S
// accumulators of that thread hold, for row g (+8), keys 8n + 2t and 8n + 2t + 1 (n = 0..); so
// the thread owns keys {2t, 2t+1, 8+2t, 9+2t} of each 16 where the A operand wants
// {4t..4t+3}. Rather than shuffle P between lanes, the kernel packs its own four keys in order
// (P_FRAG below) and V^T stores key 8h + 2t + e of each 16 at position 4t + 2h + e (VT_SLOT):
// P V sums over keys, so the same permutation on both sides gives the same product.
#pragma once

typedef unsigned char u8;

// Four f32 to four e4m3 in one register, b0 in the lowest byte (cvt.rn.satfinite.e4m3x2.f32,
// 9.7.9.21: `d, a, b` puts a in the upper byte of d, b in the lower: RNE, beyond +-448 saturated).
FA_DEVICE u32 pack_e4m3x4(float b0, float b1, float b2, float b3) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b1), "f"(b0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(b3), "f"(b2));
    return (u32)lo | ((u32)hi << 16);
}

// Register j (0..3) of the A fragment of P V k-step kk (keys 32kk..32kk+31) from the S
// accumulators s[] of the same thread: accumulators 16kk + 8(j/2) + 2(j%2) + {0, 1, 4, 5}, i.e.
// row g + 8(j%2), keys 32kk + 16(j/2) + {2t, 2t+1, 8+2t, 9+2t}, in that byte order.
template <int NS> FA_DEVICE u32 p_frag(const float (&s)[NS], int kk, int j) {
    const int i = 16 * kk + 8 * (j / 2) + 2 * (j % 2);
    return pack_e4m3x4(s[i], s[i + 1], s[i + 4], s[i + 5]);
}

// The position of key k in its V^T row: within each 16 keys, key 8h + 2t + e sits at 4t + 2h + e.
FA_DEVICE int vt_slot(int k) {
    const int j = k & 15;
    return (k - j) + 4 * ((j & 7) >> 1) + 2 * (j >> 3) + (j & 1);
}
// The key at position x of a V^T row (the inverse of vt_slot).
FA_DEVICE int vt_key(int x) {
    const int j = x & 15;
    return (x - j) + 8 * ((j >> 1) & 1) + 2 * (j >> 2) + (j & 1);
}

// ---- the V^T pre-pass: V (bshd, e4m3) to V^T [batch][heads_kv][head_dim][SK_PAD], keys
// permuted by vt_slot, zeros for keys >= seqlen_k up to sk_pad (a multiple of 64). One block of
// 256 threads per 64 keys of one (batch, kv head): V's 64 rows through shared memory, then
// each thread writes 4 consecutive positions of a V^T row as one u32.
constexpr int VT_KEYS = 64;
constexpr int VT_THREADS = 256;
struct VtParams {
    const u8 *v;
    u8 *vt;
    i64 v_sb, v_ss, v_sh; // V's element strides (batch, seq, head)
    int seqlen_k, sk_pad, head_dim, heads_kv;
};
// tile: VT_KEYS rows of head_dim + 4 bytes in shared memory.
FA_DEVICE void vt_block(const VtParams &p, u8 *tile, int key_block, int hk, int b) {
    const int k0 = key_block * VT_KEYS, pitch = p.head_dim + 4;
    const u8 *src = p.v + b * p.v_sb + hk * p.v_sh;
    for (int x = threadIdx.x; x < VT_KEYS * p.head_dim; x += VT_THREADS) {
        const int k = x / p.head_dim, c = x % p.head_dim;
        tile[k * pitch + c] = k0 + k < p.seqlen_k ? src[(i64)(k0 + k) * p.v_ss + c] : (u8)0;
    }
    __syncthreads();
    u8 *dst = p.vt + ((i64)b * p.heads_kv + hk) * p.head_dim * p.sk_pad + k0;
    for (int x = threadIdx.x; x < p.head_dim * (VT_KEYS / 4); x += VT_THREADS) {
        const int c = x / (VT_KEYS / 4), pos = 4 * (x % (VT_KEYS / 4));
        u32 w = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) w |= (u32)tile[vt_key(pos + e) * pitch + c] << (8 * e);
        *(u32 *)(dst + (i64)c * p.sk_pad + pos) = w;
    }
}
