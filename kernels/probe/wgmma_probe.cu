// wgmma_probe.cu: single-warpgroup experiments that prove the layouts attn_wgmma.cu relies on.
// Each kernel runs as one block of 128 threads (one warpgroup). Thread 0 loads its tiles from
// global memory with TMA (128-byte swizzle, boxes of 64 columns, exactly as attn_wgmma), every
// thread waits on the mbarrier, the warpgroup runs wgmma through the same descriptor helpers
// as attn_wgmma (hopper.cuh), and each thread dumps its registers; thread 0 also dumps the
// descriptors it built. The host (src/probe_wgmma.rs) checks every register against the layout
// model of src/layout_wgmma.rs and names the thread and register of any wrong cell.
//
// wg_probe_acc:    A (64x16 of a 64x64 tile, K-major) A[i][k] = i, B (16x64 as 64 rows of k,
//                  K-major) B[k][j] = j: one m64n64k16, so D[i][j] = 16*i*j. Dump: d0..d31.
// wg_probe_kmajor: the Q K^T path. A 64x128 (two boxes), B 64 rows x 128 (two boxes), all 8
//                  k-steps through desc_kmajor_sw128. The host fills A one-hot (A[i][i] = 1,
//                  A[i][i+64] = 1) and B with a code (B[n][k] = k, or = n), so every D cell names
//                  the k (or n) it read. Dump: d0..d31, then 8 descriptors of A and 8 of B.
// wg_probe_pv:     the P V path. S = Q K^T (m64n64, 4 k-steps) with S[i][k] = 16*(i%16) + k%16;
//                  P = S packed to 16-bit pairs as the register A operand; O = P V (m64n128k16 x 4,
//                  V MN-major through desc_mnmajor_sw128, two boxes of 64 columns) with V[k][j] =
//                  [k == j] for j < 64 and 2*[k == j-64] after, so O[i][j] = P[i][j%64] * (1 or 2).
//                  Dump: s0..s31, p0..p15, o0..o63, then the 4 V descriptors.
//
// Defines: IS_BF16 (inputs as bf16), PROBE_FAULT=1: the K-major descriptors use the 64-byte
// swizzle and V's descriptor a stride (SBO) of 512 bytes instead of 1024: the host must catch both.
#include "ptx.cuh"
#include "hopper.cuh"
#ifndef IS_BF16
#define IS_BF16 0
#endif
#if IS_BF16
#define WG_AB "bf16"
#else
#define WG_AB "f16"
#endif
#include "wgmma_ops.cuh"
#ifndef PROBE_FAULT
#define PROBE_FAULT 0
#endif

// Words each thread dumps (mirrored in src/probe_wgmma.rs).
#define ACC_WORDS 32
#define KMAJOR_WORDS 32
#define PV_WORDS (32 + 16 + 64)

struct ProbeMaps {
    TmaMap a, b, c; // 2D maps (64 columns x rows boxes) of the global inputs
};

FA_DEVICE u32 pack16(float lo, float hi) { return elem_pack2<IS_BF16>(lo, hi); }

FA_DEVICE u64 kdesc(u32 tile, int kk, u32 sub_bytes) {
#if PROBE_FAULT
    // the fault: a 64-byte swizzle where TMA wrote a 128-byte one
    return (desc_kmajor_sw128(tile, kk, sub_bytes) & ~(3ull << 62)) | (2ull << 62);
#else
    return desc_kmajor_sw128(tile, kk, sub_bytes);
#endif
}
FA_DEVICE u64 vdesc(u32 tile, int kk, u32 sub_bytes) {
#if PROBE_FAULT
    // the fault: 8-key groups 512 bytes apart where they are 1024 apart
    return (desc_mnmajor_sw128(tile, kk, sub_bytes) & ~(0x3FFFull << 32)) | ((u64)(512 >> 4) << 32);
#else
    return desc_mnmajor_sw128(tile, kk, sub_bytes);
#endif
}

// Loads `boxes` boxes of map `m` (64 columns x rows each, columns 0, 64, ...) to `dst`
// (`box_bytes` apart) on barrier `bar`; thread 0 only.
FA_DEVICE void load_boxes(const TmaMap &m, u32 dst, u32 bar, int boxes, u32 box_bytes) {
    for (int j = 0; j < boxes; ++j) tma_load_2d(dst + j * box_bytes, m, bar, 64 * j, 0);
}

