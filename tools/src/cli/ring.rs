//! `flashattn ring`: ring attention (context parallelism, [`flashattn::dist`]) on one
//! sequence, checked against one device and sampled rows of the f64 oracle, and timed.
//!
//! This version runs the ranks as a simulation on the CPU (every rank's work in one process,
//! the ring a rotation of buffers): it proves the sharding, the order of the ring and the
//! merge, not the speed of several devices. The GPU version over NCCL is not in yet:
//! `--backend cuda` is refused by name.

use flashattn::compare::{Tolerance, diff, random_inputs};
use flashattn::dist::{Sharding, ring_forward_cpu};
use flashattn::{
    AttnError, AttnProblem, AttnShape, BackendChoice, Element, Mask, Result, reference,
};
use half::{bf16, f16};
use std::time::Instant;

/// Options of `flashattn ring`.
#[derive(Debug, clap::Args)]
pub struct RingArgs {
    /// Rank counts to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "2,3,4",
        value_name = "LIST"
    )]
    pub ranks: Vec<usize>,
    /// Tokens of the sequence (queries and keys alike).
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub seqlen: usize,
    /// Sequences.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub batch: usize,
    /// Query heads.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub heads: usize,
    /// Key/value heads [default: --heads].
    #[arg(long = "heads-kv", value_name = "N")]
    pub heads_kv: Option<usize>,
    /// Channels per head.
    #[arg(long = "head-dim", default_value_t = 64, value_name = "N")]
    pub head_dim: usize,
    /// Causal mask (the ranks then hold the load-balanced "zigzag" shards).
    #[arg(long)]
    pub causal: bool,
    /// Element type.
    #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
    pub dtype: String,
    /// Query rows (all heads) compared with the f64 oracle, spread over the sequence: at
    /// least 1 (at most seqlen_q are used).
    #[arg(long = "sample-rows", default_value_t = 16, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub sample_rows: usize,
    /// Where the ranks run: `cpu` (simulated); `cuda` (NCCL over GPUs) is not in yet.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub backend: String,
}

/// Runs the rings; Ok(0) when every one matches, Ok(1) otherwise.
///
/// # Errors
/// Bad options, `--backend cuda`, and the problem's validation errors.
pub fn run(a: &RingArgs) -> Result<u8> {
    if a.backend == "cuda" {
        return Err(AttnError::UnsupportedFeature {
            feature: "ring attention on GPUs (NCCL)".into(),
            backend: "this build".into(),
            hint: "use `ring --backend cpu` for the simulated ring; the NCCL path is not in yet"
                .into(),
        });
    }
    if a.ranks.is_empty() || a.ranks.contains(&0) {
        return Err(AttnError::InvalidInput {
            what: "--ranks: positive rank counts, e.g. 2,3,4".into(),
        });
    }
    let shape = AttnShape {
        heads_kv: a.heads_kv.unwrap_or(a.heads),
        ..AttnShape::new(a.batch, a.seqlen, a.heads, a.head_dim)
    };
    let mask = if a.causal { Mask::Causal } else { Mask::None };
    let p = AttnProblem::new(shape)?.with_mask(mask);
    match a.dtype.as_str() {
        "bf16" => rings::<bf16>(a, &p),
        "f32" => rings::<f32>(a, &p),
        _ => rings::<f16>(a, &p),
    }
}

