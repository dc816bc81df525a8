// ptx.cuh: the PTX instructions our kernels use, as small inline wrappers.
//
// Header-free on purpose: NVRTC on a user's machine has no CUDA include path, so halves are
// raw 16-bit storage (u16) and every conversion is a PTX instruction. Section numbers refer
// to the PTX ISA 9.0 manual ("Parallel Thread Execution ISA").
#pragma once

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FA_DEVICE __device__ __forceinline__

// Generic -> shared-window address (9.7.9.21 cvta). ldmatrix/cp.async take 32-bit shared addresses.
FA_DEVICE u32 smem_u32(const void *p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// ---- ldmatrix (9.7.14.5.15): each lane supplies one 16-byte row address; lanes 8i..8i+7
// address the 8 rows of tile i; register ri of lane l holds row l/4, columns 2(l%4), 2(l%4)+1
// of tile i (.trans: rows 2(l%4), 2(l%4)+1 of column l/4).
FA_DEVICE void ldmatrix_x1(u32 &r0, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r0) : "r"(addr));
}
FA_DEVICE void ldmatrix_x2(u32 &r0, u32 &r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}
FA_DEVICE void ldmatrix_x4(u32 &r0, u32 &r1, u32 &r2, u32 &r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
FA_DEVICE void ldmatrix_x1_trans(u32 &r0, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r0) : "r"(addr));
}
FA_DEVICE void ldmatrix_x2_trans(u32 &r0, u32 &r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1) : "r"(addr));
}
FA_DEVICE void ldmatrix_x4_trans(u32 &r0, u32 &r1, u32 &r2, u32 &r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// ---- stmatrix (9.7.14.5.16, sm_90): the inverse of ldmatrix with the same .trans: register ri
// of lane l goes to the cells of tile i that ldmatrix would hand to it, at the 16-byte row
// addresses of lanes 8i..8i+7. Proven by layout_probe.cu's layout_trans_store.
#if __CUDA_ARCH__ >= 900
FA_DEVICE void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
FA_DEVICE void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
#endif

// ---- mma.sync m16n8k16 (9.7.14.5.14), f32 accumulate. With g = lane/4, t = lane%4:
// A (row): a0={A[g][2t],A[g][2t+1]} a1={A[g+8][2t],..} a2={A[g][2t+8],..} a3={A[g+8][2t+8],..}
// B (col): b0={B[2t][g],B[2t+1][g]} b1={B[2t+8][g],B[2t+9][g]}
// C/D:     d0=(g,2t) d1=(g,2t+1) d2=(g+8,2t) d3=(g+8,2t+1)
FA_DEVICE void mma_f16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
FA_DEVICE void mma_bf16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- cp.async (9.7.9.25): 16-byte global -> shared copies that bypass registers.
// src_bytes < 16 zero-fills the rest; 0 reads nothing (used for rows past the end).
FA_DEVICE void cp_async_16(u32 dst, const void *src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4-byte form (.ca: 4 and 8 bytes go through L1), zero-filling when src_bytes is 0.
FA_DEVICE void cp_async_4(u32 dst, const void *src, u32 src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
FA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FA_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ---- acquire/release on a global counter (9.7.13.4 memory consistency: ld.acquire,
// red.release at gpu scope): one block publishes what it wrote before the release, the block
// whose acquire sees the new count may read it.
FA_DEVICE int ld_acquire_gpu(const int *p) {
    int x;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
    return x;
}
FA_DEVICE void red_release_gpu_add(int *p, int x) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(x) : "memory");
}

// ---- plain shared/global vector accesses (9.7.9.8 ld, 9.7.9.10 st).
FA_DEVICE void st_shared_u32(u32 addr, u32 x) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
FA_DEVICE u32 ld_shared_u32(u32 addr) {
    u32 x;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x) : "r"(addr) : "memory");
    return x;
}
FA_DEVICE void ld_shared_f32x2(u32 addr, float &x, float &y) {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(addr));
}
FA_DEVICE void st_shared_u16(u32 addr, u16 x) { asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"(x)); }
FA_DEVICE void st_shared_f32x2(u32 addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y));
}
FA_DEVICE void ld_shared_v4(u32 &x0, u32 &x1, u32 &x2, u32 &x3, u32 addr) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3) : "r"(addr));
}
FA_DEVICE void st_shared_v4(u32 addr, u32 x0, u32 x1, u32 x2, u32 x3) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
}
FA_DEVICE void st_global_v4(void *p, u32 x0, u32 x1, u32 x2, u32 x3) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(x0), "r"(x1), "r"(x2), "r"(x3)
                 : "memory");
}

// ---- conversions (9.7.9.21 cvt). Packing puts the first value in the low half, as the
// A fragment wants (lower column index in the lower 16 bits).
FA_DEVICE u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
FA_DEVICE u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
FA_DEVICE float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}
FA_DEVICE float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }
FA_DEVICE u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    return h;
}
FA_DEVICE u16 f32_to_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    return h;
}

