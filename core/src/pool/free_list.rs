//! A lock-free, ABA-safe stack of free page indices, with a count that
//! lets `reserve(n)` claim n pages all-or-nothing before popping them.
//!
//! The head word packs `(tag << 32) | (index + 1)` (0 is the empty stack).
//! Every successful push or pop bumps the tag, so a thread that read
//! `head = A, next(A) = B` and was delayed while `A` was popped, reused and
//! pushed back cannot swing the head to the stale `B`: the tag differs.
//!
//! `available` counts pages on the stack that nobody has reserved. A push
//! links the page first and then increments it; a reservation decrements it
//! first and then pops. So a holder of a reservation always finds its pages
//! on the stack, and a failed reservation changes nothing.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crate::sync::{AtomicU32, AtomicU64, Ordering, spin_hint};

const EMPTY: u32 = 0;

fn pack(tag: u32, slot: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(slot)
}

fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

pub(crate) struct FreeList {
    head: AtomicU64,
    /// `next[i]` is the slot (index + 1) below page `i`, or [`EMPTY`].
    next: Box<[AtomicU32]>,
    available: AtomicU32,
}

impl FreeList {
    /// A stack holding pages `0..n`, page 0 on top.
    pub(crate) fn full(n: u32) -> Self {
        let next: Vec<AtomicU32> = (0..n)
            .map(|i| AtomicU32::new(if i + 1 < n { i + 2 } else { EMPTY }))
            .collect();
        Self {
            head: AtomicU64::new(pack(0, if n > 0 { 1 } else { EMPTY })),
            next: next.into_boxed_slice(),
            available: AtomicU32::new(n),
        }
    }

    /// Pages that can be reserved now.
    pub(crate) fn available(&self) -> u32 {
        self.available.load(Ordering::Acquire)
    }

    /// Claims `n` pages, or none. Each claimed page must then be taken with
    /// [`FreeList::pop_reserved`] or handed back with [`FreeList::unreserve`].
    pub(crate) fn reserve(&self, n: u32) -> bool {
        let mut cur = self.available.load(Ordering::Acquire);
        loop {
            if cur < n {
                return false;
            }
            match self
                .available
                .compare_exchange(cur, cur - n, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Returns `n` reserved-but-unpopped pages to the available count.
    pub(crate) fn unreserve(&self, n: u32) {
        self.available.fetch_add(n, Ordering::AcqRel);
    }

    /// Pops one page of a reservation. Never fails: the reservation
    /// guarantees the page is on the stack.
    pub(crate) fn pop_reserved(&self) -> u32 {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, slot) = unpack(head);
            if slot == EMPTY {
                // Unreachable while the invariant holds (pages are linked
                // before they are counted, and only reservation holders
                // pop). Retrying keeps a broken invariant from becoming a
                // use of a bogus index; debug builds say so loudly.
                debug_assert!(false, "free list empty under a reservation");
                spin_hint();
                head = self.head.load(Ordering::Acquire);
                continue;
            }
            let below = self.next[(slot - 1) as usize].load(Ordering::Acquire);
            match self.head.compare_exchange(
                head,
                pack(tag.wrapping_add(1), below),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return slot - 1,
                Err(seen) => head = seen,
            }
        }
    }

    /// Pushes a page the caller owns exclusively and makes it available.
    pub(crate) fn push(&self, index: u32) {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, slot) = unpack(head);
            self.next[index as usize].store(slot, Ordering::Release);
            match self.head.compare_exchange(
                head,
                pack(tag.wrapping_add(1), index + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(seen) => head = seen,
            }
        }
        self.available.fetch_add(1, Ordering::AcqRel);
    }

    /// Bytes of metadata per page.
    pub(crate) const BYTES_PER_PAGE: usize = core::mem::size_of::<AtomicU32>();
}