fn rings<T: Element>(a: &RingArgs, p: &AttnProblem) -> Result<u8> {
    let s = p.shape;
    let seed = flashattn::compare::random_seed();
    let (q, k, v) = random_inputs::<T>(p, seed);
    println!(
        "ring attention, simulated on the CPU: batch {} seqlen {} heads {}/{} d{} {} {} (seed {seed}; FLASHATTN_SEED replays it)",
        s.batch,
        s.seqlen_q,
        s.heads_q,
        s.heads_kv,
        s.head_dim,
        p.mask.name(),
        T::DTYPE
    );
    let t0 = Instant::now();
    let one = flashattn::forward(BackendChoice::Cpu, p, &q, &k, &v)?;
    let one_s = t0.elapsed().as_secs_f64();
    println!("  one device: {:.1} ms", one_s * 1e3);
    // Sampled rows of the oracle: evenly spread positions, every batch entry and head.
    let n = a.sample_rows.clamp(1, s.seqlen_q.max(1));
    let positions: Vec<usize> = (0..n)
        .map(|i| (i * s.seqlen_q.saturating_sub(1)) / (n - 1).max(1))
        .collect();
    let keys: Vec<(usize, usize, usize)> = (0..s.batch)
        .flat_map(|b| {
            positions
                .iter()
                .flat_map(move |&i| (0..s.heads_q).map(move |h| (b, i, h)))
        })
        .collect();
    let exact = reference::attention_rows(p, &q, &k, &v, &keys)?;
    let tol = Tolerance::for_dtype(T::DTYPE);
    let mut failed = 0;
    for &ranks in &a.ranks {
        let t = Instant::now();
        let ring = ring_forward_cpu(p, &q, &k, &v, ranks)?;
        let secs = t.elapsed().as_secs_f64();
        // Against the sampled oracle rows.
        let row = s.heads_q * s.head_dim;
        let (mut got, mut want, mut got_l, mut want_l) = (vec![], vec![], vec![], vec![]);
        for (&(b, i, h), (eo, el, _)) in keys.iter().zip(&exact) {
            let at = (b * s.seqlen_q + i) * row + h * s.head_dim;
            got.extend(ring.o[at..at + s.head_dim].iter().map(|x| x.to_f64()));
            want.extend_from_slice(eo);
            got_l.push(f64::from(ring.lse[(b * s.heads_q + h) * s.seqlen_q + i]));
            want_l.push(*el);
        }
        let (od, ld) = (diff(got, &want), diff(got_l, &want_l));
        let oracle = tol.check("ring vs oracle rows", &od, &ld);
        // Against one device, every row.
        let (od1, ld1) = (
            diff(
                ring.o.iter().map(|x| x.to_f64()),
                &one.o.iter().map(|x| x.to_f64()).collect::<Vec<_>>(),
            ),
            diff(
                ring.lse.iter().map(|&x| f64::from(x)),
                &one.lse.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
            ),
        );
        let single = tol.check("ring vs one device", &od1, &ld1);
        // The work each rank does: its query rows' visible keys.
        let plan = if p.mask.is_causal() {
            Sharding::zigzag(s.seqlen_q, ranks)?
        } else {
            Sharding::contiguous(s.seqlen_q, ranks)?
        };
        let pairs: Vec<usize> = plan
            .positions
            .iter()
            .map(|pos| {
                pos.iter()
                    .map(|&i| {
                        if p.mask.is_causal() {
                            i + 1
                        } else {
                            s.seqlen_k
                        }
                    })
                    .sum()
            })
            .collect();
        let (lo, hi) = (
            pairs.iter().copied().min().unwrap_or(0),
            pairs.iter().copied().max().unwrap_or(0),
        );
        let ok = oracle.is_ok() && single.is_ok();
        failed += usize::from(!ok);
        println!(
            "  {ranks} ranks: {:.1} ms for all ranks in one process; vs one device: o rel-L2 {:.2e}, lse max-abs {:.2e}; vs {} oracle rows: o rel-L2 {:.2e}, lse max-abs {:.2e}; work per rank {lo}..{hi} visible pairs per head (balance {:.3})  {}",
            secs * 1e3,
            od1.rel_l2,
            ld1.max_abs,
            keys.len(),
            od.rel_l2,
            ld.max_abs,
            if hi > 0 { lo as f64 / hi as f64 } else { 1.0 },
            if ok { "ok" } else { "FAIL" }
        );
        for e in [oracle.err(), single.err()].into_iter().flatten() {
            println!("    {e}");
        }
    }
    if one_s > 0.0 {
        println!(
            "note: the simulated ring runs every rank's share on this machine: its time is the sum of the ranks' work, not what N devices would take"
        );
    }
    Ok(u8::from(failed > 0))
}
