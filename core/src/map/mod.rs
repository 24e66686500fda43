//! The slice map: `SliceKey` → `PageHandle`, lock-free, epoch-reclaimed.
//!
//! A fixed array of cache-line buckets (twice the pool's capacity, rounded
//! up to a power of two, so it never resizes). Each bucket holds one entry
//! inline and a lock-free Harris–Michael overflow chain (`bucket.rs`,
//! `list.rs`), so most hits read one cache line and follow no pointer.
//! Readers never write; removed chain nodes are unlinked and handed to
//! crossbeam-epoch, which frees them once no pinned thread can still see
//! them, and a removed inline entry's slot is handed back the same way.
//! Every operation takes a [`Guard`] from the map's [`Collector`]:
//!
//! ```
//! use crossbeam_epoch::Collector;
//! use kvslice_core::{BlockHash, SliceKey, SliceMap};
//!
//! let map = SliceMap::with_collector(1024, Collector::new());
//! let local = map.collector().register(); // once per thread
//! let guard = local.pin();
//! let key = SliceKey { block: BlockHash(7), block_index: 0, layer_group: 0, head_shard: 0 };
//! # let pool = kvslice_core::PagePool::new(kvslice_core::KvLayout::new(kvslice_core::LayoutSpec::new(1,1,1,1,1,kvslice_core::KvDtype::F32))?, 1)?;
//! # let handle = pool.alloc()?.handle();
//! assert_eq!(map.insert(key, handle, &guard)?, None);
//! assert_eq!(map.get(&key, &guard)?, Some(handle));
//! assert_eq!(map.remove(&key, &guard)?, Some(handle));
//! # Ok::<(), kvslice_core::Error>(())
//! ```

mod bucket;
mod list;

use alloc::boxed::Box;
use alloc::vec::Vec;

use crossbeam_epoch::{Collector, Guard};

use self::bucket::{Bucket, Removed};
use crate::error::{Error, Result};
use crate::key::SliceKey;
use crate::pool::PageHandle;
use crate::sync::Arc;

/// A fixed-size, lock-free map from slice keys to page handles.
pub struct SliceMap {
    /// Shared with the closures that reclaim inline slots, which the
    /// collector may run after the map is gone: the table is freed with the
    /// last of them (on the default collector, that can be much later).
    table: Arc<Table>,
    collector: Collector,
}

struct Table {
    buckets: Box<[Bucket]>,
    mask: usize,
}

impl core::fmt::Debug for SliceMap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SliceMap")
            .field("buckets", &self.table.buckets.len())
            .finish()
    }
}

impl SliceMap {
    /// A map sized for `capacity` live entries (one per pool page), whose
    /// nodes are reclaimed through `collector`.
    pub fn with_collector(capacity: u32, collector: Collector) -> Self {
        let n = (capacity as usize)
            .max(1)
            .saturating_mul(2)
            .next_power_of_two();
        let buckets: Vec<Bucket> = (0..n).map(|_| Bucket::new()).collect();
        Self {
            table: Arc::new(Table {
                buckets: buckets.into_boxed_slice(),
                mask: n - 1,
            }),
            collector,
        }
    }

    /// A map on crossbeam-epoch's default collector, so that
    /// `crossbeam_epoch::pin()` gives guards for it.
    #[cfg(feature = "std")]
    pub fn new(capacity: u32) -> Self {
        Self::with_collector(capacity, crossbeam_epoch::default_collector().clone())
    }

    /// The collector guards must come from.
    pub fn collector(&self) -> &Collector {
        &self.collector
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.table.buckets.len()
    }

    /// The bucket `key` lives in (its inline slot or its overflow chain),
    /// for tests and diagnostics that need keys to collide.
    ///
    /// ```
    /// use kvslice_core::{BlockHash, SliceKey, SliceMap};
    ///
    /// let map = SliceMap::new(1); // two buckets
    /// let key = |i| SliceKey { block: BlockHash(i), block_index: 0, layer_group: 0, head_shard: 0 };
    /// let first = map.bucket_of(&key(0));
    /// let same = (1..).map(key).find(|k| map.bucket_of(k) == first).unwrap();
    /// assert!(map.bucket_of(&same) < map.buckets());
    /// ```
    pub fn bucket_of(&self, key: &SliceKey) -> usize {
        hash(key) as usize & self.table.mask
    }

