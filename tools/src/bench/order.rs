//! The order of the timing turns: with --peers, each case's round 1 times ours then the
//! peers, round 2 the peers then ours, every list of lines mirrored, so that a clock drifting
//! steadily through a case weighs on both sides alike; or ours first and the peers after.

/// Who is timed in a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Our lines.
    Ours,
    /// The peers (one request to the peers process).
    Peers,
}

impl Side {
    /// `ours` or `peers`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Peers => "peers",
        }
    }
}

/// How ours and the peers take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Case by case: round 1 ours then the peers, round 2 the peers then ours, the lines of
    /// round 2 in reverse order (the whole case's sequence mirrored).
    Interleaved,
    /// Every case of ours (one round), then every case of the peers (the method before issue
    /// 41: the clock drifts between the halves and moves the ratios by a few per cent).
    PeersAfter,
    /// No peers: ours, one round.
    OursOnly,
}

/// One turn: one side times all its lines on one case in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The case's index.
    pub case: usize,
    /// 1 or 2.
    pub round: usize,
    /// Who is timed.
    pub side: Side,
    /// Who goes first in this round of the case.
    pub first: Side,
    /// Lines in reverse order (round 2 of the interleaved order).
    pub mirrored: bool,
}

impl Order {
    /// `interleaved`, `peers-after` or `ours-only`.
    pub fn name(self) -> &'static str {
        match self {
            Order::Interleaved => "interleaved",
            Order::PeersAfter => "peers-after",
            Order::OursOnly => "ours-only",
        }
    }

    /// Rounds per line and case.
    pub fn rounds(self) -> usize {
        match self {
            Order::Interleaved => 2,
            _ => 1,
        }
    }

    /// The turns over `cases` cases, in the order they run.
    pub fn turns(self, cases: usize) -> Vec<Turn> {
        let turn = |case, round, side, first, mirrored| Turn {
            case,
            round,
            side,
            first,
            mirrored,
        };
        match self {
            Order::Interleaved => (0..cases)
                .flat_map(|c| {
                    [
                        turn(c, 1, Side::Ours, Side::Ours, false),
                        turn(c, 1, Side::Peers, Side::Ours, false),
                        turn(c, 2, Side::Peers, Side::Peers, true),
                        turn(c, 2, Side::Ours, Side::Peers, true),
                    ]
                })
                .collect(),
            Order::PeersAfter => (0..cases)
                .map(|c| turn(c, 1, Side::Ours, Side::Ours, false))
                .chain((0..cases).map(|c| turn(c, 1, Side::Peers, Side::Ours, false)))
                .collect(),
            Order::OursOnly => (0..cases)
                .map(|c| turn(c, 1, Side::Ours, Side::Ours, false))
                .collect(),
        }
    }

    /// The method as a sentence (the table's `method:` line and the JSON's
    /// `method.schedule`).
    pub fn describe(self, warmup_ms: u64, window_ms: u64) -> String {
        let each = if window_ms > 0 {
            format!(
                "each line after {warmup_ms} ms of warm-up, timed over a window of at least {window_ms} ms (launch count from the warm-up's time per launch)"
            )
        } else {
            format!("each line after {warmup_ms} ms of warm-up")
        };
        match self {
            Order::Interleaved => format!(
                "ours and the peers interleaved case by case in one persistent peers process, both orders (round 1 ours first, round 2 the peers first, lines mirrored); {each}; a line's value is the median over the launches of both rounds (per round in the JSON)"
            ),
            Order::PeersAfter => format!(
                "all our cases first, then the peers' in one persistent peers process (--peers-after: the clock may drift between the halves); {each}"
            ),
            Order::OursOnly => each,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_turns_take_both_orders_and_mirror_round_two() {
        let t = Order::Interleaved.turns(2);
        let seq: Vec<(usize, usize, Side, bool)> = t
            .iter()
            .map(|t| (t.case, t.round, t.side, t.mirrored))
            .collect();
        assert_eq!(
            seq,
            [
                (0, 1, Side::Ours, false),
                (0, 1, Side::Peers, false),
                (0, 2, Side::Peers, true),
                (0, 2, Side::Ours, true),
                (1, 1, Side::Ours, false),
                (1, 1, Side::Peers, false),
                (1, 2, Side::Peers, true),
                (1, 2, Side::Ours, true),
            ]
        );
        let after = Order::PeersAfter.turns(2);
        assert_eq!(
            after.iter().map(|t| (t.case, t.side)).collect::<Vec<_>>(),
            [
                (0, Side::Ours),
                (1, Side::Ours),
                (0, Side::Peers),
                (1, Side::Peers)
            ]
        );
        assert_eq!(Order::OursOnly.turns(3).len(), 3);
        assert!(
            Order::Interleaved
                .describe(500, 250)
                .contains("both orders")
        );
    }
}
