//! Where evicted blocks go: a lower tier the store hands each evicted
//! block's bytes to, before its page is reused.

use alloc::boxed::Box;

use super::CacheStore;
use crate::error::{Error, Result};
use crate::evict::EvictionPolicy;
use crate::key::SliceKey;
use crate::layout::KvLayout;
use crate::pool::PageRef;

/// Receives the bytes of every published block the store evicts, on the
/// evicting thread, while the page is still the block's and nobody else's.
/// It must not block: copy what it needs and return (a tier queues the
/// copy and writes it out on its own thread, dropping it when the queue is
/// full).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey, SpillSink};
///
/// struct Keep(Arc<Mutex<Vec<(SliceKey, u32, Vec<u8>)>>>);
/// impl SpillSink for Keep {
///     fn evicted(&self, key: &SliceKey, valid_tokens: u32, page: &[u8]) {
///         self.0.lock().unwrap().push((*key, valid_tokens, page.to_vec()));
///     }
/// }
///
/// let kept = Arc::new(Mutex::new(Vec::new()));
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
/// let store = CacheStore::new(layout, 1, LruPolicy::new(1))?.with_spill(Box::new(Keep(kept.clone())))?;
/// let key = |i| SliceKey { block: BlockHash(i), block_index: 0, layer_group: 0, head_shard: 0 };
/// let (guard, req) = (store.pin(), store.begin_request());
/// for i in [7, 8] {
///     let mut page = store.allocate(1, &guard)?.pop().unwrap();
///     page.bytes_mut().fill(i as u8);
///     drop(store.publish(&req, page, key(i), None, 3, &guard)?);
/// }
/// // One page: block 7 was evicted for block 8, with its bytes.
/// let kept = kept.lock().unwrap();
/// assert_eq!((kept[0].0, kept[0].1), (key(7), 3));
/// assert!(kept[0].2.iter().all(|&b| b == 7));
/// # store.end_request(req)?;
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub trait SpillSink: Send + Sync {
    /// Block `key`, holding `valid_tokens` tokens, is being evicted; `page`
    /// is its bytes.
    fn evicted(&self, key: &SliceKey, valid_tokens: u32, page: &[u8]);

    /// The page layout the sink labels what it keeps with, if it labels
    /// anything: [`CacheStore::with_spill`] refuses a sink of another
    /// layout, which would keep this store's pages as pages of its own
    /// (two layouts may share a page size, f16 and bf16 pages do). `None`,
    /// the default, for a sink that keeps bytes as they are.
    fn layout(&self) -> Option<&KvLayout> {
        None
    }
}

/// A spill sink [`CacheStore::with_spill`] refused: the store and the sink
/// as they were, and why. `?` into [`Error`] keeps only the error (and
/// drops both); into `Box<dyn std::error::Error>` it keeps this whole
/// value, so downcast to `SpillRefused`, not to [`Error`].
#[non_exhaustive]
pub struct SpillRefused<'m, E: EvictionPolicy> {
    /// The store, without a sink.
    pub store: CacheStore<'m, E>,
    /// The sink it refused.
    pub sink: Box<dyn SpillSink>,
    /// [`Error::InvalidLayout`].
    pub error: Error,
}

impl<E: EvictionPolicy> core::fmt::Debug for SpillRefused<'_, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SpillRefused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<E: EvictionPolicy> core::fmt::Display for SpillRefused<'_, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "spill sink refused: {}", self.error)
    }
}

impl<E: EvictionPolicy> core::error::Error for SpillRefused<'_, E> {}

impl<E: EvictionPolicy> From<SpillRefused<'_, E>> for Error {
    fn from(refused: SpillRefused<'_, E>) -> Self {
        refused.error
    }
}

