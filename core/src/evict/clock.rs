//! CLOCK: a lock-free second-chance approximation of LRU.

use alloc::vec::Vec;

use super::{EvictPass, EvictionPolicy, PageEvent};
use crate::page::PageId;
use crate::sync::{AtomicU8, AtomicU32, Ordering::Relaxed};

const ABSENT: u8 = 0;
const COLD: u8 = 1;
const HOT: u8 = 2;

/// Pages sit on a circle with a reference bit; the hand sweeps, clearing
/// bits, and offers the first page whose bit was already clear. A hit sets
/// the bit. All state is per-page atomics plus the hand, so lookups never
/// block each other.
///
/// ```
/// use kvslice_core::{ClockPolicy, EvictPass, EvictionPolicy, PageEvent, PageId};
///
/// let clock = ClockPolicy::new(3);
/// for p in 0..3 {
///     clock.on_insert(PageEvent { page: PageId(p), fingerprint: 0, block_index: 0, request: 0, partial: false });
/// }
/// clock.on_access(PageEvent { page: PageId(0), fingerprint: 0, block_index: 0, request: 0, partial: false });
/// // Page 0 was hit again, so it gets a second chance.
/// let victim = clock.evict_one(&mut |p: PageId, _: EvictPass| p != PageId(0));
/// assert_eq!(victim, Some(PageId(1)));
/// ```
#[derive(Debug)]
pub struct ClockPolicy {
    state: Vec<AtomicU8>,
    hand: AtomicU32,
}

impl ClockPolicy {
    /// A policy for pages `0..capacity`.
    pub fn new(capacity: u32) -> Self {
        Self {
            state: (0..capacity).map(|_| AtomicU8::new(ABSENT)).collect(),
            hand: AtomicU32::new(0),
        }
    }

    fn slot(&self, page: PageId) -> Option<&AtomicU8> {
        self.state.get(page.0 as usize)
    }
}

impl EvictionPolicy for ClockPolicy {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn capacity(&self) -> u32 {
        self.state.len() as u32
    }

    fn on_insert(&self, event: PageEvent) {
        if let Some(s) = self.slot(event.page) {
            s.store(HOT, Relaxed);
        }
    }

    /// Tracked again, cold: the next sweep may take it, as it was about to.
    fn on_restore(&self, event: PageEvent) {
        if let Some(s) = self.slot(event.page) {
            s.store(COLD, Relaxed);
        }
    }

    fn on_access(&self, event: PageEvent) {
        // Only a tracked page gets its bit; an absent one stays absent. The
        // plain load first keeps hits on hot pages free of read-modify-writes.
        if let Some(s) = self.slot(event.page)
            && s.load(Relaxed) == COLD
        {
            let _ = s.compare_exchange(COLD, HOT, Relaxed, Relaxed);
        }
    }

    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        let n = self.state.len() as u32;
        if n == 0 {
            return None;
        }
        // Two sweeps clear every bit and offer every ordinary page; two
        // more offer high-priority pages too.
        for step in 0..4 * u64::from(n) {
            let pass = if step < 2 * u64::from(n) {
                EvictPass::Normal
            } else {
                EvictPass::IncludeHigh
            };
            let i = self.hand.fetch_add(1, Relaxed) % n;
            let slot = &self.state[i as usize];
            match slot.load(Relaxed) {
                HOT => {
                    let _ = slot.compare_exchange(HOT, COLD, Relaxed, Relaxed);
                }
                COLD if try_evict(PageId(i), pass) => {
                    slot.store(ABSENT, Relaxed);
                    return Some(PageId(i));
                }
                _ => {}
            }
        }
        // Hits between the sweeps, or other evictors moving the shared
        // hand, can keep a page from ever being offered cold. Before giving
        // up, offer every tracked page once, as the trait asks, from the
        // hand on (not always from page 0).
        let start = self.hand.load(Relaxed) % n;
        for i in (0..n).map(|k| (start + k) % n) {
            let slot = &self.state[i as usize];
            if slot.load(Relaxed) != ABSENT && try_evict(PageId(i), EvictPass::IncludeHigh) {
                slot.store(ABSENT, Relaxed);
                return Some(PageId(i));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(page: u32) -> PageEvent {
        PageEvent {
            page: PageId(page),
            fingerprint: u64::from(page),
            block_index: 0,
            request: 1,
            partial: false,
        }
    }

    /// A page hit again each time the hand passes another one is never
    /// seen cold by the sweeps; the policy must still offer it before it
    /// gives up.
    #[test]
    fn a_page_hit_during_every_sweep_is_still_offered() {
        let clock = ClockPolicy::new(2);
        clock.on_insert(event(0));
        clock.on_insert(event(1));
        let mut offered = alloc::vec::Vec::new();
        let got = clock.evict_one(&mut |page, _| {
            offered.push(page.0);
            if page.0 == 0 {
                // Page 0 is held; meanwhile page 1 is hit again.
                clock.on_access(event(1));
                return false;
            }
            true
        });
        assert_eq!(got, Some(PageId(1)), "offered {offered:?}");
    }
}
