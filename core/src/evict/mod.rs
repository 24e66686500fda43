//! Eviction policies: which cached page to give up when the pool is full.
//!
//! A policy only orders pages. The store decides whether a page *may* go:
//! [`EvictionPolicy::evict_one`] offers pages, in the policy's order, to a
//! `try_evict` callback, which succeeds only for a page that is cached,
//! unreferenced, unpinned and has no cached child block (so parents outlive
//! their children: leaf-first eviction), and which then owns the page. A
//! policy never frees anything itself.
//!
//! Shipped policies: [`ClockPolicy`] (lock-free second chance, an LRU
//! approximation), [`LruPolicy`] (exact LRU, serialised by a spin lock),
//! [`TinyLfuPolicy`] (adaptive W-TinyLFU), [`ChainPolicy`] (whole-chain
//! admission steered by observed return gaps) and [`DensityPolicy`] (leaves
//! ranked by return density learned per conversation turn count).

mod chain;
mod clock;
mod density;
mod lru;
mod read_buffer;
mod segments;
mod sketch;
mod tinylfu;

pub use chain::ChainPolicy;
pub use clock::ClockPolicy;
pub use density::DensityPolicy;
pub use lru::LruPolicy;
pub use read_buffer::{Access, ReadBuffer};
pub use tinylfu::TinyLfuPolicy;

use alloc::boxed::Box;

use crate::page::PageId;

/// The names [`by_name`] knows, `default` first.
pub const POLICY_NAMES: [&str; 6] = ["default", "density", "lru", "clock", "tinylfu", "chain"];

/// A policy chosen by name (for tools and the C ABI): `default` and
/// `density` are [`DensityPolicy`], the store's default; `lru`, `clock`,
/// `tinylfu` and `chain` the others. `None` for any other name.
///
/// ```
/// use kvslice_core::evict::{POLICY_NAMES, by_name};
/// use kvslice_core::EvictionPolicy;
///
/// assert_eq!(by_name("default", 64).unwrap().name(), "density");
/// assert!(by_name("fifo", 64).is_none());
/// assert!(POLICY_NAMES.iter().all(|n| by_name(n, 8).is_some()));
/// ```
pub fn by_name(name: &str, capacity: u32) -> Option<Box<dyn EvictionPolicy>> {
    Some(match name {
        "default" | "density" => Box::new(DensityPolicy::new(capacity)),
        "lru" => Box::new(LruPolicy::new(capacity)),
        "clock" => Box::new(ClockPolicy::new(capacity)),
        "tinylfu" => Box::new(TinyLfuPolicy::new(capacity)),
        "chain" => Box::new(ChainPolicy::new(capacity)),
        _ => return None,
    })
}

/// The slot of a key fingerprint in a direct-mapped ghost table of `len`
/// slots (a power of two): the top bits of a Fibonacci hash, which depend
/// on every bit of the fingerprint (a key's layer group and head shard sit
/// in its high bits; see `store::fingerprint`).
pub(crate) fn ghost_slot(fingerprint: u64, len: usize) -> usize {
    let bits = len.trailing_zeros();
    if bits == 0 {
        return 0;
    }
    (fingerprint.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
}

/// A page event with a fixed, distinct fingerprint per page (for tests).
#[cfg(test)]
pub(crate) fn test_event(page: u32, block_index: u32) -> PageEvent {
    PageEvent {
        page: PageId(page),
        fingerprint: u64::from(page).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1,
        block_index,
        request: 0,
        partial: false,
    }
}

/// What the store tells a policy about a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEvent {
    /// The page.
    pub page: PageId,
    /// A 64-bit fingerprint of the page's key, for policies that remember
    /// keys (frequency sketches, ghost lists).
    pub fingerprint: u64,
    /// The block's position in its sequence (its prefix depth).
    pub block_index: u32,
    /// The serial of the request that caused the event (see
    /// [`CacheStore::begin_request`](crate::CacheStore::begin_request));
    /// 0 for events no request caused (a parent becoming a leaf again).
    pub request: u64,
    /// The block holds fewer tokens than a full block: a sequence's
    /// unfinished tail, which the next turn of a conversation rewrites
    /// under another key.
    pub partial: bool,
}

/// Which pages a `try_evict` callback accepts on this offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictPass {
    /// Ordinary pages only; high-priority pages are refused.
    Normal,
    /// High-priority pages too (pinned pages never).
    IncludeHigh,
}

/// An eviction order over a store's pages. Shared by all threads.
pub trait EvictionPolicy: Send + Sync {
    /// A short name, for reports.
    fn name(&self) -> &'static str;

    /// How many pages the policy can track (at least the pool's capacity).
    fn capacity(&self) -> u32;

    /// `event.page` was published and can now be evicted.
    fn on_insert(&self, event: PageEvent);

    /// A key with this fingerprint is about to be inserted: a policy
    /// whose bookkeeping reads memory chosen by the key may start that
    /// read now, so that its cache miss overlaps the store's own work
    /// before [`on_insert`](Self::on_insert) or
    /// [`on_insert_child`](Self::on_insert_child). A hint: it must not change
    /// what the policy decides. Does nothing by default.
    fn prefetch(&self, fingerprint: u64) {
        let _ = fingerprint;
    }

    /// `event.page` was published as the child of `parent`;
    /// `extends_leaf` says `parent` had no cached child before, so this
    /// continues a chain rather than branching off it. Defaults to
    /// [`on_insert`](Self::on_insert).
    fn on_insert_child(&self, event: PageEvent, parent: PageId, extends_leaf: bool) {
        let _ = (parent, extends_leaf);
        self.on_insert(event);
    }

