//! Tensor intake: a framework's tensor borrowed for the length of one call through DLPack
//! (<https://dmlc.github.io/dlpack/latest/c_api.html>; NumPy, PyTorch, CuPy, JAX...) or, for a
//! PyTorch CUDA tensor on its current stream, through its own attributes (cheaper); its device,
//! element type, shape, strides and memory span, and the stream handshake of a CUDA call.

use crate::error::FlashAttnError;
use pyo3::prelude::*;
use std::ffi::{CStr, c_void};

// ---- DLPack (https://dmlc.github.io/dlpack/latest/c_api.html), the C structs as they are laid
// out in dlpack.h ----
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

const DL_CPU: i32 = 1;

const DL_CUDA: i32 = 2;

const DL_UINT: u8 = 1;

const DL_FLOAT: u8 = 2;
/// DLPack type code of signed integers.
const DL_INT: u8 = 0;

const DL_BFLOAT: u8 = 4;

/// DLPack 1.0's versioned tensor (`__dlpack__(max_version=(1, 0))`), which can say that it is
/// read-only.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: [u32; 2],
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

const DL_FLAG_READ_ONLY: u64 = 1;

enum Managed {
    Legacy(*mut DlManagedTensor),
    Versioned(*mut DlManagedTensorVersioned),
    /// Read from a PyTorch tensor's own attributes ([`Borrowed::take_torch`]); nothing to
    /// delete.
    Torch(Box<TorchTensor>),
}

/// A DLPack description filled in from a PyTorch tensor; `dl`'s shape and strides point
/// into the two vectors' buffers, which live as long as this value.
struct TorchTensor {
    dl: DlTensor,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
}

/// torch.float16, torch.bfloat16, torch.float32 and torch.strided, looked up once (only by
/// callers that pass PyTorch tensors, so torch is imported).
static TORCH_DTYPES: pyo3::sync::PyOnceLock<[Py<PyAny>; 4]> = pyo3::sync::PyOnceLock::new();

/// A tensor borrowed through DLPack (or read from a PyTorch tensor's attributes) for the
/// length of one call; the producer's deleter runs on drop (the capsule is renamed
/// "used_...", so its own destructor does not).
pub(crate) struct Borrowed {
    managed: Managed,
    _capsule: Py<PyAny>,
    pub(crate) name: &'static str,
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a capsule this struct consumed; the DLPack protocol
        // makes the consumer call the deleter exactly once.
        unsafe {
            match self.managed {
                Managed::Legacy(m) => {
                    if let Some(del) = (*m).deleter {
                        del(m);
                    }
                }
                Managed::Versioned(m) => {
                    if let Some(del) = (*m).deleter {
                        del(m);
                    }
                }
                Managed::Torch(_) => {}
            }
        }
    }
}

