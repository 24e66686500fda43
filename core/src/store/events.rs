//! The store's side of KV cache events: attaching a ring, emitting into
//! it, clearing, and a snapshot for a consumer that lost events.

use crossbeam_epoch::Guard;

use super::CacheStore;
use crate::error::Result;
use crate::events::{EventRing, KvEvent};
use crate::evict::EvictionPolicy;
use crate::page::PageId;
use crate::pool::{Life, PageHandle};

impl<'m, E: EvictionPolicy> CacheStore<'m, E> {
    /// The store, reporting every block it publishes and evicts into
    /// `ring` (see [`crate::events`]). Lookups report nothing; a full ring
    /// drops and counts.
    ///
    /// ```
    /// use kvslice_core::events::{EventRing, KvEvent, Medium};
    /// use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
    /// let store = CacheStore::new(layout, 1, LruPolicy::new(1))?
    ///     .with_events(EventRing::new(64, Medium::Gpu));
    /// let key = |i| SliceKey { block: BlockHash(i), block_index: 0, layer_group: 0, head_shard: 0 };
    /// let (guard, req) = (store.pin(), store.begin_request());
    /// for i in [7, 8] {
    ///     let page = store.allocate(1, &guard)?.pop().unwrap();
    ///     drop(store.publish(&req, page, key(i), None, 4, &guard)?);
    /// }
    /// store.end_request(req)?;
    /// let mut seen = Vec::new();
    /// store.events().unwrap().try_drain(&mut |_, e| seen.push(e));
    /// // One page: block 7 stored, evicted for block 8, block 8 stored.
    /// assert!(matches!(seen[..], [KvEvent::Stored { .. }, KvEvent::Removed { .. }, KvEvent::Stored { .. }]));
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_events(mut self, ring: EventRing) -> Self {
        self.events = Some(ring);
        self
    }

    /// The ring events go to, if one is attached: drain it from the thread
    /// that forwards them.
    pub fn events(&self) -> Option<&EventRing> {
        self.events.as_ref()
    }

    /// Pushes the event `make` builds, if a ring is attached.
    #[inline]
    pub(super) fn emit(&self, make: impl FnOnce() -> KvEvent) {
        if let Some(ring) = &self.events {
            ring.push(make());
        }
    }

    /// Evicts every cached page nobody references (each reported as
    /// removed) and, if that leaves the store without cached pages, reports
    /// [`KvEvent::Cleared`] and returns `true`. Referenced and
    /// [`Priority::Pinned`](crate::Priority::Pinned) pages stay, and then it
    /// returns `false`.
    pub fn clear(&self, guard: &Guard) -> Result<bool> {
        while self.evict(self.pool.capacity(), guard)? > 0 {}
        let empty = (0..self.pool.capacity()).all(
            |i| !matches!(self.pool.page_info(PageId(i)), Ok(info) if info.life == Life::Cached),
        );
        if empty {
            self.emit(|| KvEvent::Cleared);
        }
        Ok(empty)
    }

    /// Calls `f` with a [`KvEvent::Stored`] for every block cached now: what
    /// a consumer that lost events needs, after a [`KvEvent::Cleared`], to
    /// know the store again. Pages published or evicted meanwhile may or
    /// may not be in it; their own events follow in the ring.
    ///
    /// A page is in it while the map's entry for its key names it: a page
    /// mid-eviction too (the eviction may be undone, and if not, its
    /// `Removed` follows, since removals are reported after the entry
    /// goes), and never a key read while the page was refilled.
    pub fn snapshot(&self, f: &mut dyn FnMut(KvEvent)) {
        let local = self.map.collector().register();
        let guard = local.pin();
        for i in 0..self.pool.capacity() {
            let Ok(info) = self.pool.page_info(PageId(i)) else {
                continue;
            };
            if !matches!(info.life, Life::Cached | Life::Evicting) {
                continue;
            }
            let meta = self.meta(PageId(i));
            let key = meta.key();
            let page = PageHandle::from_parts(i, info.generation);
            if !matches!(self.map.get(&key, &guard), Ok(Some(h)) if h == page) {
                continue;
            }
            f(KvEvent::Stored {
                key,
                parent: meta.parent().map(|p| self.meta(p.id()).key().block),
                tokens: meta.valid_tokens(),
            });
        }
    }
}
