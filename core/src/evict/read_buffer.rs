//! A striped, lossy, lock-free buffer of accesses that a store records on
//! its hit path and a policy applies later, in batches, under its own lock
//! (the read buffers of Caffeine and moka).
//!
//! Each stripe is a bounded ring with one consumer: a writer claims
//! consecutive positions for its records with one compare-and-swap on
//! `tail` and publishes each record by storing its position + 1 in the
//! slot's `seq` (Release); the drainer, which alone moves `head`, reads a
//! slot only once its `seq` says the record for that position is complete
//! (Acquire). A writer that finds its stripe too full, or loses the race
//! for the positions, drops its records and counts them: recording is
//! wait-free, two loads and one CAS per call, four stores per record.
//! Only the drainer waits, and only for the drain flag.

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::PageEvent;
use crate::page::PageId;
use crate::sync::{AtomicBool, AtomicU64, Ordering, spin_hint};

/// What a lookup tells a policy, recorded on the hit path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A cached page was hit.
    Hit(PageEvent),
    /// The lookup stopped at a key with this fingerprint.
    Miss {
        /// The missed key's fingerprint.
        fingerprint: u64,
        /// The request that missed.
        request: u64,
    },
    /// The request ended: nothing more will be recorded for it.
    End {
        /// The request.
        request: u64,
    },
}

/// Request serials must leave the top two bits to the record's kind.
const KIND_SHIFT: u32 = 62;
const KIND_HIT: u64 = 0;
const KIND_MISS: u64 = 1;
const KIND_END: u64 = 2;
const KIND_HIT_PARTIAL: u64 = 3;
const REQUEST_MASK: u64 = (1 << KIND_SHIFT) - 1;

impl Access {
    fn request(&self) -> u64 {
        match *self {
            Access::Hit(e) => e.request,
            Access::Miss { request, .. } | Access::End { request } => request,
        }
    }

    fn encode(&self) -> [u64; 3] {
        let (kind, fingerprint, page_depth) = match *self {
            Access::Hit(e) => (
                if e.partial {
                    KIND_HIT_PARTIAL
                } else {
                    KIND_HIT
                },
                e.fingerprint,
                u64::from(e.page.0) | u64::from(e.block_index) << 32,
            ),
            Access::Miss { fingerprint, .. } => (KIND_MISS, fingerprint, 0),
            Access::End { .. } => (KIND_END, 0, 0),
        };
        let request = (self.request() & REQUEST_MASK) | kind << KIND_SHIFT;
        [fingerprint, page_depth, request]
    }

    fn decode(w: [u64; 3]) -> Self {
        let request = w[2] & REQUEST_MASK;
        match w[2] >> KIND_SHIFT {
            kind @ (KIND_HIT | KIND_HIT_PARTIAL) => Access::Hit(PageEvent {
                page: PageId(w[1] as u32),
                fingerprint: w[0],
                block_index: (w[1] >> 32) as u32,
                request,
                partial: kind == KIND_HIT_PARTIAL,
            }),
            KIND_MISS => Access::Miss {
                fingerprint: w[0],
                request,
            },
            _ => Access::End { request },
        }
    }
}

struct Slot {
    /// Position + 1 of the record this slot holds once it is complete.
    seq: AtomicU64,
    words: [AtomicU64; 3],
}

#[repr(align(64))]
struct Stripe {
    /// Next position to claim.
    tail: AtomicU64,
    /// Next position to drain (written by the drainer only).
    head: AtomicU64,
    slots: Box<[Slot]>,
}

/// Records handed to the policy per call: it takes its lock once a batch,
/// and a stripe's head moves on after each batch, freeing room for writers
/// while the policy works.
const BATCH: usize = 32;

/// Striped lossy access buffer; see the module docs.
///
/// ```
/// use kvslice_core::evict::{Access, ReadBuffer};
///
/// let buf = ReadBuffer::new(2, 4);
/// for r in 1..=3 {
///     assert!(buf.record(Access::End { request: r }));
/// }
/// let mut seen = Vec::new();
/// assert!(buf.try_drain(&mut |batch| seen.extend_from_slice(batch)));
/// assert_eq!(seen.len(), 3);
/// assert_eq!(buf.dropped(), 0);
/// ```
pub struct ReadBuffer {
    stripes: Box<[Stripe]>,
    stripe_mask: usize,
    slot_mask: u64,
    draining: AtomicBool,
    dropped: AtomicU64,
}

