//! The policy names the binary takes, and the offline Belady oracle (the
//! online policies come from `kvslice_core::evict::by_name`).

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use kvslice_core::{EvictPass, EvictionPolicy, PageEvent, PageId, PagePool};

/// Every policy the binary can run. `default` is the store's default.
pub const POLICIES: [&str; 7] = [
    "default", "lru", "clock", "tinylfu", "chain", "density", "belady",
];

/// The online policy `name` for a store of `capacity` blocks, or an
/// error naming what is wrong: an unknown name, or a capacity no page
/// pool takes (checked first, since a policy sizes its tables by the
/// capacity before the pool would refuse it).
///
/// ```
/// use kvslice_benches::policy::online;
///
/// assert!(online("lru", 1000).is_ok());
/// assert!(online("nope", 1000).is_err());
/// assert!(online("default", u32::MAX).is_err());
/// ```
pub fn online(name: &str, capacity: u32) -> kvslice_core::Result<Box<dyn EvictionPolicy>> {
    check_capacity(capacity)?;
    kvslice_core::evict::by_name(name, capacity).ok_or(kvslice_core::Error::InvalidValue(
        "unknown policy (see --help for the list)",
    ))
}

/// Whether a page pool takes `capacity` blocks (1 to
/// [`PagePool::MAX_PAGES`]).
pub fn check_capacity(capacity: u32) -> kvslice_core::Result<()> {
    match capacity == 0 || capacity > PagePool::MAX_PAGES {
        true => Err(kvslice_core::Error::InvalidValue(
            "capacity must be 1 to 2^30 - 2 blocks (a page pool's limit)",
        )),
        false => Ok(()),
    }
}

/// `blocks` times `n` (workers or replicas sharing their memory), or an
/// error where that is past what a capacity can be.
pub fn times(blocks: u32, n: usize) -> kvslice_core::Result<u32> {
    u32::try_from(n)
        .ok()
        .and_then(|n| blocks.checked_mul(n))
        .ok_or(kvslice_core::Error::InvalidValue(
            "capacity times workers or replicas is past 2^32 blocks",
        ))
}

/// Belady's MIN: evicts the page whose key is next used farthest in the
/// future. Offline (it is given the whole schedule), single-threaded, for
/// reference only. Blocks of the request being served are never chosen.
pub struct Belady {
    capacity: u32,
    /// Request indices at which each key fingerprint is looked up, sorted.
    uses: HashMap<u64, Vec<u32>>,
    /// Each request's fingerprints.
    requests: Vec<Vec<u64>>,
    now: AtomicU32,
    state: Mutex<OracleState>,
}

struct OracleState {
    /// Fingerprints of the request being served: never evicted.
    current: HashSet<u64>,
    /// Fingerprint and entry stamp of each tracked page.
    pages: Vec<Option<(u64, u64)>>,
    /// (next use, page, stamp): max-heap, stale entries skipped lazily.
    heap: BinaryHeap<(u32, u32, u64)>,
    stamp: u64,
}

impl Belady {
    /// An oracle for `schedule`: per request, the fingerprints it looks up.
    pub fn new(
        capacity: u32,
        schedule: impl IntoIterator<Item = impl IntoIterator<Item = u64>>,
    ) -> Self {
        let mut uses: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut requests = Vec::new();
        for (t, fps) in schedule.into_iter().enumerate() {
            let fps: Vec<u64> = fps.into_iter().collect();
            for &fp in &fps {
                uses.entry(fp).or_default().push(t as u32);
            }
            requests.push(fps);
        }
        Self {
            capacity,
            uses,
            requests,
            now: AtomicU32::new(0),
            state: Mutex::new(OracleState {
                current: HashSet::new(),
                pages: vec![None; capacity as usize],
                heap: BinaryHeap::new(),
                stamp: 0,
            }),
        }
    }

    /// Tells the oracle which request is being served.
    pub fn set_now(&self, request: u32) {
        self.now.store(request, Relaxed);
        let mut s = self.state.lock().unwrap();
        s.current.clear();
        if let Some(fps) = self.requests.get(request as usize) {
            s.current.extend(fps.iter().copied());
        }
    }

    /// The first request after the current one that uses `fp`.
    fn next_use(&self, fp: u64) -> u32 {
        let now = self.now.load(Relaxed);
        let Some(times) = self.uses.get(&fp) else {
            return u32::MAX;
        };
        let i = times.partition_point(|&t| t <= now);
        times.get(i).copied().unwrap_or(u32::MAX)
    }

    fn track(&self, event: PageEvent) {
        let next = self.next_use(event.fingerprint);
        let mut s = self.state.lock().unwrap();
        s.stamp += 1;
        let stamp = s.stamp;
        if let Some(slot) = s.pages.get_mut(event.page.0 as usize) {
            *slot = Some((event.fingerprint, stamp));
            s.heap.push((next, event.page.0, stamp));
        }
    }
}

impl EvictionPolicy for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn on_insert(&self, event: PageEvent) {
        self.track(event);
    }
    fn on_access(&self, event: PageEvent) {
        self.track(event);
    }
    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        let mut s = self.state.lock().unwrap();
        let mut refused = Vec::new();
        let mut found = None;
        while let Some((next, page, stamp)) = s.heap.pop() {
            let Some((fp, current)) = s.pages[page as usize] else {
                continue;
            };
            if current != stamp {
                continue;
            }
            // Time moved on since this entry was pushed: refresh it.
            let fresh = self.next_use(fp);
            if fresh != next {
                s.heap.push((fresh, page, stamp));
                continue;
            }
            if try_evict(PageId(page), EvictPass::IncludeHigh) {
                s.pages[page as usize] = None;
                found = Some(PageId(page));
                break;
            }
            refused.push((next, page, stamp));
        }
        s.heap.extend(refused);
        found
    }
}
