//! Fixed-capacity sequence table for runtimes without an allocator.

use heapless::Vec;
use heapless::index_map::FnvIndexMap;

use super::{SeqId, SequenceTable, check_advance, release_pages};
use crate::error::{Error, Result};
use crate::page::PageId;

#[derive(Debug, Clone, Default)]
struct Entry<const BLOCKS: usize> {
    pages: Vec<PageId, BLOCKS>,
    len: usize,
}

/// At most `SEQS` sequences (a power of two) of at most `BLOCKS` pages
/// each, stored inline. See [`SequenceTable`].
///
/// ```
/// use kvslice_core::{FixedSequenceMap, PageId, SequenceTable};
///
/// let mut seqs = FixedSequenceMap::<8, 4>::new(16);
/// seqs.create(1)?;
/// seqs.push_page(1, PageId(0))?;
/// seqs.advance(1, 16)?;
/// assert!(seqs.advance(1, 1).is_err());
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct FixedSequenceMap<const SEQS: usize, const BLOCKS: usize> {
    block_tokens: u32,
    seqs: FnvIndexMap<SeqId, Entry<BLOCKS>, SEQS>,
}

impl<const SEQS: usize, const BLOCKS: usize> FixedSequenceMap<SEQS, BLOCKS> {
    /// An empty table for pages of `block_tokens` tokens.
    pub fn new(block_tokens: u32) -> Self {
        Self {
            block_tokens,
            seqs: FnvIndexMap::new(),
        }
    }

    fn entry(&self, seq: SeqId) -> Result<&Entry<BLOCKS>> {
        self.seqs.get(&seq).ok_or(Error::UnknownSequence(seq))
    }

    fn entry_mut(&mut self, seq: SeqId) -> Result<&mut Entry<BLOCKS>> {
        self.seqs.get_mut(&seq).ok_or(Error::UnknownSequence(seq))
    }
}

impl<const SEQS: usize, const BLOCKS: usize> SequenceTable for FixedSequenceMap<SEQS, BLOCKS> {
    fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    fn create(&mut self, seq: SeqId) -> Result<()> {
        if self.seqs.contains_key(&seq) {
            return Err(Error::DuplicateSequence(seq));
        }
        self.seqs
            .insert(seq, Entry::default())
            .map_err(|_| Error::CapacityExhausted("sequence table"))?;
        Ok(())
    }

    fn push_page(&mut self, seq: SeqId, page: PageId) -> Result<()> {
        self.entry_mut(seq)?
            .pages
            .push(page)
            .map_err(|_| Error::CapacityExhausted("block table of a fixed sequence map"))
    }

    fn advance(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let bt = self.block_tokens;
        let e = self.entry_mut(seq)?;
        e.len = check_advance(e.len, n, e.pages.len(), bt)?;
        Ok(())
    }

    fn len(&self, seq: SeqId) -> Result<usize> {
        Ok(self.entry(seq)?.len)
    }

    fn block_table(&self, seq: SeqId) -> Result<&[PageId]> {
        Ok(&self.entry(seq)?.pages)
    }

    fn remove(&mut self, seq: SeqId, release: impl FnMut(PageId)) -> Result<()> {
        let e = self
            .seqs
            .swap_remove(&seq)
            .ok_or(Error::UnknownSequence(seq))?;
        e.pages
            .into_iter()
            .filter(|p| *p != PageId::PLACEHOLDER)
            .for_each(release);
        Ok(())
    }

    fn release_before(
        &mut self,
        seq: SeqId,
        block: usize,
        release: impl FnMut(PageId),
    ) -> Result<usize> {
        Ok(release_pages(
            &mut self.entry_mut(seq)?.pages,
            block,
            release,
        ))
    }

    fn num_sequences(&self) -> usize {
        self.seqs.len()
    }
}
