//! Heap-backed sequence table.

use alloc::vec::Vec;

use hashbrown::HashMap;

use super::{SeqId, SequenceTable, check_advance, release_pages};
use crate::error::{Error, Result};
use crate::page::PageId;

#[derive(Debug, Clone, Default)]
struct Entry {
    pages: Vec<PageId>,
    len: usize,
}

/// A growable sequence table on hashbrown. See [`SequenceTable`].
#[derive(Debug, Clone)]
pub struct SequenceMap {
    block_tokens: u32,
    seqs: HashMap<SeqId, Entry>,
}

impl SequenceMap {
    /// An empty table for pages of `block_tokens` tokens.
    pub fn new(block_tokens: u32) -> Self {
        Self {
            block_tokens,
            seqs: HashMap::new(),
        }
    }

    fn entry(&self, seq: SeqId) -> Result<&Entry> {
        self.seqs.get(&seq).ok_or(Error::UnknownSequence(seq))
    }

    fn entry_mut(&mut self, seq: SeqId) -> Result<&mut Entry> {
        self.seqs.get_mut(&seq).ok_or(Error::UnknownSequence(seq))
    }
}

impl SequenceTable for SequenceMap {
    fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    fn create(&mut self, seq: SeqId) -> Result<()> {
        match self.seqs.entry(seq) {
            hashbrown::hash_map::Entry::Occupied(_) => Err(Error::DuplicateSequence(seq)),
            hashbrown::hash_map::Entry::Vacant(v) => {
                v.insert(Entry::default());
                Ok(())
            }
        }
    }

    fn push_page(&mut self, seq: SeqId, page: PageId) -> Result<()> {
        self.entry_mut(seq)?.pages.push(page);
        Ok(())
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
        let e = self.seqs.remove(&seq).ok_or(Error::UnknownSequence(seq))?;
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
