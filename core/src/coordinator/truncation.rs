//! Token budgets: what to do with a prompt longer than the cache should
//! hold, decided before any key is computed.

use alloc::vec::Vec;
use core::ops::Range;

use crate::error::{Error, Result};

/// What happens to a sequence over its [`TokenBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncation {
    /// Refuse it with [`Error::OutOfRange`] (the default).
    #[default]
    Refuse,
    /// Keep its last `max_tokens` tokens.
    KeepLast,
    /// Keep its first `first` tokens and its last `max_tokens - first`
    /// (attention sinks, as StreamingLLM keeps them). `first` must be at
    /// least 1 and leave room for one tail token.
    KeepFirstAndLast {
        /// Leading tokens kept.
        first: usize,
    },
}

/// The most tokens a request may address, and what to do beyond that.
///
/// ```
/// use kvslice_core::coordinator::{TokenBudget, Truncation};
///
/// let budget = TokenBudget { max_tokens: 6, truncation: Truncation::KeepFirstAndLast { first: 2 } };
/// let tokens: Vec<u32> = (0..10).collect();
/// let (kept, dropped) = budget.apply(&tokens)?;
/// assert_eq!(kept, [0, 1, 6, 7, 8, 9]);
/// assert_eq!(dropped, Some(2..6));
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    /// Tokens kept at most; at least 1.
    pub max_tokens: usize,
    /// What happens to a longer sequence.
    pub truncation: Truncation,
}

impl TokenBudget {
    /// The token positions a sequence of `len` tokens loses: `None` if it
    /// fits. Errors for a zero budget, sinks that leave no room for a tail,
    /// and a sequence over a [`Truncation::Refuse`] budget.
    pub fn dropped(&self, len: usize) -> Result<Option<Range<usize>>> {
        let max = self.max_tokens;
        if max == 0 {
            return Err(Error::InvalidValue("a token budget of zero tokens"));
        }
        if let Truncation::KeepFirstAndLast { first } = self.truncation
            && (first == 0 || first >= max)
        {
            return Err(Error::OutOfRange {
                what: "sink tokens kept (1 to the budget minus one)",
                index: first as u64,
                bound: max as u64,
            });
        }
        if len <= max {
            return Ok(None);
        }
        let cut = len - max;
        match self.truncation {
            Truncation::Refuse => Err(Error::OutOfRange {
                what: "tokens of a request over its budget",
                index: len as u64,
                bound: max as u64 + 1,
            }),
            Truncation::KeepLast => Ok(Some(0..cut)),
            Truncation::KeepFirstAndLast { first } => Ok(Some(first..first + cut)),
        }
    }

    /// The tokens kept from `tokens`, and the positions dropped.
    pub fn apply(&self, tokens: &[u32]) -> Result<(Vec<u32>, Option<Range<usize>>)> {
        let dropped = self.dropped(tokens.len())?;
        let kept = match &dropped {
            None => tokens.to_vec(),
            Some(d) => without(tokens, d),
        };
        Ok((kept, dropped))
    }
}

/// `tokens` without the positions `dropped`.
pub(super) fn without(tokens: &[u32], dropped: &Range<usize>) -> Vec<u32> {
    tokens[..dropped.start]
        .iter()
        .chain(&tokens[dropped.end..])
        .copied()
        .collect()
}