// The block's 1024-aligned shared tile area and its mbarrier; thread 0 starts the loads of
// `bytes` in total with `issue`, everyone returns once they have landed.
template <class F> FA_DEVICE u32 stage_inputs(unsigned char *raw, u64 *bar_obj, u32 bytes, F issue) {
    const u32 base = (smem_u32(raw) + 1023u) & ~1023u;
    const u32 bar = smem_u32(bar_obj);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        fence_mbar_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, bytes);
        issue(base, bar);
    }
    mbar_wait(bar, 0);
    return base;
}

extern "C" __global__ void __launch_bounds__(128, 1) wg_probe_acc(u32 *out, const __grid_constant__ ProbeMaps m) {
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) u64 bar;
    // A: 64 rows x 64 columns at base; B: 64 rows (n) x 64 columns (k) at base + 8192.
    const u32 base = stage_inputs(raw, &bar, 2 * 8192, [&](u32 b, u32 br) {
        load_boxes(m.a, b, br, 1, 8192);
        load_boxes(m.b, b + 8192, br, 1, 8192);
    });
    float d[32];
    wgmma_fence();
    wgmma_ss<64, 0>(d, desc_kmajor_sw128(base, 0, 8192), desc_kmajor_sw128(base + 8192, 0, 8192), 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
    for (int i = 0; i < 32; ++i) out[threadIdx.x * ACC_WORDS + i] = __float_as_uint(d[i]);
}

