//! The benchmark sweep: cases (shape, dtype, mask) and lines (kernel and tile).
//!
//! As FlashAttention's own benchmark: `batch * seqlen` tokens and `heads * head_dim` hidden
//! size are held fixed (16384 and 2048), so every case moves the same bytes and the FLOPs grow
//! with seqlen.

use super::order::Order;
use super::stats::Schedule;
use flashattn::cuda::{KernelKind, MmaTile};
use flashattn::error::{AttnError, Result};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::{AttnProblem, AttnShape, DType, Mask};
use serde::{Deserialize, Serialize};

/// Tokens per case (`batch * seqlen`) in FlashAttention's benchmark.
pub const DEFAULT_TOKENS: usize = 16384;
/// Hidden size per token (`heads * head_dim`) in FlashAttention's benchmark.
pub const DEFAULT_HIDDEN: usize = 2048;
/// Sequence lengths of the default sweep.
pub const DEFAULT_SEQLENS: [usize; 6] = [512, 1024, 2048, 4096, 8192, 16384];
/// Head dims of the default sweep.
pub const DEFAULT_HEAD_DIMS: [usize; 2] = [64, 128];

/// One measured configuration: self-attention `[batch, seqlen, heads, head_dim]`, dense.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// `f16` or `bf16`.
    pub dtype: String,
    /// Sequences.
    pub batch: usize,
    /// Query and key rows per sequence.
    pub seqlen: usize,
    /// Heads (query and key/value).
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Causal mask (square, so top-left and bottom-right alignment agree).
    pub causal: bool,
    /// Sliding window `[left, right]` (FlashAttention-2's `window_size`, -1 = unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<[i64; 2]>,
    /// Logit soft-cap `c` (`c * tanh(s / c)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f32>,
    /// ALiBi with the standard geometric slopes ([`Alibi::geometric`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub alibi: bool,
    /// The backward pass (dq, dk, dv from o, lse and dO) instead of the forward.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub backward: bool,
}

impl Case {
    /// A case with `tokens / seqlen` sequences (at least 1) and `hidden / head_dim` heads.
    ///
    /// # Errors
    /// [`AttnError::ShapeMismatch`] when `head_dim` does not divide `hidden` or a size is 0.
    pub fn new(
        dtype: DType,
        seqlen: usize,
        head_dim: usize,
        causal: bool,
        tokens: usize,
        hidden: usize,
    ) -> Result<Self> {
        if seqlen == 0
            || head_dim == 0
            || tokens == 0
            || !hidden.is_multiple_of(head_dim)
            || hidden < head_dim
        {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "bench case seqlen {seqlen}, head_dim {head_dim}: need seqlen > 0 and head_dim dividing the hidden size {hidden}"
                ),
            });
        }
        Ok(Case {
            dtype: dtype.name().to_string(),
            batch: (tokens / seqlen).max(1),
            seqlen,
            heads: hidden / head_dim,
            head_dim,
            causal,
            window: None,
            softcap: None,
            alibi: false,
            backward: false,
        })
    }

    /// Stable identifier, e.g. `f16-d64-causal-s4096-b4-h32` (and `-w4096_0` with a window).
    pub fn id(&self) -> String {
        let mut mods = self
            .window
            .map_or(String::new(), |[l, r]| format!("-w{l}_{r}"));
        if let Some(c) = self.softcap {
            mods += &format!("-softcap{c}");
        }
        if self.alibi {
            mods += "-alibi";
        }
        if self.backward {
            mods += "-bwd";
        }
        format!(
            "{}-d{}-{}-s{}-b{}-h{}{mods}",
            self.dtype,
            self.head_dim,
            self.mask().name(),
            self.seqlen,
            self.batch,
            self.heads
        )
    }

    /// The mask.
    pub fn mask(&self) -> Mask {
        if self.causal {
            Mask::Causal
        } else {
            Mask::None
        }
    }

    /// The element type.
    ///
    /// # Errors
    /// [`AttnError::DTypeMismatch`] for anything but `f16` and `bf16`.
    pub fn dtype(&self) -> Result<DType> {
        match self.dtype.as_str() {
            "f16" => Ok(DType::F16),
            "bf16" => Ok(DType::BF16),
            other => Err(AttnError::DTypeMismatch {
                what: format!("bench dtype '{other}': expected f16 or bf16"),
            }),
        }
    }

    /// The attention problem (dense bshd, default scale).
    ///
    /// # Errors
    /// Shape validation errors.
    pub fn problem(&self) -> Result<AttnProblem> {
        let p = AttnProblem::new(AttnShape::new(
            self.batch,
            self.seqlen,
            self.heads,
            self.head_dim,
        ))?
        .with_mask(self.mask());
        if !self.has_score_mods() {
            return Ok(p);
        }
        let window = match self.window {
            Some([l, r]) => Window::from_fa(l, r)?,
            None => Window::default(),
        };
        p.with_scores(ScoreMods {
            window,
            softcap: self.softcap,
            alibi: self.alibi.then(|| Alibi::geometric(self.heads)),
            sink: None,
        })
    }

    /// Whether the case has a window, softcap or ALiBi (which SDPA's fused backends lack).
    pub fn has_score_mods(&self) -> bool {
        self.window.is_some() || self.softcap.is_some() || self.alibi
    }

    /// FLOPs by [`AttnProblem::flops`] (visible pairs only); 2.5 times that for the backward
    /// (FlashAttention's convention: five matrix products against the forward's two).
    pub fn flops(&self) -> f64 {
        let f = self.problem().map(|p| p.flops()).unwrap_or(0.0);
        if self.backward { 2.5 * f } else { f }
    }

    /// Elements of one of q, k, v, o.
    pub fn tensor_len(&self) -> usize {
        self.batch * self.seqlen * self.heads * self.head_dim
    }

    /// Bytes of q, k and v together (one input set).
    pub fn input_bytes(&self) -> usize {
        3 * self.tensor_len() * 2
    }
}

