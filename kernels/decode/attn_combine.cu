// attn_combine.cu: the exact merge of split-KV partial results (src/merge.rs states the rule):
// for each query row, lse = ln sum_s exp(lse_s) and o = sum_s exp(lse_s - lse) o_s, in f32,
// in split order (the same bytes run to run). A split that saw no key (lse_s = -inf) adds
// nothing; a row whose splits all saw none gets o = 0 and lse = -inf; a NaN propagates.
// One warp per row (b, h, i); lanes hold 4 channels each. Specialised by HEAD_DIM, IS_BF16 and
// HAS_SINK: a learnable sink merges as one more split with lse_s = sink_h and o_s = 0 (its
// logits, f32 [heads_q], the kernel's second parameter), so every row then has a finite lse.
#include "ptx.cuh"
#include "attn_common.cuh"

struct CombineParams {
    const float *o_accum;   // [splits, batch, heads_q, seqlen_q, HEAD_DIM]
    const float *lse_accum; // [splits, batch, heads_q, seqlen_q]
    u16 *o;                 // [batch, seqlen_q, heads_q, HEAD_DIM] with these strides
    float *lse;             // [batch, heads_q, seqlen_q]
    i64 o_sb, o_ss, o_sh;
    int batch, heads_q, seqlen_q, num_splits;
};

extern "C" __global__ void __launch_bounds__(128) attn_combine(const CombineParams p SINK_PARAM) {
    const int lane = threadIdx.x % 32;
    const i64 rows = (i64)p.batch * p.heads_q * p.seqlen_q;
    const i64 row = (i64)blockIdx.x * 4 + threadIdx.x / 32; // (b, h, i), i fastest
    if (row >= rows) return;
    const int i = (int)(row % p.seqlen_q);
    const int h = (int)((row / p.seqlen_q) % p.heads_q);
    const int b = (int)(row / ((i64)p.seqlen_q * p.heads_q));
    // The largest partial lse (NaN noted apart: fmaxf would drop it).
    float m = neg_inf();
    bool nan = false;
    for (int s = lane; s < p.num_splits; s += 32) {
        const float l = p.lse_accum[s * rows + row];
        nan |= l != l;
        m = fmaxf(m, l);
    }
    for (int x = 16; x >= 1; x /= 2) m = fmaxf(m, shfl_xor(m, x));
    nan = vote_any(nan);
    const float sink = sink_logit(SINK_LOGITS, h);
    if (HAS_SINK) m = fmaxf(m, sink);
    u16 *orow = p.o + b * p.o_sb + i * p.o_ss + h * p.o_sh;
    float *lse = p.lse + row; // [batch, heads_q, seqlen_q] is the row order
    if (nan || m == neg_inf() || m == -neg_inf()) {
        // No key anywhere: zeros and -inf. A NaN (or +inf) lse: NaN everywhere.
        const float fill = (nan || m != neg_inf()) ? __int_as_float(0x7fc00000) : 0.f;
        for (int c = lane * 4; c < HEAD_DIM; c += 128)
#pragma unroll
            for (int e = 0; e < 4; ++e) orow[c + e] = from_f32(fill);
        if (lane == 0) *lse = (nan || m != neg_inf()) ? fill : neg_inf();
        return;
    }
    float sum = 0.f;
    for (int s = lane; s < p.num_splits; s += 32) sum += ex2((p.lse_accum[s * rows + row] - m) * LOG2E);
    for (int x = 16; x >= 1; x /= 2) sum += shfl_xor(sum, x);
    if (HAS_SINK) sum += ex2((sink - m) * LOG2E); // the sink's share, with no o of its own
    const float inv = 1.f / sum;
    for (int c = lane * 4; c < HEAD_DIM; c += 128) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int s = 0; s < p.num_splits; ++s) {
            const float w = ex2((p.lse_accum[s * rows + row] - m) * LOG2E) * inv;
            if (w == 0.f) continue; // an empty split's o is 0 and must not turn 0 * x into NaN
            const float4 x = *(const float4 *)(p.o_accum + (s * rows + row) * HEAD_DIM + c);
            acc[0] += w * x.x;
            acc[1] += w * x.y;
            acc[2] += w * x.z;
            acc[3] += w * x.w;
        }
        *(u32 *)(orow + c) = pack2(acc[0], acc[1]);
        *(u32 *)(orow + c + 2) = pack2(acc[2], acc[3]);
    }
    if (lane == 0) *lse = m + lg2(sum) * LN2;
}
