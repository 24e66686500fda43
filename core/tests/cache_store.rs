//! The cache store: prefix lookups, dedup on publish, eviction rules,
//! all-or-nothing allocation and stats. Random operation sequences with
//! full invariant checks run through `kvslice_core::fuzzing::cache_store`
//! (see `fuzz_corpus.rs`).

use kvslice_core::{
    BlockHash, CacheStore, ClockPolicy, Error, EvictPass, EvictionPolicy, KvDtype, KvLayout,
    LayoutSpec, LruPolicy, PageEvent, PageId, PageRef, Priority, SliceKey,
};

const BT: u32 = 4;

fn layout() -> KvLayout {
    KvLayout::new(LayoutSpec::new(1, 1, 1, 2, BT, KvDtype::F32)).unwrap()
}

/// Keys of a chain: sequence `seq`, blocks `0..n`.
fn chain(seq: u64, n: u32) -> Vec<SliceKey> {
    (0..n)
        .map(|i| SliceKey {
            block: BlockHash(u128::from(seq) << 64 | u128::from(i)),
            block_index: i,
            layer_group: 0,
            head_shard: 0,
        })
        .collect()
}

/// Looks up `keys`, fills and publishes the misses, returns all references.
fn serve<'s, E: EvictionPolicy>(
    store: &'s CacheStore<'static, E>,
    keys: &[SliceKey],
) -> Result<Vec<PageRef<'s, 'static>>, Error> {
    let guard = store.pin();
    let req = store.begin_request();
    let mut held = Vec::new();
    let hits = store.lookup_prefix(&req, keys, keys.len() * BT as usize, &guard, &mut held)?;
    let pages = store.allocate((keys.len() - hits) as u32, &guard)?;
    for (key, mut page) in keys[hits..].iter().zip(pages) {
        page.bytes_mut()[0] = key.block_index as u8;
        let parent = held.last();
        let r = store.publish(&req, page, *key, parent, BT, &guard)?;
        held.push(r);
    }
    Ok(held)
}

#[test]
fn lookup_returns_the_longest_cached_prefix() {
    let store = CacheStore::new(layout(), 16, LruPolicy::new(16)).unwrap();
    let a = chain(1, 4);
    drop(serve(&store, &a).unwrap());
    let guard = store.pin();
    let req = store.begin_request();
    let mut held = Vec::new();
    // Same first 3 blocks, different 4th: 3 hits.
    let mut b = a.clone();
    b[3] = chain(2, 4)[3];
    assert_eq!(
        store
            .lookup_prefix(&req, &b, 16, &guard, &mut held)
            .unwrap(),
        3
    );
    assert!(
        held.iter()
            .zip(&a)
            .all(|(r, k)| r.bytes()[0] == k.block_index as u8)
    );
    // A gap stops the prefix even if later blocks are cached.
    let mut c = a.clone();
    c[1] = chain(3, 2)[1];
    held.clear();
    assert_eq!(
        store
            .lookup_prefix(&req, &c, 16, &guard, &mut held)
            .unwrap(),
        1
    );
    let s = store.stats();
    assert_eq!(
        (s.lookups, s.hit_blocks, s.miss_blocks),
        (3, 3 + 1, 4 + 1 + 3)
    );
    assert_eq!((s.hit_tokens, s.miss_tokens), (4 * 4, 16 + 4 + 12));
}

#[test]
fn duplicate_publish_keeps_one_page_and_both_hold_it() {
    let store = CacheStore::new(layout(), 4, ClockPolicy::new(4)).unwrap();
    let key = chain(1, 1)[0];
    let guard = store.pin();
    let req = store.begin_request();
    let mut pages = store.allocate(2, &guard).unwrap();
    let (p2, p1) = (pages.pop().unwrap(), pages.pop().unwrap());
    let first = store.publish(&req, p1, key, None, BT, &guard).unwrap();
    let second = store.publish(&req, p2, key, None, BT, &guard).unwrap();
    assert_eq!(first.handle(), second.handle());
    assert_eq!(
        store.pool().free_pages(),
        3,
        "the duplicate went back to the pool"
    );
    assert_eq!(store.pool().page_info(first.handle().id()).unwrap().refs, 2);
    assert_eq!(store.stats().duplicate_publishes, 1);
}