    /// `event.page`, which [`evict_one`](Self::evict_one) returned, stays
    /// cached after all (the store could not find enough pages and put
    /// back the ones it had taken, newest first). Policies that learn from
    /// inserts should not count this as one, and should put it back where
    /// it would be evicted from (every policy here does). Defaults to
    /// [`on_insert`](Self::on_insert).
    fn on_restore(&self, event: PageEvent) {
        self.on_insert(event);
    }

    /// `event.page` was hit by a lookup.
    fn on_access(&self, event: PageEvent);

    /// A lookup of `request` missed a key with this fingerprint (for
    /// admission policies; ignored by default).
    fn on_miss(&self, fingerprint: u64, request: u64) {
        let _ = (fingerprint, request);
    }

    /// `request` ended: no more accesses or inserts will name it (ignored
    /// by default).
    fn on_request_end(&self, request: u64) {
        let _ = request;
    }

    /// Whether the store should record this policy's accesses (hits,
    /// misses, request ends) into a lossy [`ReadBuffer`] and hand them over
    /// in batches through [`on_accesses`](Self::on_accesses) before the
    /// next insert or eviction, instead of calling it on every hit. A
    /// policy that takes a lock per access should say yes; one whose
    /// accesses are a lock-free store (clock) or that needs exact order
    /// (LRU) says no, the default. A buffered policy must tolerate stale
    /// and lost accesses: a drained hit may name a page that has since been
    /// evicted and refilled under another key (compare the fingerprint).
    fn buffers_accesses(&self) -> bool {
        false
    }

    /// A batch of recorded accesses, oldest first per request. Defaults to
    /// one call of [`on_access`](Self::on_access),
    /// [`on_miss`](Self::on_miss) or [`on_request_end`](Self::on_request_end)
    /// each; buffered policies override it to take their lock once.
    fn on_accesses(&self, batch: &[Access]) {
        for a in batch {
            match *a {
                Access::Hit(e) => self.on_access(e),
                Access::Miss {
                    fingerprint,
                    request,
                } => self.on_miss(fingerprint, request),
                Access::End { request } => self.on_request_end(request),
            }
        }
    }

    /// `event.page` gained its first cached child, so the store will not
    /// evict it until that child goes. A hint: policies may stop offering
    /// it (ignored by default).
    fn on_became_parent(&self, event: PageEvent) {
        let _ = event;
    }

    /// `event.page` lost its last cached child and can be evicted again. Its
    /// last use is older than its children's, so under recency it is next in
    /// line (ignored by default). It may come more than once for one page,
    /// or for a page this policy already gave up from `evict_one`: both
    /// must change nothing.
    fn on_became_leaf(&self, event: PageEvent) {
        let _ = event;
    }

    /// Offers pages to `try_evict` in eviction order until it accepts one,
    /// forgets that page and returns it; `None` if no tracked page is
    /// accepted. Must offer every tracked page with
    /// [`EvictPass::IncludeHigh`] before giving up.
    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId>;
}

impl<P: EvictionPolicy + ?Sized> EvictionPolicy for Box<P> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn capacity(&self) -> u32 {
        (**self).capacity()
    }
    fn on_insert(&self, event: PageEvent) {
        (**self).on_insert(event)
    }
    fn prefetch(&self, fingerprint: u64) {
        (**self).prefetch(fingerprint)
    }
    fn on_insert_child(&self, event: PageEvent, parent: PageId, extends_leaf: bool) {
        (**self).on_insert_child(event, parent, extends_leaf)
    }
    fn on_restore(&self, event: PageEvent) {
        (**self).on_restore(event)
    }
    fn on_access(&self, event: PageEvent) {
        (**self).on_access(event)
    }
    fn on_miss(&self, fingerprint: u64, request: u64) {
        (**self).on_miss(fingerprint, request)
    }
    fn on_request_end(&self, request: u64) {
        (**self).on_request_end(request)
    }
    fn buffers_accesses(&self) -> bool {
        (**self).buffers_accesses()
    }
    fn on_accesses(&self, batch: &[Access]) {
        (**self).on_accesses(batch)
    }
    fn on_became_parent(&self, event: PageEvent) {
        (**self).on_became_parent(event)
    }
    fn on_became_leaf(&self, event: PageEvent) {
        (**self).on_became_leaf(event)
    }
    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        (**self).evict_one(try_evict)
    }
}

#[cfg(test)]
mod tests {
    use super::ghost_slot;

    /// Fingerprints that differ only in the bits where a key's layer group
    /// (bit 40 up) or head shard (bit 20 up) sit land in different slots.
    #[test]
    fn ghost_slots_use_every_fingerprint_bit() {
        for len in [1usize << 16, 1 << 20] {
            let base = 0x1234_5678_9abc_def1u64;
            let mut slots: alloc::vec::Vec<usize> = (0..64u64)
                .map(|g| ghost_slot(base ^ (g << 40), len))
                .chain((0..64u64).map(|s| ghost_slot(base ^ (s << 20) ^ (1 << 63), len)))
                .collect();
            assert!(slots.iter().all(|&s| s < len));
            slots.sort_unstable();
            slots.dedup();
            assert!(slots.len() > 120, "{} distinct slots of 128", slots.len());
        }
        assert_eq!(ghost_slot(u64::MAX, 1), 0);
    }
}
