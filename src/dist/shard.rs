//! Which global sequence positions each rank of a ring holds.

use crate::error::{AttnError, Result};

/// The positions of a sequence of `len` rows held by each of `ranks` ranks, in increasing
/// order within a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharding {
    /// `positions[r]`: the global rows of rank `r`.
    pub positions: Vec<Vec<usize>>,
}

impl Sharding {
    /// Contiguous shards of `ceil(len / ranks)` rows (the last ones shorter, possibly empty).
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] for 0 ranks.
    pub fn contiguous(len: usize, ranks: usize) -> Result<Self> {
        check_ranks(ranks)?;
        let per = len.div_ceil(ranks);
        Ok(Sharding {
            positions: (0..ranks)
                .map(|r| ((r * per).min(len)..((r + 1) * per).min(len)).collect())
                .collect(),
        })
    }

    /// The causal load-balanced layout: `2 * ranks` chunks of `ceil(len / (2 ranks))` rows,
    /// rank `r` holding chunks `r` and `2 ranks - 1 - r`. With a causal mask the query rows of
    /// chunk `i` see `i * c + (1..=c)` keys, so the two chunks of every rank see
    /// `c^2 (2 ranks - 1) + c (c + 1)` pairs: the same for every rank when `len` divides evenly.
    ///
    /// # Errors
    /// [`AttnError::InvalidInput`] for 0 ranks.
    pub fn zigzag(len: usize, ranks: usize) -> Result<Self> {
        check_ranks(ranks)?;
        let chunks = 2 * ranks;
        let per = len.div_ceil(chunks);
        let chunk = |i: usize| (i * per).min(len)..((i + 1) * per).min(len);
        Ok(Sharding {
            positions: (0..ranks)
                .map(|r| chunk(r).chain(chunk(chunks - 1 - r)).collect())
                .collect(),
        })
    }

    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.positions.len()
    }
}

fn check_ranks(ranks: usize) -> Result<()> {
    if ranks == 0 {
        return Err(AttnError::InvalidInput {
            what: "a ring needs at least one rank".into(),
        });
    }
    Ok(())
}