/// One line of the benchmark (a column of the table, a curve of the plot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// `mma`, `simt`, `naive`, or `mma[2,4,64]` for an explicit tile.
    pub name: String,
    /// The kernel.
    pub kernel: KernelKind,
    /// Explicit `mma` tile; `None` takes the kernel's default.
    pub tile: Option<MmaTile>,
}

impl Line {
    /// A kernel with its default tile.
    pub fn kernel(kernel: KernelKind) -> Self {
        Line {
            name: kernel.name().to_string(),
            kernel,
            tile: None,
        }
    }

    /// `mma` with an explicit tile, named `mma[<spec>]` after the spec as given (trimmed).
    ///
    /// # Errors
    /// [`MmaTile::parse`] errors.
    pub fn tile(spec: &str) -> Result<Self> {
        let tile = MmaTile::parse(spec)?;
        let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
        Ok(Line {
            name: format!("mma[{spec}]"),
            kernel: KernelKind::Mma,
            tile: Some(tile),
        })
    }
}

/// Everything to measure.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Cases in table order (dtype, head_dim, mask, seqlen).
    pub cases: Vec<Case>,
    /// Our lines in column order.
    pub lines: Vec<Line>,
    /// Timed launches per line and case.
    pub iters: usize,
    /// Untimed launches first.
    pub warmup: usize,
    /// Then untimed launches until this many milliseconds have passed.
    pub warmup_ms: u64,
    /// The least wall time of each line's timed launches (0: `iters` launches).
    pub window_ms: u64,
    /// How ours and the peers take turns.
    pub order: Order,
}

impl Sweep {
    /// How each line is timed.
    pub fn schedule(&self) -> Schedule {
        Schedule {
            iters: self.iters,
            warmup: self.warmup,
            warmup_ms: self.warmup_ms,
            window_ms: self.window_ms,
        }
    }
}

/// Parses `LEFT,RIGHT` (integers, -1 = unbounded) into a window.
///
/// # Errors
/// [`AttnError::InvalidInput`] naming the expected form, or a side below -1.
pub fn parse_window(w: &str) -> Result<[i64; 2]> {
    let bad = || AttnError::InvalidInput {
        what: format!("--window {w}: expected LEFT,RIGHT (integers, -1 = unbounded), e.g. 4096,0"),
    };
    let (l, r) = w.split_once(',').ok_or_else(bad)?;
    let l: i64 = l.trim().parse().map_err(|_| bad())?;
    let r: i64 = r.trim().parse().map_err(|_| bad())?;
    Window::from_fa(l, r)?;
    Ok([l, r])
}

/// Cases of the cross product, in table order.
///
/// # Errors
/// [`Case::new`] errors.
pub fn cases(
    dtypes: &[DType],
    head_dims: &[usize],
    causal: &[bool],
    seqlens: &[usize],
    tokens: usize,
    hidden: usize,
) -> Result<Vec<Case>> {
    let mut out = Vec::new();
    for &dt in dtypes {
        for &d in head_dims {
            for &c in causal {
                for &s in seqlens {
                    out.push(Case::new(dt, s, d, c, tokens, hidden)?);
                }
            }
        }
    }
    Ok(out)
}
