//! Each line's result pooled over its rounds ([`combine`]), and the turns numbered as they
//! start ([`Steps`]); the order of the turns is [`super::order`]'s.

use super::order::Turn;
use super::report::{LineResult, RoundTiming, Source};
use super::stats::{self, Timing};

/// One line's launches in one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The line (timing of these launches alone, memory, tile, ...).
    pub line: LineResult,
    /// Milliseconds of every timed launch (empty when skipped, or when the peers process
    /// gave only the summary).
    pub times_ms: Vec<f64>,
    /// Wall milliseconds of the timed launches.
    pub window_ms: Option<f64>,
}

impl Measured {
    /// A line with no timing, saying why.
    pub fn skipped(name: &str, source: Source, reason: impl Into<String>) -> Self {
        Measured {
            line: LineResult::skipped(name, source, reason),
            times_ms: Vec::new(),
            window_ms: None,
        }
    }
}

/// When and in which round a [`Measured`] was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundInfo {
    /// The turn.
    pub turn: Turn,
    /// Its index in the run's sequence of turns.
    pub step: usize,
    /// Seconds from the run's first turn to its start.
    pub at_s: f64,
}

/// Numbers the turns of a run as they start, with the seconds since the first.
#[derive(Debug, Clone)]
pub struct Steps {
    t0: Option<std::time::Instant>,
    next: usize,
}

impl Default for Steps {
    fn default() -> Self {
        Self::new()
    }
}

impl Steps {
    /// No turn yet.
    pub fn new() -> Self {
        Steps { t0: None, next: 0 }
    }

    /// `turn` starts now.
    pub fn start(&mut self, turn: Turn) -> RoundInfo {
        let t0 = *self.t0.get_or_insert_with(std::time::Instant::now);
        self.next += 1;
        RoundInfo {
            turn,
            step: self.next - 1,
            at_s: t0.elapsed().as_secs_f64(),
        }
    }
}

/// One line's rounds pooled: the timing is the summary of every launch of every round
/// (the median over both rounds), or, when a round came without its launch times, the mean
/// of the rounds' medians and p90s with the least min; the other fields come from the first
/// timed round. With one round and no order to record (`record` false) the line is that
/// round's unchanged. All rounds skipped: skipped with the first reason.
///
/// `flops` is the case's (TFLOP/s of the pooled median); `parts` must not be empty.
pub fn combine(parts: Vec<(RoundInfo, Measured)>, flops: f64, record: bool) -> LineResult {
    let rounds: Vec<RoundTiming> = parts
        .iter()
        .map(|(info, m)| RoundTiming {
            round: info.turn.round,
            first: info.turn.first.name().to_string(),
            step: info.step,
            at_s: info.at_s,
            timing: m.line.timing,
            window_ms: m.window_ms,
            skipped: m.line.skipped.clone(),
        })
        .collect();
    let timed: Vec<&Measured> = parts
        .iter()
        .map(|(_, m)| m)
        .filter(|m| m.line.timing.is_some())
        .collect();
    let Some(first) = timed.first() else {
        let mut line = parts
            .into_iter()
            .next()
            .map(|(_, m)| m.line)
            .unwrap_or_else(|| LineResult::skipped("?", Source::Ours, "no rounds"));
        if record {
            line.rounds = rounds;
        }
        return line;
    };
    let mut line = first.line.clone();
    if !record && parts.len() == 1 {
        return line;
    }
    line.timing = if timed.iter().all(|m| !m.times_ms.is_empty()) {
        let all: Vec<f64> = timed
            .iter()
            .flat_map(|m| m.times_ms.iter().copied())
            .collect();
        stats::summarize(&all, flops)
    } else {
        let ts: Vec<Timing> = timed.iter().filter_map(|m| m.line.timing).collect();
        let n = ts.len() as f64;
        let median = ts.iter().map(|t| t.median_ms).sum::<f64>() / n;
        Some(Timing {
            median_ms: median,
            min_ms: ts.iter().map(|t| t.min_ms).fold(f64::INFINITY, f64::min),
            p90_ms: ts.iter().map(|t| t.p90_ms).sum::<f64>() / n,
            iters: ts.iter().map(|t| t.iters).sum(),
            tflops: stats::tflops(flops, median),
        })
    };
    line.skipped = None;
    line.rounds = rounds;
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::order::Side;

    fn measured(ms: f64, n: usize, with_times: bool) -> Measured {
        let t = stats::summarize(&vec![ms; n], 1e12).unwrap();
        Measured {
            line: LineResult::timed("x", Source::Peer, t),
            times_ms: if with_times { vec![ms; n] } else { Vec::new() },
            window_ms: Some(ms * n as f64),
        }
    }

    fn info(round: usize, step: usize) -> RoundInfo {
        let first = if round == 1 { Side::Ours } else { Side::Peers };
        RoundInfo {
            turn: Turn {
                case: 0,
                round,
                side: Side::Peers,
                first,
                mirrored: round == 2,
            },
            step,
            at_s: step as f64,
        }
    }

    #[test]
    fn rounds_pool_their_launches() {
        let l = combine(
            vec![
                (info(1, 1), measured(1.0, 30, true)),
                (info(2, 2), measured(3.0, 30, true)),
            ],
            1e12,
            true,
        );
        let t = l.timing.unwrap();
        assert_eq!((t.median_ms, t.min_ms, t.iters), (2.0, 1.0, 60));
        assert_eq!(l.rounds.len(), 2);
        assert_eq!(
            (l.rounds[0].first.as_str(), l.rounds[1].first.as_str()),
            ("ours", "peers")
        );
        assert_eq!(l.rounds[1].timing.unwrap().median_ms, 3.0);
        // Without launch times: the mean of the medians.
        let l = combine(
            vec![
                (info(1, 1), measured(1.0, 30, false)),
                (info(2, 2), measured(4.0, 31, true)),
            ],
            1e12,
            true,
        );
        assert_eq!(l.timing.unwrap().median_ms, 2.5);
        // One round skipped: the other's timing, both recorded.
        let skip = Measured::skipped("x", Source::Peer, "out of memory");
        let l = combine(
            vec![
                (info(1, 1), skip.clone()),
                (info(2, 2), measured(2.0, 30, true)),
            ],
            1e12,
            true,
        );
        assert_eq!(l.timing.unwrap().median_ms, 2.0);
        assert!(l.skipped.is_none() && l.rounds[0].skipped.as_deref() == Some("out of memory"));
        // Both skipped.
        let l = combine(
            vec![(info(1, 1), skip.clone()), (info(2, 2), skip)],
            1e12,
            true,
        );
        assert!(l.timing.is_none() && l.skipped.as_deref() == Some("out of memory"));
        // One round, nothing to record: unchanged.
        let m = measured(1.5, 30, true);
        assert_eq!(combine(vec![(info(1, 1), m.clone())], 1e12, false), m.line);
    }
}
