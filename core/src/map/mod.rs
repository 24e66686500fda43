//! The slice map: `SliceKey` → `PageHandle`, lock-free, epoch-reclaimed.
//!
//! A fixed array of buckets (twice the pool's capacity, rounded up to a
//! power of two, so it never resizes), each a lock-free Harris–Michael list
//! (`list.rs`). Readers never write; removed nodes are unlinked and handed
//! to crossbeam-epoch, which frees them once no pinned thread can still see
//! them. Every operation takes a [`Guard`] from the map's [`Collector`]:
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

mod list;

use alloc::boxed::Box;
use alloc::vec::Vec;

use crossbeam_epoch::{Atomic, Collector, Guard};

use self::list::Bucket;
use crate::error::{Error, Result};
use crate::key::SliceKey;
use crate::pool::PageHandle;

/// A fixed-size, lock-free map from slice keys to page handles.
pub struct SliceMap {
    buckets: Box<[Bucket]>,
    mask: usize,
    collector: Collector,
}

impl core::fmt::Debug for SliceMap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SliceMap")
            .field("buckets", &self.buckets.len())
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
        let buckets: Vec<Bucket> = (0..n)
            .map(|_| Bucket {
                head: Atomic::null(),
            })
            .collect();
        Self {
            buckets: buckets.into_boxed_slice(),
            mask: n - 1,
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
        self.buckets.len()
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
    fn bucket(&self, key: &SliceKey, guard: &Guard) -> Result<&Bucket> {
        self.check_guard(guard)?;
        Ok(&self.buckets[hash(key) as usize & self.mask])
    }

    /// The handle stored for `key`. Read-only and allocation-free.
    #[inline]
    pub fn get(&self, key: &SliceKey, guard: &Guard) -> Result<Option<PageHandle>> {
        Ok(self.bucket(key, guard)?.get(key, guard))
    }

    /// Stores `key → value` unless `key` is present; returns the present
    /// value in that case (and stores nothing).
    pub fn insert(
        &self,
        key: SliceKey,
        value: PageHandle,
        guard: &Guard,
    ) -> Result<Option<PageHandle>> {
        Ok(self.bucket(&key, guard)?.insert(key, value, guard))
    }

    /// Removes `key`, returning its value.
    pub fn remove(&self, key: &SliceKey, guard: &Guard) -> Result<Option<PageHandle>> {
        Ok(self.bucket(key, guard)?.remove(key, None, guard))
    }

    /// Removes `key` only if it maps to `expected`; returns whether it did.
    pub fn remove_if(&self, key: &SliceKey, expected: PageHandle, guard: &Guard) -> Result<bool> {
        Ok(self
            .bucket(key, guard)?
            .remove(key, Some(expected), guard)
            .is_some())
    }

    /// Entries and the longest bucket chain (counting nodes not yet
    /// unlinked): O(buckets), for tests and diagnostics.
    pub fn census(&self, guard: &Guard) -> Result<MapCensus> {
        self.check_guard(guard)?;
        let mut census = MapCensus::default();
        for b in self.buckets.iter() {
            let (live, chain) = b.census(guard);
            census.entries += live;
            census.longest_chain = census.longest_chain.max(chain);
        }
        Ok(census)
    }
}

/// What [`SliceMap::census`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapCensus {
    /// Live entries.
    pub entries: usize,
    /// Nodes in the longest bucket, including removed ones not yet unlinked.
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

impl Drop for SliceMap {
    fn drop(&mut self) {
        for b in self.buckets.iter_mut() {
            b.free_all();
        }
    }
}
