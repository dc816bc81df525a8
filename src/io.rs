//! safetensors in and out: q/k/v by name (with an optional layer prefix), stored references,
//! and writing o/lse.
//!
//! Naming: with prefix `P` the tensors are `P.q`, `P.k`, `P.v` (and `P.o`, `P.lse`,
//! `P.o_causal`, `P.lse_causal` for references); with an empty prefix just `q`, `k`, ... .
//! q is `[batch, seqlen_q, heads_q, head_dim]`, k and v `[batch, seqlen_k, heads_kv,
//! head_dim]` (dense bshd), lse `[batch, heads_q, seqlen_q]` f32. Element types f16, bf16 and
//! f32 are read; any of them converts to any [`Element`] on request.
//!
//! A malformed file is an [`AttnError::SafeTensors`] (never a panic); a file that cannot be
//! read or written is an [`AttnError::Io`].

use crate::dtype::{DType, Element};
use crate::error::{AttnError, Result};
use crate::mask::Mask;
use crate::shape::AttnShape;
use half::{bf16, f16};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A safetensors file read into memory, header parsed and validated.
#[derive(Debug)]
pub struct SafeFile {
    path: String,
    bytes: Vec<u8>,
    header_len: usize,
    meta: Metadata,
}

/// q, k, v of one layer, converted to `T`, with the shape they imply.
#[derive(Debug, Clone)]
pub struct Qkv<T> {
    /// Sizes read from the tensor shapes (`seqlen_q`/`heads_q` from q, the rest from k).
    pub shape: AttnShape,
    /// The element type stored in the file (q, k and v share it).
    pub file_dtype: DType,
    /// Dense `[batch, seqlen_q, heads_q, head_dim]`.
    pub q: Vec<T>,
    /// Dense `[batch, seqlen_k, heads_kv, head_dim]`.
    pub k: Vec<T>,
    /// Dense `[batch, seqlen_k, heads_kv, head_dim]`.
    pub v: Vec<T>,
}

/// Reference outputs stored beside the inputs (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReference {
    /// Dense `[batch, seqlen_q, heads_q, head_dim]`.
    pub o: Vec<f32>,
    /// `[batch, heads_q, seqlen_q]`, natural log.
    pub lse: Vec<f32>,
}

