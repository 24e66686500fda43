//! The cache store: the one façade a runtime uses.
//!
//! It joins a [`PagePool`] (memory and page lifecycles), a [`SliceMap`]
//! (key → page) and an [`EvictionPolicy`] (which page goes first):
//!
//! - [`CacheStore::lookup_prefix`] takes references on the longest cached
//!   prefix of a sequence's keys, stopping at the first miss; a page being
//!   evicted is a miss, never a dangling hit; [`CacheStore::lookup_window`]
//!   does the same for sliding-window attention, where only the blocks the
//!   next token's window needs must be cached;
//! - [`CacheStore::allocate`] hands out pages to fill, evicting unreferenced
//!   cached leaf pages when the pool is full, all or nothing;
//! - [`CacheStore::publish`] makes a filled page findable; when two workers
//!   publish one key, one page survives, the other goes back to the pool and
//!   both callers hold the survivor;
//! - references are released by dropping the [`PageRef`]s;
//! - [`CacheStore::set_priority`] pins or favours pages (system prompts);
//! - [`CacheStore::stats`] counts hits, misses and evictions in blocks and
//!   tokens.
//!
//! Eviction never frees a referenced page (the pool refuses) and never a
//! page whose child block is cached (leaf-first), so a cached block's whole
//! prefix stays cached.

mod events;
mod meta;
mod recorder;
mod request;
mod spill;
mod stats;
mod window;

use alloc::vec::Vec;

use hashbrown::{HashMap, HashSet};

use crossbeam_epoch::{Collector, Guard};

pub use meta::Priority;
pub use request::RequestTicket;
pub use spill::{SpillRefused, SpillSink};
pub use stats::StoreStats;
pub use window::WindowHit;

use self::meta::PageMeta;
use self::recorder::Recorder;
use self::stats::{Count, Counters};
use crate::error::{Error, Result};
use crate::evict::{Access, EvictPass, EvictionPolicy, PageEvent, ReadBuffer};
use crate::key::SliceKey;
use crate::layout::KvLayout;
use crate::map::SliceMap;
use crate::page::PageId;
use crate::pool::{Evicting, Life, PageHandle, PageMut, PagePool, PageRef};
use crate::sync::AtomicU64;
use crate::sync::Ordering::Relaxed;

/// Read-buffer geometry for policies that buffer accesses: stripes of 512
/// records (16 KiB), enough for a few dozen 32-block lookups between two
/// drains per stripe; beyond that accesses are dropped and counted.
#[cfg(not(kvslice_loom))]
const READ_SLOTS: usize = 512;
/// Stripes when the store cannot ask how many cores it may use.
#[cfg(not(kvslice_loom))]
const READ_STRIPES: usize = 8;
// Small enough for loom to explore a full stripe.
#[cfg(kvslice_loom)]
const READ_STRIPES: usize = 1;
#[cfg(kvslice_loom)]
const READ_SLOTS: usize = 2;

/// Keys whose map reads a lookup issues together before taking their
/// references.
const LOOKAHEAD: usize = 16;

/// One read-buffer stripe per core the process may use (2 to 64), so
/// concurrent lookups seldom race for a stripe, and no more: every stripe
/// is memory the hit path writes, and on two cores eight stripes' 128 KiB
/// fell out of cache between lookups (p99 lookup 1.25-1.43 us against
/// 1.08-1.10 us with two, on the conversation trace at 1k blocks).
fn read_stripes() -> usize {
    #[cfg(all(feature = "std", not(kvslice_loom)))]
    {
        std::thread::available_parallelism()
            .map_or(READ_STRIPES, |n| n.get())
            .clamp(2, 64)
    }
    #[cfg(not(all(feature = "std", not(kvslice_loom))))]
    {
        READ_STRIPES
    }
}