impl Borrowed {
    /// Takes `obj.__dlpack__()`: the versioned form when the producer offers it (NumPy 2.1+
    /// exports read-only arrays only that way), else the legacy one; with DLPack's stream
    /// handshake for a CUDA tensor: `handshake` is the `stream` argument of `__dlpack__`
    /// ([`handshake`]; `None` for host arrays).
    pub(crate) fn take_on(
        obj: &Bound<'_, PyAny>,
        name: &'static str,
        handshake: Option<i64>,
    ) -> PyResult<Self> {
        let py = obj.py();
        let not_dlpack = |e: PyErr| {
            FlashAttnError::new_err(format!(
                "{name}: not a DLPack tensor ({e}); pass a NumPy array, a PyTorch tensor or another object with __dlpack__"
            ))
        };
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        // DLPack: `stream` only for CUDA producers.
        let on_cuda = obj
            .call_method0("__dlpack_device__")
            .and_then(|d| d.extract::<(i32, i32)>())
            .is_ok_and(|(kind, _)| kind == DL_CUDA);
        if on_cuda {
            kwargs.set_item("stream", handshake.unwrap_or(1))?;
        }
        let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // A producer without DLPack 1.0 (no `max_version`): the legacy capsule, with the
            // same stream handshake.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
                kwargs.del_item("max_version")?;
                obj.call_method("__dlpack__", (), Some(&kwargs))
                    .map_err(not_dlpack)?
            }
            Err(e) => return Err(not_dlpack(e)),
        };
        // SAFETY: PyCapsule_GetName/GetPointer check the object and name; renaming marks the
        // capsule consumed (DLPack protocol).
        let managed = unsafe {
            let cap = capsule.as_ptr();
            let cname = pyo3::ffi::PyCapsule_GetName(cap);
            if cname.is_null() {
                return Err(PyErr::fetch(py));
            }
            let versioned = CStr::from_ptr(cname) == c"dltensor_versioned";
            let (want, used): (&CStr, &CStr) = if versioned {
                (c"dltensor_versioned", c"used_dltensor_versioned")
            } else {
                (c"dltensor", c"used_dltensor")
            };
            let ptr = pyo3::ffi::PyCapsule_GetPointer(cap, want.as_ptr());
            if ptr.is_null() {
                return Err(PyErr::fetch(py));
            }
            pyo3::ffi::PyCapsule_SetName(cap, used.as_ptr());
            if versioned {
                Managed::Versioned(ptr as *mut DlManagedTensorVersioned)
            } else {
                Managed::Legacy(ptr as *mut DlManagedTensor)
            }
        };
        let b = Borrowed {
            managed,
            _capsule: capsule.unbind(),
            name,
        };
        b.check_aligned()?;
        Ok(b)
    }

    /// A PyTorch CUDA tensor of float16, bfloat16 or float32 read through its own attributes
    /// (data_ptr, shape, stride, dtype, device), which costs a fifth of a DLPack export;
    /// `None` for anything else (the caller takes it through DLPack, whose errors name the
    /// problem); an error for a negated view. Only for a call on the tensor's current stream, where DLPack's handshake
    /// would do nothing either.
    fn take_torch(obj: &Bound<'_, PyAny>, name: &'static str) -> PyResult<Option<Self>> {
        let py = obj.py();
        // CUDA only (get_device() also numbers XPU, MPS and other backends' devices)
        if !obj.getattr("is_cuda")?.is_truthy()? {
            return Ok(None);
        }
        let device: i32 = obj.call_method0("get_device")?.extract()?;
        // A negated view (torch._neg_view) holds other values than its memory.
        if obj.call_method0("is_neg")?.is_truthy()? {
            return Err(FlashAttnError::new_err(format!(
                "{name} is a negated view (its values are minus its memory); pass {name}.resolve_neg()"
            )));
        }
        let torch = TORCH_DTYPES.get_or_try_init(py, || -> PyResult<[Py<PyAny>; 4]> {
            let torch = py.import("torch")?;
            Ok([
                torch.getattr("float16")?.unbind(),
                torch.getattr("bfloat16")?.unbind(),
                torch.getattr("float32")?.unbind(),
                torch.getattr("strided")?.unbind(),
            ])
        })?;
        // Sparse and nested tensors: DLPack's refusal names them.
        if !obj.getattr("layout")?.is(&torch[3]) {
            return Ok(None);
        }
        let dtype = obj.getattr("dtype")?;
        let Some(i) = torch[..3].iter().position(|d| dtype.is(d)) else {
            return Ok(None);
        };
        let (code, bits) = [(DL_FLOAT, 16), (DL_BFLOAT, 16), (DL_FLOAT, 32)][i];
        let shape: Vec<i64> = obj.getattr("shape")?.extract()?;
        let strides: Vec<i64> = obj.call_method0("stride")?.extract()?;
        if strides.len() != shape.len() {
            return Ok(None);
        }
        let data: usize = obj.call_method0("data_ptr")?.extract()?;
        let dl = DlTensor {
            data: data as *mut c_void,
            device: DlDevice {
                device_type: DL_CUDA,
                device_id: device,
            },
            ndim: shape.len() as i32,
            dtype: DlDataType {
                code,
                bits,
                lanes: 1,
            },
            shape: shape.as_ptr(),
            strides: strides.as_ptr(),
            byte_offset: 0,
        };
        let b = Borrowed {
            managed: Managed::Torch(Box::new(TorchTensor {
                dl,
                _shape: shape,
                _strides: strides,
            })),
            _capsule: obj.clone().unbind(),
            name,
        };
        b.check_aligned()?;
        Ok(Some(b))
    }

    /// [`Self::take_torch`] when `torch` (the caller passed PyTorch tensors) and the call runs
    /// on their current stream (`handshake` -1), else [`Self::take_on`] (the caller detaches
    /// tensors that require grad: DLPack refuses them).
    fn take_fast(
        obj: &Bound<'_, PyAny>,
        name: &'static str,
        handshake: Option<i64>,
        torch: bool,
    ) -> PyResult<Self> {
        if torch
            && handshake == Some(-1)
            && let Some(b) = Self::take_torch(obj, name)?
        {
            return Ok(b);
        }
        Self::take_on(obj, name, handshake)
    }

    /// Whether the producer marked the tensor read-only (DLPack 1.0 only).
    fn read_only(&self) -> bool {
        match self.managed {
            // SAFETY: valid until the deleter runs in drop.
            Managed::Versioned(m) => unsafe { (*m).flags & DL_FLAG_READ_ONLY != 0 },
            Managed::Legacy(_) | Managed::Torch(_) => false,
        }
    }

    /// Refuses a tensor this call would write when its producer marked it read-only.
    pub(crate) fn check_writable(&self) -> PyResult<()> {
        if self.read_only() {
            return Err(FlashAttnError::new_err(format!(
                "{} is read-only and this call writes it: pass a writable array",
                self.name
            )));
        }
        Ok(())
    }

    /// The data address must be aligned to the element size (a misaligned slice is undefined
    /// behaviour in Rust).
    fn check_aligned(&self) -> PyResult<()> {
        let t = self.t();
        let addr = t.data as usize + t.byte_offset as usize;
        let size = (t.dtype.bits as usize / 8).max(1);
        if !addr.is_multiple_of(size) {
            return Err(FlashAttnError::new_err(format!(
                "{}: the data at {addr:#x} is not aligned to its {size}-byte elements; pass an aligned array (e.g. a copy)",
                self.name
            )));
        }
        Ok(())
    }

    /// The bytes from the first to one past the last element addressed.
    pub(crate) fn span(&self) -> PyResult<(usize, usize)> {
        let t = self.t();
        let start = t.data as usize + t.byte_offset as usize;
        Ok((
            start,
            start + self.extent()? * (t.dtype.bits as usize / 8).max(1),
        ))
    }

    fn t(&self) -> &DlTensor {
        // SAFETY: valid until the deleter runs in drop.
        unsafe {
            match &self.managed {
                Managed::Legacy(m) => &(**m).dl_tensor,
                Managed::Versioned(m) => &(**m).dl_tensor,
                Managed::Torch(t) => &t.dl,
            }
        }
    }

    pub(crate) fn shape(&self) -> Vec<usize> {
        let t = self.t();
        // SAFETY: DLPack guarantees `ndim` entries.
        (0..t.ndim as usize)
            .map(|i| unsafe { *t.shape.add(i) } as usize)
            .collect()
    }

    /// Strides in elements (a null pointer means compact row-major).
    pub(crate) fn strides(&self) -> PyResult<Vec<usize>> {
        let t = self.t();
        let shape = self.shape();
        if t.strides.is_null() {
            let mut st = vec![1usize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                st[i] = st[i + 1] * shape[i + 1];
            }
            return Ok(st);
        }
        let mut st = (0..shape.len())
            .map(|i| {
                // SAFETY: DLPack guarantees `ndim` entries when strides is not null.
                let s = unsafe { *t.strides.add(i) };
                usize::try_from(s).map_err(|_| {
                    FlashAttnError::new_err(format!(
                        "{}: negative stride {s} on axis {i}; pass a tensor with non-negative strides (e.g. .copy())",
                        self.name
                    ))
                })
            })
            .collect::<PyResult<Vec<usize>>>()?;
        // A dimension of one element is never stepped over, and producers report anything
        // there (PyTorch: 1): give it the stride a dense layout would, so that layout checks
        // and the copy engine's tensor maps see the tensor as it is.
        for i in (0..shape.len()).rev() {
            if shape[i] == 1 {
                st[i] = st.get(i + 1).map_or(1, |&s| s * shape[i + 1]);
            }
        }
        Ok(st)
    }

    pub(crate) fn dtype(&self) -> PyResult<&'static str> {
        let d = self.t().dtype;
        match (d.code, d.bits, d.lanes) {
            (DL_FLOAT, 16, 1) => Ok("float16"),
            (DL_BFLOAT, 16, 1) => Ok("bfloat16"),
            (DL_FLOAT, 32, 1) => Ok("float32"),
            (code @ 7..=14, 8, 1) => {
                // DLPack 1.1's 8-bit floats (dlpack.h DLDataTypeCode).
                let name = [
                    "float8_e3m4",
                    "float8_e4m3",
                    "float8_e4m3b11fnuz",
                    "float8_e4m3fn",
                    "float8_e4m3fnuz",
                    "float8_e5m2",
                    "float8_e5m2fnuz",
                    "float8_e8m0fnu",
                ][usize::from(code - 7)];
                Err(crate::error::unsupported(format!(
                    "{}: element type {name}: FP8 attention is flash_attn_func's and its packed forms' only (float8_e4m3fn q, k and v with q_descale, k_descale, v_descale); this call takes float16, bfloat16 or float32",
                    self.name
                )))
            }
            _ => {
                // DLPack type codes (dlpack.h DLDataTypeCode).
                let kind = match d.code {
                    0 => "int",
                    1 => "uint",
                    DL_FLOAT => "float",
                    DL_BFLOAT => "bfloat",
                    5 => "complex",
                    6 => "bool",
                    _ => "an unknown type of",
                };
                let lanes = if d.lanes > 1 {
                    format!(" x{}", d.lanes)
                } else {
                    String::new()
                };
                Err(FlashAttnError::new_err(format!(
                    "{}: element type {kind}{}{lanes} is not float16, bfloat16 or float32; cast it (e.g. .astype(np.float32) / .half()), the GPU takes float16 or bfloat16",
                    self.name, d.bits
                )))
            }
        }
    }

    /// Refuses a tensor that is not one byte per element (DLPack uint8), the form in which
    /// the FP8 call takes float8_e4m3fn tensors (the Python layer passes `.view(torch.uint8)`
    /// after checking their dtype), naming the dtype that is expected.
    pub(crate) fn check_bytes(&self, expected: &str) -> PyResult<()> {
        let d = self.t().dtype;
        if (d.code, d.bits, d.lanes) != (DL_UINT, 8, 1) {
            return Err(FlashAttnError::new_err(format!(
                "{}: expected {expected}, read as bytes (uint8), got DLPack type code {} of {} bits",
                self.name, d.code, d.bits
            )));
        }
        Ok(())
    }

    /// Whether the elements are int32 (the index arrays' type).
    pub(crate) fn is_int32(&self) -> bool {
        let d = self.t().dtype;
        (d.code, d.bits, d.lanes) == (DL_INT, 32, 1)
    }

    /// The element type as NumPy names it (`int64`, `float16`, ...), for messages.
    pub(crate) fn type_name(&self) -> String {
        let d = self.t().dtype;
        let kind = match d.code {
            DL_INT => "int",
            1 => "uint",
            DL_FLOAT => "float",
            DL_BFLOAT => "bfloat",
            5 => "complex",
            6 => "bool",
            _ => "unknown",
        };
        if d.lanes > 1 {
            format!("{kind}{}x{}", d.bits, d.lanes)
        } else {
            format!("{kind}{}", d.bits)
        }
    }

    pub(crate) fn check_cpu(&self) -> PyResult<()> {
        match self.t().device.device_type {
            DL_CPU => Ok(()),
            DL_CUDA => Err(FlashAttnError::new_err(format!(
                "{}: the f64 oracle (reference) takes CPU tensors; move the tensors to the CPU",
                self.name
            ))),
            other => Err(FlashAttnError::new_err(format!(
                "{}: DLPack device type {other} is not supported (CPU tensors only in this version)",
                self.name
            ))),
        }
    }

    /// Where the tensor lives: `None` on the CPU, `Some(id)` on CUDA device `id`.
    pub(crate) fn place(&self) -> PyResult<Option<i32>> {
        let d = self.t().device;
        match d.device_type {
            DL_CPU => Ok(None),
            DL_CUDA => Ok(Some(d.device_id)),
            other => Err(FlashAttnError::new_err(format!(
                "{}: DLPack device type {other} is not supported (CPU and CUDA tensors only)",
                self.name
            ))),
        }
    }

    /// The first element's address and the count of elements from it to the last one the
    /// shape and strides address.
    fn first<T>(&self) -> PyResult<(*mut T, usize)> {
        let t = self.t();
        // DLPack: `data + byte_offset` is the first element (wrapping: only an address here).
        let first = (t.data as *mut u8).wrapping_add(t.byte_offset as usize) as *mut T;
        Ok((first, self.extent()?))
    }

    /// The tensor as a slice of `T` covering every element its shape and strides address.
    ///
    /// # Safety
    /// The caller checked the dtype is `T` and the device is the CPU.
    pub(crate) unsafe fn slice<T>(&self) -> PyResult<&[T]> {
        let (first, len) = self.first::<T>()?;
        // SAFETY: DLPack: the producer's memory covers `len` elements from `first`.
        Ok(unsafe { std::slice::from_raw_parts(first, len) })
    }

    /// As [`Self::slice`], writable.
    ///
    /// # Safety
    /// As [`Self::slice`]; the caller writes only through the tensor's own strides.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<T>(&self) -> PyResult<&mut [T]> {
        let (first, len) = self.first::<T>()?;
        // SAFETY: as slice(); the producer handed out a writable buffer.
        Ok(unsafe { std::slice::from_raw_parts_mut(first, len) })
    }

    /// Elements from the first to one past the last addressed (0 for an empty tensor).
    pub(crate) fn extent(&self) -> PyResult<usize> {
        let shape = self.shape();
        if shape.contains(&0) {
            return Ok(0);
        }
        let st = self.strides()?;
        Ok(shape
            .iter()
            .zip(&st)
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
            + 1)
    }
}

