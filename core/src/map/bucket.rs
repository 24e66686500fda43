//! One bucket: an inline slot and an overflow chain, in one cache line.
//!
//! Most keys live in their bucket's inline slot (the table has twice as
//! many buckets as the map has capacity), so a hit reads one cache line and
//! follows no pointer. Keys that find the slot taken go to the overflow
//! chain (`list.rs`).
//!
//! The control word `ctl` is the chain's head pointer, tagged with the
//! inline slot's state:
//!
//! ```text
//! EMPTY --claim--> WRITING --publish--> LIVE --remove--> DEAD
//!   ^                 |                                    |
//!   +-----abort-------+          +----epoch-deferred-------+
//!   +----------------------------+
//! ```
//!
//! Every insert-if-absent ends in one CAS on `ctl` from a snapshot taken
//! before it scanned for its key (a chain push, or a claimed slot going
//! LIVE), so any insert of the same key since the snapshot moves `ctl` and
//! makes it fail and rescan. `ctl` can return to the snapshot's exact value
//! (ABA), but never with the key newly present:
//! - the chain pointer: nodes are only ever pushed at the head, never
//!   relinked, and not freed while the inserter is pinned, so if the head
//!   is the same pointer, every node below it was seen by the scan;
//! - a LIVE snapshot is the same entry: a slot leaves DEAD only through a
//!   closure deferred on the epoch collector, which cannot run while a
//!   thread that saw it LIVE is pinned;
//! - a DEAD or EMPTY snapshot may come back after the slot held other
//!   entries (a reclaim deferred before the inserter pinned can run), but
//!   then the slot is not LIVE when the CAS succeeds;
//! - a WRITING snapshot may come back after an abort and a new claim, but
//!   whoever fills a slot rescans the chain after its own load of `ctl` and
//!   goes LIVE only by a CAS from that load, so of a chain push and a fill
//!   of one key, the later one sees the other.
//!
//! The deferral also keeps the slot's key and value words fixed for as
//! long as any reader that saw the slot LIVE is pinned, so readers never
//! write and never retry: load `ctl`, compare the key, read the value.
//!
//! Readers that load a later value of `ctl` than the CAS that made the slot
//! LIVE (after a chain push, say) still see its words because every write
//! to `ctl` is a read-modify-write, which continues the release sequence: a
//! plain `store` to `ctl` anywhere would break that.
//!
//! A DEAD slot waits in its remover's epoch bag until the collector runs
//! it (a bag holds up to 64 deferred calls; a long-pinned thread delays
//! all of them); meanwhile inserts into that bucket use the chain, which
//! costs a pointer, never correctness.

use crossbeam_epoch::{Atomic, Guard, Owned};

use super::list::{self, Node};
use crate::key::SliceKey;
use crate::pool::PageHandle;
use crate::sync::AtomicU64;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};

const EMPTY: usize = 0;
const WRITING: usize = 1;
const LIVE: usize = 2;
const DEAD: usize = 3;

/// A key as the four words the inline slot stores.
type KeyWords = [u64; 4];

/// What a removal took out, and from where.
pub(super) enum Removed {
    /// From the inline slot, which is now DEAD: the caller must defer
    /// [`Bucket::reclaim`] on the epoch collector.
    Inline(PageHandle),
    /// From the chain: the node is marked, and unlinked and deferred either
    /// now or by a later traversal that passes it.
    Chained(PageHandle),
}

#[repr(C, align(64))]
pub(super) struct Bucket {
    /// Head of the overflow chain; its tag is the inline slot's state.
    ctl: Atomic<Node>,
    /// The inline entry's page handle; written only while WRITING.
    value: AtomicU64,
    /// The inline entry's key; written only while WRITING.
    key: [AtomicU64; 4],
}