impl core::fmt::Debug for ReadBuffer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ReadBuffer")
            .field("stripes", &self.stripes.len())
            .field("slots_per_stripe", &(self.slot_mask + 1))
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl ReadBuffer {
    /// A buffer of `stripes` rings of `slots` records each (both rounded
    /// up to powers of two, at least 1). All memory is allocated here.
    pub fn new(stripes: usize, slots: usize) -> Self {
        let stripes = stripes.max(1).next_power_of_two();
        let slots = slots.max(1).next_power_of_two();
        let stripe = |_| Stripe {
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            slots: (0..slots)
                .map(|_| Slot {
                    seq: AtomicU64::new(0),
                    words: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
                })
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        };
        Self {
            stripes: (0..stripes)
                .map(stripe)
                .collect::<Vec<_>>()
                .into_boxed_slice(),
            stripe_mask: stripes - 1,
            slot_mask: slots as u64 - 1,
            draining: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
        }
    }

    /// Records `access` on its request's stripe (so one request's records
    /// stay in order); returns `false` if it was dropped because the stripe
    /// was full or another writer won the position.
    pub fn record(&self, access: Access) -> bool {
        self.record_all(core::slice::from_ref(&access))
    }

    /// Records `accesses`, all of one request, at consecutive positions of
    /// its stripe claimed at once: all of them, or none (dropped and
    /// counted) if the stripe lacks room or another writer won the
    /// positions. A lookup records its hits this way, one claim for many
    /// blocks. More than a stripe holds are always dropped.
    ///
    /// ```
    /// use kvslice_core::evict::{Access, ReadBuffer};
    ///
    /// let buf = ReadBuffer::new(1, 4);
    /// let ends = [1, 1, 1].map(|request| Access::End { request });
    /// assert!(buf.record_all(&ends));
    /// assert!(!buf.record_all(&ends), "one slot left");
    /// assert_eq!(buf.dropped(), 3);
    /// ```
    pub fn record_all(&self, accesses: &[Access]) -> bool {
        let Some(first) = accesses.first() else {
            return true;
        };
        let n = accesses.len() as u64;
        debug_assert!(accesses.iter().all(|a| a.request() == first.request()));
        let stripe = &self.stripes[first.request() as usize & self.stripe_mask];
        let t = stripe.tail.load(Ordering::Relaxed);
        // Acquire: the drainer's reads of the slots we may reuse happened
        // before it moved `head` past them.
        let h = stripe.head.load(Ordering::Acquire);
        // `t` is stale when others recorded and a drainer took their
        // records since (`h > t`): the wrapped difference saturates, and
        // the writer drops as it would on losing the exchange.
        if t.wrapping_sub(h).saturating_add(n) > self.slot_mask + 1
            || stripe
                .tail
                .compare_exchange(t, t + n, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.dropped.fetch_add(n, Ordering::Relaxed);
            return false;
        }
        for (pos, access) in (t..).zip(accesses) {
            let slot = &stripe.slots[(pos & self.slot_mask) as usize];
            for (w, v) in slot.words.iter().zip(access.encode()) {
                w.store(v, Ordering::Relaxed);
            }
            slot.seq.store(pos + 1, Ordering::Release);
        }
        true
    }

    /// Whether every record of `request` made so far (on this thread, or
    /// before a hand-off to it) has been applied: its stripe is empty and
    /// no drain is under way. A drainer moves `head` past records before it
    /// applies them, so an empty stripe alone is not enough; but seeing a
    /// drainer's `head` (Acquire) and then the drain flag clear means that
    /// drainer has finished applying.
    ///
    /// ```
    /// use kvslice_core::evict::{Access, ReadBuffer};
    ///
    /// let buf = ReadBuffer::new(2, 4);
    /// assert!(buf.settled(7));
    /// buf.record(Access::End { request: 7 });
    /// assert!(!buf.settled(7));
    /// assert!(buf.settled(8), "another stripe");
    /// buf.drain(&mut |_| {});
    /// assert!(buf.settled(7));
    /// ```
    pub fn settled(&self, request: u64) -> bool {
        let stripe = &self.stripes[request as usize & self.stripe_mask];
        stripe.head.load(Ordering::Acquire) == stripe.tail.load(Ordering::Relaxed)
            && !self.draining.load(Ordering::Acquire)
    }

    /// Records dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Drains every complete record, in batches, into `apply`, unless
    /// another thread is draining; returns whether this call drained.
    pub fn try_drain(&self, apply: &mut dyn FnMut(&[Access])) -> bool {
        if self
            .draining
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.drain_held(apply);
        self.draining.store(false, Ordering::Release);
        true
    }

    /// Drains every record complete when it starts, waiting for another
    /// drainer to finish first. For maintenance (eviction, inserts), which
    /// must see the accesses recorded before it.
    pub fn drain(&self, apply: &mut dyn FnMut(&[Access])) {
        while !self.try_drain(apply) {
            while self.draining.load(Ordering::Relaxed) {
                spin_hint();
            }
        }
    }

    fn drain_held(&self, apply: &mut dyn FnMut(&[Access])) {
        let mut batch = [Access::End { request: 0 }; BATCH];
        let mut n = 0;
        for stripe in self.stripes.iter() {
            let mut h = stripe.head.load(Ordering::Relaxed);
            let t = stripe.tail.load(Ordering::Relaxed);
            while h != t {
                let slot = &stripe.slots[(h & self.slot_mask) as usize];
                // A claimed slot whose writer has not finished stops the
                // drain of this stripe; the rest waits for the next one.
                if slot.seq.load(Ordering::Acquire) != h + 1 {
                    break;
                }
                let words = core::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
                batch[n] = Access::decode(words);
                n += 1;
                h += 1;
                if n == BATCH {
                    stripe.head.store(h, Ordering::Release);
                    apply(&batch);
                    n = 0;
                }
            }
            stripe.head.store(h, Ordering::Release);
        }
        if n > 0 {
            apply(&batch[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(page: u32, request: u64) -> Access {
        Access::Hit(PageEvent {
            page: PageId(page),
            fingerprint: u64::from(page) * 7 + 1,
            block_index: page % 5,
            request,
            partial: page % 2 == 1,
        })
    }

    fn drained(buf: &ReadBuffer) -> Vec<Access> {
        let mut out = Vec::new();
        buf.drain(&mut |b| out.extend_from_slice(b));
        out
    }

    #[test]
    fn records_round_trip_in_order_per_request() {
        let buf = ReadBuffer::new(4, 64);
        let mut want = Vec::new();
        for i in 0..40 {
            let a = match i % 3 {
                0 => hit(i, 3),
                1 => Access::Miss {
                    fingerprint: u64::MAX - u64::from(i),
                    request: 3,
                },
                _ => Access::End { request: 3 },
            };
            assert!(buf.record(a));
            want.push(a);
        }
        assert_eq!(drained(&buf), want);
        assert!(drained(&buf).is_empty());
    }

    /// A writer whose tail is older than the head (others recorded and a
    /// drainer took their records between its two loads) drops and
    /// counts, rather than overflow the free-space sum.
    #[test]
    fn a_tail_older_than_the_head_drops() {
        let buf = ReadBuffer::new(1, 8);
        buf.stripes[0].head.store(1, Ordering::Relaxed);
        assert!(!buf.record(hit(1, 0)));
        assert_eq!(buf.dropped(), 1);
    }

    #[test]
    fn a_full_stripe_drops_and_counts_then_recovers() {
        let buf = ReadBuffer::new(1, 8);
        for i in 0..8 {
            assert!(buf.record(hit(i, 1)));
        }
        assert!(!buf.record(hit(9, 1)));
        assert_eq!(buf.dropped(), 1);
        assert_eq!(drained(&buf).len(), 8);
        // Positions wrap around the ring.
        for round in 0..5 {
            for i in 0..8 {
                assert!(buf.record(hit(i + round, 1)));
            }
            let got = drained(&buf);
            assert_eq!(got.len(), 8);
            assert_eq!(got[0], hit(round, 1));
        }
    }

    #[test]
    fn claims_of_many_are_all_or_nothing_and_in_order() {
        let buf = ReadBuffer::new(1, 8);
        let run: Vec<Access> = (0..5).map(|i| hit(i, 2)).collect();
        assert!(buf.record_all(&run));
        assert!(!buf.record_all(&run), "5 + 5 > 8");
        assert!(buf.record_all(&run[..3]), "exactly full");
        assert!(!buf.record(hit(9, 2)));
        assert_eq!(buf.dropped(), 6);
        let mut want = run.clone();
        want.extend_from_slice(&run[..3]);
        assert_eq!(drained(&buf), want);
        // Too many for the stripe: dropped even when it is empty.
        let long: Vec<Access> = (0..9).map(|i| hit(i, 2)).collect();
        assert!(!buf.record_all(&long));
        assert!(buf.record_all(&[]));
        assert_eq!(buf.dropped(), 15);
        // Claims wrap around the ring.
        for _ in 0..5 {
            assert!(buf.record_all(&run[..3]));
            assert_eq!(drained(&buf), run[..3]);
        }
    }

    #[test]
    fn batches_are_bounded_and_complete() {
        let buf = ReadBuffer::new(2, 128);
        for i in 0..200 {
            assert!(buf.record(hit(i, u64::from(i))));
        }
        let mut sizes = Vec::new();
        buf.drain(&mut |b| sizes.push(b.len()));
        assert!(sizes.iter().all(|&n| n <= BATCH));
        assert_eq!(sizes.iter().sum::<usize>(), 200);
    }

    #[test]
    fn a_second_drainer_backs_off() {
        let buf = ReadBuffer::new(1, 4);
        assert!(buf.record(hit(1, 1)));
        let mut inner = None;
        assert!(buf.try_drain(&mut |_| {
            inner = Some(buf.try_drain(&mut |_| {}));
        }));
        assert_eq!(inner, Some(false));
    }
}