#[test]
fn eviction_respects_references_parents_and_pins() {
    let store = CacheStore::new(layout(), 6, LruPolicy::new(6)).unwrap();
    let a = chain(1, 3);
    let held_a = serve(&store, &a).unwrap();
    let b = chain(2, 3);
    drop(serve(&store, &b).unwrap());
    let guard = store.pin();
    let req = store.begin_request();
    // Pool full. `a` is referenced, so only `b`'s pages can go, leaf first.
    let pages = store.allocate(1, &guard).unwrap();
    let mut held = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &b, 12, &guard, &mut held)
            .unwrap(),
        2,
        "b's leaf went first"
    );
    drop(held);
    drop(pages);
    // Pin b[0]: with b[1] gone and one page free, two more allocations must
    // take b[1] and then fail rather than touch the pinned b[0] or held a.
    assert!(store.set_priority(&b[0], Priority::Pinned, &guard).unwrap());
    let two = store.allocate(2, &guard).unwrap();
    assert!(matches!(
        store.allocate(1, &guard),
        Err(Error::CapacityExhausted(_))
    ));
    drop(two);
    let mut held = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &b, 12, &guard, &mut held)
            .unwrap(),
        1
    );
    drop(held);
    drop(held_a);
    // Unreferenced now: a's pages are evictable, leaf first.
    let three = store.allocate(3, &guard).unwrap();
    assert_eq!(three.len(), 3);
    drop(three);
    let mut held = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &b, 12, &guard, &mut held)
            .unwrap(),
        1,
        "pinned b[0] survived"
    );
}

#[test]
fn high_priority_goes_only_after_normal_pages() {
    let store = CacheStore::new(layout(), 2, ClockPolicy::new(2)).unwrap();
    let sys = chain(1, 1);
    let user = chain(2, 1);
    drop(serve(&store, &sys).unwrap());
    drop(serve(&store, &user).unwrap());
    let guard = store.pin();
    let req = store.begin_request();
    store.set_priority(&sys[0], Priority::High, &guard).unwrap();
    let one = store.allocate(1, &guard).unwrap();
    let mut held = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &sys, 4, &guard, &mut held)
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .lookup_prefix(&req, &user, 4, &guard, &mut Vec::new())
            .unwrap(),
        0
    );
    drop(held);
    let two = store.allocate(1, &guard).unwrap();
    assert_eq!(
        store
            .lookup_prefix(&req, &sys, 4, &guard, &mut Vec::new())
            .unwrap(),
        0
    );
    drop((one, two));
}

#[test]
fn failed_allocate_leaves_the_store_as_it_was() {
    let store = CacheStore::new(layout(), 5, LruPolicy::new(5)).unwrap();
    let a = chain(1, 3);
    let held = serve(&store, &a).unwrap();
    let b = chain(2, 2);
    drop(serve(&store, &b).unwrap());
    let guard = store.pin();
    let req = store.begin_request();
    let before: Vec<_> = (0..5)
        .map(|i| store.pool().page_info(PageId(i)).unwrap())
        .collect();
    // Two evictable pages (b), three needed.
    assert!(matches!(
        store.allocate(3, &guard),
        Err(Error::CapacityExhausted(_))
    ));
    let after: Vec<_> = (0..5)
        .map(|i| store.pool().page_info(PageId(i)).unwrap())
        .collect();
    assert_eq!(before, after);
    assert_eq!(
        store
            .lookup_prefix(&req, &b, 8, &guard, &mut Vec::new())
            .unwrap(),
        2
    );
    assert_eq!(store.stats().evictions, 0);
    // More pages than the pool has: refused at once, without reserving
    // room for them (u32::MAX guards would be 64 GiB).
    assert!(matches!(
        store.allocate(u32::MAX, &guard),
        Err(Error::CapacityExhausted(_))
    ));
    assert!(matches!(
        store.allocate(6, &guard),
        Err(Error::CapacityExhausted(_))
    ));
    assert_eq!(store.stats().evictions, 0);
    drop(held);
}

/// A failed allocate puts the pages it took back in LRU order: the
/// oldest is still the next to go.
#[test]
fn failed_allocate_keeps_the_lru_order() {
    let store = CacheStore::new(layout(), 4, LruPolicy::new(4)).unwrap();
    let chains: Vec<_> = (10..14).map(|s| chain(s, 1)).collect();
    for c in &chains[..2] {
        drop(serve(&store, c).unwrap());
    }
    let held: Vec<_> = chains[2..]
        .iter()
        .map(|c| serve(&store, c).unwrap())
        .collect();
    let guard = store.pin();
    // Two evictable pages, three needed: both taken, then put back.
    assert!(matches!(
        store.allocate(3, &guard),
        Err(Error::CapacityExhausted(_))
    ));
    drop(held);
    assert_eq!(store.evict(1, &guard).unwrap(), 1);
    let req = store.begin_request();
    let cached: Vec<usize> = chains
        .iter()
        .map(|c| {
            store
                .lookup_prefix(&req, c, BT as usize, &guard, &mut Vec::new())
                .unwrap()
        })
        .collect();
    assert_eq!(cached, [0, 1, 1, 1], "the oldest page went");
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let store = CacheStore::new(layout(), 2, LruPolicy::new(2)).unwrap();
    let guard = store.pin();
    let req = store.begin_request();
    let page = store.allocate(1, &guard).unwrap().pop().unwrap();
    let key = chain(1, 1)[0];
    assert!(matches!(
        store.publish(&req, page, key, None, BT + 1, &guard),
        Err(Error::OutOfRange { .. })
    ));
    assert_eq!(store.pool().free_pages(), 2, "the rejected page was freed");
    // The collector outlives the handle registered with it: dropping a
    // temporary collector's last handle frees the collector from inside
    // crossbeam-epoch's `Local::finalize`, which Miri reports as a
    // deallocation through a protected reference (see `kvslice_core::epoch`).
    let collector = crossbeam_epoch::Collector::new();
    let other = collector.register();
    assert!(store.allocate(1, &other.pin()).is_err());
    assert!(CacheStore::new(layout(), 4, LruPolicy::new(3)).is_err());
    // A page of another store: its index names one of this store's pages.
    let held = serve(&store, &chain(2, 1)).unwrap();
    let foreign = CacheStore::new(layout(), 2, LruPolicy::new(2)).unwrap();
    let fg = foreign.pin();
    let mut page = foreign.allocate(1, &fg).unwrap().pop().unwrap();
    assert_eq!(page.handle().id(), held[0].handle().id(), "the same index");
    page.bytes_mut()[0] = 0xAB;
    let key = chain(3, 1)[0];
    assert!(matches!(
        store.publish(&req, page, key, None, BT, &guard),
        Err(Error::InvalidValue(_))
    ));
    assert_eq!(
        foreign.pool().free_pages(),
        2,
        "the page went back to its own pool"
    );
    assert_eq!(store.stats().inserts, 1);
    let mut found = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &[key], 4, &guard, &mut found)
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .lookup_prefix(&req, &chain(2, 1), 4, &guard, &mut found)
            .unwrap(),
        1
    );
    assert_eq!(found[0].bytes()[0], 0, "chain 2's own bytes");
    drop((found, held));
}

