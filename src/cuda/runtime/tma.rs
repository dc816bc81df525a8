//! TMA tensor maps: `cuTensorMapEncodeTiled` for the Hopper kernels' tile loads and stores.
//!
//! A tensor map describes a tensor in global memory (up to 5 dimensions, innermost first, with
//! byte strides) and the box one `cp.async.bulk.tensor` moves. It is built on the host, passed
//! by value as a `__grid_constant__` kernel parameter, and read by the copy engine. Boxes that
//! reach past the tensor's edge are zero-filled on loads and clipped on stores: that is how the
//! wgmma kernel handles partial tiles and head dims below its padded width without a branch.
//! Rules from the CUDA driver API reference of `cuTensorMapEncodeTiled`: global address 16-byte
//! aligned; every stride a multiple of 16 bytes and below 2^40; dimensions in 1..=2^32; box
//! sides in 1..=256; with the 128-byte swizzle the box's inner side is at most 128 bytes.

use crate::dtype::DType;
use cudarc::driver::{DeviceRepr, sys};

/// A CUDA tensor map (`CUtensorMap`): 128 opaque bytes, 64-byte aligned, as the kernels'
/// `TmaMap` (kernels/common/hopper.cuh).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmaMap(pub [u64; 16]);
// SAFETY: plain old data with C layout, mirrored by the kernels' `TmaMap`.
unsafe impl DeviceRepr for TmaMap {}

/// A tiled tensor map request: 16-bit elements, dimensions innermost first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiledMap {
    /// f16 or bf16.
    pub dtype: DType,
    /// Device address of element 0.
    pub addr: u64,
    /// Extent of each dimension (elements), innermost first.
    pub dims: Vec<u64>,
    /// Byte stride of dimensions 1.. (dimension 0 is contiguous).
    pub strides: Vec<u64>,
    /// Box extent per dimension (elements).
    pub boxes: Vec<u32>,
}

impl TiledMap {
    /// Why the copy engine cannot describe this tensor (`None` when it can): checked here so
    /// that the reason is ours, not a bare driver error code.
    pub fn unsupported(&self) -> Option<String> {
        self.unsupported_for(2)
    }

    /// [`Self::unsupported`] for elements of `elem_bytes` bytes.
    fn unsupported_for(&self, elem_bytes: u32) -> Option<String> {
        let rank = self.dims.len();
        if !(1..=5).contains(&rank) || self.strides.len() + 1 != rank || self.boxes.len() != rank {
            return Some(format!(
                "a rank-{rank} tensor map with mismatched strides or box"
            ));
        }
        if !self.addr.is_multiple_of(16) {
            return Some(format!("address {:#x} is not 16-byte aligned", self.addr));
        }
        if let Some(s) = self
            .strides
            .iter()
            .find(|&&s| !s.is_multiple_of(16) || s >= 1 << 40)
        {
            return Some(format!(
                "a stride of {s} bytes (the copy engine needs multiples of 16 below 2^40)"
            ));
        }
        if let Some(d) = self.dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return Some(format!("a dimension of {d} elements (1..=2^32)"));
        }
        if self.boxes.iter().any(|&b| !(1..=256).contains(&b)) || self.boxes[0] * elem_bytes > 128 {
            return Some(format!(
                "box {:?} (sides 1..=256, inner side <= 128 bytes)",
                self.boxes
            ));
        }
        None
    }

    /// Encodes the map with the 128-byte swizzle, 256-byte L2 promotion and zero fill.
    ///
    /// # Errors
    /// The reason, when [`Self::unsupported`] finds one or the driver refuses the map.
    pub fn encode(&self) -> std::result::Result<TmaMap, String> {
        use sys::CUtensorMapDataType_enum as T;
        let dtype = match self.dtype {
            DType::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            DType::F32 => return Err("f32 tensors (the kernels take f16 or bf16)".into()),
        };
        self.encode_as(dtype, 2)
    }

    /// [`Self::encode`] for one-byte elements (e4m3, moved as `CU_TENSOR_MAP_DATA_TYPE_UINT8`:
    /// TMA copies bytes and zero-fills out-of-bounds ones, 0x00 = +0.0 in e4m3); `dtype` is
    /// ignored, the inner box side is at most 128 elements.
    ///
    /// # Errors
    /// As [`Self::encode`].
    pub fn encode_bytes(&self) -> std::result::Result<TmaMap, String> {
        self.encode_as(
            sys::CUtensorMapDataType_enum::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            1,
        )
    }

    fn encode_as(
        &self,
        dtype: sys::CUtensorMapDataType_enum,
        elem_bytes: u32,
    ) -> std::result::Result<TmaMap, String> {
        if let Some(why) = self.unsupported_for(elem_bytes) {
            return Err(why);
        }
        let elem_strides = vec![1u32; self.dims.len()];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: every array holds `rank` (strides: rank - 1) elements, as the call requires;
        // `map` is written by the driver before it is read.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                dtype,
                self.dims.len() as u32,
                self.addr as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!(
                "cuTensorMapEncodeTiled refused dims {:?}, byte strides {:?}, box {:?}: {r:?}",
                self.dims, self.strides, self.boxes
            ));
        }
        // SAFETY: initialised by the successful call above.
        let map = unsafe { map.assume_init() };
        Ok(TmaMap(map.opaque))
    }
}

/// The 4-D map (head_dim, seqlen, heads, batch) of one bshd tensor, `dims` in that order,
/// with a box of (64 channels, `rows`, 1, 1): the forward, backward and decode kernels' loads.
pub(crate) fn bshd_map(
    dtype: DType,
    addr: u64,
    dims: [usize; 4],
    st: crate::shape::Strides,
    rows: u32,
) -> TiledMap {
    TiledMap {
        dtype,
        addr,
        dims: dims.iter().map(|&x| x as u64).collect(),
        strides: vec![st.seq as u64 * 2, st.head as u64 * 2, st.batch as u64 * 2],
        boxes: vec![64, rows, 1, 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> TiledMap {
        TiledMap {
            dtype: DType::F16,
            addr: 0x1000,
            dims: vec![128, 4096, 16, 2],
            strides: vec![16 * 128 * 2, 128 * 2, 4096 * 16 * 128 * 2],
            boxes: vec![64, 128, 1, 1],
        }
    }

    #[test]
    fn layout_matches_the_kernel_struct() {
        assert_eq!(std::mem::size_of::<TmaMap>(), 128);
        assert_eq!(std::mem::align_of::<TmaMap>(), 64);
    }

    #[test]
    fn refuses_what_the_copy_engine_cannot_describe() {
        assert_eq!(map().unsupported(), None);
        let bad = [
            TiledMap {
                addr: 0x1008,
                ..map()
            },
            TiledMap {
                strides: vec![264, 256, 1 << 20],
                ..map()
            },
            TiledMap {
                strides: vec![256, 256, 1 << 40],
                ..map()
            },
            TiledMap {
                dims: vec![128, 0, 16, 2],
                ..map()
            },
            TiledMap {
                boxes: vec![128, 128, 1, 1],
                ..map()
            },
            TiledMap {
                boxes: vec![64, 257, 1, 1],
                ..map()
            },
            TiledMap {
                strides: vec![256, 256],
                ..map()
            },
        ];
        for m in bad {
            assert!(m.unsupported().is_some(), "{m:?}");
        }
    }
}
