//! Return density: evict the leaf expected to bring the fewest hits per
//! slot and unit of time, learned per class from every observed reuse gap.

use alloc::vec;
use alloc::vec::Vec;

use super::{Access, EvictPass, EvictionPolicy, PageEvent};
use crate::page::PageId;
use crate::sync::{SpinLock, prefetch, prefetch_address};

/// Turn classes: how many turns the block's conversation has had (1 to
/// 8+).
const TURNS: usize = 8;
/// Classes: each turn class twice, full blocks and partial tails apart.
const CLASSES: usize = 2 * TURNS;
/// Age bins per octave; ages are in requests.
const PER_OCTAVE: usize = 4;
/// Ages up to 2^20 requests are told apart.
const BINS: usize = PER_OCTAVE * 20 + 1;
/// Requests between two recomputations of the density tables.
const PERIOD: u64 = 500;
/// Weight of the past at each recomputation.
const DECAY: f64 = 0.9;
/// Ghost slots per page, up to [`GHOST_FLOOR`]. A key survives about as
/// many later insertions as the ghost has slots, and the returns worth
/// learning come long after a small cache would have evicted the block:
/// on the Mooncake conversation trace a conversation's next turn comes a
/// median 6,300 new blocks later, a tenth of them after 24,000. 2^19
/// slots (4 MiB) instead of 2^16 took its 1k- and 3k-block hit ratios
/// from 0.0702 / 0.1081 to 0.0744 / 0.1154 (docs/EVICTION.md).
const GHOST_PER_PAGE: usize = 512;
/// The ghost's slots stop growing with [`GHOST_PER_PAGE`] here (from
/// 1,024 pages on), and grow again as 8 per page from 64k pages.
const GHOST_FLOOR: usize = 1 << 19;
/// Fewest ghost slots (512 KiB), for small caches.
const GHOST_MIN: usize = 1 << 16;
/// Leaves sampled per eviction when the kept candidates are refused.
const SAMPLE: usize = 64;
/// Fresh leaves sampled per eviction, beside the kept candidates.
const REFRESH: usize = 16;
/// Runners-up of an eviction, kept for the next (Redis's eviction pool):
/// a near-best choice at a quarter of the ranking work.
const KEPT: usize = 16;
/// Not in the leaf list.
const UNLISTED: u32 = u32::MAX;
/// Requests in flight that are told apart (a direct-mapped table by
/// serial); an older request in a reused slot is finished then.
const OPEN: usize = 64;

