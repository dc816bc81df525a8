//! `flashattn run`: attention on q/k/v from a safetensors file, timed, and checked against
//! the references stored in the file (or the f64 oracle).

use clap::{Args, ValueEnum};
use flashattn::compare::{Tolerance, diff_reference, widen};
use flashattn::io::{SafeFile, Writer};
use flashattn::kvcache::{CacheLayout, KvCacheProblem};
use flashattn::scores::{Alibi, ScoreMods, Window};
use flashattn::{AttnError, AttnProblem, BackendChoice, Element, Mask, Result, reference};
use half::{bf16, f16};
use std::path::{Path, PathBuf};

/// The MiniLM sample shipped in the repository, used when `--input` is not given.
pub const DEFAULT_DATA: &str = "data/minilm-L6-s77.safetensors";

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The GPU when usable, else the CPU.
    Auto,
    /// The CPU backend.
    Cpu,
    /// The CUDA backend (an error when no GPU is usable).
    Cuda,
}

/// `--dtype`: the element type the inputs are converted to before running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// f32 (CPU backend only).
    F32,
}

/// Arguments of `flashattn run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// safetensors file with q, k, v (`P.q`, `P.k`, `P.v`, bshd; or packed variable-length
    /// layers: `P.cu_seqlens_q`, `P.cu_seqlens_k` i32 `[batch + 1]`, q `[total_q, heads_q,
    /// head_dim]`, k/v `[total_k, heads_kv, head_dim]`, judged by the f64 oracle; or KV-cache
    /// layers: `P.q` `[batch, seqlen_q, heads_q, head_dim]`, `P.k_cache`/`P.v_cache`
    /// contiguous `[batch, seqlen_cache, heads_kv, head_dim]` or paged `[num_blocks, page_size,
    /// heads_kv, head_dim]` with `P.block_table` i32 `[batch, max_blocks]`, `P.cache_seqlens`
    /// i32 `[batch]`, optional new rows `P.k`/`P.v` `[batch, seqlen_new, heads_kv, head_dim]`,
    /// judged by the f64 oracle); default: the MiniLM sample data/minilm-L6-s77.safetensors of
    /// the repository.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Run only this layer prefix (e.g. `layer3`); default: every layer in the file.
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// Causal mask (bottom-right aligned); checked against `P.o_causal`/`P.lse_causal`.
    #[arg(long)]
    pub causal: bool,
    /// softmax scale, a finite number above 0 (the rule the file's `scale` metadata follows
    /// too); default: the file's `scale` metadata, else 1/sqrt(head_dim).
    #[arg(long, value_name = "S", allow_hyphen_values = true)]
    pub scale: Option<f32>,
    /// Which backend runs the attention.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Element type to run in (inputs are converted from the file's type when it differs).
    #[arg(long, value_enum, default_value_t = DTypeArg::F16)]
    pub dtype: DTypeArg,
    /// Write o and lse of every layer run to this safetensors file (`P.o`, `P.lse`, or
    /// `P.o_causal`, `P.lse_causal`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Timed runs per layer; the fastest is reported.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub repeat: usize,
    /// Also check against the f64 oracle when the file holds no references.
    #[arg(long)]
    pub check: bool,
    /// Also run the backward pass (on the CPU; `check --kernel all` checks the GPU backward
    /// kernels) with
    /// a seeded random output gradient dO (the seed is printed; FLASHATTN_SEED replays it),
    /// and check dq, dk, dv against the exact f64 gradients.
    #[arg(long)]
    pub backward: bool,
    /// Sliding window `LEFT,RIGHT` in keys around the diagonal (FlashAttention-2's
    /// `window_size`; -1 = unbounded on that side). Stored references (plain attention) are
    /// then skipped and the f64 oracle judges.
    #[arg(long, value_name = "L,R", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Logit soft-cap: scores become `C * tanh(s / C)` (C > 0).
    #[arg(long, value_name = "C", allow_hyphen_values = true)]
    pub softcap: Option<f32>,
    /// ALiBi: the file's `P.alibi_slopes` (f32 `[heads_q]` or `[batch, heads_q]`) when it has
    /// them, else the standard geometric slopes.
    #[arg(long)]
    pub alibi: bool,
}