/// Clock, with every insert's and hit's event recorded; `buffered` sends
/// the hits through the store's read buffer.
struct Recording {
    inner: ClockPolicy,
    buffered: bool,
    inserts: std::sync::Mutex<Vec<PageEvent>>,
    hits: std::sync::Mutex<Vec<PageEvent>>,
}

impl EvictionPolicy for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn capacity(&self) -> u32 {
        self.inner.capacity()
    }
    fn on_insert(&self, event: PageEvent) {
        self.inserts.lock().unwrap().push(event);
        self.inner.on_insert(event);
    }
    fn on_access(&self, event: PageEvent) {
        self.hits.lock().unwrap().push(event);
        self.inner.on_access(event);
    }
    fn buffers_accesses(&self) -> bool {
        self.buffered
    }
    fn evict_one(&self, try_evict: &mut dyn FnMut(PageId, EvictPass) -> bool) -> Option<PageId> {
        self.inner.evict_one(try_evict)
    }
}

#[test]
fn events_tell_policies_which_blocks_are_partial_tails() {
    for buffered in [false, true] {
        let policy = Recording {
            inner: ClockPolicy::new(16),
            buffered,
            inserts: Default::default(),
            hits: Default::default(),
        };
        let store = CacheStore::new(layout(), 16, policy).unwrap();
        let keys = chain(1, 3);
        let guard = store.pin();
        let req = store.begin_request();
        let mut held = Vec::new();
        // Two full blocks and a tail of 3 of the block's 4 tokens.
        for (i, (key, page)) in keys
            .iter()
            .zip(store.allocate(3, &guard).unwrap())
            .enumerate()
        {
            let valid = if i == 2 { BT - 1 } else { BT };
            let r = store
                .publish(&req, page, *key, held.last(), valid, &guard)
                .unwrap();
            held.push(r);
        }
        store.end_request(req).unwrap();
        let req = store.begin_request();
        let mut again = Vec::new();
        let hits = store
            .lookup_prefix(&req, &keys, 11, &guard, &mut again)
            .unwrap();
        assert_eq!(hits, 3);
        // A buffered policy gets its hits before the next eviction.
        store.evict(1, &guard).unwrap();
        let partial = |events: &[PageEvent]| -> Vec<(u32, bool)> {
            events.iter().map(|e| (e.block_index, e.partial)).collect()
        };
        let want = vec![(0, false), (1, false), (2, true)];
        let p = store.policy();
        assert_eq!(partial(&p.inserts.lock().unwrap()), want, "{buffered}");
        assert_eq!(partial(&p.hits.lock().unwrap()), want, "{buffered}");
    }
}

/// `pin` gives a guard the store accepts whatever collector it was built
/// on: a store of its own collector is used through it like any other.
#[test]
fn pin_works_on_a_store_of_its_own_collector() {
    let collector = crossbeam_epoch::Collector::new();
    let store = CacheStore::from_parts(
        kvslice_core::PagePool::new(layout(), 4).unwrap(),
        LruPolicy::new(4),
        collector.clone(),
    )
    .unwrap();
    let guard = store.pin();
    let req = store.begin_request();
    let page = store.allocate(1, &guard).unwrap().pop().unwrap();
    let key = chain(9, 1)[0];
    let held = store.publish(&req, page, key, None, BT, &guard).unwrap();
    drop(held);
    let mut found = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &[key], BT as usize, &guard, &mut found)
            .unwrap(),
        1
    );
    drop(found);
    store.end_request(req).unwrap();
}