/// Ranks leaves by *return density*: the hits per slot-request a block can
/// still bring, given its class and age, under the best eviction horizon.
///
/// Under prefix lookup in multi-turn traffic a block's reuse is its
/// conversation's next turn, usually many cache turnovers away, and the
/// chance of a next turn grows with the turns already seen (0.31 after the
/// first turn of the Mooncake conversation trace, 0.51 after the third,
/// 0.67 after the sixth), while the gap to it barely does. So:
///
/// - A block's *class* is the number of turns its conversation has had:
///   a request that hits blocks below the root continues that
///   conversation (turns + 1); one that misses but whose first missing
///   key a ghost remembers continues it too; anything else starts a new
///   one. The request's blocks, hit or new, take the request's turn count.
///   Partial tails ([`PageEvent::partial`]) have classes of their own:
///   the next turn extends a tail into a full block under another key, so
///   tails rarely come back (on the Mooncake conversation trace 0.7% of
///   them, against about a quarter of full blocks) and, learned apart,
///   go first.
/// - Every reuse of a key is a sample, whether the block was still cached
///   or not (a direct-mapped ghost keeps each key's last use and class,
///   in 512 slots per page, at least 2^16 and, from 1,024 pages to 64k,
///   2^19; 8 per page beyond):
///   per class, a histogram of reuse gaps, and the count of uses that are
///   never followed by a reuse. Learning from the ghost rather than from
///   hits on what survived is what lets it find returns that come long
///   after LRU would have evicted the block.
/// - From those, for a block of class c at age a, the density is the best
///   over horizons L > a of (returns between a and L) / (slot-time spent
///   until the return or L), per block still at age a (LHD's hit density,
///   with the horizon chosen rather than given by the current cache). It
///   is computed on quarter-octave bins of age: a bin's returns count as
///   happening at its lower edge, and horizons are bin edges, so it is an
///   approximation that favours young ages slightly. Tables are recomputed
///   every 500 requests, the past decayed by 0.9.
/// - Eviction ranks 16 fresh random leaves together with 16 runners-up of
///   the previous eviction (the better of each pair of its candidates),
///   and offers them lowest density first (older first on ties); if all
///   are refused, it samples 64, then every leaf. Parents wait until they
///   are leaves again.
///
/// Requests are told apart by the serial each event carries (see
/// [`CacheStore::begin_request`](crate::CacheStore::begin_request)), so
/// requests served by several threads at once keep their own classes;
/// a request's pages take their class when it ends. The request clock
/// (ages) is the newest serial seen. Its bookkeeping runs under one spin
/// lock, but it asks the store to buffer accesses
/// ([`EvictionPolicy::buffers_accesses`]): hits and misses reach it in
/// batches before inserts and evictions, so a lookup takes no lock.
/// Events of request 0 (no request) update ages but no class.
///
/// On the Mooncake traces (see `docs/EVICTION.md`) it meets every margin of
/// the trace issue against LRU.
///
/// Memory: about 30 bytes per page and the ghost's 8 bytes per slot, 512
/// KiB up to 128 pages and 4 MiB from 1,024 pages on.
///
/// ```
/// use kvslice_core::{DensityPolicy, EvictionPolicy, PageEvent, PageId};
///
/// let policy = DensityPolicy::new(4);
/// let ev = |p, depth| PageEvent { page: PageId(p), fingerprint: u64::from(p) * 0x9e37_79b9, block_index: depth, request: 0, partial: false };
/// // A chain 0 → 1 → 2: only the leaf can go.
/// policy.on_insert(ev(0, 0));
/// policy.on_became_parent(ev(0, 0));
/// policy.on_insert_child(ev(1, 1), PageId(0), true);
/// policy.on_became_parent(ev(1, 1));
/// policy.on_insert_child(ev(2, 2), PageId(1), true);
/// assert_eq!(policy.evict_one(&mut |_, _| true), Some(PageId(2)));
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub struct DensityPolicy {
    capacity: u32,
    state: SpinLock<State>,
    /// The ghost's address and length, for [`EvictionPolicy::prefetch`]
    /// without the lock (the table is never reallocated).
    ghost_at: usize,
    ghost_len: usize,
}

impl core::fmt::Debug for DensityPolicy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DensityPolicy")
            .field("capacity", &self.capacity)
            .field("ghost_slots", &self.ghost_len)
            .finish_non_exhaustive()
    }
}

/// A request in flight.
#[derive(Debug, Default)]
struct Open {
    serial: u64,
    ended: bool,
    /// Turns of its conversation so far (0: new).
    current: u8,
    /// Turns the ghost remembered for a key it missed.
    missed: u8,
    /// Pages it hit or inserted, with the key fingerprint each held then
    /// (a page may be evicted and refilled before the request ends).
    pages: Vec<(u32, u64)>,
}

/// What the policy knows of a page, in one place: ranking a page or
/// applying an access to it reads one cache line, not one per field.
#[derive(Debug, Clone, Copy)]
struct Page {
    /// Request clock at the last insert or hit.
    last: u64,
    fingerprint: u64,
    depth: u32,
    /// Index in `leaves`, or [`UNLISTED`].
    leaf_at: u32,
    /// Turns of its conversation (1 = first turn).
    turns: u8,
    /// A partial tail (see [`PageEvent::partial`]).
    partial: bool,
    /// Tracked (inserted, not yet evicted).
    live: bool,
}

impl Default for Page {
    fn default() -> Self {
        Self {
            last: 0,
            fingerprint: 0,
            depth: 0,
            leaf_at: UNLISTED,
            turns: 1,
            partial: false,
            live: false,
        }
    }
}

/// A ghost entry in 8 bytes, so the ghost (2^19 entries for a cache of
/// 1,024 pages) takes 4 MiB rather than twice that: a 32-bit tag of the
/// key's fingerprint (independent of the bits that chose the slot), the
/// request clock of the last use modulo 2^27, whether the block was a
/// partial tail, and the turns then (capped at 15; classes stop at 8). 0
/// is empty: a stored entry has at least one turn.
#[derive(Debug, Clone, Copy, Default)]
struct Ghost(u64);

/// Ghost clocks wrap at 2^27 requests; gaps are told apart up to 2^26,
/// far beyond the 2^20 the age bins distinguish.
const GHOST_TIME_BITS: u32 = 27;
const GHOST_TIME_MASK: u64 = (1 << GHOST_TIME_BITS) - 1;

