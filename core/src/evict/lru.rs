//! Exact LRU over leaf pages, behind a spin lock.

use super::segments::{NIL, Segments};
use super::{EvictPass, EvictionPolicy, PageEvent};
use crate::page::PageId;
use crate::sync::SpinLock;

const LIST: usize = 0;

/// Least recently inserted-or-hit goes first. Every event takes the lock,
/// so this is the reference policy to compare against, not the fast one.
///
/// Only leaves are listed: a page that gains a cached child leaves the list
/// and comes back at the least-recent end when its last child goes (it was
/// used before its children, so that is its place). Eviction then never
/// walks past parents.
///
/// ```
/// use kvslice_core::{EvictPass, EvictionPolicy, LruPolicy, PageEvent, PageId};
///
/// let lru = LruPolicy::new(3);
/// let ev = |p| PageEvent { page: PageId(p), fingerprint: 0, block_index: 0, request: 0, partial: false };
/// (0..3).for_each(|p| lru.on_insert(ev(p)));
/// lru.on_access(ev(0));
/// assert_eq!(lru.evict_one(&mut |_, _| true), Some(PageId(1)));
/// assert_eq!(lru.evict_one(&mut |_, _| true), Some(PageId(2)));
/// ```
#[derive(Debug)]
pub struct LruPolicy {
    capacity: u32,
    list: SpinLock<Segments<1>>,
}

impl LruPolicy {
    /// A policy for pages `0..capacity`.
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity,
            list: SpinLock::new(Segments::new(capacity)),
        }
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn on_insert(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.list.lock().touch(event.page.0, LIST);
        }
    }

    /// Back where it was taken from, the least recent end: a failed
    /// `allocate` restores its victims newest first, which puts them back
    /// in their order.
    fn on_restore(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.list.lock().touch_back(event.page.0, LIST);
        }
    }

    fn on_access(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            let mut list = self.list.lock();
            if list.is_listed(event.page.0) {
                list.touch(event.page.0, LIST);
            }
        }
    }

    fn on_became_parent(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.list.lock().park(event.page.0);
        }
    }

    fn on_became_leaf(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.list.lock().unpark(event.page.0);
        }
    }

    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        let mut list = self.list.lock();
        for pass in [EvictPass::Normal, EvictPass::IncludeHigh] {
            let mut i = list.lru(LIST);
            while i != NIL {
                if try_evict(PageId(i), pass) {
                    list.remove(i);
                    return Some(PageId(i));
                }
                i = list.newer(i);
            }
        }
        None
    }
}