/// `--window L,R` as a [`Window`].
fn parse_window(w: &str) -> Result<Window> {
    let bad = || AttnError::InvalidInput {
        what: format!("--window {w}: expected LEFT,RIGHT (integers, -1 = unbounded), e.g. 256,0"),
    };
    let (l, r) = w.split_once(',').ok_or_else(bad)?;
    let num = |x: &str| x.trim().parse::<i64>().map_err(|_| bad());
    Window::from_fa(num(l)?, num(r)?)
}

/// Runs `flashattn run`.
///
/// # Errors
/// File, validation and backend errors; [`AttnError::CheckFailed`] when any layer is
/// outside tolerance.
pub fn run(a: &RunArgs) -> Result<()> {
    let path = match &a.input {
        Some(p) => p.clone(),
        None => find_default_data()?,
    };
    let file = SafeFile::open(&path)?;
    let layers = file.layer_prefixes();
    let prefixes = match &a.prefix {
        Some(p) => {
            let p = p.trim_end_matches('.').to_string();
            if !layers.contains(&p) {
                return Err(AttnError::InvalidInput {
                    what: format!(
                        "--prefix {p}: {} has no layer of that name; its layers are: {}",
                        path.display(),
                        if layers.is_empty() {
                            "(none)".to_string()
                        } else {
                            layers.join(", ")
                        }
                    ),
                });
            }
            vec![p]
        }
        None => layers,
    };
    // Fail before any work when the output cannot be written.
    if a.out.is_some() && (a.window.is_some() || a.softcap.is_some() || a.alibi) {
        return Err(AttnError::InvalidInput {
            what: "--out with --window, --softcap or --alibi: the file's o/lse names stand for plain attention, so a modified result would later be read as a plain reference; run without --out (or without the modifier)".into(),
        });
    }
    if let Some(out) = &a.out {
        let dir = out
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            return Err(AttnError::InvalidInput {
                what: format!(
                    "--out {}: the folder {} does not exist; create it first",
                    out.display(),
                    dir.display()
                ),
            });
        }
    }
    if prefixes.is_empty() {
        return Err(AttnError::SafeTensors {
            what: format!(
                "{}: no q/k/v found (expected tensors q, k, v or P.q, P.k, P.v); the file has: {}",
                path.display(),
                file.names().join(", ")
            ),
        });
    }
    let mask = if a.causal { Mask::Causal } else { Mask::None };
    let choice = match a.backend {
        BackendArg::Auto => BackendChoice::Auto,
        BackendArg::Cpu => BackendChoice::Cpu,
        BackendArg::Cuda => BackendChoice::Cuda,
    };
    println!(
        "input: {} ({} layer(s)), mask {}",
        path.display(),
        prefixes.len(),
        mask.name()
    );
    let mut ctx = Ctx {
        a,
        file: &file,
        mask,
        choice,
        writer: Writer::new(),
        failures: Vec::new(),
        first: true,
    };
    for prefix in &prefixes {
        match a.dtype {
            DTypeArg::F16 => ctx.layer::<f16>(prefix)?,
            DTypeArg::Bf16 => ctx.layer::<bf16>(prefix)?,
            DTypeArg::F32 => ctx.layer::<f32>(prefix)?,
        }
    }
    if let Some(out) = &a.out {
        ctx.writer
            .meta("layout", "bshd")
            .meta("source", &path.display().to_string())
            .meta("mask", mask.name());
        ctx.writer.write(out)?;
        println!("wrote {}", out.display());
    }
    if ctx.failures.is_empty() {
        Ok(())
    } else {
        Err(AttnError::CheckFailed {
            what: ctx.failures.join("; "),
        })
    }
}

/// State shared by the layers of one `run`.
struct Ctx<'a> {
    a: &'a RunArgs,
    file: &'a SafeFile,
    mask: Mask,
    choice: BackendChoice,
    writer: Writer,
    failures: Vec<String>,
    first: bool,
}