impl Ghost {
    fn tag(fingerprint: u64) -> u64 {
        fingerprint.wrapping_mul(0xd6e8_feb8_6659_fd93) >> 32
    }

    fn new(fingerprint: u64, time: u64, turns: u8, partial: bool) -> Self {
        let turns = u64::from(turns.clamp(1, 15));
        Self(
            Self::tag(fingerprint) << 32
                | (time & GHOST_TIME_MASK) << 5
                | u64::from(partial) << 4
                | turns,
        )
    }

    /// `(requests since the last use, turns then, partial)` if this entry
    /// is the key's; a use stamped after `now` (a buffered event applied
    /// late) is 0 requests old.
    fn of(self, fingerprint: u64, now: u64) -> Option<(u64, u8, bool)> {
        if self.0 == 0 || self.0 >> 32 != Self::tag(fingerprint) {
            return None;
        }
        let then = (self.0 >> 5) & GHOST_TIME_MASK;
        let gap = now.wrapping_sub(then) & GHOST_TIME_MASK;
        let gap = if gap >> (GHOST_TIME_BITS - 1) != 0 {
            0
        } else {
            gap
        };
        Some((gap, (self.0 & 15) as u8, self.0 & 16 != 0))
    }
}

/// An eviction candidate: its rank (lower goes first) and page.
type Candidate = (u64, u32);

#[derive(Debug)]
struct State {
    pages: Vec<Page>,
    leaves: Vec<u32>,
    /// Direct-mapped ghost of keys: [`Ghost`] words, kept as `u64` so
    /// that the table is allocated zeroed rather than filled entry by
    /// entry (which Miri interprets one at a time).
    ghost: Vec<u64>,
    /// The newest request serial seen (starts at 1).
    clock: u64,
    /// Requests in flight, by `serial % OPEN`.
    open: Vec<Open>,
    /// Per class: reuse gaps by age bin, and uses started.
    returns: Vec<[f64; BINS]>,
    uses: [f64; CLASSES],
    /// Per class and age bin: the density's `f32` bits, which order as
    /// the densities do (they are never negative), so ranking is integer
    /// work. On the heap, as `returns`: inline, the tables would make the
    /// policy a value of kilobytes, copied through callers' stacks (a
    /// loom model's coroutine overflowed on it).
    density: Vec<[u32; BINS]>,
    /// Representative age of each bin.
    age_of_bin: [f64; BINS],
    next_update: u64,
    rng: u64,
    /// Scratch for `evict_one`'s candidates.
    sample: Vec<Candidate>,
    /// The previous eviction's runners-up.
    kept: Vec<u32>,
}

impl DensityPolicy {
    /// A policy for pages `0..capacity`. Until its first tables (after 500
    /// requests) it ranks by age alone, like LRU.
    pub fn new(capacity: u32) -> Self {
        let pages = capacity as usize;
        let ghost = (GHOST_PER_PAGE * pages)
            .clamp(GHOST_MIN, GHOST_FLOOR)
            .max(8 * pages)
            .next_power_of_two();
        let n = capacity as usize;
        let mut age_of_bin = [0.0; BINS];
        for (b, x) in age_of_bin.iter_mut().enumerate() {
            *x = libm::exp2(b as f64 / PER_OCTAVE as f64) - 1.0;
        }
        // Before anything is learned: younger is denser (LRU order).
        let prior: [u32; BINS] = core::array::from_fn(|b| (1.0 / (b + 1) as f32).to_bits());
        let ghost_len = ghost;
        let ghost = vec![0u64; ghost_len];
        Self {
            capacity,
            // Moving the vector into the state keeps its buffer in place.
            ghost_at: ghost.as_ptr().addr(),
            ghost_len,
            state: SpinLock::new(State {
                pages: vec![Page::default(); n],
                leaves: Vec::with_capacity(n),
                ghost,
                clock: 1,
                open: (0..OPEN).map(|_| Open::default()).collect(),
                returns: vec![[0.0; BINS]; CLASSES],
                uses: [0.0; CLASSES],
                density: vec![prior; CLASSES],
                age_of_bin,
                next_update: 1 + PERIOD,
                rng: 0x9e37_79b9_7f4a_7c15,
                sample: Vec::with_capacity(n.clamp(KEPT + REFRESH, SAMPLE)),
                kept: Vec::with_capacity(KEPT),
            }),
        }
    }
}