/// `prefix.name`, or `name` for an empty prefix (a trailing `.` on the prefix is ignored).
pub fn tensor_name(prefix: &str, name: &str) -> String {
    let prefix = prefix.trim_end_matches('.');
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn st_err(path: &str, what: impl std::fmt::Display) -> AttnError {
    AttnError::SafeTensors {
        what: format!("{path}: {what}"),
    }
}

impl SafeFile {
    /// Reads and validates a file.
    ///
    /// # Errors
    /// [`AttnError::Io`] when it cannot be read, [`AttnError::SafeTensors`] when it is not a
    /// valid safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| AttnError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(&path.display().to_string(), bytes)
    }

    /// Parses a file already in memory; `name` is used in error messages.
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when the bytes are not a valid safetensors file.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        let (header_len, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| {
            st_err(
                name,
                format!(
                    "not a valid safetensors file ({e}); re-export it with the safetensors library"
                ),
            )
        })?;
        Ok(Self {
            path: name.to_string(),
            bytes,
            header_len,
            meta,
        })
    }

    /// The path (or name) the file was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.meta.tensors().into_keys().collect();
        n.sort();
        n
    }

    /// `true` when the file holds a tensor of this name.
    pub fn has(&self, name: &str) -> bool {
        self.meta.info(name).is_some()
    }

    /// The free-form `__metadata__` of the header (empty when absent).
    pub fn metadata(&self) -> HashMap<String, String> {
        self.meta.metadata().clone().unwrap_or_default()
    }

    /// The `scale` entry of the metadata (`None` when absent), under the rule `--scale` and
    /// [`crate::AttnProblem::with_scale`] apply: a finite number above 0.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] naming the file and the value when the entry is not a
    /// number, or is NaN, infinite, zero or negative (never silently replaced by the default).
    pub fn scale(&self) -> Result<Option<f32>> {
        let Some(raw) = self.metadata().get("scale").cloned() else {
            return Ok(None);
        };
        let bad = |why: String| AttnError::InvalidInput {
            what: format!(
                "{}: metadata scale = '{raw}' {why}; fix the file's metadata, or override it with --scale",
                self.path
            ),
        };
        let value: f32 = raw
            .trim()
            .parse()
            .map_err(|_| bad("is not a number".into()))?;
        crate::shape::check_scale(value)
            .map(Some)
            .map_err(|e| bad(format!("is refused: {e}")))
    }

    /// Prefixes `P` for which `P.q` and `P.k`/`P.v` (or a KV cache, `P.k_cache`/`P.v_cache`)
    /// exist, in natural order (`layer2` before `layer10`); `""` when they sit at the top level.
    pub fn layer_prefixes(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .meta
            .tensors()
            .into_keys()
            .filter_map(|n| {
                let p = if n == "q" { "" } else { n.strip_suffix(".q")? };
                let both =
                    |a: &str, b: &str| self.has(&tensor_name(p, a)) && self.has(&tensor_name(p, b));
                (both("k", "v") || both("k_cache", "v_cache")).then(|| p.to_string())
            })
            .collect();
        out.sort_by_key(|a| natural_key(a));
        out
    }

    /// Element type and shape of a tensor.
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when it is missing or not f16/bf16/f32.
    pub fn info(&self, name: &str) -> Result<(DType, Vec<usize>)> {
        let info = self.tensor_info(name)?;
        Ok((self.dtype_of(name, info)?, info.shape.clone()))
    }

    fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.meta.info(name).ok_or_else(|| {
            st_err(
                &self.path,
                format!(
                    "no tensor named '{name}' (the file has: {})",
                    self.names().join(", ")
                ),
            )
        })
    }

    fn dtype_of(&self, name: &str, info: &TensorInfo) -> Result<DType> {
        match info.dtype {
            Dtype::F16 => Ok(DType::F16),
            Dtype::BF16 => Ok(DType::BF16),
            Dtype::F32 => Ok(DType::F32),
            other => Err(AttnError::DTypeMismatch {
                what: format!(
                    "{}: tensor '{name}' is {other:?}; only F16, BF16 and F32 are supported",
                    self.path
                ),
            }),
        }
    }

    /// Reads a tensor, converting whatever is stored (f16/bf16/f32) to `T` (round to nearest
    /// even when narrowing). Returns the data (row-major) and the shape.
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when missing or inconsistent, [`AttnError::DTypeMismatch`]
    /// when the stored type is not f16/bf16/f32.
    pub fn read<T: Element>(&self, name: &str) -> Result<(Vec<T>, Vec<usize>)> {
        let info = self.tensor_info(name)?;
        let dtype = self.dtype_of(name, info)?;
        let bytes = self.raw(name, info, dtype.size())?;
        let data = match dtype {
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|c| T::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32()))
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| T::from_f32(bf16::from_le_bytes([c[0], c[1]]).to_f32()))
                .collect(),
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| T::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        };
        Ok((data, info.shape.clone()))
    }

    /// A tensor's bytes, checked against its shape (`elem` bytes per element).
    fn raw(&self, name: &str, info: &TensorInfo, elem: usize) -> Result<&[u8]> {
        let (start, end) = info.data_offsets;
        let base = 8 + self.header_len;
        let bytes = self
            .bytes
            .get(base + start..base + end)
            .ok_or_else(|| st_err(&self.path, format!("tensor '{name}' lies outside the file")))?;
        let n = info.shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
        if n.and_then(|n| n.checked_mul(elem)) != Some(bytes.len()) {
            return Err(st_err(
                &self.path,
                format!(
                    "tensor '{name}': shape {:?} does not match its {} bytes",
                    info.shape,
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// Reads an i32 tensor (offsets such as `P.cu_seqlens_q`), with its shape.
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when missing or inconsistent; [`AttnError::DTypeMismatch`]
    /// when it is not stored as I32.
    pub fn read_i32(&self, name: &str) -> Result<(Vec<i32>, Vec<usize>)> {
        let info = self.tensor_info(name)?;
        if info.dtype != Dtype::I32 {
            return Err(AttnError::DTypeMismatch {
                what: format!(
                    "{}: tensor '{name}' is {:?}; integer tensors (offsets, cache lengths, block tables) must be stored as I32: convert it (e.g. numpy .astype(np.int32))",
                    self.path, info.dtype
                ),
            });
        }
        let bytes = self.raw(name, info, 4)?;
        let data = bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok((data, info.shape.clone()))
    }

    /// Like [`Self::read`] but the stored type must be `T` (no conversion).
    ///
    /// # Errors
    /// As [`Self::read`], and [`AttnError::DTypeMismatch`] when the stored type is not `T`.
    pub fn read_exact<T: Element>(&self, name: &str) -> Result<(Vec<T>, Vec<usize>)> {
        let (dtype, _) = self.info(name)?;
        if dtype != T::DTYPE {
            return Err(AttnError::DTypeMismatch {
                what: format!(
                    "{}: tensor '{name}' is {dtype}, expected {}; use read() to convert",
                    self.path,
                    T::DTYPE
                ),
            });
        }
        self.read(name)
    }

    /// Reads q, k, v under `prefix` as `T` (converted from the file's type when it differs;
    /// see [`Qkv::file_dtype`]).
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when a tensor is missing or not 4-D,
    /// [`AttnError::DTypeMismatch`] when q, k and v are stored with different types,
    /// [`AttnError::ShapeMismatch`] when their shapes disagree (batch, head_dim, k vs v),
    /// and any error of [`AttnShape::validate`].
    pub fn qkv<T: Element>(&self, prefix: &str) -> Result<Qkv<T>> {
        let names = ["q", "k", "v"].map(|n| tensor_name(prefix, n));
        let infos = [
            self.info(&names[0])?,
            self.info(&names[1])?,
            self.info(&names[2])?,
        ];
        let file_dtype = infos[0].0;
        if infos.iter().any(|(d, _)| *d != file_dtype) {
            return Err(AttnError::DTypeMismatch {
                what: format!(
                    "{}: {} is {}, {} is {}, {} is {}; q, k and v must be stored with one type",
                    self.path, names[0], infos[0].0, names[1], infos[1].0, names[2], infos[2].0
                ),
            });
        }
        for (n, (_, sh)) in names.iter().zip(&infos) {
            if sh.len() != 4 {
                return Err(st_err(
                    &self.path,
                    format!(
                        "{n} has shape {sh:?}; expected 4 dims [batch, seqlen, heads, head_dim]"
                    ),
                ));
            }
        }
        let (qs, ks, vs) = (&infos[0].1, &infos[1].1, &infos[2].1);
        if ks != vs || qs[0] != ks[0] || qs[3] != ks[3] {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "{}: q {qs:?}, k {ks:?}, v {vs:?}; k and v must match, and q must share batch and head_dim with them",
                    self.path
                ),
            });
        }
        let shape = AttnShape {
            batch: qs[0],
            seqlen_q: qs[1],
            seqlen_k: ks[1],
            heads_q: qs[2],
            heads_kv: ks[2],
            head_dim: qs[3],
        };
        shape.validate()?;
        Ok(Qkv {
            shape,
            file_dtype,
            q: self.read(&names[0])?.0,
            k: self.read(&names[1])?.0,
            v: self.read(&names[2])?.0,
        })
    }

    /// Stored reference for `prefix` and `mask` (`o`/`lse`, or `o_causal`/`lse_causal`),
    /// checked against `shape`; `None` when the file holds neither tensor.
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when only one of the pair exists or a shape is wrong.
    pub fn reference(
        &self,
        prefix: &str,
        mask: Mask,
        shape: &AttnShape,
    ) -> Result<Option<StoredReference>> {
        let (on, ln) = match mask {
            Mask::None => ("o", "lse"),
            Mask::Causal => ("o_causal", "lse_causal"),
        };
        let (on, ln) = (tensor_name(prefix, on), tensor_name(prefix, ln));
        match (self.has(&on), self.has(&ln)) {
            (false, false) => return Ok(None),
            (true, true) => {}
            _ => {
                return Err(st_err(
                    &self.path,
                    format!("holds only one of {on} and {ln}; store both or neither"),
                ));
            }
        }
        let (o, os) = self.read::<f32>(&on)?;
        let (lse, ls) = self.read::<f32>(&ln)?;
        let s = shape;
        let want_o = [s.batch, s.seqlen_q, s.heads_q, s.head_dim];
        let want_l = [s.batch, s.heads_q, s.seqlen_q];
        if os != want_o || ls != want_l {
            return Err(st_err(
                &self.path,
                format!("{on} is {os:?} and {ln} is {ls:?}; expected {want_o:?} and {want_l:?}"),
            ));
        }
        Ok(Some(StoredReference { o, lse }))
    }
}

/// Sort key that orders digit runs numerically (`layer2` < `layer10`).
fn natural_key(s: &str) -> Vec<(String, u128)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut num = c.to_digit(10).unwrap_or(0) as u128;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                num = num.saturating_mul(10).saturating_add(d as u128);
                chars.next();
            }
            out.push((std::mem::take(&mut text), num));
        } else {
            text.push(c);
        }
    }
    out.push((text, 0));
    out
}