/// The `stream` argument of `__dlpack__` for a call launched on `stream` (a raw `CUstream`
/// handle; `None`: the legacy default stream). `current`: `stream` is the producer's own
/// current stream, on which its pending writes are already ordered, so -1 (DLPack: no
/// synchronisation; PyTorch would otherwise wrap the handle and compare streams for every
/// tensor); else the handle, with 1 for the legacy default stream (0 is ambiguous in DLPack),
/// and the producer orders its writes before that stream's next work.
pub(crate) fn handshake(stream: Option<usize>, current: bool) -> Option<i64> {
    if current {
        return Some(-1);
    }
    Some(match stream.unwrap_or(0) {
        0 => 1,
        s => s as i64,
    })
}

/// Each named tensor of a call taken with [`Borrowed::take_fast`] (every one, so that each
/// producer's export is consumed), or the first failure in argument order.
pub(crate) fn take_all<const N: usize>(
    named: [(&Bound<'_, PyAny>, &'static str); N],
    handshake: Option<i64>,
    torch: bool,
) -> PyResult<[Borrowed; N]> {
    let taken = named.map(|(x, name)| Borrowed::take_fast(x, name, handshake, torch));
    let mut ts = Vec::with_capacity(N);
    for t in taken {
        ts.push(t?);
    }
    ts.try_into()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("take_all: a tensor went missing"))
}

/// Where a call runs: every tensor on the CPU (`None`) or every one on one CUDA device.
pub(crate) fn placement(ts: &[&Borrowed]) -> PyResult<Option<i32>> {
    let first = ts[0].place()?;
    for t in &ts[1..] {
        let here = t.place()?;
        if here != first {
            let name = |p: Option<i32>| p.map_or("cpu".to_string(), |i| format!("cuda:{i}"));
            return Err(FlashAttnError::new_err(format!(
                "{} is on {} but {} is on {}: pass every tensor of a call on one device",
                ts[0].name,
                name(first),
                t.name,
                name(here)
            )));
        }
    }
    Ok(first)
}
