//! A bounded, lossy, multi-producer ring of [`KvEvent`]s with one drainer.
//!
//! The protocol of one stripe of the read buffer ([`crate::evict::ReadBuffer`]):
//! a producer claims a position with a compare-and-swap on `tail` and
//! publishes its event by storing the position + 1 in the slot's `seq`
//! (Release); the drainer, which alone moves `head`, reads a slot only once
//! its `seq` says the event for that position is complete (Acquire). Unlike
//! the read buffer, a producer that loses the race for a position tries the
//! next one (events are not hints), and drops only when the ring is full.
//! An accepted event's number is its position, so numbers rise by one in
//! ring order; a dropped event is counted, not numbered, and a drainer that
//! sees [`EventRing::dropped`] rise knows that events went missing.

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::{EVENT_WORDS, KvEvent, Medium};
use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// One event: 64 bytes, one cache line, so that a producer writing a slot
/// and the drainer reading its neighbour do not share a line.
#[repr(align(64))]
struct Slot {
    /// Position + 1 of the event this slot holds once it is complete.
    seq: AtomicU64,
    /// The encoded event; its position is in the last word's high bits.
    words: [AtomicU64; EVENT_WORDS],
}

/// What producers touch, on a line of its own.
#[repr(align(128))]
struct ProducerSide {
    /// Next position to claim: the number of the next accepted event.
    tail: AtomicU64,
    dropped: AtomicU64,
}

/// What the drainer writes, on another line.
#[repr(align(128))]
struct DrainerSide {
    /// Next position to drain (written by the drainer only).
    head: AtomicU64,
    draining: AtomicBool,
}

/// A claimed ring position not written yet ([`EventRing::claim_unwritten`]).
#[cfg(feature = "testkit")]
#[derive(Debug)]
pub struct UnwrittenSlot<'r> {
    ring: &'r EventRing,
    t: u64,
}

#[cfg(feature = "testkit")]
impl UnwrittenSlot<'_> {
    /// Writes `event` there, as the preempted producer finally does.
    pub fn write(self, event: KvEvent) {
        self.ring.write(self.t, event);
    }
}

/// Event numbers wrap at 2^48.
const NUMBER_MASK: u64 = (1 << 48) - 1;

