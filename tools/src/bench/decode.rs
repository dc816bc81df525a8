//! `flashattn bench --decode`: decoding against a KV cache ([`flashattn::cuda::decode`]), timed
//! as a decoding loop runs it (a [`DecodePlan`] made once, then launches only), contiguous and
//! paged, against a read-only pass over the same bytes in the same run (the bandwidth
//! ceiling) and, with `--peers`, against PyTorch SDPA on the same contiguous cache.
//!
//! Bytes moved per call: k and v of every visible key (`batch x seqlen_k x heads_kv x
//! head_dim x 2` elements), q read and o written; GB/s = bytes / median time (10^9 bytes/s).
//! The caches hold one constant value (the timing does not depend on the data; the check
//! covers correctness). No mask: with `seqlen_q` > 1, SDPA's causal mask would align top-left,
//! unlike decoding's bottom-right.
//!
//! With --peers the peers run in one persistent process, interleaved with ours shape by shape
//! in both orders ([`super::decode_rounds`]).

pub use super::decode_record::{DecodeLine, DecodeRound, DecodeShape, PeerLine};
use super::decode_rounds::{DecodeRun, decode_line, peer_lines};
use super::gpu::time_launches;
use super::options::BenchOptions;
use super::order::{Order, Side};
use super::peers::Peers;
use super::plot;
use super::report::{LineResult, Source, io_err, write_record};
use super::rounds::{Measured, RoundInfo, Steps};
use super::stats::{self, Schedule};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg, sys};
use flashattn::cuda::decode::{DecodePlan, DecodeTensors, DecodeTile};
use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelSource};
use flashattn::dtype::DType;
use flashattn::error::{AttnError, Result};
use flashattn::kvcache::{CacheLayout, KvCacheProblem, shuffled_pages};
use half::{bf16, f16};
use std::fmt::Write as _;

