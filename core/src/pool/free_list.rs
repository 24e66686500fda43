//! A lock-free stack of free pages, ABA-safe within a bound, linked
//! through the pages' own state words (see `state.rs`): a Free page's word
//! holds the slot of the page below it.
//!
//! The head word packs `(tag << 30) | slot`, where a slot is index + 1
//! (below 2^30, as pools have fewer pages) and 0 is the empty stack.
//! Every successful push or pop bumps the 34-bit tag, so a thread that
//! read `head = A, link(A) = B` and was delayed while `A` was popped,
//! reused and pushed back cannot swing the head to the stale `B`: the tag
//! differs. The bound: a thread stalled between its read of the head and
//! its compare-and-swap for a whole multiple of 2^34 pushes and pops
//! (minutes of nothing but allocation on every other core) with the same
//! page back on top would see its stale read succeed.
//!
//! [`FreeList::pop_chain`] takes `n` pages in one CAS: it walks `n` links
//! from the head and swings the head past them. If the head is unchanged at
//! the CAS, nothing was pushed or popped since the walk began, so the links
//! it read were the stack's; and a stack shorter than `n` fails with
//! nothing changed. That makes `alloc_many` all-or-nothing.

use super::state::{Life, PageState};
use crate::sync::{AtomicU64, Ordering};

/// Exponential backoff after a failed CAS on the head: under contention,
/// hammering the head's cache line slows every thread; pausing lets the
/// winner finish a few operations while the line stays in its cache. At
/// most 2^6 pause instructions per retry, the cap crossbeam's `Backoff`
/// uses too; larger caps win the two-thread benchmark by more but add
/// microseconds of latency to a loser.
struct Backoff(u32);

impl Backoff {
    const MAX_SHIFT: u32 = 6;

    fn new() -> Self {
        Self(0)
    }

    #[inline]
    fn spin(&mut self) {
        for _ in 0..1u32 << self.0 {
            core::hint::spin_loop();
        }
        self.0 = (self.0 + 1).min(Self::MAX_SHIFT);
    }
}

/// "No page": the empty stack, or the end of a chain.
const NIL: u32 = 0;

/// Bits of the head word that hold the slot.
const SLOT_BITS: u32 = 30;

fn pack(tag: u64, slot: u32) -> u64 {
    debug_assert!(slot < 1 << SLOT_BITS);
    (tag << SLOT_BITS) | u64::from(slot)
}

/// The head's tag (34 bits) and slot.
fn unpack(word: u64) -> (u64, u32) {
    (word >> SLOT_BITS, (word & ((1 << SLOT_BITS) - 1)) as u32)
}

/// The stack's head. The links live in the pool's state words, passed to
/// every call as `states`.
pub(crate) struct FreeList {
    head: AtomicU64,
}

/// Pages popped together, still linked through their state words.
#[derive(Debug)]
pub(crate) struct Chain {
    /// Slot of the first page, or [`NIL`].
    first: u32,
    len: u32,
}

impl Chain {
    pub(crate) fn len(&self) -> u32 {
        self.len
    }
}

/// The link of the page in `slot`, if it is Free: a page popped since it
/// was read as the stack's (and perhaps published) holds none.
#[inline]
fn link(states: &[AtomicU64], slot: u32) -> Option<u32> {
    let word = states[(slot - 1) as usize].load(Ordering::Acquire);
    (PageState::unpack(word).life == Life::Free).then(|| PageState::link(word))
}

impl FreeList {
    /// Initial state words and the stack over them: pages `0..n`, page 0 on
    /// top, all at generation 0.
    pub(crate) fn full(n: u32) -> (Self, impl Iterator<Item = u64>) {
        let words = (0..n).map(move |i| PageState::free(0, if i + 1 < n { i + 2 } else { NIL }));
        let head = AtomicU64::new(pack(0, if n > 0 { 1 } else { NIL }));
        (Self { head }, words)
    }