/// `floor(log2(age + 1) · PER_OCTAVE)`, capped: integer octave, then the
/// quarter-octave thresholds of that octave.
fn bin(age: u64) -> usize {
    let v = age.saturating_add(1);
    let octave = (63 - v.leading_zeros()) as usize;
    if octave * PER_OCTAVE >= BINS - 1 {
        return BINS - 1;
    }
    let base = 1u64 << octave;
    // v / 2^octave ≥ 2^(q/4) for q = 1, 2, 3, in 16.16 fixed point.
    const STEPS: [u64; 3] = [77_936, 92_682, 110_218];
    let frac = ((v - base) << 16) / base + (1 << 16);
    octave * PER_OCTAVE + STEPS.iter().filter(|&&t| frac >= t).count()
}

fn class(turns: u8, partial: bool) -> usize {
    usize::from(turns).clamp(1, TURNS) - 1 + if partial { TURNS } else { 0 }
}

impl State {
    fn ghost_slot(&self, fingerprint: u64) -> usize {
        super::ghost_slot(fingerprint, self.ghost.len())
    }

    /// Warms what applying `access` will read: the key's ghost slot and,
    /// for a hit, its page's record.
    fn prefetch(&self, access: &Access) {
        let fingerprint = match access {
            Access::Hit(e) => {
                if let Some(page) = self.pages.get(e.page.0 as usize) {
                    prefetch(page);
                }
                e.fingerprint
            }
            Access::Miss { fingerprint, .. } => *fingerprint,
            Access::End { .. } => return,
        };
        prefetch(&self.ghost[self.ghost_slot(fingerprint)]);
    }

    /// The ghost's `(requests since the last use, turns, partial)` for a
    /// key at request time `now`, if it still knows the key.
    fn ghost(&self, fingerprint: u64, now: u64) -> Option<(u64, u8, bool)> {
        Ghost(self.ghost[self.ghost_slot(fingerprint)]).of(fingerprint, now)
    }

    /// A use of a key at request time `now`: if it was used before, one
    /// reuse-gap sample for the class it had then.
    fn sample_reuse(&mut self, fingerprint: u64, now: u64) {
        if let Some((gap, turns, partial)) = self.ghost(fingerprint, now) {
            self.returns[class(turns, partial)][bin(gap)] += 1.0;
        }
    }

    /// The state of request `serial`, starting it (and finishing the older
    /// request in its slot) if it is new; `None` for request 0, an ended
    /// request, or one so old that its slot went to a newer request.
    fn open(&mut self, serial: u64) -> Option<usize> {
        if serial == 0 {
            return None;
        }
        if serial > self.clock {
            self.clock = serial;
            if self.clock >= self.next_update {
                self.next_update = self.clock + PERIOD;
                self.update_density();
            }
        }
        let at = (serial % OPEN as u64) as usize;
        let slot_serial = self.open[at].serial;
        if slot_serial == serial {
            return (!self.open[at].ended).then_some(at);
        }
        if slot_serial > serial {
            return None;
        }
        self.finish(at);
        let o = &mut self.open[at];
        o.serial = serial;
        o.ended = false;
        o.current = 0;
        o.missed = 0;
        Some(at)
    }

    /// Request `at` is done: its pages take its turn count and start a new
    /// use each (the ghost remembers it).
    fn finish(&mut self, at: usize) {
        if self.open[at].ended || self.open[at].serial == 0 {
            return;
        }
        let o = &mut self.open[at];
        o.ended = true;
        let (serial, turns) = (o.serial, o.current.max(o.missed).saturating_add(1));
        let pages = core::mem::take(&mut o.pages);
        for &(p, fingerprint) in &pages {
            prefetch(&self.pages[p as usize]);
            prefetch(&self.ghost[self.ghost_slot(fingerprint)]);
        }
        for &(p, fingerprint) in &pages {
            let page = &mut self.pages[p as usize];
            if !page.live || page.fingerprint != fingerprint {
                continue;
            }
            page.turns = page.turns.max(turns);
            let (fingerprint, turns, partial) = (page.fingerprint, page.turns, page.partial);
            let slot = self.ghost_slot(fingerprint);
            self.ghost[slot] = Ghost::new(fingerprint, serial, turns, partial).0;
            self.uses[class(turns, partial)] += 1.0;
        }
        let o = &mut self.open[at];
        o.pages = pages;
        o.pages.clear();
    }