/// A KV cache of pages addressed by [`SliceKey`].
///
/// ```
/// use kvslice_core::{
///     CacheStore, ClockPolicy, Coordinator, HashSecret, KvDtype, KvLayout, LayoutSpec, Request,
/// };
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 8, 4, KvDtype::F16))?;
/// let store = CacheStore::new(layout, 16, ClockPolicy::new(16))?;
/// let coord = Coordinator::new(layout, HashSecret::from_bytes([1; 16]));
/// let tokens: Vec<u32> = (0..12).collect();
/// let plan = coord.plan(&Request::new(&tokens))?;
/// let keys: Vec<_> = plan.keys_for(0, 0)?.collect();
///
/// let guard = store.pin();
/// let request = store.begin_request();
/// let mut held = Vec::new();
/// assert_eq!(store.lookup_prefix(&request, &keys, tokens.len(), &guard, &mut held)?, 0);
/// // Fill the three missing blocks and publish them, each after its parent.
/// for (i, page) in store.allocate(3, &guard)?.into_iter().enumerate() {
///     let parent = held.last();
///     let r = store.publish(&request, page, keys[i], parent, 4, &guard)?;
///     held.push(r);
/// }
/// drop(held); // release the references
/// store.end_request(request)?;
/// let next = store.begin_request();
/// let mut again = Vec::new();
/// assert_eq!(store.lookup_prefix(&next, &keys, tokens.len(), &guard, &mut again)?, 3);
/// assert_eq!(store.stats().hit_blocks, 3);
/// store.end_request(next)?;
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub struct CacheStore<'m, E: EvictionPolicy> {
    pool: PagePool<'m>,
    map: SliceMap,
    meta: alloc::boxed::Box<[PageMeta]>,
    policy: E,
    /// Accesses on their way to a policy that buffers them.
    reads: Option<ReadBuffer>,
    /// Where publishes and evictions are reported, if anywhere.
    events: Option<crate::events::EventRing>,
    /// Where evicted blocks' bytes go, if anywhere.
    spill: Option<alloc::boxed::Box<dyn SpillSink>>,
    next_request: AtomicU64,
    stats: Counters,
}

impl<E: EvictionPolicy> core::fmt::Debug for CacheStore<'_, E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CacheStore")
            .field("pool", &self.pool)
            .field("policy", &self.policy.name())
            .field("stats", &self.stats.snapshot())
            .finish()
    }
}

#[cfg(feature = "std")]
impl<E: EvictionPolicy> CacheStore<'static, E> {
    /// A store of `capacity` pages on crossbeam-epoch's default collector;
    /// get guards with [`CacheStore::pin`].
    pub fn new(layout: KvLayout, capacity: u32, policy: E) -> Result<Self> {
        Self::from_parts(
            PagePool::new(layout, capacity)?,
            policy,
            crossbeam_epoch::default_collector().clone(),
        )
    }

    /// A guard for this thread on the store's collector: the default one's
    /// thread-local handle for a store made by [`CacheStore::new`]; for one
    /// built by [`CacheStore::from_parts`] on a collector of its own, a
    /// handle registered for the call (slower: pin such a store's own
    /// handles where it matters).
    pub fn pin(&self) -> Guard {
        let collector = self.map.collector();
        if collector == crossbeam_epoch::default_collector() {
            crossbeam_epoch::pin()
        } else {
            collector.register().pin()
        }
    }
}

impl<'m, E: EvictionPolicy> CacheStore<'m, E> {
    /// A store over `pool`, whose map reclaims through `collector` (each
    /// thread registers with it and passes its pinned guards).
    pub fn from_parts(pool: PagePool<'m>, policy: E, collector: Collector) -> Result<Self> {
        let capacity = pool.capacity();
        if policy.capacity() < capacity {
            return Err(Error::ShapeMismatch {
                what: "eviction policy capacity (pages)",
                expected: u64::from(capacity),
                actual: u64::from(policy.capacity()),
            });
        }
        Ok(Self {
            map: SliceMap::with_collector(capacity, collector),
            meta: (0..capacity).map(|_| PageMeta::new()).collect(),
            pool,
            reads: policy
                .buffers_accesses()
                .then(|| ReadBuffer::new(read_stripes(), READ_SLOTS)),
            events: None,
            spill: None,
            policy,
            next_request: AtomicU64::new(1),
            stats: Counters::default(),
        })
    }