/// Runs the decode bench; returns the table and writes `bench-decode.json` and `.txt` into
/// the output folder.
///
/// # Errors
/// Options that make no sense here; setup and launch errors; [`AttnError::Io`].
pub fn run(opts: &BenchOptions) -> Result<String> {
    for (given, name) in [
        (!opts.kernels.is_empty(), "--kernels"),
        (!opts.tiles.is_empty(), "--tiles"),
        (!opts.seqlen.is_empty(), "--seqlen (use --decode-seqlen)"),
        (opts.varlen.is_some(), "--varlen"),
        (
            matches!(opts.causal, Some(c) if c != super::CausalChoice::Off),
            "--causal (the decode bench has no mask: with seqlen_q > 1, SDPA's causal mask would align top-left)",
        ),
        (opts.window.is_some(), "--window"),
        (opts.softcap.is_some(), "--softcap"),
        (opts.alibi, "--alibi"),
        (
            opts.quick,
            "--quick (pick the shapes with --decode-batch and --decode-seqlen)",
        ),
    ] {
        if given {
            return Err(AttnError::InvalidInput {
                what: format!(
                    "--decode with {name}: the decode bench takes --decode-batch, --decode-seqlen, --decode-q, --decode-pages, --decode-tiles, --decode-splits, --decode-heads, --max-cache-gb, --head-dim, --dtype, --iters, --warmup, --warmup-ms, --window-ms, --peers, --peers-after, --peers-timeout, --out-dir and --device"
                ),
            });
        }
    }
    let bad = |what: &str| -> Result<String> { Err(AttnError::InvalidInput { what: what.into() }) };
    if opts.decode_pages.iter().any(|&p| p != 0 && p % 16 != 0) {
        return bad("--decode-pages: 0 (contiguous) or multiples of 16");
    }
    if opts.decode_batch.contains(&0) || opts.decode_q.contains(&0) {
        return bad("--decode-batch and --decode-q: positive counts");
    }
    if opts
        .decode_splits
        .iter()
        .any(|&s| s == 0 || s > flashattn::kvcache::MAX_SPLITS)
    {
        return bad("--decode-splits: counts from 1 to 128");
    }
    if opts
        .head_dim
        .iter()
        .any(|&d| d == 0 || d % 8 != 0 || d > 256)
    {
        return bad("--head-dim with --decode: multiples of 8 up to 256 (the decode kernel's)");
    }
    let gpu = Gpu::new(opts.device)?;
    let head_dims = if opts.head_dim.is_empty() {
        vec![128]
    } else {
        opts.head_dim.clone()
    };
    let dtypes = match opts.dtype {
        Some(super::DTypeChoice::F16) => vec![DType::F16],
        Some(super::DTypeChoice::Bf16) => vec![DType::BF16],
        _ => vec![DType::F16, DType::BF16],
    };
    let sched = Schedule {
        iters: opts.iters as usize,
        warmup: opts.warmup as usize,
        warmup_ms: opts.warmup_ms,
        window_ms: opts.window_ms(),
    };
    let mut peers = Peers::start_if(opts.peers, sched, opts.peers_timeout);
    let order = match &peers {
        Some(p) if p.available() => opts.order(),
        _ => Order::OursOnly,
    };
    eprintln!(
        "flashattn bench --decode: {}",
        order.describe(sched.warmup_ms, sched.window_ms)
    );
    let mut run = DecodeRun {
        sched,
        order,
        peers: peers.as_mut(),
        steps: Steps::new(),
    };
    let mut shapes = Vec::new();
    let mut skipped = Vec::new();
    for &d in &head_dims {
        for &dtype in &dtypes {
            for &b in &opts.decode_batch {
                for &sk in &opts.decode_seqlen {
                    let cache_bytes = (2 * b * sk * opts.decode_heads.1 * d * 2) as f64;
                    if cache_bytes > opts.max_cache_gb * 1e9 {
                        skipped.push(format!(
                            "{dtype} batch {b} seqlen_k {sk} d{d}: caches of {:.0} GB > --max-cache-gb {}",
                            cache_bytes / 1e9,
                            opts.max_cache_gb
                        ));
                        continue;
                    }
                    let got = match dtype {
                        DType::BF16 => shape_set::<bf16>(&gpu, opts, &mut run, b, sk, d),
                        _ => shape_set::<f16>(&gpu, opts, &mut run, b, sk, d),
                    };
                    match got {
                        Ok(s) => shapes.extend(s),
                        Err(e) => {
                            skipped.push(format!("{dtype} batch {b} seqlen_k {sk} d{d}: {e}"))
                        }
                    }
                }
            }
        }
    }
    let mut notes = skipped;
    if shapes.is_empty() {
        return Err(AttnError::InvalidInput {
            what: format!("no decode shape was timed: {}", notes.join("; ")),
        });
    }
    run.peers_after(&mut shapes);
    let mut env = serde_json::Value::Null;
    if let Some(p) = &peers {
        if let Some(m) = &p.info.message {
            notes.push(format!(
                "peers{}: {m}",
                if p.available() { "" } else { " did not run" }
            ));
        }
        env = serde_json::to_value(&p.info.env).unwrap_or_default();
    }
    let schedule = order.describe(sched.warmup_ms, sched.window_ms);
    let table = table(&gpu, &shapes, &schedule, &notes);
    let record = serde_json::json!({
        "device": gpu.info().name,
        "arch": gpu.info().arch,
        "heads_q": opts.decode_heads.0,
        "heads_kv": opts.decode_heads.1,
        "iters": opts.iters,
        "warmup_ms": opts.warmup_ms,
        "method": {
            "iters": sched.iters,
            "warmup": sched.warmup,
            "warmup_ms": sched.warmup_ms,
            "window_ms": sched.window_ms,
            "order": (order != Order::OursOnly).then(|| order.name()),
            "rounds": order.rounds(),
            "schedule": schedule,
        },
        "peers": env,
        "notes": notes,
        "shapes": shapes,
    });
    write_record(&opts.out_dir, "bench-decode", "decode", &record, &table)?;
    if !opts.no_plot {
        let out = plot::write_figures(
            figures(&shapes, &gpu.info().name),
            &opts.out_dir,
            "bench-decode",
        );
        for e in out.errors {
            eprintln!("plot failed: {e}");
        }
    }
    Ok(table)
}

