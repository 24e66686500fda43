//! Prefix reuse under a sliding attention window: a cached prefix is usable
//! when the blocks the first uncomputed token's window needs are cached,
//! whatever happened to the blocks before them.

use alloc::vec::Vec;

use crossbeam_epoch::Guard;

use super::CacheStore;
use super::request::RequestTicket;
use super::stats::Count;
use crate::error::{Error, Result};
use crate::evict::{Access, EvictionPolicy};
use crate::key::SliceKey;
use crate::pool::PageRef;
use crate::store::fingerprint;

/// What [`CacheStore::lookup_window`] found: blocks `first..end` of the
/// keys are referenced (in order, appended to the caller's vector), the
/// tokens before block `end` need no compute, and blocks before `first`
/// are not needed (their block-table entries may be
/// [`PageId::PLACEHOLDER`](crate::PageId::PLACEHOLDER)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowHit {
    /// The first block referenced.
    pub first: usize,
    /// One past the last block referenced; zero when nothing is reused.
    pub end: usize,
}

impl<'m, E: EvictionPolicy> CacheStore<'m, E> {
    /// [`lookup_prefix`](Self::lookup_prefix) for a model that attends
    /// over a sliding window of `window` tokens (as vLLM's sliding-window
    /// manager does): finds the longest prefix of `keys` whose *last*
    /// blocks, those the first uncomputed token's window needs, are cached,
    /// and takes references on those blocks only. Blocks before them may
    /// be missing: a long conversation whose early pages were evicted
    /// still reuses its recent ones.
    ///
    /// Keys chain every block to all the tokens before it, so a cached
    /// block still names the same prefix. Lock-free like
    /// [`lookup_prefix`](Self::lookup_prefix): map reads from the end, then
    /// one reference per needed block; a needed block being evicted
    /// meanwhile shortens the hit. A window of zero is an error.
    ///
    /// Publish a windowed sequence's blocks without a parent: eviction
    /// takes leaves only, and a parent link would keep every early block of
    /// a long generation cached while its latest block is held.
    ///
    /// ```
    /// use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
    /// let store = CacheStore::new(layout, 8, LruPolicy::new(8))?;
    /// let keys: Vec<SliceKey> = (0..4)
    ///     .map(|i| SliceKey { block: BlockHash(100 + i as u128), block_index: i, layer_group: 0, head_shard: 0 })
    ///     .collect();
    /// let (guard, req) = (store.pin(), store.begin_request());
    /// // Only blocks 2 and 3 are cached (0 and 1 were evicted, say).
    /// let mut held = Vec::new();
    /// for (key, page) in keys[2..].iter().zip(store.allocate(2, &guard)?) {
    ///     held.push(store.publish(&req, page, *key, None, 4, &guard)?);
    /// }
    /// drop(held);
    /// let mut held = Vec::new();
    /// // A window of 5 tokens: token 16 needs keys 12..=15, block 3 only.
    /// let hit = store.lookup_window(&req, &keys, 16, 5, &guard, &mut held)?;
    /// assert_eq!((hit.first, hit.end, held.len()), (3, 4, 1));
    /// // Without a window the prefix stops at the missing block 0.
    /// held.clear();
    /// assert_eq!(store.lookup_prefix(&req, &keys, 16, &guard, &mut held)?, 0);
    /// # drop(held);
    /// # store.end_request(req)?;
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn lookup_window<'s>(
        &'s self,
        request: &RequestTicket,
        keys: &[SliceKey],
        total_tokens: usize,
        window: u32,
        guard: &Guard,
        out: &mut Vec<PageRef<'s, 'm>>,
    ) -> Result<WindowHit> {
        request.check(self.id())?;
        if window == 0 {
            return Err(Error::InvalidValue(
                "attention window must be at least one token",
            ));
        }
        let bt = self.layout().block_tokens() as usize;
        // The first block the token after `end` blocks attends to.
        let first_for = |end: usize| {
            let next = (end * bt).min(total_tokens);
            (next + 1).saturating_sub(window as usize) / bt
        };
        // From the end: the longest `end` whose needed blocks are all in
        // the map. `run_end` closes the run of present blocks being walked.
        let mut hit = WindowHit::default();
        let mut run_end = keys.len();
        for i in (0..keys.len()).rev() {
            if self.map.get(&keys[i], guard)?.is_none() {
                run_end = i;
            } else if run_end > i && i <= first_for(run_end) {
                hit = WindowHit {
                    first: first_for(run_end),
                    end: run_end,
                };
                break;
            }
        }
        // References, in order; a block lost since (evicted or being
        // filled) ends the hit there if the blocks before still serve.
        let serial = request.serial;
        let spread = keys.first().map_or(0, fingerprint);
        let start = out.len();
        let mut hit_tokens = 0u64;
        for (i, key) in keys.iter().enumerate().take(hit.end).skip(hit.first) {
            let page = match self.map.get(key, guard)? {
                Some(handle) => self.pool.try_acquire(handle).ok(),
                None => None,
            };
            let Some(page) = page else {
                hit.end = if first_for(i) >= hit.first { i } else { 0 };
                break;
            };
            let id = page.handle().id();
            hit_tokens += u64::from(self.meta(id).valid_tokens());
            out.push(page);
        }
        if hit.end == 0 {
            out.truncate(start);
            hit = WindowHit::default();
            hit_tokens = 0;
        } else {
            out.truncate(start + hit.end - hit.first);
        }
        let mut recorder = self.recorder();
        for (key, page) in keys[hit.first..hit.end].iter().zip(&out[start..]) {
            recorder.push(Access::Hit(self.event(page.handle().id(), key, serial)));
        }
        if let Some(key) = keys.get(hit.end) {
            recorder.push(Access::Miss {
                fingerprint: fingerprint(key),
                request: serial,
            });
        }
        drop(recorder);
        let computed = (hit.end * bt).min(total_tokens) as u64;
        self.stats.add(spread, Count::Lookups, 1);
        self.stats
            .add(spread, Count::HitBlocks, (hit.end - hit.first) as u64);
        self.stats
            .add(spread, Count::MissBlocks, (keys.len() - hit.end) as u64);
        self.stats.add(spread, Count::HitTokens, hit_tokens);
        self.stats.add(
            spread,
            Count::MissTokens,
            (total_tokens as u64).saturating_sub(computed),
        );
        Ok(hit)
    }
}