/// One tensor waiting to be written.
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Entry {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Collects tensors and writes them as one safetensors file.
#[derive(Default)]
pub struct Writer {
    entries: Vec<(String, Entry)>,
    metadata: BTreeMap<String, String>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tensor stored as `T` (f16, bf16 or f32), row-major with `shape`.
    ///
    /// # Errors
    /// [`AttnError::ShapeMismatch`] when `data.len()` is not the product of `shape`, or the
    /// name is already used.
    pub fn add<T: Element>(
        &mut self,
        name: &str,
        shape: &[usize],
        data: &[T],
    ) -> Result<&mut Self> {
        let n = shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
        if n != Some(data.len()) {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "tensor '{name}' has {} elements but shape {shape:?}",
                    data.len()
                ),
            });
        }
        if self.entries.iter().any(|(n, _)| n == name) {
            return Err(AttnError::ShapeMismatch {
                what: format!("tensor '{name}' added twice"),
            });
        }
        let mut bytes = Vec::with_capacity(data.len() * T::DTYPE.size());
        let dtype = match T::DTYPE {
            DType::F16 => {
                data.iter()
                    .for_each(|x| bytes.extend(f16::from_f32(x.to_f32()).to_le_bytes()));
                Dtype::F16
            }
            DType::BF16 => {
                data.iter()
                    .for_each(|x| bytes.extend(bf16::from_f32(x.to_f32()).to_le_bytes()));
                Dtype::BF16
            }
            DType::F32 => {
                data.iter()
                    .for_each(|x| bytes.extend(x.to_f32().to_le_bytes()));
                Dtype::F32
            }
        };
        self.entries.push((
            name.to_string(),
            Entry {
                dtype,
                shape: shape.to_vec(),
                bytes,
            },
        ));
        Ok(self)
    }

    /// Adds `o` (`[batch, seqlen_q, heads_q, head_dim]`, type `T`) and `lse`
    /// (`[batch, heads_q, seqlen_q]`, f32) as `prefix.o`/`prefix.lse`, or
    /// `prefix.o_causal`/`prefix.lse_causal` for a causal mask (the names the inputs use).
    ///
    /// # Errors
    /// As [`Self::add`].
    pub fn add_output<T: Element>(
        &mut self,
        prefix: &str,
        mask: Mask,
        shape: &AttnShape,
        o: &[T],
        lse: &[f32],
    ) -> Result<&mut Self> {
        let sfx = if mask.is_causal() { "_causal" } else { "" };
        let s = shape;
        self.add(
            &tensor_name(prefix, &format!("o{sfx}")),
            &[s.batch, s.seqlen_q, s.heads_q, s.head_dim],
            o,
        )?;
        self.add(
            &tensor_name(prefix, &format!("lse{sfx}")),
            &[s.batch, s.heads_q, s.seqlen_q],
            lse,
        )
    }

    /// Sets a `__metadata__` entry.
    pub fn meta(&mut self, key: &str, value: &str) -> &mut Self {
        self.metadata.insert(key.to_string(), value.to_string());
        self
    }

    /// Serialises everything added so far: the same entries and metadata give the same bytes.
    ///
    /// safetensors writes `__metadata__` from a `HashMap` (its order changes from process to
    /// process), so the tensors are serialised without it and the header is then rewritten
    /// with the metadata in key order (header padded with spaces to 8 bytes, as the format
    /// asks; the data offsets are relative to the data and do not move).
    ///
    /// # Errors
    /// [`AttnError::SafeTensors`] when serialisation fails.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let err = |e: String| st_err("output", format!("cannot serialise: {e}"));
        let bytes = safetensors::serialize(self.entries.iter().map(|(n, e)| (n.as_str(), e)), None)
            .map_err(|e| err(e.to_string()))?;
        if self.metadata.is_empty() {
            return Ok(bytes);
        }
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8-byte length")) as usize;
        let header = &bytes[8..8 + n];
        let mut json: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(header).map_err(|e| err(e.to_string()))?;
        let meta: serde_json::Map<String, serde_json::Value> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        // "__metadata__" first, then the tensors in safetensors' own order.
        let mut ordered = serde_json::Map::new();
        ordered.insert("__metadata__".into(), meta.into());
        ordered.append(&mut json);
        let mut header = serde_json::to_vec(&ordered).map_err(|e| err(e.to_string()))?;
        header.resize(header.len().next_multiple_of(8), b' ');
        let mut out = Vec::with_capacity(8 + header.len() + bytes.len() - 8 - n);
        out.extend((header.len() as u64).to_le_bytes());
        out.extend(header);
        out.extend(&bytes[8 + n..]);
        Ok(out)
    }

    /// Writes the file.
    ///
    /// # Errors
    /// [`AttnError::Io`] when it cannot be written, [`AttnError::SafeTensors`] when
    /// serialisation fails.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| AttnError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let mut v = vec!["layer10", "layer2", "layer1", "a"];
        v.sort_by_key(|a| natural_key(a));
        assert_eq!(v, ["a", "layer1", "layer2", "layer10"]);
    }

    #[test]
    fn names() {
        assert_eq!(tensor_name("", "q"), "q");
        assert_eq!(tensor_name("layer3", "q"), "layer3.q");
        assert_eq!(tensor_name("layer3.", "q"), "layer3.q");
    }
}