    /// Pops `n >= 1` pages at once, or none if fewer are free. The pages'
    /// words still say Free; the caller owns them.
    #[inline]
    pub(crate) fn pop_chain(&self, states: &[AtomicU64], n: u32) -> Option<Chain> {
        debug_assert!(n >= 1);
        let mut head = self.head.load(Ordering::Acquire);
        'retry: loop {
            let (tag, first) = unpack(head);
            let mut below = first;
            for _ in 0..n {
                if below == NIL {
                    // Fewer than n pages, unless the stack moved under us.
                    let now = self.head.load(Ordering::Acquire);
                    if now == head {
                        return None;
                    }
                    head = now;
                    continue 'retry;
                }
                match link(states, below) {
                    Some(next) => below = next,
                    None => {
                        // Not a free page any more: the stack moved.
                        head = self.head.load(Ordering::Acquire);
                        continue 'retry;
                    }
                }
            }
            match self.head.compare_exchange(
                head,
                pack(tag.wrapping_add(1), below),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Chain { first, len: n }),
                Err(seen) => head = seen,
            }
        }
    }

    /// Pops one page, returning its index and generation. (The one-page
    /// case of [`FreeList::pop_chain`], kept apart because it is the hot
    /// path.)
    #[inline]
    pub(crate) fn pop(&self, states: &[AtomicU64]) -> Option<(u32, u32)> {
        let mut backoff = Backoff::new();
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack(head);
            if top == NIL {
                return None;
            }
            let word = states[(top - 1) as usize].load(Ordering::Acquire);
            match self.head.compare_exchange(
                head,
                pack(tag.wrapping_add(1), PageState::link(word)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                // The head did not move between the load of `word` and the
                // CAS, so the page sat on the stack all along and nobody
                // wrote its word: `word` is current.
                Ok(_) => return Some((top - 1, PageState::unpack(word).generation)),
                Err(_) => {
                    backoff.spin();
                    head = self.head.load(Ordering::Acquire);
                }
            }
        }
    }

    /// Takes the first page off a popped chain: its index and generation.
    pub(crate) fn next_of(&self, states: &[AtomicU64], chain: &mut Chain) -> Option<(u32, u32)> {
        if chain.len == 0 {
            return None;
        }
        let slot = chain.first;
        let word = states[(slot - 1) as usize].load(Ordering::Acquire);
        chain.len -= 1;
        chain.first = if chain.len == 0 {
            NIL
        } else {
            PageState::link(word)
        };
        Some((slot - 1, PageState::unpack(word).generation))
    }

    /// Pushes the untaken rest of a popped chain back, in one CAS.
    pub(crate) fn push_chain(&self, states: &[AtomicU64], chain: Chain) {
        if chain.len == 0 {
            return;
        }
        let mut last = chain.first;
        // The chain is ours: its links hold.
        for _ in 1..chain.len {
            last = PageState::link(states[(last - 1) as usize].load(Ordering::Acquire));
        }
        let generation =
            PageState::unpack(states[(last - 1) as usize].load(Ordering::Acquire)).generation;
        self.push_linked(states, chain.first, last, generation);
    }

    /// Marks the caller-owned page `index` Free at `generation` and pushes
    /// it. The Release store of its word (inside the CAS loop) publishes the
    /// caller's last accesses to the page's next owner.
    #[inline]
    pub(crate) fn push(&self, states: &[AtomicU64], index: u32, generation: u32) {
        self.push_linked(states, index + 1, index + 1, generation);
    }

    /// Links the caller-owned chain `first..=last` on top of the stack,
    /// writing `last`'s word as Free at `generation` with the new link.
    #[inline]
    fn push_linked(&self, states: &[AtomicU64], first: u32, last: u32, generation: u32) {
        let word = &states[(last - 1) as usize];
        let mut backoff = Backoff::new();
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let (tag, top) = unpack(head);
            word.store(PageState::free(generation, top), Ordering::Release);
            match self.head.compare_exchange(
                head,
                pack(tag.wrapping_add(1), first),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(_) => {
                    backoff.spin();
                    head = self.head.load(Ordering::Acquire);
                }
            }
        }
    }
}
