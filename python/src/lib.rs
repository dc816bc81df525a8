//! `flashattn._native`: the Python binding of the `flashattn` library. Tensors come in through
//! DLPack (`__dlpack__`), so NumPy, PyTorch, JAX and CuPy arrays all work without a copy; the
//! Python package (`flashattn/__init__.py`) gives FlashAttention-2's function names and
//! allocates outputs in the caller's framework.
//!
//! CPU tensors run on the library's CPU backend; CUDA tensors (forward and backward) on its
//! GPU kernels, on the stream the caller names (its framework's current stream), through the
//! DLPack stream handshake, without a copy or a device synchronisation (`gpu.rs`); the
//! variable-length and KV-cache calls plan from host copies of their index arrays, which the
//! Python layer makes.

mod gpu;

use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::shape::{AttnProblem, AttnShape, Strides};
use flashattn::{AttnError, Element, Mask};
use half::{bf16, f16};
use pyo3::exceptions::{PyNotImplementedError, PyValueError};
use pyo3::prelude::*;
use std::ffi::{CStr, c_void};

pyo3::create_exception!(
    _native,
    FlashAttnError,
    PyValueError,
    "An invalid call: the message says what is wrong and what to do."
);

fn err(e: AttnError) -> PyErr {
    FlashAttnError::new_err(e.to_string())
}

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
const DL_FLOAT: u8 = 2;
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
    name: &'static str,
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
    /// exports read-only arrays only that way), else the legacy one.
    fn take(obj: &Bound<'_, PyAny>, name: &'static str) -> PyResult<Self> {
        Self::take_on(obj, name, None)
    }

    /// As [`Self::take`], with DLPack's stream handshake for a CUDA tensor: `handshake` is
    /// the `stream` argument of `__dlpack__` ([`handshake`]).
    fn take_on(
        obj: &Bound<'_, PyAny>,
        name: &'static str,
        handshake: Option<i64>,
    ) -> PyResult<Self> {
        let py = obj.py();
        let not_dlpack = |e: PyErr| {
            PyValueError::new_err(format!(
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
    fn check_writable(&self) -> PyResult<()> {
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

    fn shape(&self) -> Vec<usize> {
        let t = self.t();
        // SAFETY: DLPack guarantees `ndim` entries.
        (0..t.ndim as usize)
            .map(|i| unsafe { *t.shape.add(i) } as usize)
            .collect()
    }

    /// Strides in elements (a null pointer means compact row-major).
    fn strides(&self) -> PyResult<Vec<usize>> {
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

    fn dtype(&self) -> PyResult<&'static str> {
        let d = self.t().dtype;
        match (d.code, d.bits, d.lanes) {
            (DL_FLOAT, 16, 1) => Ok("float16"),
            (DL_BFLOAT, 16, 1) => Ok("bfloat16"),
            (DL_FLOAT, 32, 1) => Ok("float32"),
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

    fn check_cpu(&self) -> PyResult<()> {
        match self.t().device.device_type {
            DL_CPU => Ok(()),
            DL_CUDA => Err(PyNotImplementedError::new_err(format!(
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
    fn place(&self) -> PyResult<Option<i32>> {
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

    /// The tensor as a slice of `T` covering every element its shape and strides address.
    ///
    /// # Safety
    /// The caller checked the dtype is `T` and the device is the CPU.
    unsafe fn slice<T>(&self) -> PyResult<&[T]> {
        let len = self.extent()?;
        let t = self.t();
        // SAFETY: DLPack: `data + byte_offset` addresses every element of the tensor.
        Ok(unsafe {
            std::slice::from_raw_parts(
                (t.data as *const u8).add(t.byte_offset as usize) as *const T,
                len,
            )
        })
    }

    /// As [`Self::slice`], writable.
    ///
    /// # Safety
    /// As [`Self::slice`]; the caller writes only through the tensor's own strides.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut<T>(&self) -> PyResult<&mut [T]> {
        let len = self.extent()?;
        let t = self.t();
        // SAFETY: as slice(); the producer handed out a writable buffer.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(
                (t.data as *mut u8).add(t.byte_offset as usize) as *mut T,
                len,
            )
        })
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
fn handshake(stream: Option<usize>, current: bool) -> Option<i64> {
    if current {
        return Some(-1);
    }
    Some(match stream.unwrap_or(0) {
        0 => 1,
        s => s as i64,
    })
}

/// Each named tensor of a call taken with [`Borrowed::take_fast`], in argument order (the
/// caller reports the first failure).
fn take_all<const N: usize>(
    named: [(&Bound<'_, PyAny>, &'static str); N],
    handshake: Option<i64>,
    torch: bool,
) -> [PyResult<Borrowed>; N] {
    named.map(|(x, name)| Borrowed::take_fast(x, name, handshake, torch))
}

/// Where a call runs: every tensor on the CPU (`None`) or every one on one CUDA device.
fn placement(ts: &[&Borrowed]) -> PyResult<Option<i32>> {
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

/// A bshd tensor's shape and strides (head_dim contiguous).
fn bshd(t: &Borrowed) -> PyResult<([usize; 4], Strides)> {
    let shape = t.shape();
    if shape.len() != 4 {
        return Err(FlashAttnError::new_err(format!(
            "{} has {} dimensions {shape:?}; expected 4: [batch, seqlen, heads, head_dim]",
            t.name,
            shape.len()
        )));
    }
    let st = t.strides()?;
    // An empty tensor's strides mean nothing (NumPy reports 0): the sizes are refused later.
    if st[3] != 1 && shape[3] > 1 && !shape.contains(&0) {
        return Err(FlashAttnError::new_err(format!(
            "{}: the last dimension (head_dim) has stride {}; it must be contiguous (call .contiguous() / np.ascontiguousarray)",
            t.name, st[3]
        )));
    }
    Ok((
        [shape[0], shape[1], shape[2], shape[3]],
        Strides {
            batch: st[0],
            seq: st[1],
            head: st[2],
        },
    ))
}

/// Every tensor this call writes must be writable and share no memory with any other tensor
/// of the call (Rust may not read and write one place through two references).
fn check_disjoint(written: &[&Borrowed], read: &[&Borrowed]) -> PyResult<()> {
    for (i, w) in written.iter().enumerate() {
        w.check_writable()?;
        let (a0, a1) = w.span()?;
        for other in written[i + 1..].iter().chain(read) {
            let (b0, b1) = other.span()?;
            if a0 < b1 && b0 < a1 {
                return Err(FlashAttnError::new_err(format!(
                    "{} and {} share memory, and this call writes {}: pass separate buffers",
                    w.name, other.name, w.name
                )));
            }
        }
    }
    Ok(())
}

/// q's element type shared by `others`; lse f32.
fn same_dtype(dtype: &str, others: &[&Borrowed], lse: &Borrowed) -> PyResult<()> {
    for t in others {
        if t.dtype()? != dtype {
            return Err(FlashAttnError::new_err(format!(
                "q is {dtype} but {} is {}: pass q, k, v (and out, the caches) with one element type",
                t.name,
                t.dtype()?
            )));
        }
    }
    if lse.dtype()? != "float32" {
        return Err(FlashAttnError::new_err("lse must be float32"));
    }
    Ok(())
}

/// FlashAttention-2's `window_size`, `softcap` (0 = off) and `alibi_slopes` (`[heads_q]`, or
/// `[batch, heads_q]` flattened) as the library's score modifiers.
fn score_mods(
    (left, right): (i64, i64),
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    batch: usize,
    heads_q: usize,
) -> PyResult<ScoreMods> {
    Ok(ScoreMods {
        window: Window::from_fa(left, right).map_err(err)?,
        softcap: (softcap != 0.0).then_some(softcap),
        alibi: alibi_slopes.map(|slopes| {
            let per_batch = slopes.len() == batch * heads_q && batch > 1;
            Alibi { slopes, per_batch }
        }),
    })
}

/// The problem of a call: sizes `[batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim]`,
/// the mask, the strides of q, k, v, o and the scale (default `1/sqrt(head_dim)`).
fn problem(
    [b, sq, sk, hq, hkv, d]: [usize; 6],
    causal: bool,
    [qs, ks, vs, os]: [Strides; 4],
    softmax_scale: Option<f32>,
) -> PyResult<AttnProblem> {
    let p = AttnProblem::new(AttnShape {
        batch: b,
        seqlen_q: sq,
        seqlen_k: sk,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
    })
    .map_err(err)?
    .with_mask(if causal { Mask::Causal } else { Mask::None })
    .with_strides(qs, ks, vs, os)
    .map_err(err)?;
    match softmax_scale {
        Some(s) => p.with_scale(s).map_err(err),
        None => Ok(p),
    }
}

/// Runs attention: `q` `[batch, seqlen_q, heads_q, head_dim]`, `k`/`v` `[batch, seqlen_k,
/// heads_kv, head_dim]`, written into `out` (q's shape, any strides with head_dim contiguous)
/// and `lse` (f32 `[batch, heads_q, seqlen_q]`, contiguous). CPU tensors run on the CPU
/// backend (f16, bf16, f32); CUDA tensors (f16, bf16) on the GPU kernels, enqueued on
/// `stream` (a raw `CUstream` handle; `None` or 0: the legacy default stream; `current`: it
/// is the tensors' producer's current stream, see [`handshake`]). Returns where it ran.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false, torch=false))]
#[allow(clippy::too_many_arguments)]
fn forward(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    stream: Option<usize>,
    current: bool,
    torch: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let [tq, tk, tv, to, tl] = take_all(
        [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")],
        hs,
        torch,
    );
    let (tq, tk, tv, to, tl) = (tq?, tk?, tv?, to?, tl?);
    let place = placement(&[&tq, &tk, &tv, &to, &tl])?;
    let dtype = tq.dtype()?;
    same_dtype(dtype, &[&tk, &tv, &to], &tl)?;
    check_disjoint(&[&to, &tl], &[&tq, &tk, &tv])?;
    let p = bshd_problem(
        [&tq, &tk, &tv, &to, &tl],
        softmax_scale,
        causal,
        (window_left, window_right),
        softcap,
        alibi_slopes,
    )?;
    // SAFETY: dtypes and devices checked above; the slices cover what the strides address;
    // a CUDA tensor's stream is the one its framework hands out as current.
    unsafe {
        match (place, dtype) {
            (None, "float16") => run::<f16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, "bfloat16") => run::<bf16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, _) => run::<f32>(&p, &tq, &tk, &tv, &to, &tl),
            (Some(id), "float16") => {
                gpu::forward::<f16>(id, stream.unwrap_or(0), &p, &tq, &tk, &tv, &to, &tl)
            }
            (Some(id), "bfloat16") => {
                gpu::forward::<bf16>(id, stream.unwrap_or(0), &p, &tq, &tk, &tv, &to, &tl)
            }
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

fn cuda_dtype(dtype: &str) -> PyErr {
    FlashAttnError::new_err(format!(
        "q is {dtype}: the CUDA kernels take float16 or bfloat16; convert the tensors (e.g. q.half()), or run float32 on the CPU"
    ))
}

/// The problem of a bshd call after checking its tensors: q, k, v, out (q's shape) and lse
/// (a contiguous f32 `[batch, heads_q, seqlen_q]`).
#[allow(clippy::too_many_arguments)]
fn bshd_problem(
    [tq, tk, tv, to, tl]: [&Borrowed; 5],
    softmax_scale: Option<f32>,
    causal: bool,
    window: (i64, i64),
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
) -> PyResult<AttnProblem> {
    let ([b, sq, hq, d], qs) = bshd(tq)?;
    let ([bk, sk, hkv, dk], ks) = bshd(tk)?;
    let (vshape, vs) = bshd(tv)?;
    let (oshape, os) = bshd(to)?;
    if bk != b || dk != d || vshape != [bk, sk, hkv, dk] || oshape != [b, sq, hq, d] {
        return Err(FlashAttnError::new_err(format!(
            "shapes disagree: q {:?}, k {:?}, v {vshape:?}, out {oshape:?}; k and v must be [batch, seqlen_k, heads_kv, head_dim] with q's batch and head_dim, out q's shape",
            [b, sq, hq, d],
            [bk, sk, hkv, dk]
        )));
    }
    let mods = score_mods(window, softcap, alibi_slopes, b, hq)?;
    let p = problem(
        [b, sq, sk, hq, hkv, d],
        causal,
        [qs, ks, vs, os],
        softmax_scale,
    )?
    .with_scores(mods)
    .map_err(err)?;
    let lshape = tl.shape();
    // (compact() judges strides only where a dimension has more than one element: DLPack
    // producers may report anything, e.g. 1, for the others.)
    if lshape != [b, hq, sq] || compact(tl, 3, "[batch, heads_q, seqlen_q]").is_err() {
        return Err(FlashAttnError::new_err(format!(
            "lse has shape {lshape:?}; expected a contiguous float32 [{b}, {hq}, {sq}]"
        )));
    }
    Ok(p)
}

/// Gradients of attention: `q`, `k`, `v`, `out`, `lse` as [`forward`] took and wrote them,
/// `dout` with `out`'s shape and strides; writes `dq` (q's shape), `dk`, `dv` (k's shape), all
/// three contiguous (dk, dv summed over the query heads of each kv head). CPU tensors run on
/// the CPU backward, CUDA tensors on the GPU backward (softcap and ALiBi: CPU only), enqueued
/// on `stream`. `deterministic`: dq the same bytes run to run (GPU; the CPU always is).
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, dout, dq, dk, dv, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic, stream=None, current=false, torch=false))]
#[allow(clippy::too_many_arguments)]
fn backward(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    dout: &Bound<'_, PyAny>,
    dq: &Bound<'_, PyAny>,
    dk: &Bound<'_, PyAny>,
    dv: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    deterministic: bool,
    stream: Option<usize>,
    current: bool,
    torch: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let [tq, tk, tv, to, tl, tdo, tdq, tdk, tdv] = take_all(
        [
            (q, "q"),
            (k, "k"),
            (v, "v"),
            (out, "out"),
            (lse, "lse"),
            (dout, "dout"),
            (dq, "dq"),
            (dk, "dk"),
            (dv, "dv"),
        ],
        hs,
        torch,
    );
    let (tq, tk, tv, to, tl, tdo) = (tq?, tk?, tv?, to?, tl?, tdo?);
    let (tdq, tdk, tdv) = (tdq?, tdk?, tdv?);
    let place = placement(&[&tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv])?;
    let dtype = tq.dtype()?;
    same_dtype(dtype, &[&tk, &tv, &to, &tdo, &tdq, &tdk, &tdv], &tl)?;
    check_disjoint(&[&tdq, &tdk, &tdv], &[&tq, &tk, &tv, &to, &tl, &tdo])?;
    let p = bshd_problem(
        [&tq, &tk, &tv, &to, &tl],
        softmax_scale,
        causal,
        (window_left, window_right),
        softcap,
        alibi_slopes,
    )?;
    // Strides compared where a dimension has more than one element (see bshd_problem).
    let (dshape, dstr, ostr) = (tdo.shape(), tdo.strides()?, to.strides()?);
    let same_layout =
        dshape == to.shape() && (0..dshape.len()).all(|i| dshape[i] <= 1 || dstr[i] == ostr[i]);
    if !same_layout {
        return Err(FlashAttnError::new_err(format!(
            "dout has shape {:?} and strides {:?}; it must have out's ({:?}, {:?})",
            tdo.shape(),
            tdo.strides()?,
            to.shape(),
            to.strides()?
        )));
    }
    let (qshape, kshape) = (tq.shape(), tk.shape());
    for (t, want) in [(&tdq, &qshape), (&tdk, &kshape), (&tdv, &kshape)] {
        if compact(t, 4, "[batch, seqlen, heads, head_dim]")? != *want {
            return Err(FlashAttnError::new_err(format!(
                "{} has shape {:?}; expected {want:?}",
                t.name,
                t.shape()
            )));
        }
    }
    let ins = [&tq, &tk, &tv, &to, &tl, &tdo];
    let grads = [&tdq, &tdk, &tdv];
    // SAFETY: dtypes, devices, shapes and strides checked above.
    unsafe {
        match (place, dtype) {
            (None, "float16") => run_backward::<f16>(&p, ins, grads),
            (None, "bfloat16") => run_backward::<bf16>(&p, ins, grads),
            (None, _) => run_backward::<f32>(&p, ins, grads),
            (Some(id), "float16") => {
                gpu::backward::<f16>(id, stream.unwrap_or(0), &p, deterministic, ins, grads)
            }
            (Some(id), "bfloat16") => {
                gpu::backward::<bf16>(id, stream.unwrap_or(0), &p, deterministic, ins, grads)
            }
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU; the gradients are compact.
unsafe fn run_backward<T: Element>(
    p: &AttnProblem,
    [q, k, v, o, lse, d_o]: [&Borrowed; 6],
    [dq, dk, dv]: [&Borrowed; 3],
) -> PyResult<String> {
    // SAFETY: the caller checked dtype and device; the gradients are distinct writable buffers.
    unsafe {
        flashattn::cpu_backward::backward(
            p,
            q.slice::<T>()?,
            k.slice::<T>()?,
            v.slice::<T>()?,
            o.slice::<T>()?,
            lse.slice::<f32>()?,
            d_o.slice::<T>()?,
            dq.slice_mut::<T>()?,
            dk.slice_mut::<T>()?,
            dv.slice_mut::<T>()?,
        )
        .map_err(err)?;
    }
    Ok(format!("cpu ({} threads)", rayon_threads()))
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU.
unsafe fn run<T: Element>(
    p: &AttnProblem,
    q: &Borrowed,
    k: &Borrowed,
    v: &Borrowed,
    o: &Borrowed,
    lse: &Borrowed,
) -> PyResult<String> {
    // SAFETY: the caller checked dtype and device.
    let (q, k, v) = unsafe { (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?) };
    // SAFETY: as above; out and lse are distinct writable buffers of the caller.
    let (o, lse) = unsafe { (o.slice_mut::<T>()?, lse.slice_mut::<f32>()?) };
    flashattn::cpu::forward(p, q, k, v, o, lse).map_err(err)?;
    Ok(format!("cpu ({} threads)", rayon_threads()))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The exact f64 oracle on CPU tensors (q, k, v as for `forward`): returns `(o, lse)` as flat
/// f64 lists (o dense `[batch, seqlen_q, heads_q, head_dim]`, lse `[batch, heads_q, seqlen_q]`),
/// for tests.
#[pyfunction]
#[pyo3(signature = (q, k, v, softmax_scale, causal))]
fn reference(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    softmax_scale: Option<f32>,
    causal: bool,
) -> PyResult<(Vec<f64>, Vec<f64>)> {
    let tq = Borrowed::take(q, "q")?;
    let tk = Borrowed::take(k, "k")?;
    let tv = Borrowed::take(v, "v")?;
    for t in [&tq, &tk, &tv] {
        t.check_cpu()?;
    }
    let ([b, sq, hq, d], qs) = bshd(&tq)?;
    let ([_, sk, hkv, _], ks) = bshd(&tk)?;
    let (_, vs) = bshd(&tv)?;
    let dense = Strides::contiguous(sq, hq, d);
    let p = problem(
        [b, sq, sk, hq, hkv, d],
        causal,
        [qs, ks, vs, dense],
        softmax_scale,
    )?;
    let dtype = tq.dtype()?;
    // SAFETY: dtype and device checked.
    let r = unsafe {
        match dtype {
            "float16" => flashattn::reference::attention(
                &p,
                tq.slice::<f16>()?,
                tk.slice::<f16>()?,
                tv.slice::<f16>()?,
            ),
            "bfloat16" => flashattn::reference::attention(
                &p,
                tq.slice::<bf16>()?,
                tk.slice::<bf16>()?,
                tv.slice::<bf16>()?,
            ),
            _ => flashattn::reference::attention(
                &p,
                tq.slice::<f32>()?,
                tk.slice::<f32>()?,
                tv.slice::<f32>()?,
            ),
        }
    }
    .map_err(err)?;
    Ok((r.o, r.lse))
}

/// A compact (row-major, no gaps) tensor of `ndim` dimensions: its shape.
fn compact(t: &Borrowed, ndim: usize, what: &str) -> PyResult<Vec<usize>> {
    let shape = t.shape();
    if shape.len() != ndim {
        return Err(FlashAttnError::new_err(format!(
            "{} has {} dimensions {shape:?}; expected {ndim}: {what}",
            t.name,
            shape.len()
        )));
    }
    if shape.contains(&0) {
        return Ok(shape); // nothing addressed; the sizes are judged by the library
    }
    let st = t.strides()?;
    let mut want = 1usize;
    for i in (0..ndim).rev() {
        if shape[i] > 1 && st[i] != want {
            return Err(FlashAttnError::new_err(format!(
                "{} is not contiguous (strides {st:?} for shape {shape:?}); pass a contiguous tensor (.contiguous() / np.ascontiguousarray)",
                t.name
            )));
        }
        want *= shape[i];
    }
    Ok(shape)
}

/// Runs a packed variable-length batch on CPU tensors (FlashAttention-2's varlen layout):
/// `q` `[total_q, heads_q, head_dim]`, `k`/`v` `[total_k, heads_kv, head_dim]`, all
/// contiguous, written into `out` (like q) and `lse` (f32 `[heads_q, total_q]`).
#[pyfunction]
#[pyo3(signature = (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, stream=None, current=false, torch=false))]
#[allow(clippy::too_many_arguments)]
fn varlen_forward(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    cu_seqlens_q: Vec<i32>,
    cu_seqlens_k: Vec<i32>,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    stream: Option<usize>,
    current: bool,
    torch: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let [tq, tk, tv, to, tl] = take_all(
        [(q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse")],
        hs,
        torch,
    );
    let (tq, tk, tv, to, tl) = (tq?, tk?, tv?, to?, tl?);
    let place = placement(&[&tq, &tk, &tv, &to, &tl])?;
    let packed = "[total, heads, head_dim]";
    let qs = compact(&tq, 3, packed)?;
    let ks = compact(&tk, 3, packed)?;
    let vs = compact(&tv, 3, packed)?;
    let os = compact(&to, 3, packed)?;
    let ls = compact(&tl, 2, "[heads_q, total_q]")?;
    if ks != vs || ks[2] != qs[2] || os != qs || ls != [qs[1], qs[0]] {
        return Err(FlashAttnError::new_err(format!(
            "shapes disagree: q {qs:?}, k {ks:?}, v {vs:?}, out {os:?}, lse {ls:?}"
        )));
    }
    let dtype = tq.dtype()?;
    same_dtype(dtype, &[&tk, &tv, &to], &tl)?;
    check_disjoint(&[&to, &tl], &[&tq, &tk, &tv])?;
    let batch = cu_seqlens_q.len().saturating_sub(1);
    let mut p =
        flashattn::varlen::VarlenProblem::new(cu_seqlens_q, cu_seqlens_k, qs[1], ks[1], qs[2])
            .map_err(err)?
            .with_mask(if causal { Mask::Causal } else { Mask::None });
    if let Some(s) = softmax_scale {
        p = p.with_scale(s).map_err(err)?;
    }
    p = p
        .with_scores(score_mods(
            (window_left, window_right),
            softcap,
            alibi_slopes,
            batch,
            qs[1],
        )?)
        .map_err(err)?;
    if p.total_q() != qs[0] || p.total_k() != ks[0] {
        return Err(FlashAttnError::new_err(format!(
            "cu_seqlens_q ends at {} and cu_seqlens_k at {}, but q has {} rows and k {}",
            p.total_q(),
            p.total_k(),
            qs[0],
            ks[0]
        )));
    }
    // SAFETY: dtypes and devices checked; the tensors are compact with the sizes checked.
    unsafe {
        let s = stream.unwrap_or(0);
        match (place, dtype) {
            (None, "float16") => run_varlen::<f16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, "bfloat16") => run_varlen::<bf16>(&p, &tq, &tk, &tv, &to, &tl),
            (None, _) => run_varlen::<f32>(&p, &tq, &tk, &tv, &to, &tl),
            (Some(id), "float16") => gpu::varlen::<f16>(id, s, &p, &tq, &tk, &tv, &to, &tl),
            (Some(id), "bfloat16") => gpu::varlen::<bf16>(id, s, &p, &tq, &tk, &tv, &to, &tl),
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU, compact, with the problem's sizes.
unsafe fn run_varlen<T: Element>(
    p: &flashattn::varlen::VarlenProblem,
    q: &Borrowed,
    k: &Borrowed,
    v: &Borrowed,
    o: &Borrowed,
    lse: &Borrowed,
) -> PyResult<String> {
    // SAFETY: the caller checked dtype, device and sizes.
    let (q, k, v) = unsafe { (q.slice::<T>()?, k.slice::<T>()?, v.slice::<T>()?) };
    let r = flashattn::varlen::forward(flashattn::BackendChoice::Cpu, p, q, k, v).map_err(err)?;
    // SAFETY: as above; out and lse are the caller's writable buffers of these sizes.
    unsafe {
        o.slice_mut::<T>()?.copy_from_slice(&r.o);
        lse.slice_mut::<f32>()?.copy_from_slice(&r.lse);
    }
    Ok(r.ran)
}

/// Decoding against a KV cache on CPU tensors (FlashAttention-2's `flash_attn_with_kvcache`):
/// `q` `[batch, seqlen_q, heads_q, head_dim]`; caches contiguous `[batch, seqlen_cache,
/// heads_kv, head_dim]`, or paged `[num_blocks, page_size, heads_kv, head_dim]` with
/// `block_table` (row-major `[batch, max_blocks]`); optional new rows `k_new`/`v_new`
/// `[batch, seqlen_new, heads_kv, head_dim]` appended to the caches in place; all compact.
/// Writes `out` (like q) and `lse` (f32 `[batch, heads_q, seqlen_q]`).
#[pyfunction]
#[pyo3(signature = (q, k_cache, v_cache, k_new, v_new, out, lse, cache_seqlens, block_table, max_blocks, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, num_splits, stream=None, current=false))]
#[allow(clippy::too_many_arguments)]
fn kvcache_forward(
    q: &Bound<'_, PyAny>,
    k_cache: &Bound<'_, PyAny>,
    v_cache: &Bound<'_, PyAny>,
    k_new: Option<&Bound<'_, PyAny>>,
    v_new: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    lse: &Bound<'_, PyAny>,
    cache_seqlens: Option<Vec<i32>>,
    block_table: Option<Vec<i32>>,
    max_blocks: usize,
    softmax_scale: Option<f32>,
    causal: bool,
    window_left: i64,
    window_right: i64,
    softcap: f32,
    alibi_slopes: Option<Vec<f32>>,
    num_splits: usize,
    stream: Option<usize>,
    current: bool,
) -> PyResult<String> {
    let hs = handshake(stream, current);
    let tq = Borrowed::take_on(q, "q", hs)?;
    let tkc = Borrowed::take_on(k_cache, "k_cache", hs)?;
    let tvc = Borrowed::take_on(v_cache, "v_cache", hs)?;
    let to = Borrowed::take_on(out, "out", hs)?;
    let tl = Borrowed::take_on(lse, "lse", hs)?;
    let new = match (k_new, v_new) {
        (Some(k), Some(v)) => Some((
            Borrowed::take_on(k, "k", hs)?,
            Borrowed::take_on(v, "v", hs)?,
        )),
        (None, None) => None,
        _ => {
            return Err(FlashAttnError::new_err(
                "pass both k and v (new rows), or neither",
            ));
        }
    };
    let mut all = vec![&tq, &tkc, &tvc, &to, &tl];
    if let Some((k, v)) = &new {
        all.extend([k, v]);
    }
    let place = placement(&all)?;
    let bshd_c = "[batch, seqlen, heads, head_dim]";
    let qs = compact(&tq, 4, bshd_c)?;
    let cs = compact(
        &tkc,
        4,
        "[batch or num_blocks, seqlen_cache or page_size, heads_kv, head_dim]",
    )?;
    let (b, sq, hq, d, hkv) = (qs[0], qs[1], qs[2], qs[3], cs[2]);
    if compact(&tvc, 4, bshd_c)? != cs || cs[3] != d || compact(&to, 4, bshd_c)? != qs {
        return Err(FlashAttnError::new_err(format!(
            "shapes disagree: q {qs:?}, k_cache {cs:?}, v_cache {:?}, out {:?}",
            tvc.shape(),
            to.shape()
        )));
    }
    if compact(&tl, 3, "[batch, heads_q, seqlen_q]")? != [b, hq, sq] {
        return Err(FlashAttnError::new_err(format!(
            "lse has shape {:?}; expected [{b}, {hq}, {sq}]",
            tl.shape()
        )));
    }
    let seqlen_new = match &new {
        Some((k, v)) => {
            let ns = compact(k, 4, bshd_c)?;
            if compact(v, 4, bshd_c)? != ns || ns[0] != b || ns[2] != hkv || ns[3] != d {
                return Err(FlashAttnError::new_err(format!(
                    "new rows k {ns:?}, v {:?}; expected [{b}, seqlen_new, {hkv}, {d}]",
                    v.shape()
                )));
            }
            ns[1]
        }
        None => 0,
    };
    let dtype = tq.dtype()?;
    let others: Vec<&Borrowed> = all
        .iter()
        .copied()
        .filter(|t| t.name != "q" && t.name != "lse")
        .collect();
    same_dtype(dtype, &others, &tl)?;
    let layout = match block_table {
        Some(table) => flashattn::kvcache::CacheLayout::Paged {
            num_blocks: cs[0],
            page_size: cs[1],
            block_table: table,
            max_blocks,
        },
        None => flashattn::kvcache::CacheLayout::Contiguous {
            seqlen_cache: cs[1],
        },
    };
    let capacity = match &layout {
        flashattn::kvcache::CacheLayout::Paged { page_size, .. } => page_size * max_blocks,
        flashattn::kvcache::CacheLayout::Contiguous { seqlen_cache } => *seqlen_cache,
    };
    // No cache_seqlens: every cache is full (what FlashAttention-2 assumes).
    let lens = cache_seqlens.unwrap_or_else(|| vec![capacity.saturating_sub(seqlen_new) as i32; b]);
    let mut p =
        flashattn::kvcache::KvCacheProblem::new(b, sq, hq, hkv, d, layout, lens, seqlen_new)
            .map_err(err)?
            .with_mask(if causal { Mask::Causal } else { Mask::None });
    if let Some(s) = softmax_scale {
        p = p.with_scale(s).map_err(err)?;
    }
    p = p
        .with_scores(score_mods(
            (window_left, window_right),
            softcap,
            alibi_slopes,
            b,
            hq,
        )?)
        .map_err(err)?;
    // The caches (new rows appended in place), out and lse are written.
    let mut read = vec![&tq];
    if let Some((k, v)) = &new {
        read.extend([k, v]);
    }
    check_disjoint(&[&tkc, &tvc, &to, &tl], &read)?;
    // The CPU runs one split unless asked; the GPU picks its own count from 0.
    let splits = num_splits.max(1);
    let gpu_splits = (num_splits > 0).then_some(num_splits);
    let (caches, outs, s) = ((&tkc, &tvc), (&to, &tl), stream.unwrap_or(0));
    // SAFETY: dtypes, devices and sizes checked; caches are the caller's writable buffers.
    unsafe {
        match (place, dtype) {
            (None, "float16") => run_kvcache::<f16>(&p, &tq, caches, new.as_ref(), outs, splits),
            (None, "bfloat16") => run_kvcache::<bf16>(&p, &tq, caches, new.as_ref(), outs, splits),
            (None, _) => run_kvcache::<f32>(&p, &tq, caches, new.as_ref(), outs, splits),
            (Some(id), "float16") => {
                gpu::kvcache::<f16>(id, s, &p, &tq, caches, new.as_ref(), outs, gpu_splits)
            }
            (Some(id), "bfloat16") => {
                gpu::kvcache::<bf16>(id, s, &p, &tq, caches, new.as_ref(), outs, gpu_splits)
            }
            (Some(_), other) => Err(cuda_dtype(other)),
        }
    }
}

/// # Safety
/// Every tensor holds `T` (lse f32) on the CPU, compact, with the problem's sizes.
unsafe fn run_kvcache<T: Element>(
    p: &flashattn::kvcache::KvCacheProblem,
    q: &Borrowed,
    (kc, vc): (&Borrowed, &Borrowed),
    new: Option<&(Borrowed, Borrowed)>,
    (o, lse): (&Borrowed, &Borrowed),
    splits: usize,
) -> PyResult<String> {
    // SAFETY: the caller checked dtype, device and sizes; the caches are written in place.
    let r = unsafe {
        let (kn, vn): (&[T], &[T]) = match new {
            Some((k, v)) => (k.slice::<T>()?, v.slice::<T>()?),
            None => (&[], &[]),
        };
        flashattn::kvcache::forward_cpu(
            p,
            q.slice::<T>()?,
            kc.slice_mut::<T>()?,
            vc.slice_mut::<T>()?,
            kn,
            vn,
            splits,
        )
        .map_err(err)?
    };
    // SAFETY: as above.
    unsafe {
        o.slice_mut::<T>()?.copy_from_slice(&r.o);
        lse.slice_mut::<f32>()?.copy_from_slice(&r.lse);
    }
    Ok(format!("cpu ({splits} split(s))"))
}

/// NVRTC's version `(major, minor)` as the library loads it (from the `nvidia-cuda-nvrtc`
/// wheel that `flashattn/__init__.py` preloads, or the system's); raises when none loads.
#[pyfunction]
fn nvrtc_version() -> PyResult<(i32, i32)> {
    flashattn::cuda::nvrtc::nvrtc_version().map_err(err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(nvrtc_version, m)?)?;
    m.add_function(wrap_pyfunction!(reference, m)?)?;
    m.add_function(wrap_pyfunction!(varlen_forward, m)?)?;
    m.add_function(wrap_pyfunction!(kvcache_forward, m)?)?;
    m.add("FlashAttnError", m.py().get_type::<FlashAttnError>())?;
    Ok(())
}
