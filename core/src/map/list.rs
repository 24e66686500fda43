//! A bucket's overflow chain: a lock-free Harris–Michael linked list,
//! unsorted, new nodes pushed at the head.
//!
//! Removal first *marks* a node (tag bit 1 on its `next` pointer), which
//! removes it logically and freezes its `next`; then some thread *unlinks*
//! it with a CAS on its predecessor's link. Only the thread whose unlink
//! CAS succeeds hands the node to the epoch collector, so each node is
//! destroyed once, after every thread that could have seen it unpins.
//!
//! The head link is the bucket's control word, whose tag is the state of
//! the bucket's inline slot (`bucket.rs`), not a mark: every CAS on a link
//! keeps the tag it read there, so unlinking the first node never changes
//! the inline slot's state, and fails (and retries) if that state moved.

use crossbeam_epoch::{Atomic, Guard, Shared};

use crate::key::SliceKey;
use crate::pool::PageHandle;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};

pub(super) struct Node {
    pub(super) key: SliceKey,
    pub(super) value: PageHandle,
    pub(super) next: Atomic<Node>,
    /// Under loom, a tracked allocation: a node never freed fails the model.
    #[cfg(kvslice_loom)]
    pub(super) _track: loom::alloc::Track<()>,
    /// Under loom, the node's life as a cell: every dereference reads it
    /// and the drop writes it, so a node freed while a reader could still
    /// reach it (a reclamation that does not wait for pinned readers) is a
    /// causality violation that fails the model.
    #[cfg(kvslice_loom)]
    life: Life,
}

/// A node's life under loom (see `Node::life`).
#[cfg(kvslice_loom)]
struct Life(loom::cell::UnsafeCell<()>);

// SAFETY: nothing is ever read or written through the cell: its `with`
// and `with_mut` only record accesses, for loom to order.
#[cfg(kvslice_loom)]
unsafe impl Sync for Life {}

#[cfg(kvslice_loom)]
impl Drop for Node {
    fn drop(&mut self) {
        self.life.0.with_mut(|_| ());
    }
}

// The head link's tag holds a two-bit slot state.
const _: () = assert!(core::mem::align_of::<Node>() >= 4);

impl Node {
    pub(super) fn new(key: SliceKey, value: PageHandle) -> Self {
        Self {
            key,
            value,
            next: Atomic::null(),
            #[cfg(kvslice_loom)]
            _track: loom::alloc::Track::new(()),
            #[cfg(kvslice_loom)]
            life: Life(loom::cell::UnsafeCell::new(())),
        }
    }
}

/// The node `ptr` points to (its tag ignored).
///
/// # Safety
/// `ptr` must have been loaded from a bucket's chain under `guard`: chain
/// nodes are destroyed only through `defer_destroy` after being unlinked,
/// so anything reachable while `guard` is pinned stays allocated until the
/// guard goes.
pub(super) unsafe fn deref<'g>(ptr: Shared<'g, Node>, _guard: &'g Guard) -> Option<&'g Node> {
    // SAFETY: see the function's contract.
    let node = unsafe { ptr.as_ref() };
    #[cfg(kvslice_loom)]
    if let Some(n) = node {
        n.life.0.with(|_| ());
    }
    node
}

/// Where [`find`] stopped: the link that points at `curr`, the tagged value
/// read from that link, and `curr` (null if the key is absent).
pub(super) struct Position<'g> {
    link: &'g Atomic<Node>,
    seen: Shared<'g, Node>,
    pub(super) curr: Shared<'g, Node>,
}

/// Finds the first unmarked node with `key`, unlinking marked nodes on the
/// way.
pub(super) fn find<'g>(head: &'g Atomic<Node>, key: &SliceKey, guard: &'g Guard) -> Position<'g> {
    'retry: loop {
        let mut link = head;
        let mut seen = link.load(Acquire, guard);
        loop {
            let curr = seen.with_tag(0);
            // SAFETY: `curr` came from this chain under `guard`.
            let Some(node) = (unsafe { deref(curr, guard) }) else {
                return Position { link, seen, curr };
            };
            let next = node.next.load(Acquire, guard);
            if next.tag() == 1 {
                // `node` is removed: unlink it, or start over if the link
                // changed (its owner was removed, someone unlinked, or the
                // inline slot's state moved).
                let after = next.with_tag(seen.tag());
                match link.compare_exchange(seen, after, AcqRel, Acquire, guard) {
                    Ok(_) => {
                        // SAFETY: our CAS unlinked `curr`, so no new
                        // reference to it can be made; existing ones are
                        // protected by their threads' guards.
                        unsafe { guard.defer_destroy(curr) };
                        seen = after;
                        continue;
                    }
                    Err(_) => continue 'retry,
                }
            }
            if node.key == *key {
                return Position { link, seen, curr };
            }
            link = &node.next;
            seen = next;
        }
    }
}

/// The value of an unmarked node with `key`, walking from `first` (the
/// head's value). Writes nothing.
#[inline]
pub(super) fn get(first: Shared<'_, Node>, key: &SliceKey, guard: &Guard) -> Option<PageHandle> {
    let mut curr = first.with_tag(0);
    // SAFETY: every pointer followed was loaded from this chain under
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

/// Removes the node with `key` (if its value is `expected`, when given).
pub(super) fn remove(
    head: &Atomic<Node>,
    key: &SliceKey,
    expected: Option<PageHandle>,
    guard: &Guard,
) -> Option<PageHandle> {
    loop {
        let at = find(head, key, guard);
        // SAFETY: `at.curr` came from this chain under `guard`.
        let node = unsafe { deref(at.curr, guard) }?;
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
        let after = next.with_tag(at.seen.tag());
        match at
            .link
            .compare_exchange(at.seen, after, AcqRel, Acquire, guard)
        {
            // SAFETY: our CAS unlinked the node; see `find`.
            Ok(_) => unsafe { guard.defer_destroy(at.curr) },
            Err(_) => drop(find(head, key, guard)),
        }
        return Some(node.value);
    }
}

/// (live entries, nodes in the chain).
pub(super) fn census(head: &Atomic<Node>, guard: &Guard) -> (usize, usize) {
    let (mut live, mut chain) = (0, 0);
    let mut curr = head.load(Acquire, guard).with_tag(0);
    // SAFETY: as in `get`.
    while let Some(node) = unsafe { deref(curr, guard) } {
        let next = node.next.load(Acquire, guard);
        chain += 1;
        live += usize::from(next.tag() == 0);
        curr = next.with_tag(0);
    }
    (live, chain)
}

/// Frees every node of a chain nobody else can reach any more.
///
/// # Safety
/// No other thread may access the chain, now or later.
pub(super) unsafe fn free_all(head: &Atomic<Node>) {
    // SAFETY: the caller guarantees exclusive access, so an unprotected
    // guard is enough, and each node is freed exactly once as we walk past
    // it (linked nodes, marked or not, are owned by the chain; unlinked ones
    // were handed to the collector and are not reachable from here).
    unsafe {
        let guard = crossbeam_epoch::unprotected();
        let mut curr = head.load(Relaxed, guard).with_tag(0);
        while !curr.is_null() {
            let next = curr.deref().next.load(Relaxed, guard);
            drop(curr.into_owned());
            curr = next.with_tag(0);
        }
    }
}