/// The decode plots: one figure per (dtype, seqlen_q), one panel per batch, GB/s against
/// seqlen_k for our layouts, the read-only pass and the SDPA peers.
pub fn figures(shapes: &[DecodeShape], device: &str) -> Vec<plot::Figure> {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for s in shapes {
        if !kinds.contains(&(s.dtype.clone(), s.seqlen_q)) {
            kinds.push((s.dtype.clone(), s.seqlen_q));
        }
    }
    kinds
        .into_iter()
        .map(|(dt, sq)| {
            let mine: Vec<&DecodeShape> = shapes
                .iter()
                .filter(|s| s.dtype == dt && s.seqlen_q == sq)
                .collect();
            let mut batches: Vec<usize> = mine.iter().map(|s| s.batch).collect();
            batches.sort_unstable();
            batches.dedup();
            let mut names: Vec<String> = Vec::new();
            for s in &mine {
                let here = s
                    .lines
                    .iter()
                    .map(|l| l.layout.clone())
                    .chain(std::iter::once("read".to_string()))
                    .chain(s.peers.iter().filter(|p| p.gbps.is_some()).map(|p| p.peer.clone()));
                for n in here {
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
            let value = |s: &DecodeShape, n: &str| -> Option<f64> {
                if n == "read" {
                    return Some(s.read_gbps);
                }
                s.lines
                    .iter()
                    .find(|l| l.layout == n)
                    .map(|l| l.gbps)
                    .or_else(|| s.peers.iter().find(|p| p.peer == n).and_then(|p| p.gbps))
            };
            let panels = batches
                .iter()
                .map(|&b| {
                    let mut pts: Vec<&&DecodeShape> = mine.iter().filter(|s| s.batch == b).collect();
                    pts.sort_by_key(|s| s.seqlen_k);
                    plot::Panel {
                        title: format!("batch {b}, seqlen_q {sq}"),
                        series: names
                            .iter()
                            .filter(|n| pts.iter().any(|s| value(s, n).is_some()))
                            .map(|n| plot::Series {
                                name: n.clone(),
                                label: plot::label(n),
                                points: pts.iter().map(|s| (s.seqlen_k, value(s, n))).collect(),
                            })
                            .collect(),
                    }
                })
                .collect::<Vec<_>>();
            let (heads_q, heads_kv, d) = mine
                .first()
                .map_or((0, 0, 0), |s| (s.heads_q, s.heads_kv, s.head_dim));
            plot::Figure {
                title: format!("KV-cache decoding, {dt}, seqlen_q {sq}, {device}"),
                subtitle: format!(
                    "GB/s of k, v, q and o against cached keys per sequence; heads {heads_q} q / {heads_kv} kv, head_dim {d}"
                ),
                rows: batches.len().div_ceil(2).max(1),
                cols: batches.len().clamp(1, 2),
                panels,
                // the file name: bench-decode-f16.png for seqlen_q 1, -f16-q4 for 4
                dtype: if sq == 1 { dt } else { format!("{dt}-q{sq}") },
                legend: names,
                x_desc: "keys per sequence (seqlen_k)".into(),
                y_desc: "GB/s".into(),
            }
        })
        .collect()
}

/// Redraws the decode plots from a bench-decode.json into `out_dir` (`bench-plot`).
///
/// # Errors
/// [`AttnError::Io`] when the file cannot be read, [`AttnError::InvalidInput`] when it is not a
/// bench-decode.json.
pub fn plots_from_json(
    json: &std::path::Path,
    out_dir: &std::path::Path,
) -> Result<plot::PlotOutput> {
    let text = std::fs::read_to_string(json).map_err(|e| io_err(json, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| AttnError::InvalidInput {
            what: format!("{}: not JSON: {e}", json.display()),
        })?;
    let shapes: Vec<DecodeShape> =
        serde_json::from_value(v["shapes"].clone()).map_err(|e| AttnError::InvalidInput {
            what: format!("{}: not a bench-decode.json ({e})", json.display()),
        })?;
    if shapes.is_empty() {
        return Err(AttnError::InvalidInput {
            what: format!("{}: holds no decode shapes to plot", json.display()),
        });
    }
    let device = v["device"].as_str().unwrap_or("unknown GPU");
    Ok(plot::write_figures(
        figures(&shapes, device),
        out_dir,
        "bench-decode",
    ))
}

/// Every seqlen_q and layout of one (batch, seqlen_k, head_dim) on one pair of caches.
fn shape_set<T: GpuElement>(
    gpu: &Gpu,
    opts: &BenchOptions,
    run: &mut DecodeRun<'_>,
    batch: usize,
    seqlen_k: usize,
    d: usize,
) -> Result<Vec<DecodeShape>> {
    let stream = gpu.stream();
    let (heads_q, heads_kv) = opts.decode_heads;
    let row = heads_kv * d;
    // One pool serves every layout: the contiguous cache is its first batch x seqlen_k rows,
    // the paged ones use up to three spare pages of the largest size past them.
    let largest = opts.decode_pages.iter().copied().max().unwrap_or(0).max(16);
    let rows = batch * seqlen_k.div_ceil(largest) * largest + 3 * largest;
    let alloc = |n: usize, what: &str| -> Result<CudaSlice<T>> {
        // SAFETY: filled by the memset below before any read.
        unsafe { stream.alloc::<T>(n) }.map_err(cuda_err(format!("allocating {what}")))
    };
    let (mut kc, mut vc) = (alloc(rows * row, "k_cache")?, alloc(rows * row, "v_cache")?);
    // 1/16 in the element type (f16 0x2C00, bf16 0x3D80).
    let one16: u16 = if T::DTYPE == DType::BF16 {
        0x3D80
    } else {
        0x2C00
    };
    for c in [&kc, &vc] {
        let (ptr, _g) = c.device_ptr(stream);
        // SAFETY: the buffer holds rows * row elements of 2 bytes, on this stream.
        unsafe { sys::cuMemsetD16Async(ptr, one16, rows * row, stream.cu_stream()) }
            .result()
            .map_err(cuda_err("filling a cache"))?;
    }
    let read_bytes = (2 * batch * seqlen_k * row * 2) as f64;
    let read_gbps = read_pass(gpu, run.sched, &kc, &vc, batch * seqlen_k * row)? / 1e9;
    let mut out = Vec::new();
    for &sq in &opts.decode_q {
        let nq = batch * sq * heads_q * d;
        let q = stream
            .clone_htod(&flashattn::compare::random_vec::<T>(nq, 7))
            .map_err(cuda_err("copying q"))?;
        let mut o: CudaSlice<T> = stream.alloc_zeros(nq).map_err(cuda_err("allocating o"))?;
        let mut lse: CudaSlice<f32> = stream
            .alloc_zeros(batch * sq * heads_q)
            .map_err(cuda_err("allocating lse"))?;
        let bytes = read_bytes + (2 * nq * 2) as f64;
        let contiguous = KvCacheProblem::new(
            batch,
            sq,
            heads_q,
            heads_kv,
            d,
            CacheLayout::Contiguous {
                seqlen_cache: seqlen_k,
            },
            vec![seqlen_k as i32; batch],
            0,
        )?;
        let mut plans: Vec<(String, DecodePlan)> = Vec::new();
        let stages: Vec<Option<(usize, usize, bool)>> = if opts.decode_tiles.is_empty() {
            vec![None]
        } else {
            opts.decode_tiles.iter().copied().map(Some).collect()
        };
        let splits: Vec<Option<usize>> = if opts.decode_splits.is_empty() {
            vec![None]
        } else {
            opts.decode_splits.iter().copied().map(Some).collect()
        };
        let variants = stages
            .iter()
            .flat_map(|st| splits.iter().map(move |sp| (*st, *sp)));
        for (&page, (st, sp)) in opts
            .decode_pages
            .iter()
            .flat_map(|pg| variants.clone().map(move |v| (pg, v)))
        {
            let (name, p) = if page == 0 {
                ("contiguous".to_string(), contiguous.clone())
            } else {
                (
                    format!("paged{page}"),
                    shuffled_pages(&contiguous, page, 42)?,
                )
            };
            let layout = format!(
                "{name}{}{}",
                st.map_or(String::new(), |(w, s, bulk)| format!(
                    " {w}x{s}{}",
                    if bulk { "b" } else { "" }
                )),
                sp.map_or(String::new(), |n| format!(" x{n}"))
            );
            let tile = st.map(|(warps, stages, bulk)| DecodeTile {
                warps,
                stages,
                q_in_regs: d <= 128,
                bulk,
            });
            plans.push((layout, DecodePlan::with_tile(gpu, &p, T::DTYPE, sp, tile)?));
        }
        let mut shape = DecodeShape {
            dtype: T::DTYPE.name().into(),
            batch,
            seqlen_k,
            seqlen_q: sq,
            head_dim: d,
            heads_q,
            heads_kv,
            bytes,
            read_gbps,
            lines: Vec::new(),
            peers: Vec::new(),
        };
        // Ours and the peers in the order of the run's turns, the layouts reversed in a
        // mirrored turn.
        let mut ours: Vec<Vec<(RoundInfo, Measured)>> = vec![Vec::new(); plans.len()];
        let mut theirs: Vec<(usize, Vec<(RoundInfo, Measured)>)> = Vec::new();
        for turn in run.shape_turns() {
            if turn.side == Side::Peers {
                let got = run.peers_turn(&shape, turn);
                theirs.extend(got.into_iter().map(|(i, info, m)| (i, vec![(info, m)])));
                continue;
            }
            let info = run.steps.start(turn);
            let mut idx: Vec<usize> = (0..plans.len()).collect();
            if turn.mirrored {
                idx.reverse();
            }
            for i in idx {
                let (layout, plan) = &plans[i];
                let what = format!("decode {layout} b{batch} sk{seqlen_k} sq{sq}");
                let timed = time_launches(gpu, &what, run.sched, |_| {
                    plan.run(
                        gpu,
                        DecodeTensors {
                            q: &q,
                            k_cache: &mut kc,
                            v_cache: &mut vc,
                            new: None,
                            rotary: None,
                            o: &mut o,
                            lse: &mut lse,
                        },
                    )
                })?;
                let t = stats::summarize(&timed.times, bytes).ok_or_else(|| AttnError::Cuda {
                    context: what.clone(),
                    message: "no valid event times".into(),
                })?;
                let mut line = LineResult::timed(layout, Source::Ours, t);
                line.host_us = timed.host_us.is_finite().then_some(timed.host_us);
                ours[i].push((
                    info,
                    Measured {
                        line,
                        times_ms: timed.times,
                        window_ms: Some(timed.window_ms),
                    },
                ));
            }
        }
        let record = run.record();
        for (parts, (layout, plan)) in ours.into_iter().zip(&plans) {
            let line = decode_line(parts, bytes, plan.splits(), record).ok_or_else(|| {
                AttnError::Cuda {
                    context: format!("decode {layout} b{batch} sk{seqlen_k} sq{sq}"),
                    message: "no round was timed".into(),
                }
            })?;
            shape.lines.push(line);
        }
        shape.peers = peer_lines(theirs, bytes);
        out.push(shape);
    }
    Ok(out)
}

/// Bytes per second of read_pass over the first `n` elements of both caches (median of the
/// bench's iterations, same warm-up).
fn read_pass<T: GpuElement>(
    gpu: &Gpu,
    sched: Schedule,
    kc: &CudaSlice<T>,
    vc: &CudaSlice<T>,
    n: usize,
) -> Result<f64> {
    let stream = gpu.stream();
    let k = gpu.kernel(KernelSource::ReadPass, "read_pass", &[])?;
    let blocks = (gpu.info().sm_count.max(1) as u32) * 4;
    let sink: CudaSlice<u32> = stream
        .alloc_zeros(blocks as usize)
        .map_err(cuda_err("allocating the read sink"))?;
    let (a, _ga) = kc.device_ptr(stream);
    let (b, _gb) = vc.device_ptr(stream);
    let (s, _gs) = sink.device_ptr(stream);
    let chunks = (n * 2 / 16) as u64; // 16-byte pieces (n * 2 bytes is a multiple of 16)
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: 0,
    };
    let timed = time_launches(gpu, "read pass", sched, |_| {
        let mut l = stream.launch_builder(&k.function);
        l.arg(&a).arg(&chunks).arg(&b).arg(&chunks).arg(&s);
        // SAFETY: both buffers hold at least `chunks` 16-byte pieces; the sink one word
        // per block.
        unsafe { l.launch(cfg) }.map_err(cuda_err("read_pass launch"))?;
        Ok(flashattn::cuda::LaunchInfo {
            kernel: flashattn::cuda::KernelKind::Mma,
            why: "read pass".into(),
            config: None,
            registers: k.stats.registers,
            spill_bytes: 0,
            smem_bytes: 0,
        })
    })?;
    let bytes = (2 * n * 2) as f64;
    let t = stats::summarize(&timed.times, bytes).ok_or_else(|| AttnError::Cuda {
        context: "read pass".into(),
        message: "no valid event times".into(),
    })?;
    Ok(t.tflops * 1e12)
}

fn table(gpu: &Gpu, shapes: &[DecodeShape], schedule: &str, notes: &[String]) -> String {
    let mut out = format!(
        "flashattn {} bench --decode on {} {}: GB/s (median, CUDA events) of k, v, q and o bytes; heads {} q / {} kv; read = a read-only pass over the same k and v bytes\nmethod: {schedule}\n",
        env!("CARGO_PKG_VERSION"),
        gpu.info().name,
        gpu.info().arch,
        shapes.first().map_or(0, |s| s.heads_q),
        shapes.first().map_or(0, |s| s.heads_kv),
    );
    let layouts: Vec<String> = shapes
        .first()
        .map(|s| s.lines.iter().map(|l| l.layout.clone()).collect())
        .unwrap_or_default();
    let peers: Vec<String> = shapes
        .first()
        .map(|s| s.peers.iter().map(|p| p.peer.clone()).collect())
        .unwrap_or_default();
    let _ = write!(
        out,
        "{:<5} {:>4} {:>4} {:>7} {:>3} {:>7}",
        "dtype", "d", "b", "sk", "sq", "read"
    );
    for l in &layouts {
        let _ = write!(out, " {l:>11} {:>8}", "us");
    }
    for p in &peers {
        let _ = write!(out, " {p:>9}");
    }
    out.push_str("  ours/read");
    if !peers.is_empty() {
        out.push_str("  ours/bestSDPA  ours/flash");
    }
    out.push('\n');
    for s in shapes {
        let _ = write!(
            out,
            "{:<5} {:>4} {:>4} {:>7} {:>3} {:>7.0}",
            s.dtype, s.head_dim, s.batch, s.seqlen_k, s.seqlen_q, s.read_gbps
        );
        for l in &s.lines {
            let _ = write!(out, " {:>11.0} {:>8.1}", l.gbps, l.median_us);
        }
        for p in &s.peers {
            match p.gbps {
                Some(g) => {
                    let _ = write!(out, " {g:>9.0}");
                }
                None => {
                    let _ = write!(out, " {:>9}", "-");
                }
            }
        }
        // The worst of our layouts against each reference.
        let ours = s.lines.iter().map(|l| l.gbps).fold(f64::INFINITY, f64::min);
        let _ = write!(out, "  {:>9.2}", ours / s.read_gbps);
        if !s.peers.is_empty() {
            let best = s
                .peers
                .iter()
                .filter_map(|p| p.gbps)
                .fold(f64::NAN, f64::max);
            let flash = s
                .peers
                .iter()
                .find(|p| p.peer == "flash")
                .and_then(|p| p.gbps)
                .unwrap_or(f64::NAN);
            let _ = write!(out, "  {:>13.2}  {:>10.2}", ours / best, ours / flash);
        }
        out.push('\n');
    }
    for n in notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, seqlen_k: usize, gbps: f64) -> DecodeShape {
        DecodeShape {
            dtype: "f16".into(),
            batch,
            seqlen_k,
            seqlen_q: 1,
            head_dim: 128,
            heads_q: 32,
            heads_kv: 8,
            bytes: 1e9,
            read_gbps: 4000.0,
            lines: vec![DecodeLine {
                layout: "contiguous".into(),
                median_us: 1e3,
                gbps,
                splits: 1,
                host_us: None,
                rounds: Vec::new(),
            }],
            peers: vec![PeerLine {
                peer: "cudnn".into(),
                median_us: None,
                gbps: None,
                skipped: Some("not run".into()),
                host_us: None,
                rounds: Vec::new(),
            }],
        }
    }

    #[test]
    fn decode_figures_have_a_panel_per_batch_and_render() {
        let shapes = vec![
            shape(1, 8192, 1700.0),
            shape(1, 32768, 2900.0),
            shape(64, 8192, 4100.0),
        ];
        let figs = figures(&shapes, "test GPU");
        assert_eq!(figs.len(), 1);
        let f = &figs[0];
        assert_eq!(f.panels.len(), 2);
        assert_eq!((f.rows, f.cols), (1, 2));
        // Our layout and the read pass; the skipped peer has no curve.
        assert_eq!(f.legend, vec!["contiguous".to_string(), "read".to_string()]);
        assert_eq!(
            f.panels[0].series[0].points,
            vec![(8192, Some(1700.0)), (32768, Some(2900.0))]
        );
        let svg = plot::svg(f).unwrap();
        assert!(svg.contains("GB/s") && svg.contains("batch 64"));
        // The JSON round trip that bench-plot reads.
        let dir =
            std::env::temp_dir().join(format!("flashattn-decode-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("bench-decode.json");
        std::fs::write(
            &json,
            serde_json::to_string(&serde_json::json!({"device": "test GPU", "shapes": shapes}))
                .unwrap(),
        )
        .unwrap();
        let out = plots_from_json(&json, &dir).unwrap();
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(out.files.len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn options_the_decode_bench_cannot_honour_are_refused_before_the_gpu() {
        for args in [
            &["--decode", "--causal", "on"][..],
            &["--decode", "--window", "10,0"],
            &["--decode", "--softcap", "30"],
            &["--decode", "--alibi"],
            &["--decode", "--quick"],
            &["--decode", "--decode-batch", "0"],
            &["--decode", "--decode-q", "0"],
            &["--decode", "--decode-splits", "0"],
            &["--decode", "--head-dim", "36"],
            &["--decode", "--decode-pages", "24"],
        ] {
            let opts = BenchOptions::from_args(args.iter().copied()).unwrap();
            match run(&opts) {
                Err(AttnError::InvalidInput { .. }) => {}
                other => panic!("{args:?}: {other:?}"),
            }
        }
        // An empty result file has nothing to plot, and says so.
        let dir =
            std::env::temp_dir().join(format!("flashattn-decode-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("bench-decode.json");
        std::fs::write(&json, r#"{"device": "x", "shapes": []}"#).unwrap();
        assert!(matches!(
            plots_from_json(&json, &dir),
            Err(AttnError::InvalidInput { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