/// Whether event number `n` comes before `cut` (both from one ring, fewer
/// than 2^47 apart), modulo 2^48.
pub fn number_is_before(n: u64, cut: u64) -> bool {
    let ahead = cut.wrapping_sub(n) & NUMBER_MASK;
    ahead != 0 && ahead < 1 << 47
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
/// // The fifth found the ring full.
/// assert_eq!(ring.dropped(), 1);
/// let mut seen = Vec::new();
/// assert!(ring.try_drain(&mut |number, event| seen.push((number, event))));
/// assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
/// assert_eq!(ring.emitted(), 5);
/// ```
pub struct EventRing {
    slots: Box<[Slot]>,
    mask: u64,
    producers: ProducerSide,
    drainer: DrainerSide,
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
                    words: core::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect::<Vec<_>>()
                .into_boxed_slice(),
            mask: slots as u64 - 1,
            producers: ProducerSide {
                tail: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            },
            drainer: DrainerSide {
                head: AtomicU64::new(0),
                draining: AtomicBool::new(false),
            },
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
    /// producer took the position first, or when the tail it read was
    /// stale (drained since).
    pub fn push(&self, event: KvEvent) -> bool {
        match self.claim() {
            Some(t) => {
                self.write(t, event);
                true
            }
            None => false,
        }
    }

    /// Claims the next position, or counts a drop when the ring is full.
    fn claim(&self) -> Option<u64> {
        let p = &self.producers;
        // Acquire on the tail, Release on claiming it: a producer that
        // reads a tail also sees every head its claimer had seen. A
        // producer that drained and then pushed otherwise let another
        // read its new tail (from a failed exchange) with a head from
        // before its drain: full by those two, and dropped, with room.
        let mut t = p.tail.load(Ordering::Acquire);
        loop {
            // Acquire: the drainer's reads of the slot we may reuse
            // happened before it moved `head` past it.
            let h = self.drainer.head.load(Ordering::Acquire);
            if h > t {
                // `t` is stale: other producers claimed it and the drainer
                // took it since. The tail is past `h` now; not full.
                t = p.tail.load(Ordering::Acquire);
                continue;
            }
            if t - h > self.mask {
                p.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            match p
                .tail
                .compare_exchange(t, t + 1, Ordering::Release, Ordering::Acquire)
            {
                Ok(_) => return Some(t),
                Err(now) => t = now,
            }
        }
    }

    /// Writes `event` into claimed position `t` and completes it.
    fn write(&self, t: u64, event: KvEvent) {
        let slot = &self.slots[(t & self.mask) as usize];
        for (w, v) in slot.words.iter().zip(event.encode(t)) {
            w.store(v, Ordering::Relaxed);
        }
        slot.seq.store(t + 1, Ordering::Release);
    }

    /// Claims the next position without writing it, as a producer
    /// preempted between its claim and its write leaves it (a drain stops
    /// there until it is written); `None` when full. For tests of what
    /// drains do meanwhile.
    #[cfg(feature = "testkit")]
    pub fn claim_unwritten(&self) -> Option<UnwrittenSlot<'_>> {
        self.claim().map(|t| UnwrittenSlot { ring: self, t })
    }

    /// The number the next event pushed will have (below 2^48; events'
    /// numbers rise by one from it, modulo 2^48). Every event numbered
    /// below it was claimed before this call; see [`number_is_before`].
    ///
    /// ```
    /// use kvslice_core::events::{EventRing, KvEvent, Medium, number_is_before};
    ///
    /// let ring = EventRing::new(8, Medium::Cpu);
    /// ring.push(KvEvent::Cleared);
    /// let cut = ring.next_number();
    /// ring.push(KvEvent::Cleared);
    /// let mut numbers = Vec::new();
    /// ring.try_drain(&mut |n, _| numbers.push(number_is_before(n, cut)));
    /// assert_eq!(numbers, [true, false]);
    /// ```
    pub fn next_number(&self) -> u64 {
        self.producers.tail.load(Ordering::Acquire) & NUMBER_MASK
    }

    /// Events dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.producers.dropped.load(Ordering::Relaxed)
    }

    /// Events emitted so far, dropped ones included.
    pub fn emitted(&self) -> u64 {
        self.producers.tail.load(Ordering::Relaxed) + self.dropped()
    }

    /// Hands every complete event, in ring order, to `apply` with its
    /// number, unless another thread is draining; returns whether this
    /// call drained (an empty ring counts as drained). Numbers rise by one
    /// (modulo 2^48).
    pub fn try_drain(&self, apply: &mut dyn FnMut(u64, KvEvent)) -> bool {
        self.try_drain_up_to(usize::MAX, apply).is_some()
    }

    /// [`Self::try_drain`], stopping after `max` events (the rest stay for
    /// the next drain, in order): for a consumer whose buffer is bounded,
    /// such as the C ABI's caller. Returns how many it handed on, or
    /// `None` if another thread is draining.
    ///
    /// ```
    /// use kvslice_core::events::{EventRing, KvEvent, Medium};
    ///
    /// let ring = EventRing::new(8, Medium::Cpu);
    /// for _ in 0..5 {
    ///     ring.push(KvEvent::Cleared);
    /// }
    /// let mut numbers = Vec::new();
    /// assert_eq!(ring.try_drain_up_to(3, &mut |n, _| numbers.push(n)), Some(3));
    /// assert_eq!(ring.try_drain_up_to(3, &mut |n, _| numbers.push(n)), Some(2));
    /// assert_eq!(numbers, [0, 1, 2, 3, 4]);
    /// ```
    pub fn try_drain_up_to(
        &self,
        max: usize,
        apply: &mut dyn FnMut(u64, KvEvent),
    ) -> Option<usize> {
        let d = &self.drainer;
        // An empty ring costs a drainer two loads and no write, so a
        // forwarding thread that polls does not take the producers' lines.
        if max == 0 || d.head.load(Ordering::Relaxed) == self.producers.tail.load(Ordering::Relaxed)
        {
            return Some(0);
        }
        if d.draining
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        let mut h = d.head.load(Ordering::Relaxed);
        let t = self.producers.tail.load(Ordering::Relaxed);
        let mut handed = 0;
        while h != t && handed < max {
            let slot = &self.slots[(h & self.mask) as usize];
            // A claimed slot whose producer has not finished stops the
            // drain; the rest waits for the next one.
            if slot.seq.load(Ordering::Acquire) != h + 1 {
                break;
            }
            let words = core::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
            h += 1;
            // Free the slot before handing the event on, so that producers
            // blocked on a full ring see room as early as possible.
            d.head.store(h, Ordering::Release);
            let (number, event) = KvEvent::decode(words);
            apply(number, event);
            handed += 1;
        }
        d.draining.store(false, Ordering::Release);
        Some(handed)
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
    fn a_full_ring_drops_and_counts() {
        let ring = EventRing::new(2, Medium::Cpu);
        assert!(ring.push(stored(0)));
        assert!(ring.push(stored(1)));
        assert!(!ring.push(stored(2)));
        assert_eq!(drained(&ring).len(), 2);
        assert!(ring.push(stored(3)));
        let got = drained(&ring);
        assert_eq!(got, [(2, stored(3))], "numbered by position");
        assert_eq!((ring.dropped(), ring.emitted()), (1, 4));
    }

    #[test]
    fn a_second_drainer_backs_off() {
        let ring = EventRing::new(4, Medium::Cpu);
        ring.push(KvEvent::Cleared);
        ring.push(KvEvent::Cleared);
        // While the first event is handed on, the second waits: a second
        // drainer backs off. Once all are out, a drain finds nothing.
        let mut inner = Vec::new();
        assert!(ring.try_drain(&mut |_, _| {
            inner.push(ring.try_drain(&mut |_, _| {}));
        }));
        assert_eq!(inner, [false, true]);
    }
}
