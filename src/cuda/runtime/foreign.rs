//! Device memory owned by another library (a PyTorch or CuPy tensor handed over through
//! DLPack), seen as a cudarc device slice for the length of one call, so that every
//! `*_device` entry point of this crate takes it without a copy.
//!
//! A [`ForeignSlice`] records no events and waits on none: the caller orders the work (in the
//! Python binding, everything runs on the caller's current stream, [`crate::cuda::runtime::device::Gpu::on_raw_stream`]).

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys};
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` at device address `ptr`, owned elsewhere.
#[derive(Debug)]
pub struct ForeignSlice<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _t: PhantomData<*const T>,
}

impl<T> ForeignSlice<T> {
    /// Wraps `len` elements at `ptr` (0 is allowed only with `len` 0).
    ///
    /// # Safety
    /// `ptr` must address `len` live elements of `T` in `stream`'s context for as long as the
    /// value and the work enqueued with it are in use; the caller orders that work with every
    /// other user of the memory, and never hands the same memory to a call as an output and as
    /// another argument.
    pub unsafe fn new(ptr: sys::CUdeviceptr, len: usize, stream: Arc<CudaStream>) -> Self {
        Self {
            ptr,
            len,
            stream,
            _t: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for ForeignSlice<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for ForeignSlice<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for ForeignSlice<T> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        _stream: &'a CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}
