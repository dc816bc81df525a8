// bwd_common.cuh: what the two backward kernels (attn_bwd.cu on mma.sync, attn_bwd_wgmma.cu
// on wgmma) share: their parameters, the D = rowsum(dO O) and dQ-conversion kernels, the
// steps of query rows a key block visits, and the rows that see a key. Included after
// ptx.cuh and attn_common.cuh.
#pragma once

struct BwdParams {
    Params p;              // q, k, v, lse, strides, lengths, heads, scale_log2, window
    const u16 *d_o;        // do, o's layout
    i64 do_sb, do_ss, do_sh;
    float *dsum;           // D, laid out as lse (written by attn_bwd_dsum)
    float *dq_accum;       // dense [batch, seqlen_q, heads_q, head_dim] f32, zeroed by the host
    u16 *dk, *dv;          // dense [batch, seqlen_k, heads_kv, head_dim]
    float scale;           // softmax_scale (dS is the gradient of the scaled score)
    int heads_kv, num_k_blocks;
    int *dq_order;         // DETERMINISTIC (attn_bwd): per (batch, query head, step of rows),
                           // the key blocks that have added their dQ tile; zeroed by the host
};

// D_i = do_i . o_i in f32, written where lse has it. Eight threads per (batch, row, head):
// thread j takes the 8-channel chunks j, j + 8, ... (16-byte loads where both rows are
// 16-byte aligned, element loads otherwise), then the eight sum by shuffles. Consecutive
// threads read consecutive bytes of a row (the row is the contiguous dimension).
extern "C" __global__ void attn_bwd_dsum(const BwdParams bp, const u16 *o, i64 o_sb, i64 o_ss, i64 o_sh) {
    const Params &p = bp.p;
#if IS_VARLEN
    const i64 n = (i64)p.total_q * p.heads_q; // packed rows (attn_bwd's IS_VARLEN)
#else
    const i64 n = (i64)p.batch * p.seqlen_q * p.heads_q;
#endif
    const i64 idx = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 8;
    const int j = (int)(threadIdx.x % 8);
    const bool live = idx < n; // every lane stays for the shuffles
    const i64 at = live ? idx : 0;
    const int h = (int)(at % p.heads_q);
#if IS_VARLEN
    // Row i of the packed o and do, batch entry 0: lse_offset is then h total_q + i.
    const int i = (int)(at / p.heads_q), b = 0;
#else
    const int i = (int)(at / p.heads_q % p.seqlen_q);
    const int b = (int)(at / p.heads_q / p.seqlen_q);
#endif
    const u16 *orow = o + b * o_sb + i * o_ss + h * o_sh;
    const u16 *drow = bp.d_o + b * bp.do_sb + i * bp.do_ss + h * bp.do_sh;
    float sum = 0.f;
    if (live) {
        if ((((unsigned long long)orow | (unsigned long long)drow) & 15) == 0) {
            for (int c = 8 * j; c < D; c += 64) {
                const uint4 o4 = *(const uint4 *)(orow + c), d4 = *(const uint4 *)(drow + c);
                const u32 ov[4] = {o4.x, o4.y, o4.z, o4.w}, dv[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sum = fmaf(to_f32((u16)(dv[e] & 0xffff)), to_f32((u16)(ov[e] & 0xffff)), sum);
                    sum = fmaf(to_f32((u16)(dv[e] >> 16)), to_f32((u16)(ov[e] >> 16)), sum);
                }
            }
        } else {
            for (int c = 8 * j; c < D; c += 64)
                for (int e = 0; e < 8 && c + e < D; ++e) sum = fmaf(to_f32(drow[c + e]), to_f32(orow[c + e]), sum);
        }
    }
    sum += shfl_xor(sum, 1);
    sum += shfl_xor(sum, 2);
    sum += shfl_xor(sum, 4);
    if (live && j == 0) bp.dsum[lse_offset(p, b, h, 0) + i] = sum;
}

// The f32 dQ workspace to the element type (dense, same index).
extern "C" __global__ void attn_bwd_dq(const float *dq_accum, u16 *dq, i64 n) {
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) dq[idx] = from_f32(dq_accum[idx]);
}