    /// Per class and age bin: the best hits per slot-request over eviction
    /// horizons beyond that age. Uses that never saw a reuse count as
    /// living past every horizon.
    fn update_density(&mut self) {
        let x = &self.age_of_bin;
        for c in 0..CLASSES {
            let h = &mut self.returns[c];
            let returned: f64 = h.iter().sum();
            let never = (self.uses[c] - returned).max(0.0);
            let mut beyond = [0.0; BINS + 1];
            for b in (0..BINS).rev() {
                beyond[b] = beyond[b + 1] + h[b];
            }
            for i in 0..BINS {
                let (mut hits, mut held, mut best) = (0.0, 0.0, 0.0f64);
                for j in i..BINS {
                    hits += h[j];
                    held += h[j] * (x[j] - x[i]);
                    if j > i {
                        let cost = held + (beyond[j + 1] + never) * (x[j] - x[i]);
                        if cost > 0.0 {
                            best = best.max(hits / cost);
                        }
                    }
                }
                self.density[c][i] = (best as f32).to_bits();
            }
            h.iter_mut().for_each(|v| *v *= DECAY);
            self.uses[c] *= DECAY;
        }
    }

    fn list(&mut self, p: u32) {
        if self.pages[p as usize].leaf_at == UNLISTED {
            self.pages[p as usize].leaf_at = self.leaves.len() as u32;
            self.leaves.push(p);
        }
    }

    fn unlist(&mut self, p: u32) {
        let at = self.pages[p as usize].leaf_at;
        if at == UNLISTED {
            return;
        }
        self.pages[p as usize].leaf_at = UNLISTED;
        let last = self.leaves.pop().expect("a listed page is in the list");
        if last != p {
            self.leaves[at as usize] = last;
            self.pages[last as usize].leaf_at = at;
        }
    }

    /// A use of `event`'s key by its request: opens the request, samples
    /// the reuse gap, and returns the request's slot and the use's time.
    fn use_key(&mut self, event: &PageEvent) -> (Option<usize>, u64) {
        let open = self.open(event.request);
        let now = if event.request == 0 {
            self.clock
        } else {
            event.request
        };
        self.sample_reuse(event.fingerprint, now);
        (open, now)
    }

    fn insert(&mut self, event: PageEvent) {
        let (open, now) = self.use_key(&event);
        let mut turns = 1;
        if let Some(at) = open {
            let o = &mut self.open[at];
            turns = o.current.max(o.missed).saturating_add(1);
            o.pages.push((event.page.0, event.fingerprint));
        }
        let page = &mut self.pages[event.page.0 as usize];
        page.live = true;
        page.last = now;
        page.depth = event.block_index;
        page.fingerprint = event.fingerprint;
        page.turns = turns;
        page.partial = event.partial;
        self.list(event.page.0);
    }

    fn access(&mut self, event: PageEvent) {
        let p = event.page.0;
        if p >= self.pages.len() as u32 {
            return;
        }
        let (open, now) = self.use_key(&event);
        let page = &mut self.pages[p as usize];
        // A buffered hit can be stale: the page may hold another key now.
        if !page.live || page.fingerprint != event.fingerprint {
            return;
        }
        page.last = page.last.max(now);
        let (depth, turns) = (page.depth, page.turns);
        if let Some(at) = open {
            let o = &mut self.open[at];
            if depth > 0 {
                o.current = o.current.max(turns);
            }
            o.pages.push((p, event.fingerprint));
        }
    }

    fn miss(&mut self, fingerprint: u64, request: u64) {
        let Some(at) = self.open(request) else { return };
        if let Some((_, turns, _)) = self.ghost(fingerprint, self.clock) {
            let o = &mut self.open[at];
            o.missed = o.missed.max(turns);
        }
    }