impl<'m, E: EvictionPolicy> CacheStore<'m, E> {
    /// The store, handing every published block it evicts to `sink` first
    /// (see [`SpillSink`]). Blocks whose entry another publisher replaced
    /// are not handed over: the key is still cached. Refuses a sink of
    /// another page layout (one whose pages mean something else: another
    /// fingerprint or size) with [`SpillRefused`], which hands back the
    /// store and the sink as they were; `?` into [`Error`] turns it into
    /// its [`Error::InvalidLayout`].
    ///
    /// ```
    /// use kvslice_core::{CacheStore, Error, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey, SpillSink};
    ///
    /// struct Labelled(KvLayout);
    /// impl SpillSink for Labelled {
    ///     fn evicted(&self, _: &SliceKey, _: u32, _: &[u8]) {}
    ///     fn layout(&self) -> Option<&KvLayout> {
    ///         Some(&self.0)
    ///     }
    /// }
    ///
    /// let f16 = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F16))?;
    /// let bf16 = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::Bf16))?;
    /// let store = CacheStore::new(f16, 4, LruPolicy::new(4))?;
    /// // Same page size, other pages: refused, and nothing is lost.
    /// let refused = store.with_spill(Box::new(Labelled(bf16))).unwrap_err();
    /// assert!(matches!(refused.error, Error::InvalidLayout(_)));
    /// let store = refused.store.with_spill(Box::new(Labelled(f16)))?;
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    #[allow(
        clippy::result_large_err,
        reason = "the error holds the store, as large as the Ok variant"
    )]
    pub fn with_spill(
        mut self,
        sink: Box<dyn SpillSink>,
    ) -> core::result::Result<Self, SpillRefused<'m, E>> {
        if sink.layout().is_some_and(|l| !l.same_pages(self.layout())) {
            return Err(SpillRefused {
                store: self,
                sink,
                error: Error::InvalidLayout("a spill sink that labels pages with another layout"),
            });
        }
        self.spill = Some(sink);
        Ok(self)
    }

    /// How many tokens of its block `page` holds (what it was published
    /// with).
    pub fn valid_tokens(&self, page: &PageRef<'_, 'm>) -> Result<u32> {
        self.check_ours(page.pool(), "page from another store")?;
        Ok(self.meta(page.handle().id()).valid_tokens())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyOrder, KvDtype, LayerGrouping, LayoutSpec, LruPolicy};

    /// A sink that labels pages with `0`'s layout and keeps nothing.
    struct Labelled(KvLayout);

    impl SpillSink for Labelled {
        fn evicted(&self, _: &SliceKey, _: u32, _: &[u8]) {}
        fn layout(&self) -> Option<&KvLayout> {
            Some(&self.0)
        }
    }

    /// A sink of another layout whose pages are the same size is refused;
    /// one whose pages mean the same (two spellings of one grouping) or
    /// that labels nothing is taken.
    #[test]
    fn a_sink_of_another_layout_is_refused() {
        let spec = LayoutSpec::new(2, 2, 2, 8, 4, KvDtype::F16);
        let layout = KvLayout::new(spec).unwrap();
        // On a collector of its own: the default one's handles outlive
        // the test, which Miri reports as leaks.
        let store = || {
            let pool = crate::PagePool::new(layout, 2).unwrap();
            CacheStore::from_parts(pool, LruPolicy::new(2), crossbeam_epoch::Collector::new())
                .unwrap()
        };
        let others = [
            spec.with_key_order(KeyOrder::DimMajor),
            LayoutSpec::new(2, 2, 2, 8, 4, KvDtype::Bf16),
        ];
        for other in others.map(|s| KvLayout::new(s).unwrap()) {
            assert_eq!(other.page_bytes(), layout.page_bytes());
            let refused = store().with_spill(Box::new(Labelled(other))).unwrap_err();
            assert!(matches!(refused.error, Error::InvalidLayout(_)));
            // Handed back as they were: the store without a sink, the sink
            // with its layout.
            assert!(refused.store.spill.is_none());
            assert_eq!(refused.sink.layout(), Some(&other));
        }
        let respelled = KvLayout::new(spec.with_grouping(LayerGrouping::Groups(2))).unwrap();
        assert!(store().with_spill(Box::new(Labelled(respelled))).is_ok());
        assert!(store().with_spill(Box::new(Labelled(layout))).is_ok());
    }
}
