//! Chain admission: keep a subset of conversations whole, long enough for
//! their next turn.

use alloc::vec;
use alloc::vec::Vec;

use super::segments::{NIL, Segments};
use super::{EvictPass, EvictionPolicy, PageEvent};
use crate::page::PageId;
use crate::sync::SpinLock;

/// Evicted first.
const PROBATION: usize = 0;
/// Selected chains.
const MAIN: usize = 1;
/// Insertions between two adjustments of θ.
const PERIOD: u64 = 2048;
/// Bins of the return-gap histogram (log2 of a gap in insertions).
const BINS: usize = 48;
/// θ's steps when main's pages die younger than L* / otherwise.
const SHRINK: f64 = 0.95;
const GROW: f64 = 1.25;

/// Selects whole chains of blocks to keep, and steers how many so that the
/// kept ones live about as long as conversations take to return.
///
/// Under prefix lookup a block is worth keeping only with all its
/// ancestors, and in multi-turn traffic its reuse is the conversation's
/// next turn, often after many cache turnovers. LRU keeps everything for a
/// short time and catches few of those returns; this policy keeps fewer
/// chains for longer:
///
/// - Pages are in a *main* or a *probation* LRU list (leaves only, as in
///   [`LruPolicy`](super::LruPolicy)); probation is always evicted first.
/// - A block that extends a leaf (the next turn of a conversation) joins
///   its parent's list. A block that starts a chain (a root, or a branch
///   off a block that already has children) goes to main with probability
///   q2 if a ghost of recently seen keys knows it (a returning
///   conversation), else q1, by a fixed hash of its key.
/// - One knob θ ∈ [0.01, 1] sets both: q2 = min(1, 2θ), q1 = max(0, 2θ − 1).
///   θ = 1 is exactly LRU.
/// - Every 2048 insertions θ moves toward the lifetime L* that maximises
///   F(L)/L, F the distribution of observed return gaps (one sample per
///   returning request: a hit on a cached leaf below the root, or a ghost
///   hit when a chain starts). F(L)/L is hits per slot for chains kept L
///   insertions. If main's pages are evicted younger than L* on average, θ
///   shrinks by 5%; otherwise it grows by 25%.
///
/// On the Mooncake conversation trace it gets 1.34× LRU's hit ratio at 1k
/// blocks, 1.52× at 3k, 0.98× at 10k and LRU's at 30k; on the synthetic
/// trace 1.04×, 0.98×, 0.99×, 1.00× (see `docs/EVICTION.md`, which also
/// shows how these move with the step sizes). The default since,
/// [`DensityPolicy`](super::DensityPolicy), does better. All events take
/// one spin lock.
///
/// ```
/// use kvslice_core::{ChainPolicy, EvictionPolicy, PageEvent, PageId};
///
/// let policy = ChainPolicy::new(4);
/// let ev = |p, depth| PageEvent { page: PageId(p), fingerprint: u64::from(p) * 0x9e37_79b9, block_index: depth, request: 0, partial: false };
/// // A chain 0 → 1 → 2: its blocks share the fate of its root.
/// policy.on_insert(ev(0, 0));
/// policy.on_became_parent(ev(0, 0));
/// policy.on_insert_child(ev(1, 1), PageId(0), true);
/// policy.on_became_parent(ev(1, 1));
/// policy.on_insert_child(ev(2, 2), PageId(1), true);
/// // Leaves go first, parents only once their children are gone.
/// assert_eq!(policy.evict_one(&mut |_, _| true), Some(PageId(2)));
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug)]
pub struct ChainPolicy {
    capacity: u32,
    state: SpinLock<State>,
}

#[derive(Debug)]
struct State {
    lists: Segments<2>,
    /// Insertion clock at each page's last insert or hit.
    touched: Vec<u64>,
    depth: Vec<u32>,
    /// Direct-mapped ghost: key fingerprint and the clock when last seen
    /// (0 = empty; the clock starts at 1, so fresh tables are all zeros and
    /// cost nothing until touched).
    ghost_key: Vec<u64>,
    ghost_time: Vec<u64>,
    clock: u64,
    gaps: [u64; BINS],
    main_age_sum: u64,
    main_evictions: u64,
    theta: f64,
    next_control: u64,
}

