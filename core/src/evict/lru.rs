//! Exact LRU: a doubly linked list over page indices behind a spin lock.

use alloc::vec;
use alloc::vec::Vec;

use super::{EvictPass, EvictionPolicy, PageEvent};
use crate::page::PageId;
use crate::sync::SpinLock;

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct List {
    prev: Vec<u32>,
    next: Vec<u32>,
    present: Vec<bool>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
}

impl List {
    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.prev[i as usize], self.next[i as usize]);
        if p == NIL {
            self.head = n
        } else {
            self.next[p as usize] = n
        }
        if n == NIL {
            self.tail = p
        } else {
            self.prev[n as usize] = p
        }
        self.present[i as usize] = false;
    }

    fn push_back(&mut self, i: u32) {
        self.next[i as usize] = NIL;
        self.prev[i as usize] = self.tail;
        if self.tail == NIL {
            self.head = i
        } else {
            self.next[self.tail as usize] = i
        }
        self.tail = i;
        self.present[i as usize] = true;
    }

    fn push_front(&mut self, i: u32) {
        self.prev[i as usize] = NIL;
        self.next[i as usize] = self.head;
        if self.head == NIL {
            self.tail = i
        } else {
            self.prev[self.head as usize] = i
        }
        self.head = i;
        self.present[i as usize] = true;
    }
}

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
/// let ev = |p| PageEvent { page: PageId(p), fingerprint: 0, block_index: 0 };
/// (0..3).for_each(|p| lru.on_insert(ev(p)));
/// lru.on_access(ev(0));
/// assert_eq!(lru.evict_one(&mut |_, _| true), Some(PageId(1)));
/// assert_eq!(lru.evict_one(&mut |_, _| true), Some(PageId(2)));
/// ```
#[derive(Debug)]
pub struct LruPolicy {
    capacity: u32,
    list: SpinLock<List>,
}

impl LruPolicy {
    /// A policy for pages `0..capacity`.
    pub fn new(capacity: u32) -> Self {
        let n = capacity as usize;
        Self {
            capacity,
            list: SpinLock::new(List {
                prev: vec![NIL; n],
                next: vec![NIL; n],
                present: vec![false; n],
                head: NIL,
                tail: NIL,
            }),
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
        let i = event.page.0;
        if i >= self.capacity {
            return;
        }
        let mut list = self.list.lock();
        if list.present[i as usize] {
            list.unlink(i);
        }
        list.push_front(i);
    }

    fn on_access(&self, event: PageEvent) {
        let i = event.page.0;
        if i >= self.capacity {
            return;
        }
        let mut list = self.list.lock();
        if list.present[i as usize] {
            list.unlink(i);
            list.push_front(i);
        }
    }

    fn on_became_parent(&self, event: PageEvent) {
        let i = event.page.0;
        if i < self.capacity {
            let mut list = self.list.lock();
            if list.present[i as usize] {
                list.unlink(i);
            }
        }
    }

    fn on_became_leaf(&self, event: PageEvent) {
        let i = event.page.0;
        if i < self.capacity {
            let mut list = self.list.lock();
            if !list.present[i as usize] {
                list.push_back(i);
            }
        }
    }

    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        let mut list = self.list.lock();
        for pass in [EvictPass::Normal, EvictPass::IncludeHigh] {
            let mut i = list.tail;
            while i != NIL {
                if try_evict(PageId(i), pass) {
                    list.unlink(i);
                    return Some(PageId(i));
                }
                i = list.prev[i as usize];
            }
        }
        None
    }
}
