//! A bounded, lossy, multi-producer ring of [`KvEvent`]s with one drainer.
//!
//! The protocol of one stripe of the read buffer ([`crate::evict::ReadBuffer`]):
//! a producer claims a position with a compare-and-swap on `tail` and
//! publishes its event by storing the position + 1 in the slot's `seq`
//! (Release); the drainer, which alone moves `head`, reads a slot only once
//! its `seq` says the event for that position is complete (Acquire). Unlike
//! the read buffer, a producer that loses the race for a position tries the
//! next one (events are not hints), and drops only when the ring is full.
//! Every event gets a number in the order producers emit them; a dropped
//! event's number is never seen, so a drainer finds the gap.

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::{EVENT_WORDS, KvEvent, Medium};
use crate::sync::{AtomicBool, AtomicU64, Ordering};

struct Slot {
    /// Position + 1 of the event this slot holds once it is complete.
    seq: AtomicU64,
    /// The event's number.
    number: AtomicU64,
    words: [AtomicU64; EVENT_WORDS],
}

/// Events on their way from a store to whoever forwards them.
///
/// ```
/// use kvslice_core::events::{EventRing, KvEvent, Medium};
///
/// let ring = EventRing::new(4, Medium::Gpu);
/// for _ in 0..5 {
///     ring.push(KvEvent::Cleared);
/// }
/// assert_eq!(ring.dropped(), 1);
/// let mut seen = Vec::new();
/// assert!(ring.try_drain(&mut |number, event| seen.push((number, event))));
/// // Numbers 0..4 arrived; number 4 was dropped.
/// assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
/// assert_eq!(ring.emitted(), 5);
/// ```
pub struct EventRing {
    slots: Box<[Slot]>,
    mask: u64,
    /// Next position to claim.
    tail: AtomicU64,
    /// Next position to drain (written by the drainer only).
    head: AtomicU64,
    /// Next event number (dropped events take one too).
    next: AtomicU64,
    dropped: AtomicU64,
    draining: AtomicBool,
    medium: Medium,
}

impl core::fmt::Debug for EventRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EventRing")
            .field("slots", &self.slots.len())
            .field("medium", &self.medium)
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl EventRing {
    /// A ring of `slots` events (rounded up to a power of two, at least 1)
    /// for a store whose pages live on `medium`. All memory is allocated
    /// here.
    pub fn new(slots: usize, medium: Medium) -> Self {
        let slots = slots.max(1).next_power_of_two();
        Self {
            slots: (0..slots)
                .map(|_| Slot {
                    seq: AtomicU64::new(0),
                    number: AtomicU64::new(0),
                    words: core::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect::<Vec<_>>()
                .into_boxed_slice(),
            mask: slots as u64 - 1,
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            next: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            medium,
        }
    }

    /// Where the store's pages live.
    pub fn medium(&self) -> Medium {
        self.medium
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Pushes `event`; returns `false` if the ring was full and the event
    /// was dropped (and counted). Lock-free: retries only when another
    /// producer took the position first.
    pub fn push(&self, event: KvEvent) -> bool {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let mut t = self.tail.load(Ordering::Relaxed);
        loop {
            // Acquire: the drainer's reads of the slot we may reuse
            // happened before it moved `head` past it.
            let h = self.head.load(Ordering::Acquire);
            if t.wrapping_sub(h) > self.mask {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            match self
                .tail
                .compare_exchange(t, t + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => t = now,
            }
        }
        let slot = &self.slots[(t & self.mask) as usize];
        slot.number.store(number, Ordering::Relaxed);
        for (w, v) in slot.words.iter().zip(event.encode()) {
            w.store(v, Ordering::Relaxed);
        }
        slot.seq.store(t + 1, Ordering::Release);
        true
    }

    /// Events dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events emitted so far, dropped ones included: the next number.
    pub fn emitted(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// Hands every complete event, in ring order, to `apply` with its
    /// number, unless another thread is draining; returns whether this
    /// call drained. Numbers rise in ring order except where two
    /// producers raced between taking a number and a position.
    pub fn try_drain(&self, apply: &mut dyn FnMut(u64, KvEvent)) -> bool {
        if self
            .draining
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let mut h = self.head.load(Ordering::Relaxed);
        let t = self.tail.load(Ordering::Relaxed);
        while h != t {
            let slot = &self.slots[(h & self.mask) as usize];
            // A claimed slot whose producer has not finished stops the
            // drain; the rest waits for the next one.
            if slot.seq.load(Ordering::Acquire) != h + 1 {
                break;
            }
            let number = slot.number.load(Ordering::Relaxed);
            let words = core::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
            h += 1;
            // Free the slot before handing the event on, so that producers
            // blocked on a full ring see room as early as possible.
            self.head.store(h, Ordering::Release);
            apply(number, KvEvent::decode(words));
        }
        self.draining.store(false, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{BlockHash, SliceKey};

    fn stored(i: u32) -> KvEvent {
        KvEvent::Stored {
            key: SliceKey {
                block: BlockHash(u128::from(i) << 70 | 3),
                block_index: i,
                layer_group: 0,
                head_shard: 1,
            },
            parent: (i > 0).then(|| BlockHash(u128::from(i - 1))),
            tokens: 16,
        }
    }

    fn drained(ring: &EventRing) -> Vec<(u64, KvEvent)> {
        let mut out = Vec::new();
        assert!(ring.try_drain(&mut |n, e| out.push((n, e))));
        out
    }

    #[test]
    fn events_arrive_in_order_with_their_numbers_and_wrap() {
        let ring = EventRing::new(8, Medium::Cpu);
        for round in 0..5u32 {
            for i in 0..8 {
                assert!(ring.push(stored(round * 8 + i)));
            }
            let got = drained(&ring);
            assert_eq!(got.len(), 8);
            for (j, (n, e)) in got.into_iter().enumerate() {
                assert_eq!(n, u64::from(round * 8) + j as u64);
                assert_eq!(e, stored(round * 8 + j as u32));
            }
        }
        assert_eq!((ring.dropped(), ring.emitted()), (0, 40));
    }

    #[test]
    fn a_full_ring_drops_counts_and_leaves_a_gap() {
        let ring = EventRing::new(2, Medium::Cpu);
        assert!(ring.push(stored(0)));
        assert!(ring.push(stored(1)));
        assert!(!ring.push(stored(2)));
        assert_eq!(drained(&ring).len(), 2);
        assert!(ring.push(stored(3)));
        let got = drained(&ring);
        assert_eq!(got, [(3, stored(3))], "number 2 is the gap");
        assert_eq!(ring.dropped(), 1);
    }

    #[test]
    fn a_second_drainer_backs_off() {
        let ring = EventRing::new(4, Medium::Cpu);
        ring.push(KvEvent::Cleared);
        let mut inner = None;
        assert!(ring.try_drain(&mut |_, _| {
            inner = Some(ring.try_drain(&mut |_, _| {}));
        }));
        assert_eq!(inner, Some(false));
    }
}
