// read_pass.cu: a read-only pass over two buffers, the memory-bandwidth ceiling that
// `bench --decode` sets the decode kernels against (the same bytes of k and v, read once).
// Grid-stride 16-byte loads, four in flight per thread; one word per block is written (the
// XOR of everything read) so that the loads cannot be dropped.
#include "ptx.cuh"

extern "C" __global__ void __launch_bounds__(512) read_pass(const uint4 *a, u64 na, const uint4 *b, u64 nb,
                                                            u32 *sink) {
    u32 x = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (int which = 0; which < 2; ++which) {
        const uint4 *p = which == 0 ? a : b;
        const u64 n = which == 0 ? na : nb;
        u64 i = t;
        for (; i + 3 * stride < n; i += 4 * stride) {
            uint4 v0, v1, v2, v3;
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v0.x), "=r"(v0.y), "=r"(v0.z), "=r"(v0.w) : "l"(p + i));
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v1.x), "=r"(v1.y), "=r"(v1.z), "=r"(v1.w) : "l"(p + i + stride));
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v2.x), "=r"(v2.y), "=r"(v2.z), "=r"(v2.w) : "l"(p + i + 2 * stride));
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v3.x), "=r"(v3.y), "=r"(v3.z), "=r"(v3.w) : "l"(p + i + 3 * stride));
            x ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w ^ v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;
        }
        for (; i < n; i += stride) {
            const uint4 v = p[i];
            x ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    for (int m = 16; m >= 1; m /= 2) x ^= __shfl_xor_sync(0xffffffffu, x, m);
    if (threadIdx.x % 32 == 0) atomicXor(sink + blockIdx.x, x);
}
