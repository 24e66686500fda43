//! Adaptive W-TinyLFU: a recency window in front of a frequency-filtered
//! main cache, with the window's size tuned online by hill climbing.

use super::segments::{NIL, Segments};
use super::sketch::Sketch;
use super::{EvictPass, EvictionPolicy, PageEvent};
use crate::page::PageId;
use crate::sync::SpinLock;

const WINDOW: usize = 0;
const PROBATION: usize = 1;
const PROTECTED: usize = 2;

#[derive(Debug)]
struct State {
    lists: Segments<3>,
    /// Fingerprint of each tracked page.
    fps: alloc::vec::Vec<u64>,
    sketch: Sketch,
    /// Target size of the window, in pages.
    window: f64,
    climber: HillClimber,
}

/// Adjusts the window size to whatever raised the hit rate last period.
#[derive(Debug)]
struct HillClimber {
    hits: u64,
    misses: u64,
    period: u64,
    previous: f64,
    step: f64,
    max_step: f64,
}

impl HillClimber {
    /// Returns how much to move the window by, once per period.
    fn record(&mut self, hit: bool) -> Option<f64> {
        if hit {
            self.hits += 1
        } else {
            self.misses += 1
        }
        if self.hits + self.misses < self.period {
            return None;
        }
        let rate = self.hits as f64 / (self.hits + self.misses) as f64;
        let delta = rate - self.previous;
        // Keep going while it helps; turn around when it hurt.
        let amount = if delta >= 0.0 { self.step } else { -self.step };
        self.step = if delta.abs() >= 0.05 {
            self.max_step.copysign(amount)
        } else {
            amount * 0.98
        };
        self.previous = rate;
        self.hits = 0;
        self.misses = 0;
        Some(amount)
    }
}

/// W-TinyLFU (Einziger, Friedman & Manes, 2017), adaptive as in Caffeine.
///
/// New pages enter a small LRU *window*; the window's overflow moves to the
/// front of the main cache's *probation* segment. When the cache must
/// evict, the newest probationary page (the candidate, just out of the
/// window) competes with the oldest (the victim): a count-min sketch
/// estimates how often each key was seen recently, and the less frequent one
/// goes. Pages hit in probation move to a *protected* LRU segment. So a burst of
/// one-time blocks cannot flush blocks that are reused, while new blocks
/// still get a chance in the window.
///
/// Whether recency or frequency pays better depends on the workload and the
/// cache size, so the window is resized by hill climbing on the observed hit
/// rate: every period (ten times the capacity in events) the window moves
/// by a step in the direction that last improved the hit rate, turning
/// around when it got worse. A large window behaves like LRU, a small one
/// like LFU with admission.
///
/// As for [`LruPolicy`](super::LruPolicy), pages with cached children are
/// parked out of the lists and return, oldest, when they become leaves.
///
/// ```
/// use kvslice_core::{EvictionPolicy, PageEvent, PageId, TinyLfuPolicy};
///
/// let p = TinyLfuPolicy::new(4);
/// let ev = |page, fp| PageEvent { page: PageId(page), fingerprint: fp, block_index: 0, request: 0, partial: false };
/// // Key 100 is popular; keys 1..=3 are seen once.
/// for _ in 0..5 { p.on_access(ev(0, 100)); }
/// p.on_insert(ev(0, 100));
/// for i in 1..4 { p.on_insert(ev(i, i as u64)); }
/// let victim = p.evict_one(&mut |_, _| true).unwrap();
/// assert_ne!(victim, PageId(0));
/// ```
#[derive(Debug)]
pub struct TinyLfuPolicy {
    capacity: u32,
    state: SpinLock<State>,
}

impl TinyLfuPolicy {
    /// A policy for pages `0..capacity`, starting with a 1% window, with a
    /// frequency sketch of `capacity` counters that halves every `10 ×
    /// capacity` events (Caffeine's sizing).
    pub fn new(capacity: u32) -> Self {
        Self::with_sketch(capacity, 1, 10)
    }

    /// As [`TinyLfuPolicy::new`], with a sketch of `counters_per_page ×
    /// capacity` counters per row that halves every `period_per_page ×
    /// capacity` events. Workloads whose reuse gaps span many cache
    /// turnovers need a wider sketch and a longer memory.
    pub fn with_sketch(capacity: u32, counters_per_page: u32, period_per_page: u32) -> Self {
        let cap = f64::from(capacity.max(1));
        let period = u64::from(period_per_page.max(1)) * u64::from(capacity.max(1));
        Self {
            capacity,
            state: SpinLock::new(State {
                lists: Segments::new(capacity),
                fps: alloc::vec![0; capacity as usize],
                sketch: Sketch::new(capacity.saturating_mul(counters_per_page.max(1)), period),
                window: (cap * 0.01).max(1.0),
                climber: HillClimber {
                    hits: 0,
                    misses: 0,
                    period,
                    previous: 0.0,
                    step: -0.0625 * cap,
                    max_step: 0.0625 * cap,
                },
            }),
        }
    }