    /// The page pool (for page bytes, capacity and diagnostics).
    pub fn pool(&self) -> &PagePool<'m> {
        &self.pool
    }

    /// The key → page map.
    pub fn map(&self) -> &SliceMap {
        &self.map
    }

    /// The eviction policy.
    pub fn policy(&self) -> &E {
        &self.policy
    }

    /// The layout of every page.
    pub fn layout(&self) -> &KvLayout {
        self.pool.layout()
    }

    /// Counters so far.
    pub fn stats(&self) -> StoreStats {
        let mut s = self.stats.snapshot();
        s.dropped_accesses = self.reads.as_ref().map_or(0, ReadBuffer::dropped);
        s
    }

    /// `Ok` if `pool` is this store's.
    /// What tells this store's request tickets from another's: its pool's
    /// id, which no other pool in the process has (a store owns its pool
    /// for life).
    fn id(&self) -> u64 {
        self.pool.id()
    }

    fn check_ours(&self, pool: &PagePool<'m>, what: &'static str) -> Result<()> {
        if core::ptr::eq(pool, &self.pool) {
            Ok(())
        } else {
            Err(Error::InvalidValue(what))
        }
    }

    fn meta(&self, page: PageId) -> &PageMeta {
        &self.meta[page.0 as usize]
    }

    /// The policy's view of `page`, which holds `key` (its metadata set).
    fn event(&self, page: PageId, key: &SliceKey, request: u64) -> PageEvent {
        self.event_of(page, key, request, self.meta(page).valid_tokens())
    }

    /// [`event`](Self::event) for a caller that has read the page's valid
    /// tokens already (the hit path).
    fn event_of(&self, page: PageId, key: &SliceKey, request: u64, valid_tokens: u32) -> PageEvent {
        PageEvent {
            page,
            fingerprint: fingerprint(key),
            block_index: key.block_index,
            request,
            partial: valid_tokens < self.layout().block_tokens(),
        }
    }

    /// Starts a request: its lookups and publishes carry the ticket, so the
    /// policy can tell its blocks from those of requests that other threads
    /// serve at the same time. End it with [`end_request`](Self::end_request).
    pub fn begin_request(&self) -> RequestTicket {
        RequestTicket {
            store: self.id(),
            serial: self.next_request.fetch_add(1, Relaxed),
        }
    }

    /// Ends a request. References it took are released by dropping them,
    /// before or after.
    pub fn end_request(&self, request: RequestTicket) -> Result<()> {
        request.check(self.id())?;
        self.record(Access::End {
            request: request.serial,
        });
        Ok(())
    }

    /// Tells the policy of an access: into the read buffer if it buffers
    /// them (lossy, lock-free), else directly.
    fn record(&self, access: Access) {
        match &self.reads {
            Some(reads) => {
                reads.record(access);
            }
            None => self.policy.on_accesses(&[access]),
        }
    }

    /// Collects one lookup's accesses for the policy.
    fn recorder(&self) -> Recorder<'_, E> {
        Recorder::new(self.reads.as_ref(), &self.policy)
    }

    /// Hands every buffered access to the policy (maintenance only: before
    /// inserts and evictions, which must see them).
    fn drain_reads(&self) {
        if let Some(reads) = &self.reads {
            reads.drain(&mut |batch| self.policy.on_accesses(batch));
        }
    }

    /// Takes a reference on each page of the longest cached prefix of
    /// `keys`, appending them to `out`, and returns how many. Stops at the
    /// first key that is absent, or whose page is being filled or evicted.
    /// `total_tokens` (the tokens `keys` cover) sizes the miss count in
    /// tokens.
    ///
    /// Under the default policy and the clock policy it takes no lock: per
    /// block, a map read, a reference, and one record of the access (the
    /// clock policy's bit, or four stores into a lossy buffer, whose slots
    /// the lookup claims with one compare-and-swap per 16 blocks).
    /// [`LruPolicy`] (whose exact order needs it), [`TinyLfuPolicy`] and
    /// [`ChainPolicy`] take their lock once per hit block.
    ///
    /// [`LruPolicy`]: crate::LruPolicy
    /// [`TinyLfuPolicy`]: crate::TinyLfuPolicy
    /// [`ChainPolicy`]: crate::ChainPolicy
    pub fn lookup_prefix<'s>(
        &'s self,
        request: &RequestTicket,
        keys: &[SliceKey],
        total_tokens: usize,
        guard: &Guard,
        out: &mut Vec<PageRef<'s, 'm>>,
    ) -> Result<usize> {
        request.check(self.id())?;
        let serial = request.serial;
        let spread = keys.first().map_or(0, fingerprint);
        let mut hits = 0usize;
        let mut hit_tokens = 0u64;
        let mut recorder = self.recorder();
        let mut found = [PageHandle::from_bits(0); LOOKAHEAD];
        'chunks: for chunk in keys.chunks(LOOKAHEAD) {
            // A chunk's map reads first: they do not depend on each other,
            // so their cache misses overlap, where between references'
            // compare-and-swaps (locked, so later loads wait for them)
            // each would wait for the one before.
            let mut n = 0;
            for key in chunk {
                match self.map.get(key, guard)? {
                    Some(handle) => found[n] = handle,
                    None => break,
                }
                n += 1;
            }
            for (key, &handle) in chunk.iter().zip(&found[..n]) {
                let Ok(page) = self.pool.try_acquire(handle) else {
                    break 'chunks;
                };
                let valid = self.meta(handle.id()).valid_tokens();
                hit_tokens += u64::from(valid);
                recorder.push(Access::Hit(self.event_of(handle.id(), key, serial, valid)));
                out.push(page);
                hits += 1;
            }
            if let Some(missed) = chunk.get(n) {
                recorder.push(Access::Miss {
                    fingerprint: fingerprint(missed),
                    request: serial,
                });
                break;
            }
        }
        drop(recorder);
        self.stats.add(spread, Count::Lookups, 1);
        self.stats.add(spread, Count::HitBlocks, hits as u64);
        self.stats
            .add(spread, Count::MissBlocks, (keys.len() - hits) as u64);
        self.stats.add(spread, Count::HitTokens, hit_tokens);
        self.stats.add(
            spread,
            Count::MissTokens,
            (total_tokens as u64).saturating_sub(hit_tokens),
        );
        Ok(hits)
    }

    /// `n` pages to fill, all or nothing. Takes free pages first, then
    /// evicts unreferenced cached pages in the policy's order, leaves first
    /// (a block whose children are all being evicted by this call becomes a
    /// leaf for it). Evictions stay tentative until `n` pages are found; if
    /// they cannot be, every one is undone and the call fails with
    /// [`Error::CapacityExhausted`].
    pub fn allocate<'s>(&'s self, n: u32, guard: &Guard) -> Result<Vec<PageMut<'s, 'm>>> {
        self.map.check_guard(guard)?;
        if n > self.pool.capacity() {
            // Before anything is evicted, or room made for `n` guards.
            return Err(Error::CapacityExhausted("more pages than the pool has"));
        }
        if let Ok(batch) = self.pool.alloc_many(n) {
            return Ok(batch.collect());
        }
        let mut pages: Vec<PageMut<'s, 'm>> = Vec::with_capacity(n as usize);
        while pages.len() < n as usize {
            match self.pool.alloc() {
                Ok(p) => pages.push(p),
                Err(_) => break,
            }
        }
        self.drain_reads();
        let mut victims: Vec<Evicting<'s, 'm>> = Vec::new();
        // Children of each page that this call is evicting.
        let mut pending: HashMap<u32, u32> = HashMap::new();
        // Parents this call told the policy are leaves (all their children
        // are among its victims).
        let mut announced: HashSet<u32> = HashSet::new();
        while pages.len() + victims.len() < n as usize {
            let mut taken = None;
            self.policy.evict_one(&mut |page, pass| {
                let going = pending.get(&page.0).copied().unwrap_or(0);
                taken = self.try_begin_evict(page, pass, going);
                taken.is_some()
            });
            let Some(ev) = taken else {
                // Not enough: put everything back as it was.
                for ev in victims.into_iter().rev() {
                    let page = ev.handle().id();
                    let meta = self.meta(page);
                    if let Some(parent) = meta.parent()
                        && announced.remove(&parent.id().0)
                    {
                        let pm = self.meta(parent.id());
                        self.policy
                            .on_became_parent(self.event(parent.id(), &pm.key(), 0));
                    }
                    let key = meta.key();
                    ev.cancel();
                    self.policy.on_restore(self.event(page, &key, 0));
                }
                return Err(Error::CapacityExhausted(
                    "cache store: every cached page is in use",
                ));
            };
            if let Some(parent) = self.meta(ev.handle().id()).parent() {
                let going = pending.entry(parent.id().0).or_default();
                *going += 1;
                // All its children are going: to this call the parent is a
                // leaf now, so the policy may offer it.
                let pm = self.meta(parent.id());
                if *going == pm.children.load(Relaxed) && announced.insert(parent.id().0) {
                    self.policy
                        .on_became_leaf(self.event(parent.id(), &pm.key(), 0));
                }
            }
            victims.push(ev);
        }
        for ev in victims {
            // A parent not announced above, because another thread evicted
            // some of its children meanwhile, is announced by whoever
            // detaches its last child: maybe this call.
            let told = self
                .meta(ev.handle().id())
                .parent()
                .is_some_and(|p| announced.contains(&p.id().0));
            pages.push(self.commit_eviction(ev, !told, guard)?);
        }
        Ok(pages)
    }

    /// Starts evicting `page` if it may go on this pass: cached,
    /// unreferenced, no cached child other than `going` ones this caller is
    /// already evicting, not pinned (nor high-priority on a normal pass).
    fn try_begin_evict(
        &self,
        page: PageId,
        pass: EvictPass,
        going: u32,
    ) -> Option<Evicting<'_, 'm>> {
        let info = self.pool.page_info(page).ok()?;
        let meta = self.meta(page);
        let allowed = |m: &PageMeta| {
            m.children.load(Relaxed) == going
                && match m.priority() {
                    Priority::Normal => true,
                    Priority::High => pass == EvictPass::IncludeHigh,
                    Priority::Pinned => false,
                }
        };
        if info.life != Life::Cached || info.refs != 0 || !allowed(meta) {
            return None;
        }
        let ev = self
            .pool
            .try_begin_evict(PageHandle::from_parts(page.0, info.generation))
            .ok()?;
        // Now nobody holds a reference, so children and priority are final.
        if allowed(meta) {
            Some(ev)
        } else {
            ev.cancel();
            None
        }
    }

    /// Removes an evicted page's key, detaches it from its parent (telling
    /// the policy if the parent became a leaf, unless it was told already:
    /// `notify_parent` false) and hands the page back for refilling.
    fn commit_eviction<'s>(
        &'s self,
        ev: Evicting<'s, 'm>,
        notify_parent: bool,
        guard: &Guard,
    ) -> Result<PageMut<'s, 'm>> {
        let handle = ev.handle();
        let meta = self.meta(handle.id());
        let key = meta.key();
        // Usually removes the page's entry; a publisher that found this page
        // Evicting may have replaced the entry already, and that is fine.
        // Whoever removes the entry reports it, so a publisher that cleared
        // it reports the removal before its own store of the key.
        let removed = self.map.remove_if(&key, handle, guard)?;
        if removed {
            self.emit(|| crate::events::KvEvent::Removed { key });
        }
        if let Some(parent) = meta.parent() {
            self.detach_child(parent, notify_parent);
        }
        let spread = fingerprint(&key);
        let tokens = meta.valid_tokens();
        self.stats.add(spread, Count::Evictions, 1);
        self.stats
            .add(spread, Count::EvictedTokens, u64::from(tokens));
        let page = ev.refill();
        // Still the block's bytes: refilling hands the page over as it is.
        if removed && let Some(sink) = &self.spill {
            sink.evicted(&key, tokens, page.bytes());
        }
        Ok(page)
    }

    fn detach_child(&self, parent: PageHandle, notify: bool) {
        let pm = self.meta(parent.id());
        if pm.children.fetch_sub(1, Relaxed) == 1 && notify {
            self.policy
                .on_became_leaf(self.event(parent.id(), &pm.key(), 0));
        }
    }

    /// Evicts up to `n` pages now (for trimming); returns how many went.
    pub fn evict(&self, n: u32, guard: &Guard) -> Result<u32> {
        self.map.check_guard(guard)?;
        self.drain_reads();
        let mut done = 0;
        while done < n {
            let mut taken = None;
            self.policy.evict_one(&mut |page, pass| {
                taken = self.try_begin_evict(page, pass, 0);
                taken.is_some()
            });
            let Some(ev) = taken else { break };
            drop(self.commit_eviction(ev, true, guard)?);
            done += 1;
        }
        Ok(done)
    }

    /// Makes a filled page findable under `key` and returns a reference to
    /// the cached page for `key`: normally `page` itself; if another worker
    /// published `key` first, theirs, and `page` goes back to the pool.
    ///
    /// `parent` is the reference the caller holds on the previous block of
    /// the sequence (if any): while `page` is cached, the parent is not
    /// evicted. `valid_tokens` is how many of the block's tokens `page`
    /// holds.
    pub fn publish<'s>(
        &'s self,
        request: &RequestTicket,
        page: PageMut<'s, 'm>,
        key: SliceKey,
        parent: Option<&PageRef<'s, 'm>>,
        valid_tokens: u32,
        guard: &Guard,
    ) -> Result<PageRef<'s, 'm>> {
        self.map.check_guard(guard)?;
        request.check(self.id())?;
        let block_tokens = self.layout().block_tokens();
        if valid_tokens == 0 || valid_tokens > block_tokens {
            return Err(Error::OutOfRange {
                what: "valid tokens of a published page",
                index: u64::from(valid_tokens),
                bound: u64::from(block_tokens) + 1,
            });
        }
        // A foreign page's index would name one of ours: another block.
        self.check_ours(page.pool(), "page from another store")?;
        // The policy's insert comes last; its own miss can overlap ours.
        let spread = fingerprint(&key);
        self.policy.prefetch(spread);
        if let Some(p) = parent {
            self.check_ours(p.pool(), "parent page from another store")?;
        }
        // The policy sees this request's hits before its insert; usually
        // `allocate` has applied them already.
        if self
            .reads
            .as_ref()
            .is_some_and(|r| !r.settled(request.serial))
        {
            self.drain_reads();
        }
        let mut extends_leaf = false;
        if let Some(p) = parent {
            let pm = self.meta(p.handle().id());
            if pm.children.fetch_add(1, Relaxed) == 0 {
                extends_leaf = true;
                self.policy.on_became_parent(self.event(
                    p.handle().id(),
                    &pm.key(),
                    request.serial,
                ));
            }
        }
        let id = page.handle().id();
        self.meta(id)
            .set(&key, parent.map(PageRef::handle), valid_tokens);
        let ours = page.publish();
        loop {
            match self.map.insert(key, ours.handle(), guard)? {
                None => {
                    self.stats.add(spread, Count::Inserts, 1);
                    self.emit(|| crate::events::KvEvent::Stored {
                        key,
                        parent: parent.map(|p| self.meta(p.handle().id()).key().block),
                        tokens: valid_tokens,
                    });
                    let event = self.event(id, &key, request.serial);
                    match parent {
                        Some(p) => {
                            self.policy
                                .on_insert_child(event, p.handle().id(), extends_leaf)
                        }
                        None => self.policy.on_insert(event),
                    }
                    return Ok(ours);
                }
                Some(existing) => match self.pool.try_acquire(existing) {
                    Ok(theirs) => {
                        self.stats.add(spread, Count::Duplicates, 1);
                        self.record(Access::Hit(self.event(
                            theirs.handle().id(),
                            &key,
                            request.serial,
                        )));
                        self.discard(ours);
                        return Ok(theirs);
                    }
                    // Theirs is being evicted, and the eviction may yet be
                    // undone (an allocation that runs short puts its
                    // victims back): its entry must stay until it is
                    // decided, or the restored page would be cached under
                    // a key that reaches ours. Committing removes the
                    // entry; undoing makes the acquire succeed.
                    Err(Error::PageBusy { .. }) => crate::sync::spin_hint(),
                    // Theirs was evicted: clear its stale entry, if still
                    // there, and try again.
                    Err(_) => {
                        if self.map.remove_if(&key, existing, guard)? {
                            self.emit(|| crate::events::KvEvent::Removed { key });
                        }
                    }
                },
            }
        }
    }

    /// Frees a published page that never entered the map or the policy.
    fn discard(&self, page: PageRef<'_, 'm>) {
        let handle = page.handle();
        drop(page);
        let parent = self.meta(handle.id()).parent();
        // Nobody else knows this page, so eviction cannot fail.
        if self.pool.try_evict(handle).is_ok()
            && let Some(parent) = parent
        {
            self.detach_child(parent, true);
        }
    }

    /// Sets the priority of the cached page for `key`; returns whether
    /// `key` was cached.
    pub fn set_priority(&self, key: &SliceKey, priority: Priority, guard: &Guard) -> Result<bool> {
        let Some(handle) = self.map.get(key, guard)? else {
            return Ok(false);
        };
        // Holding a reference while writing makes the write visible to any
        // later evictor (which needs the references gone).
        let Ok(page) = self.pool.try_acquire(handle) else {
            return Ok(false);
        };
        self.meta(page.handle().id()).set_priority(priority);
        Ok(true)
    }

    /// How many cached child blocks depend on `page` (diagnostics, tests).
    pub fn children(&self, page: PageId) -> Result<u32> {
        crate::error::check_index("page", page.0 as usize, self.meta.len())?;
        Ok(self.meta(page).children.load(Relaxed))
    }
}

/// The 64-bit summary of a key that policies receive as
/// [`PageEvent::fingerprint`] (also used to stripe counters). Offline tools
/// use it to relate policy events to keys they know.
///
/// ```
/// use kvslice_core::{BlockHash, SliceKey, store::fingerprint};
///
/// let k = SliceKey { block: BlockHash(5), block_index: 0, layer_group: 0, head_shard: 0 };
/// assert_eq!(fingerprint(&k), 5);
/// ```
pub fn fingerprint(key: &SliceKey) -> u64 {
    (key.block.0 as u64) ^ (u64::from(key.layer_group) << 40) ^ (u64::from(key.head_shard) << 20)
}