    /// Errors unless `guard` is pinned on this map's collector.
    #[inline]
    pub(crate) fn check_guard(&self, guard: &Guard) -> Result<()> {
        if guard.collector() == Some(&self.collector) {
            Ok(())
        } else {
            Err(Error::InvalidValue(
                "guard is not pinned on this map's collector",
            ))
        }
    }

    #[inline]
    fn index(&self, key: &SliceKey, guard: &Guard) -> Result<usize> {
        self.check_guard(guard)?;
        Ok(self.bucket_of(key))
    }

    /// The handle stored for `key`. Read-only and allocation-free.
    #[inline]
    pub fn get(&self, key: &SliceKey, guard: &Guard) -> Result<Option<PageHandle>> {
        let i = self.index(key, guard)?;
        Ok(self.table.buckets[i].get(key, guard))
    }

    /// Stores `key → value` unless `key` is present; returns the present
    /// value in that case (and stores nothing).
    pub fn insert(
        &self,
        key: SliceKey,
        value: PageHandle,
        guard: &Guard,
    ) -> Result<Option<PageHandle>> {
        let i = self.index(&key, guard)?;
        Ok(self.table.buckets[i].insert(key, value, guard))
    }

    /// Removes `key`, returning its value.
    pub fn remove(&self, key: &SliceKey, guard: &Guard) -> Result<Option<PageHandle>> {
        self.remove_where(key, None, guard)
    }

    /// Removes `key` only if it maps to `expected`; returns whether it did.
    pub fn remove_if(&self, key: &SliceKey, expected: PageHandle, guard: &Guard) -> Result<bool> {
        Ok(self.remove_where(key, Some(expected), guard)?.is_some())
    }

    fn remove_where(
        &self,
        key: &SliceKey,
        expected: Option<PageHandle>,
        guard: &Guard,
    ) -> Result<Option<PageHandle>> {
        let i = self.index(key, guard)?;
        Ok(match self.table.buckets[i].remove(key, expected, guard) {
            Some(Removed::Inline(value)) => {
                // The slot is reusable once no thread that may have seen
                // the entry is still pinned.
                let table = Arc::clone(&self.table);
                guard.defer(move || table.buckets[i].reclaim());
                Some(value)
            }
            Some(Removed::Chained(value)) => Some(value),
            None => None,
        })
    }

    /// Entries and the longest bucket chain (counting nodes not yet
    /// unlinked): O(buckets), for tests and diagnostics.
    pub fn census(&self, guard: &Guard) -> Result<MapCensus> {
        self.check_guard(guard)?;
        let mut census = MapCensus::default();
        for b in self.table.buckets.iter() {
            let (inline, chained, nodes) = b.census(guard);
            census.entries += inline + chained;
            census.inline += inline;
            census.longest_chain = census.longest_chain.max(nodes);
        }
        Ok(census)
    }
}

/// What [`SliceMap::census`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapCensus {
    /// Live entries.
    pub entries: usize,
    /// Live entries held in their bucket's inline slot (the rest are
    /// chained, one pointer further away).
    pub inline: usize,
    /// Nodes in the longest overflow chain, including removed ones not yet
    /// unlinked.
    pub longest_chain: usize,
}

/// Bucket index bits for a key. The block hash is already a keyed PRF
/// output; the rest is mixed in and the whole finalised (splitmix64).
#[inline]
fn hash(key: &SliceKey) -> u64 {
    let b = key.block.0;
    let mut h = (b as u64) ^ ((b >> 64) as u64).rotate_left(29);
    h ^= (u64::from(key.layer_group) << 32 | u64::from(key.head_shard))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= u64::from(key.block_index).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
