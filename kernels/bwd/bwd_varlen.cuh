// bwd_varlen.cuh: packed variable-length batches in attn_bwd (IS_VARLEN; src/problem/varlen.rs
// states the layout, src/cuda/bwd/varlen.rs launches it): batch entry b is the sequence of rows
// cu_seqlens_q[b].. of q, o, do and dq, and cu_seqlens_k[b].. of k, v, dk and dv; lse and D are
// [heads_q, total_q]; the f32 dQ workspace is packed as dq. The grid covers the longest key
// sequence (num_k_blocks key blocks per kv head and sequence). Each block turns its own copy of
// the parameters into its sequence alone, batch entry 0 of a dense problem of that sequence's
// lengths, so that the kernel body runs as for a dense batch: the causal diagonal, the window
// and the step ranges are the sequence's (bottom-right aligned per sequence, as the forward).
// Included after bwd_common.cuh.
#pragma once

#if IS_VARLEN
// The block's sequence b as batch entry 0: its lengths; q, k, v, do, lse, D, the dQ workspace,
// dk and dv from its first rows; the ALiBi slopes from its row (slopes per sequence); in the
// deterministic mode (`deterministic`: key blocks in reverse launch order, as KeyBlock) the dQ
// order counters from its slot of heads_q x num_m_blocks (num_m_blocks: steps of the longest
// sequence); `total_k`: the packed key rows (VARLEN_PARAM). Returns false when the block's key
// block starts at or past the sequence's last key: the whole block alike (blockIdx only), so it
// leaves before any barrier. Keys of a sequence without queries are not skipped: their blocks
// run no step and write dK = dV = 0.
template <int BC> FA_DEVICE bool varlen_sequence(BwdParams &bp, bool deterministic, int total_k) {
    Params &p = bp.p;
    const int n_index = (int)(blockIdx.x % bp.num_k_blocks);
    const int n_block = deterministic ? bp.num_k_blocks - 1 - n_index : n_index;
    const int b = (int)(blockIdx.x / bp.num_k_blocks / bp.heads_kv);
    // Rows clamped into the packed tensors and to the launch's longest (attn_common.cuh
    // packed_range): the lengths bound the key blocks and the steps of rows, so also the dQ
    // order counters' slot of this sequence.
    const int2 rq = packed_range(p.cu_seqlens_q, b, p.total_q, p.seqlen_q);
    const int2 rk = packed_range(p.cu_seqlens_k, b, total_k, p.seqlen_k);
    const int q0 = rq.x, k0 = rk.x;
    p.seqlen_q = rq.y;
    p.seqlen_k = rk.y;
    if ((i64)n_block * BC >= p.seqlen_k) return false;
    p.q += q0 * p.q_ss;
    p.k += k0 * p.k_ss;
    p.v += k0 * p.v_ss;
    bp.d_o += q0 * bp.do_ss;
    p.lse += q0; // lse_offset: h total_q + row
    bp.dsum += q0;
    bp.dq_accum += (i64)q0 * p.heads_q * D;
    bp.dk += (i64)k0 * bp.heads_kv * D;
    bp.dv += (i64)k0 * bp.heads_kv * D;
    if (HAS_ALIBI) p.alibi += b * p.alibi_sb;
    if (deterministic) bp.dq_order += (i64)b * p.heads_q * p.num_m_blocks;
    return true;
}
#endif