    /// The window's current target size, in pages.
    pub fn window_target(&self) -> u32 {
        self.state.lock().window as u32
    }
}

impl State {
    fn record(&mut self, hit: bool, capacity: u32) {
        if let Some(amount) = self.climber.record(hit) {
            self.window = (self.window + amount).clamp(1.0, f64::from(capacity.max(1)));
            self.spill();
        }
    }

    /// Moves the window's overflow to the front of probation.
    fn spill(&mut self) {
        while f64::from(self.lists.len(WINDOW)) > self.window {
            let oldest = self.lists.lru(WINDOW);
            self.lists.touch(oldest, PROBATION);
        }
    }

    /// Keeps protected within 80% of the main cache by demoting its oldest.
    fn rebalance(&mut self, capacity: u32) {
        let main = (f64::from(capacity) - self.window).max(0.0);
        while f64::from(self.lists.len(PROTECTED)) > 0.8 * main {
            let oldest = self.lists.lru(PROTECTED);
            self.lists.touch(oldest, PROBATION);
        }
    }
}

impl EvictionPolicy for TinyLfuPolicy {
    fn name(&self) -> &'static str {
        "tinylfu"
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn on_insert(&self, event: PageEvent) {
        let i = event.page.0;
        if i >= self.capacity {
            return;
        }
        let mut s = self.state.lock();
        s.sketch.increment(event.fingerprint);
        s.record(false, self.capacity);
        s.fps[i as usize] = event.fingerprint;
        s.lists.touch(i, WINDOW);
        s.spill();
    }

    /// Back at the old end of probation, where victims come from; no
    /// frequency counted and no miss recorded: nothing was inserted.
    fn on_restore(&self, event: PageEvent) {
        let i = event.page.0;
        if i < self.capacity {
            let mut s = self.state.lock();
            s.fps[i as usize] = event.fingerprint;
            s.lists.touch_back(i, PROBATION);
        }
    }

    fn on_access(&self, event: PageEvent) {
        let i = event.page.0;
        if i >= self.capacity {
            return;
        }
        let mut s = self.state.lock();
        s.sketch.increment(event.fingerprint);
        s.record(true, self.capacity);
        let promoted = match s.lists.segment(i) {
            Some(WINDOW) => WINDOW,
            Some(_) => PROTECTED,
            None => return,
        };
        if s.lists.is_listed(i) {
            s.lists.touch(i, promoted);
            s.rebalance(self.capacity);
        } else {
            s.lists.rehome(i, promoted);
        }
    }

    fn on_became_parent(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.state.lock().lists.park(event.page.0);
        }
    }

    fn on_became_leaf(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.state.lock().lists.unpark(event.page.0);
        }
    }

    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        let mut guard = self.state.lock();
        let s = &mut *guard;
        for pass in [EvictPass::Normal, EvictPass::IncludeHigh] {
            // Probation: the newest (candidate) against the oldest (victim),
            // walking inwards past pages that cannot go now.
            let (mut cand, mut victim) = (s.lists.mru(PROBATION), s.lists.lru(PROBATION));
            while cand != NIL && victim != NIL {
                let page = if cand == victim {
                    cand
                } else if s.sketch.estimate(s.fps[cand as usize])
                    > s.sketch.estimate(s.fps[victim as usize])
                {
                    victim
                } else {
                    cand
                };
                if try_evict(PageId(page), pass) {
                    s.lists.remove(page);
                    return Some(PageId(page));
                }
                if page == cand && cand != victim {
                    cand = s.lists.older(cand);
                } else if page == victim && cand != victim {
                    victim = s.lists.newer(victim);
                } else {
                    break;
                }
            }
            // Then the oldest protected pages, then the window.
            for seg in [PROTECTED, WINDOW] {
                let mut p = s.lists.lru(seg);
                while p != NIL {
                    if try_evict(PageId(p), pass) {
                        s.lists.remove(p);
                        return Some(PageId(p));
                    }
                    p = s.lists.newer(p);
                }
            }
        }
        None
    }
}
