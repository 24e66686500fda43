//! Sequence bookkeeping: sequence id → block table and token count.
//!
//! [`SequenceMap`] grows on the heap (hashbrown); [`FixedSequenceMap`] has
//! its capacity in its type (heapless) for runtimes without an allocator.
//! Both implement [`SequenceTable`] and behave identically.

mod fixed;
mod map;

pub use fixed::FixedSequenceMap;
pub use map::SequenceMap;

use crate::error::{Error, Result};
use crate::page::PageId;

/// Identifies a sequence inside a runtime.
pub type SeqId = u64;

/// The operations both sequence tables share.
///
/// ```
/// use kvslice_core::{PageId, SequenceMap, SequenceTable};
///
/// let mut seqs = SequenceMap::new(16);
/// seqs.create(7)?;
/// assert_eq!(seqs.blocks_needed(7, 20)?, 2);
/// seqs.push_page(7, PageId(3))?;
/// seqs.push_page(7, PageId(9))?;
/// seqs.advance(7, 20)?;
/// assert_eq!(seqs.block_table(7)?, &[PageId(3), PageId(9)]);
/// let mut freed = Vec::new();
/// seqs.remove(7, |p| freed.push(p))?;
/// assert_eq!(freed, [PageId(3), PageId(9)]);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub trait SequenceTable {
    /// Tokens per page.
    fn block_tokens(&self) -> u32;

    /// Registers an empty sequence. Errors if `seq` exists or the table is
    /// full.
    fn create(&mut self, seq: SeqId) -> Result<()>;

    /// Appends a page to `seq`'s block table.
    fn push_page(&mut self, seq: SeqId, page: PageId) -> Result<()>;

    /// Records `n` more tokens; errors (changing nothing) if they would not
    /// fit in the pages the sequence holds.
    fn advance(&mut self, seq: SeqId, n: usize) -> Result<()>;

    /// Tokens stored for `seq`.
    fn len(&self, seq: SeqId) -> Result<usize>;

    /// `seq`'s pages, in order.
    fn block_table(&self, seq: SeqId) -> Result<&[PageId]>;

    /// Removes `seq`, handing each of its pages to `release` (not the
    /// placeholders of pages released before).
    fn remove(&mut self, seq: SeqId, release: impl FnMut(PageId)) -> Result<()>;

    /// Hands every page of `seq` before block `block` to `release` and
    /// puts [`PageId::PLACEHOLDER`] in its place (positions keep their
    /// blocks); returns how many were released. Pages released before are
    /// not handed out again.
    fn release_before(
        &mut self,
        seq: SeqId,
        block: usize,
        release: impl FnMut(PageId),
    ) -> Result<usize>;

    /// Releases the pages of `seq` that no future token attends to under a
    /// sliding window of `window` tokens: the next token, at position
    /// `len`, sees `len + 1 - window..=len`, so every block before that
    /// goes. Called after each [`advance`](Self::advance), a sequence holds
    /// at most `ceil(window / block_tokens) + 1` pages, however long it
    /// grows. Returns how many pages were released; a window of zero is an
    /// error.
    ///
    /// ```
    /// use kvslice_core::{PageId, SequenceMap, SequenceTable};
    ///
    /// let mut seqs = SequenceMap::new(4);
    /// seqs.create(1)?;
    /// for p in 0..3 {
    ///     seqs.push_page(1, PageId(p))?;
    /// }
    /// seqs.advance(1, 10)?;
    /// // The 11th token (position 10) with a window of 4 sees 7..=10.
    /// let mut freed = Vec::new();
    /// assert_eq!(seqs.slide_window(1, 4, |p| freed.push(p))?, 1);
    /// assert_eq!(freed, [PageId(0)]);
    /// assert_eq!(seqs.block_table(1)?, &[PageId::PLACEHOLDER, PageId(1), PageId(2)]);
    /// assert_eq!(seqs.held_pages(1)?, 2);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    fn slide_window(
        &mut self,
        seq: SeqId,
        window: u32,
        release: impl FnMut(PageId),
    ) -> Result<usize> {
        let first = first_kept_block(self.len(seq)?, window, self.block_tokens())?;
        self.release_before(seq, first, release)
    }

    /// Pages `seq` holds: its block table less the placeholders.
    fn held_pages(&self, seq: SeqId) -> Result<usize> {
        Ok(self
            .block_table(seq)?
            .iter()
            .filter(|p| **p != PageId::PLACEHOLDER)
            .count())
    }

    /// Number of sequences registered.
    fn num_sequences(&self) -> usize;

    /// Pages `seq` must gain before `n` more tokens fit.
    fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize> {
        let bt = self.block_tokens() as usize;
        if bt == 0 {
            return Err(Error::InvalidValue(
                "a sequence table of 0 tokens per block",
            ));
        }
        let have = self.block_table(seq)?.len();
        let want = self.len(seq)?.saturating_add(n).div_ceil(bt);
        Ok(want.saturating_sub(have))
    }
}

