// sink_grad.cu: the gradient of a learnable attention sink (gpt-oss; src/scores.rs states the
// forward), launched after the backward's attn_bwd_dsum has written D = rowsum(dO * O):
//   d_sink[h] = -sum over (b, i) of exp(sink_h - lse_bhi) * D_bhi
// (src/reference_grad.rs derives it: the sink's probability in row i is exp(sink_h - lse_i),
// lse being the forward's, which includes the sink). The main backward kernels need nothing:
// P and dS recomputed from that lse are already the sink-aware ones.
//
// One block per query head sums the rows of its head in a fixed order (each thread a strided
// share in f64, then a tree in shared memory): the same bytes run to run, and no cancellation
// loss over millions of rows. lse and D share one layout: row i of (b, h) at b * lse_sb +
// h * lse_sh + i (dense [batch, heads_q, seqlen_q]: lse_sb = heads_q * seqlen_q, lse_sh =
// seqlen_q; a packed batch's [heads_q, total_q]: batch 1, rows = total_q, lse_sh = total_q).
#include "ptx.cuh"

constexpr int THREADS = 256;

struct SinkGradParams {
    const float *lse;  // the forward's lse (natural log, the sink's term included)
    const float *dsum; // D, laid out as lse
    const float *sink; // the sink's logits, [heads_q]
    float *d_sink;     // [heads_q], written (not added to)
    long long lse_sb, lse_sh;
    int batch, rows;
};

extern "C" __global__ void __launch_bounds__(THREADS) sink_grad(const SinkGradParams p) {
    __shared__ double part[THREADS];
    const int h = blockIdx.x, tid = threadIdx.x;
    const float s = p.sink[h];
    const long long n = (long long)p.batch * p.rows;
    double acc = 0.0;
    for (long long r = tid; r < n; r += THREADS) {
        const long long b = r / p.rows, i = r % p.rows;
        const long long at = b * p.lse_sb + h * p.lse_sh + i;
        // exp(s - lse) <= 1 (lse includes the sink), as 2^((s - lse) log2 e).
        acc += (double)(ex2((s - p.lse[at]) * 1.4426950408889634f) * p.dsum[at]);
    }
    part[tid] = acc;
    __syncthreads();
#pragma unroll
    for (int w = THREADS / 2; w > 0; w /= 2) {
        if (tid < w) part[tid] += part[tid + w];
        __syncthreads();
    }
    if (tid == 0) p.d_sink[h] = (float)(-part[0]);
}