impl ChainPolicy {
    /// A policy for pages `0..capacity`, starting as LRU (θ = 1).
    pub fn new(capacity: u32) -> Self {
        // Not the density policy's larger ghost: with 2^19 slots at 1,000
        // to 3,000 pages this policy kept less (with the trace keys of the
        // time: conversation trace 0.0596 to 0.0582 at 1k blocks,
        // synthetic 0.0871 to 0.0782).
        let ghost = (8 * capacity as usize).max(1 << 16).next_power_of_two();
        let n = capacity as usize;
        Self {
            capacity,
            state: SpinLock::new(State {
                lists: Segments::new(capacity),
                touched: vec![0; n],
                depth: vec![0; n],
                ghost_key: vec![0; ghost],
                ghost_time: vec![0; ghost],
                clock: 1,
                gaps: [0; BINS],
                main_age_sum: 0,
                main_evictions: 0,
                theta: 1.0,
                next_control: 1 + PERIOD,
            }),
        }
    }

    /// The current θ (1 = LRU; smaller keeps fewer chains for longer).
    pub fn theta(&self) -> f64 {
        self.state.lock().theta
    }
}

/// A fixed uniform draw in [0, 1) from a key fingerprint.
fn coin(fingerprint: u64) -> f64 {
    let x = (fingerprint ^ (fingerprint >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl State {
    fn ghost_slot(&self, fingerprint: u64) -> usize {
        super::ghost_slot(fingerprint, self.ghost_key.len())
    }

    /// When `fingerprint` was last seen, if the ghost still knows; then
    /// records it as seen now.
    fn ghost_swap(&mut self, fingerprint: u64) -> Option<u64> {
        let i = self.ghost_slot(fingerprint);
        let seen = (self.ghost_key[i] == fingerprint && self.ghost_time[i] != 0)
            .then_some(self.ghost_time[i]);
        self.ghost_key[i] = fingerprint;
        self.ghost_time[i] = self.clock;
        seen
    }

    fn sample_gap(&mut self, since: u64) {
        let gap = self.clock.saturating_sub(since).max(1);
        let bin = (64 - gap.leading_zeros()) as usize;
        self.gaps[bin.min(BINS - 1)] += 1;
    }

    /// L*: the lifetime (a power of two) maximising F(L)/L.
    fn best_lifetime(&self) -> Option<u64> {
        let total: u64 = self.gaps.iter().sum();
        if total < 50 {
            return None;
        }
        let (mut best, mut arg, mut cum) = (0.0f64, None, 0u64);
        for (bin, &count) in self.gaps.iter().enumerate() {
            cum += count;
            let per_slot = cum as f64 / (1u64 << bin) as f64;
            if per_slot > best {
                best = per_slot;
                arg = Some(1u64 << bin);
            }
        }
        arg
    }

    fn control(&mut self) {
        if self.clock < self.next_control {
            return;
        }
        self.next_control = self.clock + PERIOD;
        let Some(target) = self.best_lifetime() else {
            return;
        };
        let shrink = self.main_evictions > 0 && (self.main_age_sum / self.main_evictions) < target;
        // Shrink slowly, grow back fast: a wrong shrink costs hits at once,
        // a wrong grow only delays the gain.
        let factor = if shrink { SHRINK } else { GROW };
        self.theta = (self.theta * factor).clamp(0.01, 1.0);
        self.main_age_sum = 0;
        self.main_evictions = 0;
    }

    fn insert(&mut self, event: PageEvent, inherit: Option<usize>) {
        let i = event.page.0;
        self.clock += 1;
        let list = match inherit {
            Some(list) => {
                self.ghost_swap(event.fingerprint);
                list
            }
            None => {
                let returning = self.ghost_swap(event.fingerprint);
                if let Some(seen) = returning {
                    self.sample_gap(seen);
                }
                let q = if returning.is_some() {
                    (2.0 * self.theta).min(1.0)
                } else {
                    (2.0 * self.theta - 1.0).max(0.0)
                };
                if coin(event.fingerprint) < q {
                    MAIN
                } else {
                    PROBATION
                }
            }
        };
        self.touched[i as usize] = self.clock;
        self.depth[i as usize] = event.block_index;
        self.lists.touch(i, list);
        self.control();
    }
}

impl EvictionPolicy for ChainPolicy {
    fn name(&self) -> &'static str {
        "chain"
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn on_insert(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.state.lock().insert(event, None);
        }
    }

    /// Back at the old end of probation, without a tick of the clock or a
    /// look in the ghost: nothing was inserted.
    fn on_restore(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.state.lock().lists.touch_back(event.page.0, PROBATION);
        }
    }

    fn on_insert_child(&self, event: PageEvent, parent: PageId, extends_leaf: bool) {
        if event.page.0 < self.capacity {
            let mut s = self.state.lock();
            let inherit = if extends_leaf {
                s.lists.segment(parent.0)
            } else {
                None
            };
            s.insert(event, inherit);
        }
    }

    fn on_access(&self, event: PageEvent) {
        let i = event.page.0;
        if i >= self.capacity {
            return;
        }
        let mut s = self.state.lock();
        let seen = s.ghost_swap(event.fingerprint);
        if s.lists.is_listed(i) {
            // A hit on a cached leaf below the root: a conversation came
            // back to its chain (one sample per returning request).
            if let Some(seen) = seen
                && s.depth[i as usize] > 0
            {
                s.sample_gap(seen);
            }
            let list = s.lists.segment(i).unwrap_or(PROBATION);
            s.lists.touch(i, list);
        }
        s.touched[i as usize] = s.clock;
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
        let mut s = self.state.lock();
        for pass in [EvictPass::Normal, EvictPass::IncludeHigh] {
            for list in [PROBATION, MAIN] {
                let mut i = s.lists.lru(list);
                while i != NIL {
                    if try_evict(PageId(i), pass) {
                        if list == MAIN {
                            let age = s.clock.saturating_sub(s.touched[i as usize]);
                            s.main_age_sum += age;
                            s.main_evictions += 1;
                        }
                        s.lists.remove(i);
                        return Some(PageId(i));
                    }
                    i = s.lists.newer(i);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_event as ev;
    use super::*;

    #[test]
    fn at_theta_one_it_is_lru() {
        let chain = ChainPolicy::new(8);
        let lru = super::super::LruPolicy::new(8);
        for p in [&chain as &dyn EvictionPolicy, &lru] {
            (0..8).for_each(|i| p.on_insert(ev(i, 0)));
            p.on_access(ev(3, 0));
            p.on_access(ev(0, 0));
        }
        for _ in 0..8 {
            let a = chain.evict_one(&mut |_, _| true);
            assert_eq!(a, lru.evict_one(&mut |_, _| true));
        }
    }

    #[test]
    fn probation_goes_first_and_extensions_inherit() {
        let p = ChainPolicy::new(16);
        p.state.lock().theta = 0.01; // new chains: probation; returning: rarely main
        {
            let mut s = p.state.lock();
            // Put page 0 in main by hand, as if selected.
            s.insert(ev(0, 0), Some(MAIN));
        }
        p.on_became_parent(ev(0, 0));
        p.on_insert_child(ev(1, 1), PageId(0), true); // inherits main
        p.on_insert(ev(5, 0)); // new chain, unseen: probation (q1 = 0)
        p.on_insert(ev(6, 0));
        let s = p.state.lock();
        assert_eq!(s.lists.segment(1), Some(MAIN));
        assert_eq!(s.lists.segment(5), Some(PROBATION));
        drop(s);
        // Probation (5, 6) before main (1), parents (0) only as leaves.
        let order: Vec<u32> = core::iter::from_fn(|| p.evict_one(&mut |_, _| true))
            .map(|id| id.0)
            .collect();
        assert_eq!(order, [5, 6, 1]);
        p.on_became_leaf(ev(0, 0));
        assert_eq!(p.evict_one(&mut |_, _| true), Some(PageId(0)));
    }

    #[test]
    fn theta_shrinks_when_kept_chains_die_before_they_return() {
        let p = ChainPolicy::new(64);
        let mut s = p.state.lock();
        // Returns observed after ~4096 insertions; main evicts at age 100.
        s.gaps[13] = 1000;
        s.main_age_sum = 100 * 10;
        s.main_evictions = 10;
        s.clock = s.next_control;
        s.control();
        assert!((s.theta - SHRINK).abs() < 1e-12);
        // Main outlives the returns: θ grows back (capped at 1).
        s.main_age_sum = 10_000 * 10;
        s.main_evictions = 10;
        s.clock = s.next_control;
        s.control();
        assert!((s.theta - 1.0).abs() < 1e-12);
    }
}