// ---- 16-bit elements by type: BF16 (a compile-time 0 or 1) picks bf16 over f16, so each of
// these is the one conversion (or mma) it names. The kernels wrap them with their own define.
template <int BF16> FA_DEVICE float elem_to_f32(u16 x) { return BF16 ? bf16_to_f32(x) : f16_to_f32(x); }
template <int BF16> FA_DEVICE u16 elem_from_f32(float x) { return BF16 ? f32_to_bf16(x) : f32_to_f16(x); }
template <int BF16> FA_DEVICE u32 elem_pack2(float lo, float hi) {
    return BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
}
template <int BF16> FA_DEVICE void elem_mma(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if (BF16)
        mma_bf16(d, a0, a1, a2, a3, b0, b1);
    else
        mma_f16(d, a0, a1, a2, a3, b0, b1);
}

// ---- fast math (9.7.3.x): 2^x with flush-to-zero; ex2(-inf) = +0.
FA_DEVICE float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// Round-to-nearest multiply that the compiler may not fuse into an FMA (9.7.3.5 mul).
// Softmax needs p = 2^(x - m) with x = round(s * scale) and m = max of those same rounded
// values, so that x - m <= 0 exactly: fma(s, scale, -m) keeps the product's rounding error,
// which for logits near 1e10 is thousands, and 2^thousands is inf.
FA_DEVICE float fmul_rn(float a, float b) {
    float y;
    asm("mul.rn.f32 %0, %1, %2;\n" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
// 1/x (PTX ISA, floating-point instructions: rcp.approx.f32, maximum relative error about
// 2^-23 on normal inputs); rcp(inf) = +0.
FA_DEVICE float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// tanh(a / (2 log2 e)) = 1 - 2 / (2^a + 1), for soft-capping (the caller folds 2 log2 e into
// its factor), to an absolute error near 1e-7 (ex2.approx: 2^-22 relative). tanh.approx.f32
// (PTX ISA, floating-point instructions: tanh) has 2^-11 relative error: soft-capped scores of
// 50 would be off by 0.02, a 2 % error in p. Saturates to +-1 at +-inf; NaN stays NaN.
// (A Newton reciprocal on the FMA pipe instead of rcp.approx measured the same speed: run 36.)
FA_DEVICE float tanh_exp2(float a) { return 1.f - 2.f * rcp_approx(ex2(a) + 1.f); }
FA_DEVICE float lg2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- warp shuffles (9.7.9.9 shfl.sync): lane 0's value to the whole warp (a value ptxas can
// tell is warp-uniform).
FA_DEVICE int shfl_lane0(int x) {
    int y;
    asm volatile("shfl.sync.idx.b32 %0, %1, 0, 0x1f, 0xffffffff;\n" : "=r"(y) : "r"(x));
    return y;
}
// Butterfly exchange inside the quad that owns a row.
FA_DEVICE float shfl_xor(float x, int mask) {
    float y;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;\n" : "=f"(y) : "f"(x), "r"(mask));
    return y;
}

// vote.sync.any (9.7.13.x vote): true in every lane when the predicate holds in any lane.
FA_DEVICE bool vote_any(bool pred) {
    u32 r;
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n vote.sync.any.pred q, p, 0xffffffff;\n selp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(r) : "r"((u32)pred));
    return r != 0;
}

// vote.sync.all (9.7.13.x vote): true in every lane when the predicate holds in every lane.
FA_DEVICE bool vote_all(bool pred) {
    u32 r;
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n vote.sync.all.pred q, p, 0xffffffff;\n selp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(r) : "r"((u32)pred));
    return r != 0;
}

// Special registers read with asm volatile: ptxas cannot merge the read with an earlier one,
// so values derived from it after a long loop are recomputed there instead of being held in
// registers across the loop (9.7.9.? mov; special registers: PTX ISA 10.1 %tid, 10.5 %ctaid).
FA_DEVICE unsigned fresh_tid_x() {
    unsigned r;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(r));
    return r;
}
// The SM's cycle counter and the global nanosecond timer (PTX ISA chapter 10, Special
// Registers: %clock, %globaltimer), for the diagnostics build of attn_wgmma (TRACE).
FA_DEVICE u32 clock_lo() {
    u32 r;
    asm volatile("mov.u32 %0, %%clock;\n" : "=r"(r));
    return r;
}
FA_DEVICE unsigned long long global_ns() {
    unsigned long long r;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(r));
    return r;
}
FA_DEVICE unsigned fresh_ctaid_x() {
    unsigned r;
    asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(r));
    return r;
}

FA_DEVICE float neg_inf() { return __int_as_float(0xff800000); }