extern "C" __global__ void __launch_bounds__(128, 1)
    wg_probe_kmajor(u32 *out, u64 *descs, const __grid_constant__ ProbeMaps m) {
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) u64 bar;
    // A: 64 x 128 as two boxes of 8 KB at base; B: 64 x 128 as two boxes at base + 16384.
    const u32 base = stage_inputs(raw, &bar, 4 * 8192, [&](u32 b, u32 br) {
        load_boxes(m.a, b, br, 2, 8192);
        load_boxes(m.b, b + 16384, br, 2, 8192);
    });
    float d[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const u64 da = kdesc(base, kk, 8192), db = kdesc(base + 16384, kk, 8192);
        wgmma_ss<64, 0>(d, da, db, kk > 0);
        if (threadIdx.x == 0) {
            descs[kk] = da;
            descs[8 + kk] = db;
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
    for (int i = 0; i < 32; ++i) out[threadIdx.x * KMAJOR_WORDS + i] = __float_as_uint(d[i]);
}

extern "C" __global__ void __launch_bounds__(128, 1) wg_probe_pv(u32 *out, u64 *descs, const __grid_constant__ ProbeMaps m) {
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) u64 bar;
    // Q: 64 x 64 at base; K: 64 keys x 64 at base + 8192; V: 64 keys x 128 as two boxes at
    // base + 16384 (LBO 8192).
    const u32 base = stage_inputs(raw, &bar, 4 * 8192, [&](u32 b, u32 br) {
        load_boxes(m.a, b, br, 1, 8192);
        load_boxes(m.b, b + 8192, br, 1, 8192);
        load_boxes(m.c, b + 16384, br, 2, 8192);
    });
    float s[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        wgmma_ss<64, 0>(s, desc_kmajor_sw128(base, kk, 8192), desc_kmajor_sw128(base + 8192, kk, 8192), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    // P register r = pack(s[2r], s[2r+1]): the A fragment of keys 16kk.. is p[4kk..4kk+3].
    u32 pf[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) pf[r] = pack16(s[2 * r], s[2 * r + 1]);
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const u64 dv = vdesc(base + 16384, kk, 8192);
        wgmma_rs<128, 1>(o, pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3], dv, 1);
        if (threadIdx.x == 0) descs[kk] = dv;
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    u32 *w = out + threadIdx.x * PV_WORDS;
    for (int i = 0; i < 32; ++i) w[i] = __float_as_uint(s[i]);
    for (int i = 0; i < 16; ++i) w[32 + i] = pf[i];
    for (int i = 0; i < 64; ++i) w[48 + i] = __float_as_uint(o[i]);
}

// ---- the FP8 (e4m3) experiments of attn_wgmma_fp8.cu (tools/src/probe_wgmma_fp8.rs) ----
// Tiles are TMA boxes of 128 one-byte columns (one 128-byte swizzled row per matrix row).
// wg_probe_fp8_qk: the Q K^T path. A = Q 64x128 one-hot, B = K 64 rows x 128, both K-major, 4
//                  k-steps of m64n64k32 through desc_kmajor_sw128. Dump d0..d31, then the 4 A
//                  and 4 B descriptors.
// wg_probe_fp8_vt: the V^T pre-pass (fp8.cuh vt_block) of attn_wgmma_fp8, on the probe's V.
// wg_probe_fp8_pv: the P V path. S = Q K^T (m64n128, 4 k-steps; Q 64x128, K 128 keys x 128),
//                  P packed from S to e4m3 by p_frag as the register A operand, 8 rows of ones
//                  written after V^T (128 channel rows x 128 key positions, TMA), O = P V^T
//                  (m64n136k32 x 4, B K-major through the kernel's descriptor). Dump s0..s63,
//                  p0..p15, o0..o67, then the 4 V^T descriptors.
#include "fp8.cuh"
#include "wgmma_fp8_ops.cuh"

extern "C" __global__ void __launch_bounds__(128, 1)
    wg_probe_fp8_qk(u32 *out, u64 *descs, const __grid_constant__ ProbeMaps m) {
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) u64 bar;
    const u32 base = stage_inputs(raw, &bar, 2 * 8192, [&](u32 b, u32 br) {
        tma_load_2d(b, m.a, br, 0, 0);
        tma_load_2d(b + 8192, m.b, br, 0, 0);
    });
    float d[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const u64 da = kdesc(base, kk, 8192), db = kdesc(base + 8192, kk, 8192);
        wgmma_fp8_ss<64>(d, da, db, kk > 0);
        if (threadIdx.x == 0) {
            descs[kk] = da;
            descs[4 + kk] = db;
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
    for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = __float_as_uint(d[i]);
}

extern "C" __global__ void __launch_bounds__(VT_THREADS) wg_probe_fp8_vt(const __grid_constant__ VtParams p) {
    __shared__ __align__(16) u8 tile[VT_KEYS * (128 + 4)];
    vt_block(p, tile, blockIdx.x, blockIdx.y, blockIdx.z);
}

extern "C" __global__ void __launch_bounds__(128, 1)
    wg_probe_fp8_pv(u32 *out, u64 *descs, const __grid_constant__ ProbeMaps m) {
    extern __shared__ __align__(1024) unsigned char raw[];
    __shared__ __align__(8) u64 bar;
    // Q at base (8 KB), K at base + 8192 (16 KB), V^T at base + 24576 (16 KB, then 1 KB of ones).
    const u32 base = stage_inputs(raw, &bar, 8192 + 2 * 16384, [&](u32 b, u32 br) {
        tma_load_2d(b, m.a, br, 0, 0);
        tma_load_2d(b + 8192, m.b, br, 0, 0);
        tma_load_2d(b + 24576, m.c, br, 0, 0);
    });
    const u32 vt = base + 24576;
    for (u32 i = 4 * threadIdx.x; i < 1024; i += 4 * 128) st_shared_u32(vt + 16384 + i, 0x38383838u); // e4m3 1.0
    fence_proxy_async();
    __syncthreads();
    float s[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        wgmma_fp8_ss<128>(s, desc_kmajor_sw128(base, kk, 8192), desc_kmajor_sw128(base + 8192, kk, 16384), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    u32 pf[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) pf[r] = p_frag(s, r / 4, r % 4);
    float o[68];
#pragma unroll
    for (int i = 0; i < 68; ++i) o[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const u64 dv = kdesc(vt, kk, 16384);
        wgmma_fp8_rs<136>(o, pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3], dv, 1);
        if (threadIdx.x == 0) descs[kk] = dv;
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    u32 *w = out + threadIdx.x * (64 + 16 + 68);
    for (int i = 0; i < 64; ++i) w[i] = __float_as_uint(s[i]);
    for (int i = 0; i < 16; ++i) w[64 + i] = pf[i];
    for (int i = 0; i < 68; ++i) w[80 + i] = __float_as_uint(o[i]);
}
