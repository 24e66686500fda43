//! Canonicalising token ranges to block boundaries.

use core::ops::Range;

use crate::error::{Error, Result};

/// The blocks `range` touches in a sequence of `seq_len` tokens.
///
/// Any range that starts and ends in the same blocks maps to the same block
/// range: with 128-token blocks, `0..127` and `0..128` both give `0..1`.
/// Errors for an empty or reversed range, one past the sequence, and
/// blocks of no tokens.
pub fn canonical_blocks(
    range: &Range<usize>,
    seq_len: usize,
    block_tokens: u32,
) -> Result<Range<u32>> {
    if block_tokens == 0 {
        return Err(Error::InvalidValue("blocks of zero tokens"));
    }
    check_range(range, seq_len)?;
    let bt = block_tokens as usize;
    let first = u32::try_from(range.start / bt).map_err(|_| Error::Overflow("block index"))?;
    let last = u32::try_from(range.end.div_ceil(bt)).map_err(|_| Error::Overflow("block index"))?;
    Ok(first..last)
}

/// `range` is a non-empty range of a sequence of `seq_len` tokens.
pub(crate) fn check_range(range: &Range<usize>, seq_len: usize) -> Result<()> {
    if range.start >= range.end {
        return Err(Error::InvalidRange {
            start: range.start as u64,
            end: range.end as u64,
        });
    }
    if range.end > seq_len {
        return Err(Error::OutOfRange {
            what: "range end",
            index: range.end as u64,
            bound: seq_len as u64 + 1,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_no_tokens_are_an_error() {
        assert!(matches!(
            canonical_blocks(&(0..1), 1, 0),
            Err(Error::InvalidValue(_))
        ));
    }

    #[test]
    fn ranges_snap_to_blocks() {
        assert_eq!(canonical_blocks(&(0..127), 300, 128).unwrap(), 0..1);
        assert_eq!(canonical_blocks(&(0..128), 300, 128).unwrap(), 0..1);
        assert_eq!(canonical_blocks(&(0..129), 300, 128).unwrap(), 0..2);
        assert_eq!(canonical_blocks(&(127..129), 300, 128).unwrap(), 0..2);
        assert_eq!(canonical_blocks(&(256..300), 300, 128).unwrap(), 2..3);
        assert_eq!(canonical_blocks(&(5..6), 6, 1).unwrap(), 5..6);
    }

    #[test]
    fn bad_ranges_are_errors() {
        assert!(matches!(
            canonical_blocks(&(4..4), 10, 4),
            Err(Error::InvalidRange { .. })
        ));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 5..3;
        assert!(canonical_blocks(&reversed, 10, 4).is_err());
        assert!(matches!(
            canonical_blocks(&(0..11), 10, 4),
            Err(Error::OutOfRange { .. })
        ));
    }
}
