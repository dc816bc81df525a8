//! Options of `flashattn bench` and `flashattn bench-plot` (clap `Args`, usable without clap
//! through [`BenchOptions::from_args`]).

use super::order::Order;
use super::sweep::{self, Line, Sweep};
use clap::{Args, Parser, ValueEnum};
use flashattn::DType;
use flashattn::cuda::KernelKind;
use flashattn::error::{AttnError, Result};
use std::path::PathBuf;

/// The window of each line with --peers when --window-ms is not given, milliseconds.
pub const DEFAULT_PEERS_WINDOW_MS: u64 = 250;

/// Which masks to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CausalChoice {
    /// No mask only.
    Off,
    /// Causal only.
    On,
    /// Both.
    Both,
}

/// Which element types to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeChoice {
    /// fp16 only.
    F16,
    /// bf16 only.
    Bf16,
    /// Both.
    Both,
}

/// `flashattn bench`: time our kernels (and PyTorch SDPA peers) over FlashAttention's sweep.
#[derive(Debug, Clone, Args)]
pub struct BenchOptions {
    /// Sequence lengths, comma-separated; `k` means 1024 [default: 512,1k,2k,4k,8k,16k].
    #[arg(long, value_delimiter = ',', value_parser = parse_len, value_name = "LIST")]
    pub seqlen: Vec<usize>,
    /// Head dims, comma-separated [default: 64,128].
    #[arg(long = "head-dim", value_delimiter = ',', value_name = "LIST")]
    pub head_dim: Vec<usize>,
    /// Masks to run [default: both].
    #[arg(long, value_enum, value_name = "off|on|both")]
    pub causal: Option<CausalChoice>,
    /// Element types to run [default: both; f16 with --quick].
    #[arg(long, value_enum, value_name = "f16|bf16|both")]
    pub dtype: Option<DTypeChoice>,
    /// Kernels, comma-separated from naive, simt, mma, wgmma (auto = wgmma; on a GPU other than
    /// sm_90 it runs mma and the JSON says so) [default: wgmma,mma, or none when --tiles is
    /// given]; naive and simt are slow and naive needs O(seqlen^2) memory.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub kernels: Vec<String>,
    /// An `mma` tile `mt,nwarps,bc[,q]` timed as its own line `mma[mt,nwarps,bc]`; repeat the
    /// option, or separate tiles with `;` or spaces.
    #[arg(long = "tiles", value_name = "MT,NWARPS,BC[,q]", action = clap::ArgAction::Append)]
    pub tiles: Vec<String>,
    /// Timed launches per case and line (at least 20; the least when --window-ms asks for
    /// more); the median is reported.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(20..))]
    pub iters: u32,
    /// Untimed launches before timing (at least 1 is always done).
    #[arg(long, default_value_t = 10)]
    pub warmup: u32,
    /// After the untimed launches, keep launching until this many milliseconds have passed,
    /// so that every line (ours and the peers) is timed in the sustained, power-limited state
    /// and not in the boost that follows the idle gap of input generation (on the H200 the
    /// SM clock fell from 1980 to ~1530 MHz once the 700 W limit was reached, ~300 ms into a
    /// busy stretch); 0 turns it off.
    #[arg(long = "warmup-ms", default_value_t = 500, value_name = "MS")]
    pub warmup_ms: u64,
    /// Where bench.json, bench.txt and the plots go (at most 6 files).
    #[arg(long = "out-dir", default_value = "out/bench", value_name = "DIR")]
    pub out_dir: PathBuf,
    /// Also time PyTorch SDPA (flash, cuDNN, efficient) in one persistent tools/bench/peers.py
    /// process, interleaved with ours case by case in both orders (round 1 ours first, round
    /// 2 the peers first; each line's value is the median over both rounds, each round in
    /// the JSON), every line over a window of --window-ms.
    #[arg(long)]
    pub peers: bool,
    /// The least wall time of each line's timed launches, milliseconds: the launch count
    /// comes from the warm-up's time per launch (at least --iters, at most 20000), so that a
    /// median spans several periods of the power limiter rather than a few milliseconds
    /// [default: 250 with --peers, else 0: --iters launches].
    #[arg(long = "window-ms", value_name = "MS")]
    pub window_ms: Option<u64>,
    /// With --peers: time all our cases first and then all the peers' (one round, the method
    /// before the interleaving; the GPU's clock drifts between the two halves).
    #[arg(long = "peers-after", requires = "peers")]
    pub peers_after: bool,
    /// With --peers: the most seconds to wait for the peers process's answer to one request
    /// (one case, all its peers) and for its start; past it the process is stopped and the
    /// remaining peers are recorded as skipped.
    #[arg(long = "peers-timeout", default_value_t = 180, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub peers_timeout: u64,
    /// Small sweep: seqlen 1k,4k; head_dim 64,128; f16; both masks (explicit options win).
    #[arg(long)]
    pub quick: bool,
    /// Tokens per case (`batch = tokens / seqlen`).
    #[arg(long, default_value_t = sweep::DEFAULT_TOKENS, value_name = "N")]
    pub tokens: usize,
    /// Hidden size per token (`heads = hidden / head_dim`).
    #[arg(long, default_value_t = sweep::DEFAULT_HIDDEN, value_name = "N")]
    pub hidden: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub device: usize,
    /// Skip writing the plots (bench.json and bench.txt are still written).
    #[arg(long = "no-plot")]
    pub no_plot: bool,
    /// Sliding window `LEFT,RIGHT` (FlashAttention-2's `window_size`, -1 = unbounded) on every
    /// case; TFLOP/s count the visible pairs only. The peers (SDPA) have no window and are
    /// skipped for these cases.
    #[arg(long, value_name = "LEFT,RIGHT", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Logit soft-cap `C` on every case (`C * tanh(s / C)`, Gemma 2 uses 50); no peers.
    #[arg(long, value_name = "C", allow_hyphen_values = true)]
    pub softcap: Option<f32>,
    /// ALiBi with the standard geometric slopes on every case; no peers.
    #[arg(long)]
    pub alibi: bool,
    /// Time the backward pass instead of the forward: line `bwd` (dq, dk, dv from o, lse and
    /// a random dO, on attn_bwd_wgmma where it serves the call, else attn_bwd), `bwd-mma`
    /// (attn_bwd) and `bwd-det` (the default kernel in the deterministic mode); --kernels picks among
    /// these, `bwd-persistent` and `bwd-grid` (attn_bwd_wgmma persistent, one block per SM, or
    /// one block per tile, whichever the library would pick; only when named) lines, --tiles does not apply; with --peers each SDPA backend's backward in the
    /// same run. TFLOP/s count 2.5x the forward's FLOPs (FlashAttention's convention).
    #[arg(long)]
    pub backward: bool,
    /// Packed variable-length batch instead of the sweep: `NxL` (e.g. 8x2k), `ragged`
    /// (16384 tokens in sequences of 64 to 8192) or lengths like `2k,512,77`; timed as the
    /// library runs it, as one packed mma launch, through the dense API one sequence at a time
    /// (mma, wgmma) and, for a uniform mix, as one dense batch; for each --head-dim, mask and
    /// dtype. Writes bench-varlen.json and .txt.
    #[arg(long, value_name = "MIX")]
    pub varlen: Option<String>,
    /// Decoding against a KV cache instead of the sweep: heads 32 q / 8 kv, head_dim 128 (or
    /// --head-dim), no mask; every --decode-batch x --decode-seqlen x --decode-q x
    /// --decode-pages, f16 and bf16 (or --dtype); achieved GB/s against a read-only pass over
    /// the same bytes, and against SDPA with --peers. Writes bench-decode.json and .txt.
    #[arg(long)]
    pub decode: bool,
    /// Batches of the decode bench.
    #[arg(
        long = "decode-batch",
        value_delimiter = ',',
        default_value = "1,8,64,256",
        value_name = "LIST"
    )]
    pub decode_batch: Vec<usize>,
    /// Cache lengths (keys per sequence) of the decode bench.
    #[arg(long = "decode-seqlen", value_delimiter = ',', default_value = "1k,8k,32k,128k", value_parser = parse_len, value_name = "LIST")]
    pub decode_seqlen: Vec<usize>,
    /// Query rows per sequence of the decode bench.
    #[arg(
        long = "decode-q",
        value_delimiter = ',',
        default_value = "1,4",
        value_name = "LIST"
    )]
    pub decode_q: Vec<usize>,
    /// Cache layouts of the decode bench: 0 = contiguous, N = paged with N keys per page.
    #[arg(
        long = "decode-pages",
        value_delimiter = ',',
        default_value = "0,16,256",
        value_name = "LIST"
    )]
    pub decode_pages: Vec<usize>,
    /// attn_decode tiles to time, `WARPSxSTAGES` (4 or 8 warps, 2 to 4 stages), with a `b`
    /// suffix for bulk copies by a producer warp (sm_90; e.g. 8x3b), each its own line
    /// [default: the library's choice].
    #[arg(long = "decode-tiles", value_delimiter = ',', value_parser = parse_decode_tile, value_name = "LIST")]
    pub decode_tiles: Vec<(usize, usize, bool)>,
    /// Query and key/value heads of the decode bench, `Q:KV`.
    #[arg(long = "decode-heads", default_value = "32:8", value_parser = parse_heads, value_name = "Q:KV")]
    pub decode_heads: (usize, usize),
    /// Split counts of attn_decode to time, each its own line [default: the heuristic's].
    #[arg(long = "decode-splits", value_delimiter = ',', value_name = "LIST")]
    pub decode_splits: Vec<usize>,
    /// Skip decode shapes whose k and v caches together exceed this many GB (10^9 bytes).
    #[arg(long = "max-cache-gb", default_value_t = 64.0, value_name = "GB")]
    pub max_cache_gb: f64,
}