    fn end(&mut self, request: u64) {
        if let Some(at) = self.open(request) {
            self.finish(at);
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Lower is evicted first: the density's bits, then the age inverted
    /// (older first on ties), then the page.
    fn rank(&self, p: u32) -> Candidate {
        let page = &self.pages[p as usize];
        let age = self.clock.saturating_sub(page.last);
        let density = self.density[class(page.turns, page.partial)][bin(age)];
        let younger = u32::MAX - age.min(u64::from(u32::MAX)) as u32;
        (u64::from(density) << 32 | u64::from(younger), p)
    }

    fn forget(&mut self, p: u32) {
        self.unlist(p);
        self.pages[p as usize].live = false;
    }
}

impl EvictionPolicy for DensityPolicy {
    fn name(&self) -> &'static str {
        "density"
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn on_insert(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.state.lock().insert(event);
        }
    }

    fn prefetch(&self, fingerprint: u64) {
        let slot = super::ghost_slot(fingerprint, self.ghost_len);
        prefetch_address(self.ghost_at + slot * core::mem::size_of::<u64>());
    }

    fn on_restore(&self, event: PageEvent) {
        // Back as it was: its use, class and age are still recorded.
        let p = event.page.0;
        if p < self.capacity {
            let mut s = self.state.lock();
            s.pages[p as usize].live = true;
            s.list(p);
        }
    }

    fn on_access(&self, event: PageEvent) {
        self.on_accesses(&[Access::Hit(event)]);
    }

    fn on_miss(&self, fingerprint: u64, request: u64) {
        self.on_accesses(&[Access::Miss {
            fingerprint,
            request,
        }]);
    }

    fn on_request_end(&self, request: u64) {
        self.on_accesses(&[Access::End { request }]);
    }

    fn buffers_accesses(&self) -> bool {
        true
    }

    fn on_accesses(&self, batch: &[Access]) {
        let mut s = self.state.lock();
        // The records are independent: start every ghost and page miss of
        // the batch before the first use needs one.
        for a in batch {
            s.prefetch(a);
        }
        for &a in batch {
            match a {
                Access::Hit(e) => s.access(e),
                Access::Miss {
                    fingerprint,
                    request,
                } => s.miss(fingerprint, request),
                Access::End { request } => s.end(request),
            }
        }
    }

    fn on_became_parent(&self, event: PageEvent) {
        if event.page.0 < self.capacity {
            self.state.lock().unlist(event.page.0);
        }
    }

    fn on_became_leaf(&self, event: PageEvent) {
        let p = event.page.0;
        if p < self.capacity {
            let mut s = self.state.lock();
            if s.pages[p as usize].live {
                s.list(p);
            }
        }
    }

    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        let mut s = self.state.lock();
        // The sample buffer is reused: evictions are the hot path.
        let mut sample = core::mem::take(&mut s.sample);
        let evicted = s.evict_sampled(&mut sample, try_evict);
        s.sample = sample;
        evicted
    }
}

impl State {
    fn evict_sampled(
        &mut self,
        sample: &mut Vec<Candidate>,
        try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool,
    ) -> Option<PageId> {
        for pass in [EvictPass::Normal, EvictPass::IncludeHigh] {
            // A few samples, best first; then, if every sampled leaf was
            // refused (held by requests), every leaf.
            for round in 0..4 {
                sample.clear();
                let n = self.leaves.len();
                if n == 0 {
                    return None;
                }
                if round == 0 && n > SAMPLE {
                    // Candidates' records are random reads: all started
                    // before the first is ranked.
                    let fresh: [u32; REFRESH] = core::array::from_fn(|_| {
                        let at = (self.random() % n as u64) as usize;
                        let p = self.leaves[at];
                        prefetch(&self.pages[p as usize]);
                        p
                    });
                    for &p in &self.kept {
                        prefetch(&self.pages[p as usize]);
                    }
                    for i in 0..self.kept.len() {
                        let p = self.kept[i];
                        if self.pages[p as usize].leaf_at != UNLISTED {
                            sample.push(self.rank(p));
                        }
                    }
                    sample.extend(fresh.iter().map(|&p| self.rank(p)));
                } else if round < 3 && n > SAMPLE {
                    for _ in 0..SAMPLE {
                        let at = (self.random() % n as u64) as usize;
                        sample.push(self.rank(self.leaves[at]));
                    }
                } else {
                    sample.extend(self.leaves.iter().map(|&p| self.rank(p)));
                }
                // Usually the best is accepted: offer it before sorting.
                let best = sample.iter().copied().min().expect("sampled");
                if try_evict(PageId(best.1), pass) {
                    self.forget(best.1);
                    // The runners-up: the better of each pair (first
                    // with last, and so on inward), which keeps most of
                    // the best half at a comparison per pair.
                    self.kept.clear();
                    let (front, back) = sample.split_at(sample.len() / 2);
                    let better = front.iter().zip(back.iter().rev()).map(|(a, b)| a.min(b));
                    let better =
                        better.chain(back.get(front.len()).filter(|_| back.len() > front.len()));
                    self.kept
                        .extend(better.filter(|r| r.1 != best.1).take(KEPT).map(|r| r.1));
                    return Some(PageId(best.1));
                }
                sample.sort_unstable();
                sample.dedup_by_key(|r| r.1);
                for &(_, p) in sample.iter() {
                    if p != best.1 && try_evict(PageId(p), pass) {
                        self.forget(p);
                        return Some(PageId(p));
                    }
                }
                if round == 3 || n <= SAMPLE {
                    break;
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests;
