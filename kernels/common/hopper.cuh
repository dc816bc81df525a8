// hopper.cuh: the Hopper (sm_90/sm_90a) instructions of attn_wgmma.cu and the wgmma probe, as
// small inline-PTX wrappers: the tensor copy engine (TMA), mbarriers, wgmma fences and
// shared-memory matrix descriptors, setmaxnreg and named barriers. Header-free like ptx.cuh
// (included after it). Section numbers refer to the PTX ISA 9.0 manual.
#pragma once

// ---- tensor maps: the 128-byte CUtensorMap that cuTensorMapEncodeTiled writes on the host,
// passed by value as a __grid_constant__ kernel parameter (its address is then a generic
// address in the parameter space, which is what cp.async.bulk.tensor takes).
struct __align__(64) TmaMap {
    u64 opaque[16];
};
FA_DEVICE u64 tma_addr(const TmaMap &m) { return (u64)(&m); }
// Loads the map into the tensor-map cache ahead of its first use (9.7.9.15 prefetch).
FA_DEVICE void tma_prefetch(const TmaMap &m) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(tma_addr(m)) : "memory");
}

// ---- mbarrier (9.7.13.15): a 64-bit shared-memory object with an arrival count and a
// transaction (byte) count; a phase completes when both reach zero, then the next phase begins.
FA_DEVICE void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the TMA unit) (9.7.13.4 fence).
FA_DEVICE void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also adds `bytes` to the transaction count the phase waits for.
FA_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
FA_DEVICE void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed (try_wait suspends the thread for a
// system-dependent time before returning false, so the loop does not spin hot).
FA_DEVICE void mbar_wait(u32 bar, u32 parity) {
    asm volatile("{\n"
                 " .reg .pred done;\n"
                 "WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra WAIT_%=;\n"
                 "}\n" ::"r"(bar), "r"(parity) : "memory");
}

// ---- TMA (9.7.9.25.5.1 cp.async.bulk.tensor): one thread copies a box of a tensor described by
// a tensor map between global and shared memory. Loads complete on an mbarrier (complete_tx
// subtracts the bytes written); elements outside the tensor are written as zeros. Coordinates
// are element indices, innermost dimension first.
FA_DEVICE void tma_load_4d(u32 dst, const TmaMap &map, u32 bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst), "l"(tma_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
FA_DEVICE void tma_load_2d(u32 dst, const TmaMap &map, u32 bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst), "l"(tma_addr(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
// Stores: elements outside the tensor are not written. Completion is tracked per thread with
// bulk async-groups (9.7.9.25.5.2-3 cp.async.bulk.commit_group / wait_group).
FA_DEVICE void tma_store_4d(const TmaMap &map, u32 src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 ::"l"(tma_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}
FA_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the shared memory of every committed store has been read (safe to reuse/exit).
FA_DEVICE void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Adds `bytes` (a multiple of 16; both addresses 16-byte aligned) of f32 from shared memory to
// global memory, element by element, in the L2 (9.7.9.25.4.2 cp.reduce.async.bulk, sm_90):
// one request per row instead of one atomic per element. Completion as the stores above.
FA_DEVICE void bulk_reduce_add_f32(float *dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
// Waits until every committed bulk operation of this thread has completed (writes included).
FA_DEVICE void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders this thread's completed async-proxy global writes (bulk reductions) before its later
// generic accesses, such as a release that publishes them to other blocks (9.7.13.4 fence).
FA_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
// Ordinary shared-memory writes become visible to the async proxy (TMA, wgmma) only after
// this fence in the writing thread, before the barrier that publishes them (9.7.13.4 fence).
FA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- named barriers (9.7.13.1 bar): `count` threads (a multiple of 32) meet at barrier `id`
// (0 is __syncthreads). arrive signals without waiting, so one group can release another.
FA_DEVICE void named_sync(u32 id, u32 count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
FA_DEVICE void named_arrive(u32 id, u32 count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// The same from a warp whose other threads may have exited (barrier.arrive without .aligned);
// the arriving warp still counts 32 threads.
FA_DEVICE void named_arrive_unaligned(u32 id, u32 count) {
    asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- setmaxnreg (9.7.19.5, sm_90a): a warpgroup gives registers back (dec) or takes more
// (inc) from the pool its block was launched with; every warp of the warpgroup executes it.
template <int N> FA_DEVICE void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> FA_DEVICE void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// ---- wgmma ordering (9.7.15.6): fence before the first wgmma that reads registers written
// since (accumulators, A fragments); commit closes a group of issued wgmmas; wait_group<N>
// returns when at most N groups are still in flight.
FA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FA_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Pins accumulator registers in place around asynchronous wgmmas, so that the compiler neither
// reads nor moves them while an instruction that writes them is in flight.
template <int N> FA_DEVICE void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> FA_DEVICE void fence_regs_u32(u32 (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// ---- shared-memory matrix descriptor (9.7.15.5.1, "Matrix Descriptor Format"):
//   bits  0-13 start address >> 4      bits 16-29 leading-dimension byte offset >> 4
//   bits 32-45 stride-dimension byte offset >> 4      bits 49-51 base offset (0 here)
//   bits 62-63 swizzle: 0 none, 1 = 128-byte, 2 = 64-byte, 3 = 32-byte.
// With the 128-byte swizzle, 16-byte chunk c of the 128-byte row r of an 8-row, 1024-byte
// atom sits at chunk c ^ (r % 8): the pattern TMA writes with CU_TENSOR_MAP_SWIZZLE_128B. Atoms
// must start 1024-byte aligned (the XOR reads address bits 7-9).
// - K-major operand (Q, K: rows of 64 16-bit elements of the contracted dimension): SBO = 1024
//   (the next 8 rows); LBO unused; k-step s of 16 elements starts 32*s bytes into the row.
// - MN-major operand (V in P V: rows are keys, 64 head_dim columns per atom row): SBO = 1024
//   (the next 8 keys along K), LBO = the byte distance to the next 64 columns.
constexpr int SWIZZLE_128B = 1;
FA_DEVICE u64 make_desc(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes, int swizzle) {
    return (u64)((smem_addr & 0x3FFFF) >> 4) | ((u64)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((u64)((sbo_bytes >> 4) & 0x3FFF) << 32) | ((u64)swizzle << 62);
}

// The descriptors of a tile that TMA wrote as 128-byte-swizzled boxes of 64 16-bit columns
// (row r of a box at r*128 bytes; `sub_bytes` apart for each further 64 columns):
// - as a K-major operand (Q, K; rows = M or N, columns = the contracted k): k-step kk (16
//   columns) starts 32*(kk%4) bytes into box kk/4; SBO 1024 = the next 8 rows; LBO unused
//   (16, as CUTLASS writes it).
FA_DEVICE u64 desc_kmajor_sw128(u32 tile, int kk, u32 sub_bytes) {
    return make_desc(tile + (u32)(kk / 4) * sub_bytes + (u32)(kk % 4) * 32, 16, 1024, SWIZZLE_128B);
}
// - as an MN-major B operand (V in P V; rows = the contracted keys, columns = N): k-step kk
//   (keys 16kk..16kk+15) starts at row 16kk; SBO 1024 = the next 8 keys; LBO = `sub_bytes`, the
//   next 64 columns of N.
FA_DEVICE u64 desc_mnmajor_sw128(u32 tile, int kk, u32 sub_bytes) {
    return make_desc(tile + (u32)kk * 16 * 128, sub_bytes, 1024, SWIZZLE_128B);
}