/// `flashattn bench-plot`: redraw the plots from a bench.json.
#[derive(Debug, Clone, Args)]
pub struct PlotOptions {
    /// The bench.json written by `flashattn bench`.
    #[arg(long, value_name = "FILE")]
    pub json: PathBuf,
    /// Where `bench-<dtype>.png` and `.svg` go.
    #[arg(long = "out-dir", default_value = "out/bench", value_name = "DIR")]
    pub out_dir: PathBuf,
}

#[derive(Parser)]
#[command(no_binary_name = true)]
struct Wrapper {
    #[command(flatten)]
    opts: BenchOptions,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self::from_args(std::iter::empty::<&str>()).expect("the defaults parse")
    }
}

/// Parses `8x3` (warps x stages of attn_decode).
fn parse_decode_tile(s: &str) -> std::result::Result<(usize, usize, bool), String> {
    let bad = || {
        format!(
            "'{s}' is not WARPSxSTAGES[b] (4 or 8 warps, 2 to 4 stages, b: bulk copies; e.g. 8x3 or 8x3b)"
        )
    };
    let t = s.trim();
    let (t, bulk) = match t.strip_suffix(['b', 'B']) {
        Some(rest) => (rest, true),
        None => (t, false),
    };
    let (w, st) = t.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, st): (usize, usize) = (
        w.trim().parse().map_err(|_| bad())?,
        st.trim().parse().map_err(|_| bad())?,
    );
    if !matches!(w, 4 | 8) || !(2..=4).contains(&st) {
        return Err(bad());
    }
    Ok((w, st, bulk))
}