// The steps of BR rows that key block n (keys n BC ..) visits, [m_begin, m_end): the rows
// whose key range meets its keys, [i_begin, i_end) (row i sees keys [key_lo(i), key_hi(i)),
// both non-decreasing in i, so both ends are non-decreasing in n).
template <int BR, int BC> FA_DEVICE void step_range(const Params &p, int n, int &m_begin, int &m_end) {
    const i64 key0 = (i64)n * BC, diag = (i64)p.seqlen_k - p.seqlen_q;
    i64 i_begin = 0, i_end = p.seqlen_q;
    if (IS_CAUSAL || IS_LOCAL) {
        const i64 right = IS_CAUSAL ? 0 : p.window_right;
        const i64 first = key0 - diag - right; // key_hi(i) > key0
        i_begin = first < 0 ? 0 : (first > p.seqlen_q ? p.seqlen_q : first);
    }
    if (IS_LOCAL) {
        const i64 last = key0 + BC - diag + p.window_left; // key_lo(i) < key0 + BC
        i_end = last < 0 ? 0 : (last > p.seqlen_q ? p.seqlen_q : last);
    }
    m_begin = (int)(i_begin / BR);
    m_end = i_end > i_begin ? (int)((i_end + BR - 1) / BR) : m_begin;
}

// The last key block that visits step m, given that block n does (step_range's ends are
// non-decreasing in n, so the blocks that visit m are one run from n): the deterministic
// modes' count of the blocks that add to a dQ tile before block n (last - n, descending).
template <int BR, int BC> FA_DEVICE int last_block_of_step(const Params &p, int num_k_blocks, int n, int m) {
    int lo = n, hi = num_k_blocks - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        int mb, me;
        step_range<BR, BC>(p, mid, mb, me);
        if (mb <= m && me > m) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// A block's key block (keys key0 = n_block BC ..), kv head hk and batch b, from its tile
// index (its index in the grid, or a persistent block's current tile: n_index, its key block
// in launch order, the last first when `reversed`), and its steps: over (query head of the
// group, step of BR rows), head_of(p, s) and row0_of(s).
template <int BR, int BC> struct KeyBlock {
    int n_block, hk, b, key0, diag, m_begin, steps_per_head, steps;
    FA_DEVICE KeyBlock(const BwdParams &bp, bool reversed) : KeyBlock(bp, reversed, blockIdx.x) {}
    FA_DEVICE KeyBlock(const BwdParams &bp, bool reversed, unsigned tile) {
        const Params &p = bp.p;
        const int n_index = (int)(tile % bp.num_k_blocks);
        n_block = reversed ? bp.num_k_blocks - 1 - n_index : n_index;
        const int rem = (int)(tile / bp.num_k_blocks);
        hk = rem % bp.heads_kv;
        b = rem / bp.heads_kv;
        key0 = n_block * BC;
        diag = p.seqlen_k - p.seqlen_q;
        int m_end;
        step_range<BR, BC>(p, n_block, m_begin, m_end);
        steps_per_head = m_end - m_begin;
        steps = steps_per_head * p.group;
    }
    FA_DEVICE int head_of(const Params &p, int s) const { return hk * p.group + s / steps_per_head; }
    FA_DEVICE int row0_of(int s) const { return (m_begin + s % steps_per_head) * BR; }
};

// The rows that see key j, as offsets from row0: [rmin, rmax] (attn_common.cuh's key range
// turned around: rows j - diag - right .. j - diag + left, right = 0 when causal), cut at
// seqlen_q; a key past seqlen_k is seen by none. Clamped to +-2^30.
// diag = seqlen_k - seqlen_q, from the caller (computed once per block).
FA_DEVICE void rows_of_key(const Params &p, int diag, i64 j, int row0, int &rmin, int &rmax) {
    const i64 right = IS_CAUSAL ? 0 : (IS_LOCAL ? p.window_right : (1 << 30));
    const i64 lo = j >= p.seqlen_k ? (1 << 30) : j - diag - right - row0;
    const i64 last = (i64)p.seqlen_q - 1 - row0;
    i64 hi = IS_LOCAL ? j - diag + p.window_left - row0 : last;
    hi = hi < last ? hi : last;
    rmin = (int)(lo < -(1 << 30) ? -(1 << 30) : (lo > (1 << 30) ? (1 << 30) : lo));
    rmax = (int)(hi < -(1 << 30) ? -(1 << 30) : (hi > (1 << 30) ? (1 << 30) : hi));
}
