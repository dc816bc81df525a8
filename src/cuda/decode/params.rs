//! The parameter blocks of the decode kernels, mirrored field by field (C layout) from
//! kernels/decode: kv_cache.cuh's `CacheMap`, rotary.cuh's `RotaryMap`, attn_decode.cu's
//! `DecodeParams`, kv_append.cu's `AppendParams`, attn_combine.cu's `CombineParams`.

use cudarc::driver::DeviceRepr;

/// kv_cache.cuh's `CacheMap`: the index arrays' device addresses (0 where absent) and the
/// bounds the kernels clamp their values to.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CacheMap {
    pub cache_seqlens: u64,
    pub block_table: u64,
    pub max_blocks: i32,
    pub page_size: i32,
    pub seqlen_new: i32,
    pub capacity: i32,
    pub num_blocks: i32,
    pub cache_batch: i32,
    pub cache_batch_idx: u64,
    pub cache_leftpad: u64,
}

/// rotary.cuh's `RotaryMap` (all zero without rotary embedding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RotaryMap {
    pub cos: u64,
    pub sin: u64,
    pub dim: i32,
    pub seqlen_ro: i32,
    pub per_row: i32,
}

/// attn_decode.cu's `DecodeParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeParams {
    pub o_accum: u64,
    pub lse_accum: u64,
    pub num_splits: i32,
    pub map: CacheMap,
    pub rot: RotaryMap,
}

/// kv_append.cu's `AppendParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct AppendParams {
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub kn: [i64; 3],
    pub vn: [i64; 3],
    pub kc: [i64; 3],
    pub vc: [i64; 3],
    pub batch: i32,
    pub heads_kv: i32,
    pub chunks: i64,
    pub map: CacheMap,
    pub rot: RotaryMap,
}

/// attn_combine.cu's `CombineParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct CombineParams {
    pub o_accum: u64,
    pub lse_accum: u64,
    pub o: u64,
    pub lse: u64,
    pub o_strides: [i64; 3],
    pub batch: i32,
    pub heads_q: i32,
    pub seqlen_q: i32,
    pub num_splits: i32,
}

// SAFETY: plain old data with C layout, mirrored field by field in the kernels.
unsafe impl DeviceRepr for CacheMap {}
unsafe impl DeviceRepr for RotaryMap {}
unsafe impl DeviceRepr for DecodeParams {}
unsafe impl DeviceRepr for AppendParams {}
unsafe impl DeviceRepr for CombineParams {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets the kernels' structs have (C layout on a 64-bit device): a field added on
    /// one side only would move these.
    #[test]
    fn parameter_blocks_have_the_kernels_layout() {
        assert_eq!(size_of::<CacheMap>(), 56);
        assert_eq!(offset_of!(CacheMap, capacity), 28);
        assert_eq!(offset_of!(CacheMap, cache_batch_idx), 40);
        assert_eq!(size_of::<RotaryMap>(), 32);
        assert_eq!(offset_of!(DecodeParams, map), 24);
        assert_eq!(offset_of!(DecodeParams, rot), 80);
        assert_eq!(offset_of!(AppendParams, map), 144);
        assert_eq!(offset_of!(AppendParams, rot), 200);
    }
}