/// Parses `32:8` (query heads : key/value heads, the first a multiple of the second).
fn parse_heads(s: &str) -> std::result::Result<(usize, usize), String> {
    let bad = || format!("'{s}' is not Q:KV heads with Q a positive multiple of KV (e.g. 32:8)");
    let (q, kv) = s.split_once(':').ok_or_else(bad)?;
    let (q, kv): (usize, usize) = (
        q.trim().parse().map_err(|_| bad())?,
        kv.trim().parse().map_err(|_| bad())?,
    );
    if q == 0 || kv == 0 || q % kv != 0 {
        return Err(bad());
    }
    Ok((q, kv))
}

/// Parses `512`, `1k`, `16K`.
fn parse_len(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.strip_suffix(['k', 'K']) {
        Some(n) => (n, 1024),
        None => (t, 1),
    };
    match num.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n * mul),
        _ => Err(format!(
            "'{s}' is not a positive length (e.g. 512, 1k, 16k)"
        )),
    }
}

impl BenchOptions {
    /// Parses the options from plain strings, without the program or subcommand name, e.g.
    /// `["--quick", "--peers"]`.
    ///
    /// # Errors
    /// [`AttnError::ShapeMismatch`] carrying clap's message.
    pub fn from_args<I, T>(args: I) -> Result<Self>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Wrapper::try_parse_from(args)
            .map(|w| w.opts)
            .map_err(|e| AttnError::ShapeMismatch {
                what: format!("bench options: {e}"),
            })
    }

    /// The window of each line: --window-ms, else 250 ms with --peers, else 0.
    pub fn window_ms(&self) -> u64 {
        self.window_ms.unwrap_or(if self.peers {
            DEFAULT_PEERS_WINDOW_MS
        } else {
            0
        })
    }

    /// How ours and the peers take turns: interleaved with --peers, peers after ours with
    /// --peers-after, ours only without --peers.
    pub fn order(&self) -> Order {
        match (self.peers, self.peers_after) {
            (false, _) => Order::OursOnly,
            (true, false) => Order::Interleaved,
            (true, true) => Order::PeersAfter,
        }
    }

    /// The sweep these options ask for.
    ///
    /// # Errors
    /// Unknown kernel names, malformed tiles, head dims that do not divide `--hidden`, or an
    /// empty list of lines.
    pub fn sweep(&self) -> Result<Sweep> {
        let seqlens = if !self.seqlen.is_empty() {
            self.seqlen.clone()
        } else if self.quick {
            vec![1024, 4096]
        } else {
            sweep::DEFAULT_SEQLENS.to_vec()
        };
        let head_dims = if self.head_dim.is_empty() {
            sweep::DEFAULT_HEAD_DIMS.to_vec()
        } else {
            self.head_dim.clone()
        };
        let causal = match self.causal.unwrap_or(CausalChoice::Both) {
            CausalChoice::Off => vec![false],
            CausalChoice::On => vec![true],
            CausalChoice::Both => vec![false, true],
        };
        let dtype = self.dtype.unwrap_or(if self.quick {
            DTypeChoice::F16
        } else {
            DTypeChoice::Both
        });
        let dtypes = match dtype {
            DTypeChoice::F16 => vec![DType::F16],
            DTypeChoice::Bf16 => vec![DType::BF16],
            DTypeChoice::Both => vec![DType::F16, DType::BF16],
        };
        let mut lines: Vec<Line> = Vec::new();
        let names: Vec<String> = if self.backward {
            const BWD_LINES: [&str; 5] =
                ["bwd", "bwd-mma", "bwd-det", "bwd-persistent", "bwd-grid"];
            // The lines run when --kernels names none.
            const BWD_DEFAULT: [&str; 3] = ["bwd", "bwd-mma", "bwd-det"];
            if !self.tiles.is_empty() {
                return Err(AttnError::InvalidInput {
                    what:
                        "--backward times the backward lines (bwd, bwd-mma, bwd-det, bwd-persistent, bwd-grid): drop --tiles"
                            .into(),
                });
            }
            if let Some(k) = self
                .kernels
                .iter()
                .map(|k| k.trim())
                .find(|k| !BWD_LINES.contains(k))
            {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "--backward --kernels takes the backward lines bwd, bwd-mma, bwd-det, bwd-persistent, bwd-grid, not '{k}'"
                    ),
                });
            }
            // bwd: attn_bwd_wgmma where it serves the call; bwd-mma: attn_bwd; bwd-det: the
            // default kernel in the deterministic mode; bwd-persistent / bwd-grid:
            // attn_bwd_wgmma's persistent variant / one block per tile, by name.
            for name in BWD_LINES {
                let picked = if self.kernels.is_empty() {
                    BWD_DEFAULT.contains(&name)
                } else {
                    self.kernels.iter().any(|k| k.trim() == name)
                };
                if !picked {
                    continue;
                }
                lines.push(Line {
                    name: name.into(),
                    kernel: KernelKind::Mma,
                    tile: None,
                });
            }
            Vec::new()
        } else if self.kernels.is_empty() && self.tiles.is_empty() {
            vec!["wgmma".into(), "mma".into()]
        } else {
            self.kernels
                .iter()
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .collect()
        };
        for name in names {
            // `fp8`: attn_wgmma_fp8 on e4m3 inputs of the case's shape (descales 1), timed in
            // the same table as the 16-bit lines (its FLOPs are the same problem's).
            let line = if name == "fp8" {
                Line {
                    name: "fp8".into(),
                    kernel: KernelKind::Wgmma,
                    tile: None,
                }
            } else {
                Line::kernel(KernelKind::parse(&name)?)
            };
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        for spec in self
            .tiles
            .iter()
            .flat_map(|t| t.split([';', ' ']))
            .filter(|t| !t.trim().is_empty())
        {
            let line = Line::tile(spec)?;
            if !lines.iter().any(|l| l.name == line.name) {
                lines.push(line);
            }
        }
        if lines.is_empty() {
            return Err(AttnError::UnknownKernel {
                name: String::new(),
                available: "naive, simt, mma, wgmma (or --tiles)".into(),
            });
        }
        let window = match &self.window {
            Some(w) => Some(sweep::parse_window(w)?),
            None => None,
        };
        let mut cases = sweep::cases(
            &dtypes,
            &head_dims,
            &causal,
            &seqlens,
            self.tokens,
            self.hidden,
        )?;
        for c in &mut cases {
            c.window = window;
            c.softcap = self.softcap;
            c.alibi = self.alibi;
            c.backward = self.backward;
            // Invalid modifier values (softcap <= 0, not finite) fail here, before any launch.
            c.problem()?;
        }
        Ok(Sweep {
            cases,
            lines,
            iters: self.iters as usize,
            warmup: self.warmup as usize,
            warmup_ms: self.warmup_ms,
            window_ms: self.window_ms(),
            order: self.order(),
        })
    }
}