impl Bucket {
    pub(super) fn new() -> Self {
        Self {
            ctl: Atomic::null(),
            value: AtomicU64::new(0),
            key: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Whether the inline slot's key is `w`. Only meaningful once `ctl` was
    /// seen LIVE under the caller's guard (the words are then fixed).
    #[inline]
    fn holds(&self, w: &KeyWords) -> bool {
        self.key[0].load(Relaxed) == w[0]
            && self.key[1].load(Relaxed) == w[1]
            && self.key[2].load(Relaxed) == w[2]
            && self.key[3].load(Relaxed) == w[3]
    }

    #[inline]
    pub(super) fn get(&self, key: &SliceKey, guard: &Guard) -> Option<PageHandle> {
        let c = self.ctl.load(Acquire, guard);
        if c.tag() == LIVE && self.holds(&key.to_words()) {
            return Some(PageHandle::from_bits(self.value.load(Relaxed)));
        }
        list::get(c, key, guard)
    }

    pub(super) fn insert(
        &self,
        key: SliceKey,
        value: PageHandle,
        guard: &Guard,
    ) -> Option<PageHandle> {
        let w = key.to_words();
        let mut spare: Option<Owned<Node>> = None;
        loop {
            let c = self.ctl.load(Acquire, guard);
            if c.tag() == LIVE && self.holds(&w) {
                return Some(PageHandle::from_bits(self.value.load(Relaxed)));
            }
            let at = list::find(&self.ctl, &key, guard);
            // SAFETY: `at.curr` came from this bucket's chain under `guard`.
            if let Some(node) = unsafe { list::deref(at.curr, guard) } {
                return Some(node.value);
            }
            if c.tag() == EMPTY {
                // Claim the slot; Acquire orders our writes after the
                // reclaim that emptied it (and so after its old readers).
                if self
                    .ctl
                    .compare_exchange(c, c.with_tag(WRITING), AcqRel, Acquire, guard)
                    .is_ok()
                {
                    return self.fill(&key, &w, value, guard);
                }
                continue;
            }
            let node = spare
                .take()
                .unwrap_or_else(|| Owned::new(Node::new(key, value)));
            node.next.store(c.with_tag(0), Relaxed);
            match self
                .ctl
                .compare_exchange(c, node.with_tag(c.tag()), AcqRel, Acquire, guard)
            {
                Ok(_) => return None,
                Err(e) => spare = Some(e.new.with_tag(0)),
            }
        }
    }

    /// Writes a claimed (WRITING) slot and publishes it, unless the chain
    /// gained `key` meanwhile: then the slot goes back to EMPTY (no reader
    /// ever saw it LIVE) and the chained value is returned.
    fn fill(
        &self,
        key: &SliceKey,
        w: &KeyWords,
        value: PageHandle,
        guard: &Guard,
    ) -> Option<PageHandle> {
        for (slot, &word) in self.key.iter().zip(w) {
            slot.store(word, Relaxed);
        }
        self.value.store(value.to_bits(), Relaxed);
        loop {
            // Only this thread moves the slot out of WRITING; others can
            // only change the chain pointer, which fails the CAS below.
            let c = self.ctl.load(Acquire, guard);
            debug_assert_eq!(c.tag(), WRITING);
            let at = list::find(&self.ctl, key, guard);
            // SAFETY: `at.curr` came from this bucket's chain under `guard`.
            if let Some(node) = unsafe { list::deref(at.curr, guard) } {
                let found = node.value;
                self.set_state(WRITING, EMPTY, guard);
                return Some(found);
            }
            // Release: a reader that sees LIVE sees the words written above.
            if self
                .ctl
                .compare_exchange(c, c.with_tag(LIVE), AcqRel, Acquire, guard)
                .is_ok()
            {
                return None;
            }
        }
    }

    /// Moves the slot from `from` (which only the caller can leave) to `to`,
    /// whatever the chain pointer does meanwhile.
    fn set_state(&self, from: usize, to: usize, guard: &Guard) {
        let mut c = self.ctl.load(Acquire, guard);
        loop {
            debug_assert_eq!(c.tag(), from);
            match self
                .ctl
                .compare_exchange(c, c.with_tag(to), AcqRel, Acquire, guard)
            {
                Ok(_) => return,
                Err(e) => c = e.current,
            }
        }
    }

    pub(super) fn remove(
        &self,
        key: &SliceKey,
        expected: Option<PageHandle>,
        guard: &Guard,
    ) -> Option<Removed> {
        let w = key.to_words();
        loop {
            let c = self.ctl.load(Acquire, guard);
            if c.tag() == LIVE && self.holds(&w) {
                let value = PageHandle::from_bits(self.value.load(Relaxed));
                if expected.is_some_and(|e| e != value) {
                    return None;
                }
                match self
                    .ctl
                    .compare_exchange(c, c.with_tag(DEAD), AcqRel, Acquire, guard)
                {
                    Ok(_) => return Some(Removed::Inline(value)),
                    // The chain moved, or another remover won: look again.
                    Err(_) => continue,
                }
            }
            return list::remove(&self.ctl, key, expected, guard).map(Removed::Chained);
        }
    }

    /// DEAD → EMPTY. Run only through the epoch collector, deferred by the
    /// thread whose removal made the slot DEAD, so no thread that saw the
    /// old entry is still pinned.
    pub(super) fn reclaim(&self) {
        // SAFETY: the unprotected guard only lets `fetch_and` hand back the
        // old pointer, which is dropped without being dereferenced.
        let guard = unsafe { crossbeam_epoch::unprotected() };
        // Clearing the tag bits is DEAD → EMPTY; the chain pointer is kept.
        // Release: the next claimer's writes come after the old readers.
        let old = self.ctl.fetch_and(0, AcqRel, guard);
        debug_assert_eq!(old.tag(), DEAD);
    }

    /// (inline entries, chained entries, chain nodes).
    pub(super) fn census(&self, guard: &Guard) -> (usize, usize, usize) {
        let inline = usize::from(self.ctl.load(Acquire, guard).tag() == LIVE);
        let (chained, nodes) = list::census(&self.ctl, guard);
        (inline, chained, nodes)
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // SAFETY: `&mut self` means no other thread can reach the chain.
        unsafe { list::free_all(&self.ctl) }
    }
}
