// pad_rows.cu: head_dim padding for head dims that are not a multiple of 8, as
// FlashAttention's Python wrapper pads them: the attention kernels move rows in 16-byte
// pieces, so a d6 q/k/v is copied into a dense [batch, seqlen, heads, DP] buffer (DP = d
// rounded up to 8, the extra channels zero: they add 0 to every q.k and produce channels of o
// that are dropped), and o is copied back from the padded result into the caller's strides.
//
// Elements are moved as raw 16-bit values (f16 or bf16 alike). One thread per destination
// element, grid-stride; offsets are 64-bit.
typedef unsigned short u16;
typedef long long i64;

struct RowMap {
    i64 seqlen, heads;          // rows are (batch, seq, head), heads fastest
    i64 st_b, st_s, st_h;       // the strided side's element strides
};

__device__ __forceinline__ i64 strided_row(const RowMap &m, i64 r) {
    const i64 h = r % m.heads, s = (r / m.heads) % m.seqlen, b = r / (m.heads * m.seqlen);
    return b * m.st_b + s * m.st_s + h * m.st_h;
}

// dst (dense, dp channels per row) <- src (strided, d channels), zero past d.
extern "C" __global__ void pad_rows(const u16 *__restrict__ src, u16 *__restrict__ dst, RowMap m, i64 rows, int d,
                                    int dp) {
    const i64 n = rows * dp;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / dp;
        const int c = (int)(i % dp);
        dst[i] = c < d ? src[strided_row(m, r) + c] : (u16)0;
    }
}

// dst (strided, d channels) <- src (dense, dp channels per row): the first d channels.
extern "C" __global__ void unpad_rows(const u16 *__restrict__ src, u16 *__restrict__ dst, RowMap m, i64 rows, int d,
                                      int dp) {
    const i64 n = rows * d;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / d;
        const int c = (int)(i % d);
        dst[strided_row(m, r) + c] = src[r * dp + c];
    }
}
