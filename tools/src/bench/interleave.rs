//! The sweep's turns run in their order ([`Order::turns`]): our lines through an
//! [`OursSide`] (the GPU, or a stand-in), the peers through [`Peers`], each line's rounds
//! pooled into the report ([`combine`]).

use super::order::{Order, Side};
use super::peers::Peers;
use super::report::{BenchReport, CaseReport, PEERS, Source};
use super::rounds::{Measured, RoundInfo, Steps, combine};
use super::sweep::Line;
use std::collections::HashMap;

/// Our side of a run: times our lines on one case.
pub trait OursSide {
    /// Times `lines`, in that order, on `case` (setting `case.sets` when it is 0); one
    /// [`Measured`] per line, in the order given. A line that cannot run is a skip with the
    /// reason, never a panic.
    fn time(&mut self, case: &mut CaseReport, lines: &[Line], round: usize) -> Vec<Measured>;
}

/// Our side without a GPU: every line skipped with the reason.
pub struct NoGpu(pub String);

impl OursSide for NoGpu {
    fn time(&mut self, _case: &mut CaseReport, lines: &[Line], _round: usize) -> Vec<Measured> {
        lines
            .iter()
            .map(|l| Measured::skipped(&l.name, Source::Ours, self.0.clone()))
            .collect()
    }
}

/// Runs every turn of `order` over `report`'s cases and writes each case's lines (ours in
/// `lines` order, then the peers in [`PEERS`] order), pooled over their rounds; with `peers`,
/// the dense matrix-product ceiling of each dtype is timed once, right before that dtype's
/// first peers turn, and `report.peers` is set from it. Cases with score modifiers have no
/// peer lines (SDPA's fused backends lack them).
pub fn measure(
    report: &mut BenchReport,
    lines: &[Line],
    order: Order,
    ours: &mut dyn OursSide,
    mut peers: Option<&mut Peers>,
) {
    let mut steps = Steps::new();
    let mut parts: Vec<HashMap<String, Vec<(RoundInfo, Measured)>>> =
        vec![HashMap::new(); report.cases.len()];
    let mut matmul_done: Vec<String> = Vec::new();
    for turn in order.turns(report.cases.len()) {
        let case = &mut report.cases[turn.case];
        let info;
        let got = match turn.side {
            Side::Ours => {
                info = steps.start(turn);
                let mut ls = lines.to_vec();
                if turn.mirrored {
                    ls.reverse();
                }
                ours.time(case, &ls, turn.round)
            }
            Side::Peers => {
                let Some(p) = peers.as_deref_mut().filter(|p| p.available()) else {
                    continue;
                };
                if case.case.has_score_mods() {
                    continue;
                }
                if !matmul_done.contains(&case.case.dtype) {
                    p.matmul(&case.case.dtype);
                    matmul_done.push(case.case.dtype.clone());
                }
                info = steps.start(turn);
                let mut names = PEERS.to_vec();
                if turn.mirrored {
                    names.reverse();
                }
                p.time_case(case, &names)
            }
        };
        for m in got {
            parts[turn.case]
                .entry(m.line.name.clone())
                .or_default()
                .push((info, m));
        }
    }
    let record = order != Order::OursOnly;
    let names: Vec<String> = lines
        .iter()
        .map(|l| l.name.clone())
        .chain(PEERS.iter().map(|p| p.to_string()))
        .collect();
    for (case, mut by_name) in report.cases.iter_mut().zip(parts) {
        case.results = names
            .iter()
            .filter_map(|n| by_name.remove(n))
            .map(|ps| combine(ps, case.flops, record))
            .collect();
    }
    if let Some(p) = peers {
        report.peers = p.info.clone();
    }
}
