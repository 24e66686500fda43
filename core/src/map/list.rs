//! One bucket: a lock-free Harris–Michael linked list, unsorted, new nodes
//! pushed at the head.
//!
//! Removal first *marks* a node (tag bit 1 on its `next` pointer), which
//! removes it logically and freezes its `next`; then some thread *unlinks*
//! it with a CAS on its predecessor's `next`. Only the thread whose unlink
//! CAS succeeds hands the node to the epoch collector, so each node is
//! destroyed once, after every thread that could have seen it unpins.
//!
//! Insert-if-absent snapshots the head, scans, and CASes the head from the
//! snapshot: any insert of the same key after the snapshot would have moved
//! the head, so the CAS fails and the insert retries.

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use crate::key::SliceKey;
use crate::pool::PageHandle;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};

pub(super) struct Node {
    key: SliceKey,
    value: PageHandle,
    next: Atomic<Node>,
    /// Under loom, a tracked allocation: a node never freed fails the model.
    #[cfg(kvslice_loom)]
    _track: loom::alloc::Track<()>,
}

pub(super) struct Bucket {
    pub(super) head: Atomic<Node>,
}

/// The node `ptr` points to.
///
/// # Safety
/// `ptr` must have been loaded from a bucket's list under `guard`: list
/// nodes are destroyed only through `defer_destroy` after being unlinked,
/// so anything reachable while `guard` is pinned stays allocated until the
/// guard goes.
unsafe fn deref<'g>(ptr: Shared<'g, Node>, _guard: &'g Guard) -> Option<&'g Node> {
    // SAFETY: see the function's contract.
    unsafe { ptr.as_ref() }
}

impl Bucket {
    /// Finds the first unmarked node with `key`, unlinking marked nodes on
    /// the way. Returns the link that points at it and the node (null if
    /// absent).
    fn find<'g>(
        &'g self,
        key: &SliceKey,
        guard: &'g Guard,
    ) -> (&'g Atomic<Node>, Shared<'g, Node>) {
        'retry: loop {
            let mut prev = &self.head;
            let mut curr = prev.load(Acquire, guard);
            loop {
                // SAFETY: `curr` came from this list under `guard`.
                let Some(node) = (unsafe { deref(curr, guard) }) else {
                    return (prev, curr);
                };
                let next = node.next.load(Acquire, guard);
                if next.tag() == 1 {
                    // `node` is removed: unlink it, or start over if `prev`
                    // changed (it was itself removed, or someone unlinked).
                    match prev.compare_exchange(curr, next.with_tag(0), AcqRel, Acquire, guard) {
                        Ok(_) => {
                            // SAFETY: our CAS unlinked `curr`, so no new
                            // reference to it can be made; existing ones are
                            // protected by their threads' guards.
                            unsafe { guard.defer_destroy(curr) };
                            curr = next.with_tag(0);
                            continue;
                        }
                        Err(_) => continue 'retry,
                    }
                }
                if node.key == *key {
                    return (prev, curr);
                }
                prev = &node.next;
                curr = next;
            }
        }
    }

    /// The value of an unmarked node with `key`. Writes nothing.
    #[inline]
    pub(super) fn get(&self, key: &SliceKey, guard: &Guard) -> Option<PageHandle> {
        let mut curr = self.head.load(Acquire, guard);
        // SAFETY: every pointer followed was loaded from this list under
        // `guard`.
        while let Some(node) = unsafe { deref(curr, guard) } {
            let next = node.next.load(Acquire, guard);
            if node.key == *key && next.tag() == 0 {
                return Some(node.value);
            }
            curr = next.with_tag(0);
        }
        None
    }

    pub(super) fn insert(
        &self,
        key: SliceKey,
        value: PageHandle,
        guard: &Guard,
    ) -> Option<PageHandle> {
        let mut node = Owned::new(Node {
            key,
            value,
            next: Atomic::null(),
            #[cfg(kvslice_loom)]
            _track: loom::alloc::Track::new(()),
        });
        loop {
            let head = self.head.load(Acquire, guard);
            let (_, found) = self.find(&key, guard);
            // SAFETY: `found` came from this list under `guard`.
            if let Some(existing) = unsafe { deref(found, guard) } {
                return Some(existing.value);
            }
            node.next.store(head, Relaxed);
            match self
                .head
                .compare_exchange(head, node, AcqRel, Acquire, guard)
            {
                Ok(_) => return None,
                Err(e) => node = e.new,
            }
        }
    }

    /// Removes the node with `key` (if its value is `expected`, when given).
    pub(super) fn remove(
        &self,
        key: &SliceKey,
        expected: Option<PageHandle>,
        guard: &Guard,
    ) -> Option<PageHandle> {
        loop {
            let (prev, curr) = self.find(key, guard);
            // SAFETY: `curr` came from this list under `guard`.
            let node = unsafe { deref(curr, guard) }?;
            if expected.is_some_and(|e| e != node.value) {
                return None;
            }
            let next = node.next.load(Acquire, guard);
            if next.tag() == 1 {
                continue; // someone else is removing it; look again
            }
            if node
                .next
                .compare_exchange(next, next.with_tag(1), AcqRel, Acquire, guard)
                .is_err()
            {
                continue;
            }
            // Logically removed by us. Unlink now, or let `find` do it.
            match prev.compare_exchange(curr, next, AcqRel, Acquire, guard) {
                // SAFETY: our CAS unlinked `curr`; see `find`.
                Ok(_) => unsafe { guard.defer_destroy(curr) },
                Err(_) => drop(self.find(key, guard)),
            }
            return Some(node.value);
        }
    }

    /// (live entries, nodes in the chain).
    pub(super) fn census(&self, guard: &Guard) -> (usize, usize) {
        let (mut live, mut chain) = (0, 0);
        let mut curr = self.head.load(Acquire, guard);
        // SAFETY: as in `get`.
        while let Some(node) = unsafe { deref(curr, guard) } {
            let next = node.next.load(Acquire, guard);
            chain += 1;
            live += usize::from(next.tag() == 0);
            curr = next.with_tag(0);
        }
        (live, chain)
    }

    /// Frees every node; the map is being dropped, so no thread can hold a
    /// reference into it.
    pub(super) fn free_all(&mut self) {
        // SAFETY: `&mut self` (from the map's `Drop`) means no other thread
        // can access the list, so an unprotected guard is enough, and each
        // node is freed exactly once as we walk past it.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let mut curr = self.head.load(Relaxed, guard);
            while !curr.is_null() {
                let next = curr.deref().next.load(Relaxed, guard);
                drop(curr.into_owned());
                curr = next.with_tag(0);
            }
        }
    }
}
