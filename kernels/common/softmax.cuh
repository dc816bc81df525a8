// softmax.cuh: the online softmax of one query row, shared by the forward kernels (FA2's
// softmax.h plays this role). Everything is in log2 units: a score s counts as s * scale_log2,
// so that exp(s * scale) = 2^(s * scale_log2); the row keeps its running max m and a running
// sum l of 2^(s * scale_log2 - m), and after the last key o = O / l, lse = (m + log2 l) ln 2
// (with a learnable sink, after sink_fold). Included after attn_common.cuh.
#pragma once

// The exponent offset of a row whose running max is m: m, or 0 for a row that has seen only
// masked keys (max -inf), so that 2^(-inf - (-inf)) never makes a NaN.
FA_DEVICE float exp_offset(float m) { return m == neg_inf() ? 0.f : m; }

// p = 2^(s * scale_log2 - m_use), the product rounded on its own (fmul_rn, ptx.cuh, says why).
FA_DEVICE float exp_scaled(float s, float scale_log2, float m_use) { return ex2(fmul_rn(s, scale_log2) - m_use); }

// The max and the sum of x over the 4 lanes of a quad: the lanes that hold one row of an
// mma.m16n8k16 or wgmma C fragment.
FA_DEVICE float quad_max(float x) {
    x = fmaxf(x, shfl_xor(x, 1));
    return fmaxf(x, shfl_xor(x, 2));
}
FA_DEVICE float quad_sum(float x) {
    x += shfl_xor(x, 1);
    return x + shfl_xor(x, 2);
}

// One row's running-max step after a key tile whose largest raw score (over the row's lanes)
// is mx, so m_cand = mx * scale_log2 (rounded on its own, as every p's product is; taking mx
// rather than m_cand keeps the callers' SASS as it was when each wrote this inline).
// The max moves only when m_cand passes it by more than SLACK (log2 units): with slack 8,
// p = 2^(s - m) <= 256, exact enough in f16/bf16 and f32 sums, and most tiles then skip
// rescaling O (slack 0: it moves whenever m_cand is larger). Sets alpha = 2^(m_old - m_use),
// the factor of O and of the row sum, ORs into `moved` whether the max moved (a warp's vote on
// it skips the rescale), and returns m_use, the exponent offset of this tile's p.
template <int SLACK>
FA_DEVICE float row_max_step(float &row_max, float mx, float scale_log2, float &alpha, bool &moved) {
    const float m_old = row_max;
    const float m_cand = fmul_rn(mx, scale_log2);
    const float m_new = m_cand > m_old + (float)SLACK ? m_cand : m_old;
    const float m_use = exp_offset(m_new);
    alpha = ex2(m_old - m_use);
    moved |= m_new != m_old;
    row_max = m_new;
    return m_use;
}

// The end of a row, from its max m and its whole sum l: the factor of O, and the row's lse
// (natural log). A row that saw no key gets o = 0 and lse = -inf, never NaN.
FA_DEVICE float row_inv(float l) { return l > 0.f ? 1.f / l : 0.f; }
FA_DEVICE float row_lse(float m, float l) { return l > 0.f ? (m + lg2(l)) * LN2 : neg_inf(); }

// HAS_SINK: the sink's logit of the row's head, in log2 units (sink_h log2(e): the kernels' m
// counts every score s as s log2(e), softcap and ALiBi included); 0 without a sink.
FA_DEVICE float sink_log2(const float *sink, int h) { return sink_logit(sink, h) * LOG2E; }

// HAS_SINK: folds the sink's term into a row's end state, from its max m (log2 units, -inf for
// a row that saw no key) and whole sum l (relative to m; 0 for such a row): m' = max(m, s),
// l' = l 2^(m - m') + 2^(s - m') with s = sink_log2. Returns O's factor 2^(m - m') (0 when m is
// -inf: ex2(-inf) = +0), so that o = O 2^(m - m') / l' and lse = row_lse(m', l'). l' > 0: a
// row that saw no key gets o = 0 and lse = sink_h; a NaN in m or l stays NaN in l'.
FA_DEVICE float sink_fold(float &m, float &l, float s) {
    const float top = fmaxf(m, s);
    const float alpha = ex2(m - top);
    l = l * alpha + ex2(s - top);
    m = top;
    return alpha;
}