impl Ctx<'_> {
    /// `--scale`, else the file's `scale` metadata (read and refused when bad), else none.
    fn scale(&self) -> Result<Option<f32>> {
        match self.a.scale {
            Some(s) => Ok(Some(s)),
            None => self.file.scale(),
        }
    }

    /// The score modifiers of `--window`, `--softcap` and `--alibi` for one layer.
    /// `batch` and `heads_q` decide the shapes the file's slopes may have.
    fn score_mods(&self, prefix: &str, batch: usize, heads_q: usize) -> Result<ScoreMods> {
        let window = match &self.a.window {
            Some(w) => parse_window(w)?,
            None => Window::default(),
        };
        let alibi = if self.a.alibi {
            let name = flashattn::io::tensor_name(prefix, "alibi_slopes");
            Some(if self.file.has(&name) {
                let (slopes, shape) = self.file.read::<f32>(&name)?;
                let per_batch = shape.len() == 2;
                if !(shape == [heads_q] || shape == [batch, heads_q]) {
                    return Err(AttnError::ShapeMismatch {
                        what: format!(
                            "{name} has shape {shape:?}; expected [{}] or [{}, {}]",
                            heads_q, batch, heads_q
                        ),
                    });
                }
                Alibi { slopes, per_batch }
            } else {
                Alibi::geometric(heads_q)
            })
        } else {
            None
        };
        Ok(ScoreMods {
            window,
            softcap: self.a.softcap,
            alibi,
            sink: None,
        })
    }

    /// Refuses `--out` and `--backward` for a layer kind that has neither (`what` says why), as
    /// [`AttnError::InvalidInput`].
    fn forward_only(&self, what: String) -> Result<()> {
        if self.a.out.is_some() || self.a.backward {
            return Err(AttnError::InvalidInput { what });
        }
        Ok(())
    }

    /// A packed variable-length layer (`P.cu_seqlens_q`, `P.cu_seqlens_k` i32 `[batch + 1]`,
    /// q `[total_q, heads_q, head_dim]`, k/v `[total_k, heads_kv, head_dim]`), judged by the
    /// f64 oracle.
    fn packed_layer<T: Element>(&mut self, prefix: &str) -> Result<()> {
        let name = |n: &str| flashattn::io::tensor_name(prefix, n);
        self.forward_only(format!(
            "--out or --backward with a packed (variable-length) layer '{prefix}': the output file holds bshd layers, and the backward takes dense ones; run without them"
        ))?;
        for (have, missing) in [
            ("cu_seqlens_q", "cu_seqlens_k"),
            ("cu_seqlens_k", "cu_seqlens_q"),
        ] {
            if self.file.has(&name(have)) && !self.file.has(&name(missing)) {
                return Err(AttnError::SafeTensors {
                    what: format!(
                        "{}: {} is there but {} is not: a packed layer needs both offsets",
                        self.file.path(),
                        name(have),
                        name(missing)
                    ),
                });
            }
        }
        let offsets = |n: &str| -> Result<Vec<i32>> {
            let (cu, shape) = self.file.read_i32(&name(n))?;
            if shape.len() != 1 {
                return Err(AttnError::ShapeMismatch {
                    what: format!(
                        "{} has shape {shape:?}; offsets are 1-D [batch + 1]",
                        name(n)
                    ),
                });
            }
            Ok(cu)
        };
        let (cu_q, cu_k) = (offsets("cu_seqlens_q")?, offsets("cu_seqlens_k")?);
        let (dq, dk, dv) = (
            self.file.info(&name("q"))?.0,
            self.file.info(&name("k"))?.0,
            self.file.info(&name("v"))?.0,
        );
        if dq != dk || dq != dv {
            return Err(AttnError::DTypeMismatch {
                what: format!(
                    "packed layer '{prefix}': q is {dq}, k {dk}, v {dv}; store them with one element type"
                ),
            });
        }
        let (q, qs) = self.file.read::<T>(&name("q"))?;
        let (k, ks) = self.file.read::<T>(&name("k"))?;
        let (v, vs) = self.file.read::<T>(&name("v"))?;
        let file_dtype = dq;
        let rows = |cu: &[i32]| cu.last().map_or(0, |&x| x.max(0) as usize);
        if qs.len() != 3 || ks.len() != 3 || ks != vs || qs[2] != ks[2] {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "packed layer '{prefix}': q {qs:?}, k {ks:?}, v {vs:?}; expected q [total_q, heads_q, head_dim] and k, v [total_k, heads_kv, head_dim]"
                ),
            });
        }
        let (hq, hkv, d) = (qs[1], ks[1], qs[2]);
        // The offsets' own rules first (start at 0, never decrease), then their ends.
        let mut p = flashattn::varlen::VarlenProblem::new(cu_q.clone(), cu_k.clone(), hq, hkv, d)?
            .with_mask(self.mask);
        if rows(&cu_q) != qs[0] || rows(&cu_k) != ks[0] {
            return Err(AttnError::ShapeMismatch {
                what: format!(
                    "packed layer '{prefix}': cu_seqlens_q ends at {} and cu_seqlens_k at {}, but q has {} rows and k {}; the offsets must end at the packed row counts",
                    rows(&cu_q),
                    rows(&cu_k),
                    qs[0],
                    ks[0]
                ),
            });
        }
        if let Some(scale) = self.scale()? {
            p = p.with_scale(scale)?;
        }
        let mods = self.score_mods(prefix, p.batch(), hq)?;
        p = p.with_scores(mods)?;
        let mut best = None;
        for _ in 0..self.a.repeat {
            let t0 = std::time::Instant::now();
            let out = flashattn::varlen::forward(self.choice, &p, &q, &k, &v)?;
            let secs = t0.elapsed().as_secs_f64();
            if best.as_ref().is_none_or(|(s, _)| secs < *s) {
                best = Some((secs, out));
            }
        }
        let (secs, out) = best.ok_or_else(|| AttnError::InvalidInput {
            what: "--repeat 0".into(),
        })?;
        if self.first {
            println!("backend: {}", out.ran);
            println!(
                "dtype: {} (file: {file_dtype}), softmax_scale {}",
                T::DTYPE,
                p.softmax_scale
            );
            self.first = false;
        }
        let label = if prefix.is_empty() { "(top)" } else { prefix };
        println!(
            "{label}: varlen batch {} total_q {} total_k {} hq={hq} hkv={hkv} d={d}  {:.3} ms (wall, with copies)",
            p.batch(),
            p.total_q(),
            p.total_k(),
            secs * 1e3
        );
        let exact = flashattn::varlen::reference(&p, &q, &k, &v)?;
        let (od, ld) = flashattn::varlen::diff_reference(&p, &out, &exact);
        let tol = Tolerance::for_dtype(T::DTYPE);
        self.verdict(label, "f64 oracle", tol.check(label, &od, &ld), &od, &ld);
        Ok(())
    }

    /// A decoding layer against a KV cache (`P.q` `[batch, seqlen_q, heads_q, head_dim]`,
    /// `P.k_cache`/`P.v_cache` contiguous `[batch, seqlen_cache, heads_kv, head_dim]` or, with
    /// `P.block_table` (i32 `[batch, max_blocks]`), paged `[num_blocks, page_size, heads_kv,
    /// head_dim]`; `P.cache_seqlens` i32 `[batch]`; optional new rows `P.k`/`P.v`
    /// `[batch, seqlen_new, heads_kv, head_dim]`), on the CPU, judged by the f64 oracle.
    fn cache_layer<T: Element>(&mut self, prefix: &str) -> Result<()> {
        let name = |n: &str| flashattn::io::tensor_name(prefix, n);
        self.forward_only(format!(
            "--out or --backward with a KV-cache layer '{prefix}': run without them"
        ))?;
        let shape_err = |what: String| AttnError::ShapeMismatch {
            what: format!("KV-cache layer '{prefix}': {what}"),
        };
        let (q, qs) = self.file.read::<T>(&name("q"))?;
        let (kc, ks) = self.file.read::<T>(&name("k_cache"))?;
        let (vc, vs) = self.file.read::<T>(&name("v_cache"))?;
        let (cache_seqlens, ls) = self.file.read_i32(&name("cache_seqlens"))?;
        if qs.len() != 4 || ks.len() != 4 || ks != vs || ks[3] != qs[3] || ls.len() != 1 {
            return Err(shape_err(format!(
                "q {qs:?}, k_cache {ks:?}, v_cache {vs:?}, cache_seqlens {ls:?}; expected q [batch, seqlen_q, heads_q, head_dim], caches of one shape ending in head_dim, cache_seqlens [batch]"
            )));
        }
        let (batch, sq, hq, d, hkv) = (qs[0], qs[1], qs[2], qs[3], ks[2]);
        let layout = if self.file.has(&name("block_table")) {
            let (table, ts) = self.file.read_i32(&name("block_table"))?;
            if ts.len() != 2 || ts[0] != batch {
                return Err(shape_err(format!(
                    "block_table {ts:?}; expected [batch = {batch}, max_blocks]"
                )));
            }
            CacheLayout::Paged {
                num_blocks: ks[0],
                page_size: ks[1],
                block_table: table,
                max_blocks: ts[1],
            }
        } else {
            if ks[0] != batch {
                return Err(shape_err(format!(
                    "a contiguous cache holds one row of pages per sequence: k_cache {ks:?} for batch {batch} (paged caches need P.block_table)"
                )));
            }
            CacheLayout::Contiguous {
                seqlen_cache: ks[1],
            }
        };
        let (k_new, v_new, seqlen_new) = if self.file.has(&name("k")) || self.file.has(&name("v")) {
            let (kn, kns) = self.file.read::<T>(&name("k"))?;
            let (vn, vns) = self.file.read::<T>(&name("v"))?;
            if kns.len() != 4 || kns != vns || kns[0] != batch || kns[2] != hkv || kns[3] != d {
                return Err(shape_err(format!(
                    "new rows k {kns:?}, v {vns:?}; expected [batch, seqlen_new, heads_kv, head_dim] = [{batch}, n, {hkv}, {d}]"
                )));
            }
            (kn, vn, kns[1])
        } else {
            (Vec::new(), Vec::new(), 0)
        };
        let mut p = KvCacheProblem::new(batch, sq, hq, hkv, d, layout, cache_seqlens, seqlen_new)?
            .with_mask(self.mask);
        if let Some(scale) = self.scale()? {
            p = p.with_scale(scale)?;
        }
        p = p.with_scores(self.score_mods(prefix, batch, hq)?)?;
        // The caches the call must leave: the CPU's append of the new rows.
        let (mut want_k, mut want_v) = (kc.clone(), vc.clone());
        flashattn::kvcache::append(
            &p,
            &mut want_k,
            &mut want_v,
            &k_new,
            &v_new,
            flashattn::kvcache::RotaryTables::none(),
        )?;
        let (mut kc, mut vc) = (kc, vc);
        if self.a.repeat > 1 {
            println!(
                "note: --repeat is not applied to KV-cache layers (each call appends its rows in place)"
            );
        }
        let t0 = std::time::Instant::now();
        let run = flashattn::kvcache::forward(
            self.choice,
            &p,
            &q,
            &mut kc,
            &mut vc,
            &k_new,
            &v_new,
            flashattn::kvcache::RotaryTables::none(),
            None,
        )?;
        let (out, secs) = (run.out, t0.elapsed().as_secs_f64());
        if self.first {
            println!("backend: {} (decoding against a KV cache)", run.ran);
            self.first = false;
        }
        let label = if prefix.is_empty() { "(top)" } else { prefix };
        let lens: Vec<usize> = (0..batch).map(|b| p.seqlen_k(b)).collect();
        println!(
            "{label}: kv-cache batch {batch} seqlen_q {sq} hq={hq} hkv={hkv} d={d} keys {lens:?}{}  {:.3} ms",
            if seqlen_new > 0 {
                format!(" ({seqlen_new} appended)")
            } else {
                String::new()
            },
            secs * 1e3
        );
        // The appended rows as the call wrote them, against the CPU's append.
        let row = hkv * d;
        let appended_ok = (0..batch).all(|b| {
            (0..seqlen_new).all(|r| {
                let at = p.key_offset(b, p.cache_seqlens[b] as usize + r);
                let same = |x: &[T], y: &[T]| {
                    x.iter()
                        .zip(y)
                        .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits())
                };
                same(&kc[at..at + row], &want_k[at..at + row])
                    && same(&vc[at..at + row], &want_v[at..at + row])
            })
        });
        if !appended_ok {
            self.failures.push(format!(
                "{label}: the appended k/v rows in the caches differ from the new rows"
            ));
            println!("  appended rows: FAIL (they differ from the new k/v)");
        }
        // The oracle on the caches the call should have left (the CPU's append).
        let exact = flashattn::kvcache::reference(
            &p,
            &q,
            &want_k,
            &want_v,
            flashattn::kvcache::RotaryTables::none(),
        )?;
        let (od, ld) = flashattn::compare::diff_rows(
            out.o.iter().map(|x| x.to_f64()),
            out.lse.iter().map(|&x| f64::from(x)),
            &exact,
            d,
            |n| {
                let row = n / d;
                let (b, i, h) = (row / (sq * hq), (row / hq) % sq, row % hq);
                (b * hq + h) * sq + i
            },
        );
        let tol = Tolerance::for_dtype(T::DTYPE);
        self.verdict(label, "f64 oracle", tol.check(label, &od, &ld), &od, &ld);
        Ok(())
    }

    fn layer<T: Element>(&mut self, prefix: &str) -> Result<()> {
        if self
            .file
            .has(&flashattn::io::tensor_name(prefix, "k_cache"))
        {
            return self.cache_layer::<T>(prefix);
        }
        let packed = ["cu_seqlens_q", "cu_seqlens_k"]
            .iter()
            .any(|n| self.file.has(&flashattn::io::tensor_name(prefix, n)));
        if packed {
            return self.packed_layer::<T>(prefix);
        }
        let qkv = self.file.qkv::<T>(prefix)?;
        let s = qkv.shape;
        let mut p = AttnProblem::new(s)?.with_mask(self.mask);
        // The scale the stored references were computed with: the file's metadata, else the
        // default 1/sqrt(head_dim); unknown (None) when --scale overrides bad metadata.
        let file_scale = match self.file.scale() {
            Ok(s) => Some(s.unwrap_or(p.softmax_scale)),
            Err(_) if self.a.scale.is_some() => None,
            Err(e) => return Err(e),
        };
        // --scale replaces the file's metadata, which is otherwise read and refused when bad.
        if let Some(scale) = self.scale()? {
            p = p.with_scale(scale)?;
        }
        p = p.with_scores(self.score_mods(prefix, s.batch, s.heads_q)?)?;
        let mut fw = flashattn::forward(self.choice, &p, &qkv.q, &qkv.k, &qkv.v)?;
        for _ in 1..self.a.repeat {
            let again = flashattn::forward(self.choice, &p, &qkv.q, &qkv.k, &qkv.v)?;
            if again.seconds < fw.seconds {
                fw = again;
            }
        }
        if self.first {
            println!("backend: {} ({})", fw.backend, fw.reason);
            println!(
                "dtype: {} (file: {}), softmax_scale {}",
                T::DTYPE,
                qkv.file_dtype,
                p.softmax_scale
            );
            self.first = false;
        }
        let name = if prefix.is_empty() { "(top)" } else { prefix };
        println!(
            "{name}: {}  {:.3} ms  {:.2} GFLOP/s",
            p.shape,
            fw.seconds * 1e3,
            p.flops() / fw.seconds.max(1e-12) / 1e9
        );
        let tol = Tolerance::for_dtype(T::DTYPE);
        // Stored references hold plain attention at the file's scale: with a score modifier
        // or another --scale, the oracle judges.
        let modified = !p.scores.is_plain() || file_scale != Some(p.softmax_scale);
        let stored = if modified {
            None
        } else {
            self.file.reference(prefix, self.mask, &s)?
        };
        let converted = qkv.file_dtype != T::DTYPE;
        // The oracle: compared with when asked or when the stored references belong to other
        // inputs, and in every case the source of each row's precision (what f32 arithmetic
        // cannot avoid at that row's logits, forgiven before the tolerance applies).
        let oracle = if stored.is_some() || self.a.check || modified {
            Some(reference::attention(&p, &qkv.q, &qkv.k, &qkv.v)?)
        } else {
            None
        };
        if let (Some(r), Some(exact)) = (&stored, &oracle) {
            let file_ref = reference::Reference {
                o: to_f64(&r.o),
                lse: to_f64(&r.lse),
                precision: exact.precision.clone(),
            };
            let (od, ld) = diff_reference(&p, widen(&fw.o), widen(&fw.lse), &file_ref);
            if converted {
                // The stored references belong to the file's inputs, not the converted ones.
                println!(
                    "  vs stored reference (info only, inputs converted {} -> {}): o {od}; lse {ld}",
                    qkv.file_dtype,
                    T::DTYPE
                );
            } else {
                self.verdict(
                    name,
                    "stored reference",
                    tol.check(name, &od, &ld),
                    &od,
                    &ld,
                );
            }
        }
        if stored.is_none() && !self.a.check && !modified {
            println!(
                "  (no stored reference for this layer: add --check to compare with the f64 oracle)"
            );
        }
        if let Some(r) = oracle.filter(|_| converted || stored.is_none()) {
            let (od, ld) = diff_reference(&p, widen(&fw.o), widen(&fw.lse), &r);
            self.verdict(name, "f64 oracle", tol.check(name, &od, &ld), &od, &ld);
        }
        if self.a.backward {
            self.backward(name, &p, &qkv, &fw.o, &fw.lse)?;
        }
        if self.a.out.is_some() {
            self.writer
                .add_output(prefix, self.mask, &s, &fw.o, &fw.lse)?;
        }
        Ok(())
    }

    /// The backward of one layer on the CPU from the forward's o and lse, with a seeded dO,
    /// against the exact gradients (rel-L2 of each of dq, dk, dv within the forward's
    /// tolerance for o).
    fn backward<T: Element>(
        &mut self,
        name: &str,
        p: &AttnProblem,
        qkv: &flashattn::io::Qkv<T>,
        o: &[T],
        lse: &[f32],
    ) -> Result<()> {
        let s = p.shape;
        let seed = flashattn::compare::random_seed();
        let d_o: Vec<T> = flashattn::compare::random_vec(o.len(), seed ^ 0xd0);
        let (nq, nk) = (
            s.batch * s.seqlen_q * s.heads_q * s.head_dim,
            s.batch * s.seqlen_k * s.heads_kv * s.head_dim,
        );
        let (mut dq, mut dk, mut dv) = (
            vec![T::from_f32(0.0); nq],
            vec![T::from_f32(0.0); nk],
            vec![T::from_f32(0.0); nk],
        );
        let t0 = std::time::Instant::now();
        flashattn::cpu_backward::backward(
            p, &qkv.q, &qkv.k, &qkv.v, o, lse, &d_o, &mut dq, &mut dk, &mut dv,
        )?;
        let secs = t0.elapsed().as_secs_f64();
        let exact = flashattn::reference_grad::backward(p, &qkv.q, &qkv.k, &qkv.v, &d_o)?;
        let tol = Tolerance::for_dtype(T::DTYPE);
        let mut worst = Vec::new();
        let mut failed = Vec::new();
        for (g, got, want) in [
            ("dq", &dq, &exact.dq),
            ("dk", &dk, &exact.dk),
            ("dv", &dv, &exact.dv),
        ] {
            let d = flashattn::compare::diff(widen(got), want);
            if !(d.is_clean() && d.rel_l2 <= tol.o_rel_l2) {
                failed.push(format!("{g} {d}"));
            }
            worst.push(format!("{g} rel-L2 {:.3e}", d.rel_l2));
        }
        let ok = failed.is_empty();
        println!(
            "  backward (CPU, dO seed {seed}, {:.3} ms): {} vs exact gradients  {}",
            secs * 1e3,
            worst.join(", "),
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            self.failures.push(format!(
                "{name} backward (dO seed {seed}): {} over rel-L2 {:e}",
                failed.join("; "),
                tol.o_rel_l2
            ));
        }
        Ok(())
    }

    fn verdict(
        &mut self,
        name: &str,
        against: &str,
        check: Result<()>,
        o: &flashattn::compare::Diff,
        lse: &flashattn::compare::Diff,
    ) {
        let ok = check.is_ok();
        println!(
            "  vs {against}: o {o}; lse {lse}  {}",
            if ok { "ok" } else { "FAIL" }
        );
        if let Err(e) = check {
            self.failures.push(format!("{name} vs {against}: {e}"));
        }
    }
}

fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Finds data/minilm-L6-s77.safetensors: in the current directory and its parents, beside
/// the executable and its parents (e.g. `target/release/../..`), and in the crate directory
/// this binary was built from.
///
/// # Errors
/// [`AttnError::Io`] listing every place searched, with what to do.
pub fn find_default_data() -> Result<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        roots.extend(dir.ancestors().map(Path::to_path_buf));
    }
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let mut searched = Vec::new();
    for root in roots {
        let candidate = root.join(DEFAULT_DATA);
        if candidate.is_file() {
            return Ok(candidate);
        }
        if !searched.contains(&candidate) {
            searched.push(candidate);
        }
    }
    Err(AttnError::Io {
        path: DEFAULT_DATA.to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "the MiniLM sample was not found (searched {}); run from the repository or pass --input FILE",
                searched
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    })
}