/// The first block a sequence of `len` tokens keeps under a sliding window
/// of `window` tokens: the next token, at position `len`, sees
/// `len + 1 - window..=len`, so the blocks before the one holding the
/// first of those are read by no later token. A window of zero is an
/// error. What [`SequenceTable::slide_window`] releases before, for block
/// tables kept elsewhere (the C ABI's requests).
///
/// ```
/// use kvslice_core::first_kept_block;
///
/// // Token 10 under a window of 4 sees 7..=10: blocks of 4 from block 1.
/// assert_eq!(first_kept_block(10, 4, 4)?, 1);
/// assert_eq!(first_kept_block(10, 100, 4)?, 0);
/// assert!(first_kept_block(10, 0, 4).is_err());
/// assert!(first_kept_block(10, 4, 0).is_err());
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub fn first_kept_block(len: usize, window: u32, block_tokens: u32) -> Result<usize> {
    if window == 0 {
        return Err(crate::Error::InvalidValue(
            "attention window must be at least one token",
        ));
    }
    if block_tokens == 0 {
        return Err(crate::Error::InvalidValue("blocks of zero tokens"));
    }
    let first = len.saturating_add(1).saturating_sub(window as usize);
    Ok(first / block_tokens as usize)
}

/// [`SequenceTable::release_before`] over one block table.
fn release_pages(pages: &mut [PageId], block: usize, mut release: impl FnMut(PageId)) -> usize {
    let upto = block.min(pages.len());
    let mut n = 0;
    for p in pages[..upto]
        .iter_mut()
        .filter(|p| **p != PageId::PLACEHOLDER)
    {
        release(core::mem::replace(p, PageId::PLACEHOLDER));
        n += 1;
    }
    n
}

/// The capacity check `advance` shares across implementations.
fn check_advance(len: usize, n: usize, pages: usize, block_tokens: u32) -> Result<usize> {
    let new_len = len
        .checked_add(n)
        .ok_or(crate::Error::Overflow("sequence length"))?;
    let capacity = pages.saturating_mul(block_tokens as usize);
    if new_len > capacity {
        return Err(crate::Error::OutOfRange {
            what: "sequence length (past its block table)",
            index: new_len as u64,
            bound: capacity as u64 + 1,
        });
    }
    Ok(new_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise<T: SequenceTable>(t: &mut T) {
        assert_eq!(t.block_tokens(), 4);
        t.create(1).unwrap();
        assert_eq!(t.create(1), Err(Error::DuplicateSequence(1)));
        assert_eq!(t.push_page(2, PageId(0)), Err(Error::UnknownSequence(2)));
        assert!(t.advance(1, 1).is_err(), "no pages yet");
        t.push_page(1, PageId(5)).unwrap();
        t.advance(1, 3).unwrap();
        assert!(t.advance(1, 2).is_err());
        assert_eq!(t.len(1).unwrap(), 3, "failed advance changed nothing");
        assert_eq!(t.blocks_needed(1, 6).unwrap(), 2);
        t.advance(1, 1).unwrap();
        t.create(2).unwrap();
        assert_eq!(t.num_sequences(), 2);
        let mut freed = alloc::vec::Vec::new();
        t.remove(1, |p| freed.push(p)).unwrap();
        assert_eq!(freed, [PageId(5)]);
        assert_eq!(t.len(1), Err(Error::UnknownSequence(1)));
        assert_eq!(t.num_sequences(), 1);
    }

    fn windows<T: SequenceTable>(t: &mut T) {
        t.create(1).unwrap();
        let mut freed = alloc::vec::Vec::new();
        for p in 0..5 {
            t.push_page(1, PageId(p)).unwrap();
        }
        assert!(t.slide_window(1, 0, |_| ()).is_err());
        // Nothing leaves a window before the context reaches it.
        t.advance(1, 3).unwrap();
        assert_eq!(t.slide_window(1, 4, |p| freed.push(p)).unwrap(), 0);
        t.advance(1, 15).unwrap();
        // Position 18 sees 15..=18 with a window of 4: blocks 3 and 4.
        assert_eq!(t.slide_window(1, 4, |p| freed.push(p)).unwrap(), 3);
        assert_eq!(t.slide_window(1, 4, |p| freed.push(p)).unwrap(), 0);
        assert_eq!(freed, [PageId(0), PageId(1), PageId(2)]);
        assert_eq!(t.held_pages(1).unwrap(), 2);
        assert_eq!(
            t.blocks_needed(1, 2).unwrap(),
            0,
            "positions keep their blocks"
        );
        freed.clear();
        t.remove(1, |p| freed.push(p)).unwrap();
        assert_eq!(
            freed,
            [PageId(3), PageId(4)],
            "placeholders are not released"
        );
        assert_eq!(
            t.release_before(9, 1, |_| ()),
            Err(Error::UnknownSequence(9))
        );
    }

    #[test]
    fn both_tables_behave_alike() {
        exercise(&mut SequenceMap::new(4));
        exercise(&mut FixedSequenceMap::<4, 2>::new(4));
        windows(&mut SequenceMap::new(4));
        windows(&mut FixedSequenceMap::<4, 8>::new(4));
    }

    #[test]
    fn fixed_table_reports_capacity() {
        let mut t = FixedSequenceMap::<2, 1>::new(4);
        t.create(1).unwrap();
        t.create(2).unwrap();
        assert!(matches!(t.create(3), Err(Error::CapacityExhausted(_))));
        t.push_page(1, PageId(0)).unwrap();
        assert!(matches!(
            t.push_page(1, PageId(1)),
            Err(Error::CapacityExhausted(_))
        ));
        assert_eq!(t.block_table(1).unwrap(), &[PageId(0)]);
    }

    #[test]
    fn a_table_of_zero_token_blocks_needs_an_error_not_a_panic() {
        let mut t = SequenceMap::new(0);
        t.create(1).unwrap();
        assert!(matches!(t.blocks_needed(1, 1), Err(Error::InvalidValue(_))));
    }
}
