//! The decode bench's turns with --peers: ours' layouts and SDPA's backends on each shape in
//! the order of the run ([`Order::turns`]: round 1 ours first, round 2 the peers first, lines
//! mirrored; or every shape of ours before the peers with --peers-after), each line pooled
//! over its rounds into a [`DecodeLine`] or [`PeerLine`] with its rounds.

use super::decode_record::{DecodeLine, DecodeRound, DecodeShape, PeerLine};
use super::order::{Order, Side, Turn};
use super::peers::{self, Peers};
use super::report::{LineResult, PEERS};
use super::rounds::{Measured, RoundInfo, Steps, combine};
use super::stats::Schedule;
use serde::Serialize;

/// A decode shape as tools/bench/peers.py takes it (GQA through `heads_kv`, `seqlen_q` rows
/// of queries; `flops` carries the bytes, so its "TFLOP/s" are TB/s).
#[derive(Debug, Clone, Serialize)]
pub struct DecodePeerCase {
    id: String,
    dtype: String,
    batch: usize,
    seqlen: usize,
    seqlen_q: usize,
    heads: usize,
    heads_kv: usize,
    head_dim: usize,
    causal: bool,
    flops: f64,
    sets: usize,
}

impl DecodePeerCase {
    /// The contiguous cache of `s`, no mask, one input set.
    pub fn of(s: &DecodeShape) -> Self {
        DecodePeerCase {
            id: shape_id(s),
            dtype: s.dtype.clone(),
            batch: s.batch,
            seqlen: s.seqlen_k,
            seqlen_q: s.seqlen_q,
            heads: s.heads_q,
            heads_kv: s.heads_kv,
            head_dim: s.head_dim,
            causal: false,
            flops: s.bytes,
            sets: 1,
        }
    }
}

/// The id of a decode shape in peer requests, e.g. `decode-f16-b8-sk8192-sq1-d128`.
pub fn shape_id(s: &DecodeShape) -> String {
    format!(
        "decode-{}-b{}-sk{}-sq{}-d{}",
        s.dtype, s.batch, s.seqlen_k, s.seqlen_q, s.head_dim
    )
}

/// What a decode run's shapes share: how each line is timed, the order, the peers and the
/// turn numbering.
pub struct DecodeRun<'p> {
    /// How each line is timed.
    pub sched: Schedule,
    /// The order of the turns (`OursOnly` without peers, or when they are not available).
    pub order: Order,
    /// The peers process, with --peers.
    pub peers: Option<&'p mut Peers>,
    /// The turns so far.
    pub steps: Steps,
}

impl DecodeRun<'_> {
    /// The turns of one shape: interleaved, ours then the peers; otherwise ours only (with
    /// --peers-after the peers come in [`DecodeRun::peers_after`]).
    pub fn shape_turns(&self) -> Vec<Turn> {
        match self.order {
            Order::Interleaved => Order::Interleaved.turns(1),
            _ => Order::OursOnly.turns(1),
        }
    }

    /// Times SDPA's backends (in `PEERS` order, reversed when `turn` is mirrored) on `shape`
    /// as one turn; `(index in PEERS, round info, measured)` per backend. Nothing without
    /// peers.
    pub fn peers_turn(
        &mut self,
        shape: &DecodeShape,
        turn: Turn,
    ) -> Vec<(usize, RoundInfo, Measured)> {
        let Some(p) = self.peers.as_deref_mut().filter(|p| p.available()) else {
            return Vec::new();
        };
        let info = self.steps.start(turn);
        let mut order: Vec<usize> = (0..PEERS.len()).collect();
        if turn.mirrored {
            order.reverse();
        }
        let names: Vec<&str> = order.iter().map(|&i| PEERS[i]).collect();
        let got = p.request(vec![DecodePeerCase::of(shape)], &names, &[]);
        let id = shape_id(shape);
        order
            .into_iter()
            .map(|i| (i, info, peers::measured(&got, &id, PEERS[i], shape.bytes)))
            .collect()
    }

    /// With --peers-after: every shape's peers, one turn each, after all of ours.
    pub fn peers_after(&mut self, shapes: &mut [DecodeShape]) {
        if self.order != Order::PeersAfter {
            return;
        }
        for (i, s) in shapes.iter_mut().enumerate() {
            let turn = Turn {
                case: i,
                round: 1,
                side: Side::Peers,
                first: Side::Ours,
                mirrored: false,
            };
            let got = self.peers_turn(s, turn);
            s.peers = peer_lines(
                got.into_iter().map(|(i, info, m)| (i, vec![(info, m)])),
                s.bytes,
            );
        }
    }

    /// Whether the lines keep their rounds (any order with peers).
    pub fn record(&self) -> bool {
        self.order != Order::OursOnly
    }
}

/// Our layout's rounds pooled into its line; `None` when no round has a timing.
pub fn decode_line(
    parts: Vec<(RoundInfo, Measured)>,
    bytes: f64,
    splits: usize,
    record: bool,
) -> Option<DecodeLine> {
    let l: LineResult = combine(parts, bytes, record);
    let t = l.timing?;
    Some(DecodeLine {
        layout: l.name,
        median_us: t.median_ms * 1e3,
        gbps: t.tflops * 1e3,
        splits,
        host_us: l.host_us,
        rounds: l.rounds.iter().map(DecodeRound::from).collect(),
    })
}

/// The peers' rounds, grouped by their index in `PEERS`, pooled into lines in `PEERS` order.
pub fn peer_lines(
    parts: impl IntoIterator<Item = (usize, Vec<(RoundInfo, Measured)>)>,
    bytes: f64,
) -> Vec<PeerLine> {
    let mut by_peer: Vec<Vec<(RoundInfo, Measured)>> = vec![Vec::new(); PEERS.len()];
    for (i, ps) in parts {
        by_peer[i].extend(ps);
    }
    by_peer
        .into_iter()
        .filter(|ps| !ps.is_empty())
        .map(|ps| {
            let l = combine(ps, bytes, true);
            PeerLine {
                peer: l.name.clone(),
                median_us: l.timing.map(|t| t.median_ms * 1e3),
                gbps: l.timing.map(|t| t.tflops * 1e3),
                skipped: l.skipped.clone(),
                host_us: l.host_us,
                rounds: l.rounds.iter().map(DecodeRound::from).collect(),
            }
        })
        .collect()
}
