//! The crate's one error type. Every variant says what was wrong and what to do about it.

use thiserror::Error;

/// Everything that can go wrong in `flashattn`, from bad shapes to a failed kernel launch.
///
/// No public function panics on user input: each invalid call returns one of these
/// before any work (and before any kernel launch).
#[derive(Debug, Error)]
pub enum AttnError {
    /// A dimension of the problem is zero.
    #[error(
        "{name} is 0: every dimension must be at least 1 (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)"
    )]
    ZeroDim {
        /// Which dimension.
        name: &'static str,
    },

    /// GQA/MQA needs `heads_q` to be a whole multiple of `heads_kv`.
    #[error(
        "heads_q = {heads_q} is not a multiple of heads_kv = {heads_kv}: for GQA/MQA each kv head must serve the same number of query heads"
    )]
    HeadsNotMultiple {
        /// Query heads.
        heads_q: usize,
        /// Key/value heads.
        heads_kv: usize,
    },

    /// The backend or kernel has no code for this head_dim.
    #[error("head_dim = {head_dim} is not supported by {backend}: supported are {supported}")]
    UnsupportedHeadDim {
        /// The head_dim asked for.
        head_dim: usize,
        /// Backend or kernel name.
        backend: String,
        /// Human-readable list of what is supported.
        supported: String,
    },

    /// The backend has no code yet for a feature the problem asks for.
    #[error("{feature} is not supported by {backend} yet: {hint}")]
    UnsupportedFeature {
        /// The feature (e.g. "a sliding window").
        feature: String,
        /// Backend or kernel name.
        backend: String,
        /// What to do instead.
        hint: String,
    },

    /// Two tensors disagree on a dimension.
    #[error("shape mismatch: {what}")]
    ShapeMismatch {
        /// What disagrees with what, and the fix.
        what: String,
    },

    /// A buffer holds fewer elements than its shape and strides address.
    #[error(
        "{tensor} buffer holds {len} elements but its shape (and strides, where it has them) needs {required}: pass a longer buffer, or fix the strides of a strided view"
    )]
    BufferTooShort {
        /// q, k, v, o or lse.
        tensor: &'static str,
        /// Elements in the buffer.
        len: usize,
        /// Elements needed (largest offset + 1).
        required: usize,
    },

    /// Strides that the backend cannot use.
    #[error("{tensor} strides are invalid: {reason}")]
    InvalidStrides {
        /// q, k, v or o.
        tensor: &'static str,
        /// What is wrong and what to do.
        reason: String,
    },

    /// Inputs of different element types, or an element type the backend lacks.
    #[error("dtype mismatch: {what}")]
    DTypeMismatch {
        /// Which tensors, which dtypes, and what is expected.
        what: String,
    },

    /// `softmax_scale` is NaN, infinite or not positive.
    #[error(
        "softmax_scale = {value} is not a finite positive number: pass e.g. 1/sqrt(head_dim) (the default)"
    )]
    InvalidScale {
        /// The value given.
        value: f32,
    },

    /// Sizes whose element offsets do not fit the index type.
    #[error("size overflow: {what}; split the problem into smaller batches")]
    Overflow {
        /// Which product overflowed.
        what: String,
    },

    /// A command-line option or input file that does not parse.
    #[error("invalid input: {what}")]
    InvalidInput {
        /// What was given, what was expected, and what to do.
        what: String,
    },

    /// A file could not be read or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A safetensors file is malformed or lacks a tensor.
    #[error("safetensors: {what}")]
    SafeTensors {
        /// What was wrong and what to do.
        what: String,
    },

    /// A backend that was asked for is not usable on this machine.
    #[error("backend {backend} is unavailable: {reason}")]
    BackendUnavailable {
        /// cpu or cuda.
        backend: &'static str,
        /// Why, and what to do.
        reason: String,
    },

    /// An unknown kernel name.
    #[error("unknown kernel '{name}': available are {available}")]
    UnknownKernel {
        /// The name given.
        name: String,
        /// Names that exist.
        available: String,
    },

    /// The problem is too large for a kernel's memory model (for example the naive kernel's S).
    #[error("{kernel} cannot run this problem: {reason}")]
    TooLarge {
        /// Kernel name.
        kernel: &'static str,
        /// Why and what to do.
        reason: String,
    },

    /// NVRTC rejected a kernel source; the log is included.
    #[error("NVRTC failed to compile {kernel} for {arch}: {log}")]
    Compile {
        /// Kernel and specialisation.
        kernel: String,
        /// Target arch, e.g. sm_90.
        arch: String,
        /// The NVRTC log.
        log: String,
    },

    /// A CUDA driver call failed.
    #[error("CUDA error in {context}: {message}")]
    Cuda {
        /// What was being done (kernel name and shape for launches).
        context: String,
        /// The driver's message.
        message: String,
    },

    /// An FP8 dequantisation factor (`q_descale`, `k_descale`, `v_descale`) of the wrong
    /// dtype, shape or value.
    #[error("{tensor} is invalid: {what}")]
    InvalidDescale {
        /// `q_descale`, `k_descale` or `v_descale`.
        tensor: &'static str,
        /// What is wrong and what to pass instead.
        what: String,
    },

    /// A result failed a check against the oracle or a stored reference.
    #[error("check failed: {what}")]
    CheckFailed {
        /// Which case and by how much.
        what: String,
    },
}

/// The one buffer-length rule of every entry point: `tensor`'s `len` elements must cover the
/// `required` ones its shape (and strides) address.
///
/// # Errors
/// [`AttnError::BufferTooShort`] when `len < required`.
pub fn check_len(tensor: &'static str, len: usize, required: usize) -> Result<()> {
    if len < required {
        return Err(AttnError::BufferTooShort {
            tensor,
            len,
            required,
        });
    }
    Ok(())
}

impl AttnError {
    /// `true` when the error says that a backend cannot take the problem at all (no usable
    /// GPU, an element type, head_dim, feature, stride or size it lacks), as opposed to an
    /// invalid call or a failure while running: `Auto` falls back to another backend on these
    /// only.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            AttnError::BackendUnavailable { .. }
                | AttnError::DTypeMismatch { .. }
                | AttnError::UnsupportedHeadDim { .. }
                | AttnError::UnsupportedFeature { .. }
                | AttnError::InvalidStrides { .. }
                | AttnError::TooLarge { .. }
        )
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = AttnError> = std::result::Result<T, E>;
