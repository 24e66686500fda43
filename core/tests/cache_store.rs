//! The cache store: prefix lookups, dedup on publish, eviction rules,
//! all-or-nothing allocation, stats, and random operation sequences
//! checked against a model.

use std::collections::{HashMap, HashSet};

use kvslice_core::testkit::Rng;
use kvslice_core::{
    BlockHash, CacheStore, ClockPolicy, Error, EvictionPolicy, KvDtype, KvLayout, LayoutSpec, Life,
    LruPolicy, PageId, PageRef, Priority, SliceKey,
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
    let mut held = Vec::new();
    let hits = store.lookup_prefix(keys, keys.len() * BT as usize, &guard, &mut held)?;
    let pages = store.allocate((keys.len() - hits) as u32, &guard)?;
    for (key, mut page) in keys[hits..].iter().zip(pages) {
        page.bytes_mut()[0] = key.block_index as u8;
        let parent = held.last();
        let r = store.publish(page, *key, parent, BT, &guard)?;
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
    let mut held = Vec::new();
    // Same first 3 blocks, different 4th: 3 hits.
    let mut b = a.clone();
    b[3] = chain(2, 4)[3];
    assert_eq!(store.lookup_prefix(&b, 16, &guard, &mut held).unwrap(), 3);
    assert!(
        held.iter()
            .zip(&a)
            .all(|(r, k)| r.bytes()[0] == k.block_index as u8)
    );
    // A gap stops the prefix even if later blocks are cached.
    let mut c = a.clone();
    c[1] = chain(3, 2)[1];
    held.clear();
    assert_eq!(store.lookup_prefix(&c, 16, &guard, &mut held).unwrap(), 1);
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
    let mut pages = store.allocate(2, &guard).unwrap();
    let (p2, p1) = (pages.pop().unwrap(), pages.pop().unwrap());
    let first = store.publish(p1, key, None, BT, &guard).unwrap();
    let second = store.publish(p2, key, None, BT, &guard).unwrap();
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
    // Pool full. `a` is referenced, so only `b`'s pages can go, leaf first.
    let pages = store.allocate(1, &guard).unwrap();
    let mut held = Vec::new();
    assert_eq!(
        store.lookup_prefix(&b, 12, &guard, &mut held).unwrap(),
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
    assert_eq!(store.lookup_prefix(&b, 12, &guard, &mut held).unwrap(), 1);
    drop(held);
    drop(held_a);
    // Unreferenced now: a's pages are evictable, leaf first.
    let three = store.allocate(3, &guard).unwrap();
    assert_eq!(three.len(), 3);
    drop(three);
    let mut held = Vec::new();
    assert_eq!(
        store.lookup_prefix(&b, 12, &guard, &mut held).unwrap(),
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
    store.set_priority(&sys[0], Priority::High, &guard).unwrap();
    let one = store.allocate(1, &guard).unwrap();
    let mut held = Vec::new();
    assert_eq!(store.lookup_prefix(&sys, 4, &guard, &mut held).unwrap(), 1);
    assert_eq!(
        store
            .lookup_prefix(&user, 4, &guard, &mut Vec::new())
            .unwrap(),
        0
    );
    drop(held);
    let two = store.allocate(1, &guard).unwrap();
    assert_eq!(
        store
            .lookup_prefix(&sys, 4, &guard, &mut Vec::new())
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
        store.lookup_prefix(&b, 8, &guard, &mut Vec::new()).unwrap(),
        2
    );
    assert_eq!(store.stats().evictions, 0);
    drop(held);
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let store = CacheStore::new(layout(), 2, LruPolicy::new(2)).unwrap();
    let guard = store.pin();
    let page = store.allocate(1, &guard).unwrap().pop().unwrap();
    let key = chain(1, 1)[0];
    assert!(matches!(
        store.publish(page, key, None, BT + 1, &guard),
        Err(Error::OutOfRange { .. })
    ));
    assert_eq!(store.pool().free_pages(), 2, "the rejected page was freed");
    let other = crossbeam_epoch::Collector::new().register();
    assert!(store.allocate(1, &other.pin()).is_err());
    assert!(CacheStore::new(layout(), 4, LruPolicy::new(3)).is_err());
}

/// Random serve/release/pin/evict sequences; after every step: no page is
/// lost, every referenced page is cached and mapped, every map entry names a
/// cached page, and children counts match the cached parent links.
#[test]
fn random_operations_keep_the_invariants() {
    const CAP: u32 = 12;
    for seed in 0..60 {
        let mut rng = Rng::new(seed);
        let store = CacheStore::new(layout(), CAP, ClockPolicy::new(CAP)).unwrap();
        let mut requests: Vec<(Vec<SliceKey>, Vec<PageRef<'_, 'static>>)> = Vec::new();
        let mut ever: HashSet<SliceKey> = HashSet::new();
        for _ in 0..400 {
            match rng.below(5) {
                0..=1 => {
                    // Sequences share prefixes: 3 roots, random depth.
                    let keys = chain(rng.below(3), 1 + rng.below(5) as u32);
                    match serve(&store, &keys) {
                        Ok(held) => {
                            assert_eq!(held.len(), keys.len());
                            ever.extend(keys.iter().copied());
                            requests.push((keys, held));
                        }
                        Err(e) => assert!(matches!(e, Error::CapacityExhausted(_)), "{e:?}"),
                    }
                }
                2 if !requests.is_empty() => {
                    drop(requests.swap_remove(rng.below(requests.len() as u64) as usize))
                }
                3 => {
                    let guard = store.pin();
                    let _ = store.evict(1 + rng.below(3) as u32, &guard).unwrap();
                }
                _ => {
                    let guard = store.pin();
                    let key = chain(rng.below(3), 5)[rng.below(5) as usize];
                    let p =
                        [Priority::Normal, Priority::High, Priority::Pinned][rng.below(3) as usize];
                    let _ = store.set_priority(&key, p, &guard).unwrap();
                }
            }
            check(&store, &requests, &ever);
        }
        drop(requests);
        check(&store, &[], &ever);
    }
}

fn check<E: EvictionPolicy>(
    store: &CacheStore<'static, E>,
    requests: &[(Vec<SliceKey>, Vec<PageRef<'_, 'static>>)],
    ever: &HashSet<SliceKey>,
) {
    let guard = store.pin();
    let cap = store.pool().capacity();
    let mut refs = vec![0u32; cap as usize];
    for (keys, held) in requests {
        for (k, r) in keys.iter().zip(held) {
            refs[r.handle().id().0 as usize] += 1;
            // A referenced page stays cached and findable under its key.
            let info = store.pool().page_info(r.handle().id()).unwrap();
            assert_eq!(
                (info.life, info.generation),
                (Life::Cached, r.handle().generation())
            );
            assert_eq!(store.map().get(k, &guard).unwrap(), Some(r.handle()));
        }
    }
    let mut mapped: HashMap<PageId, SliceKey> = HashMap::new();
    for k in ever {
        if let Some(h) = store.map().get(k, &guard).unwrap() {
            let info = store.pool().page_info(h.id()).unwrap();
            assert_eq!(
                (info.life, info.generation),
                (Life::Cached, h.generation()),
                "map entry names a cached page"
            );
            assert!(mapped.insert(h.id(), *k).is_none(), "two keys share a page");
        }
    }
    let mut children = vec![0u32; cap as usize];
    for key in mapped.values() {
        if key.block_index > 0 {
            let parent = SliceKey {
                block_index: key.block_index - 1,
                block: BlockHash(key.block.0 - 1),
                ..*key
            };
            let ph = store
                .map()
                .get(&parent, &guard)
                .unwrap()
                .expect("a cached block's parent is cached");
            children[ph.id().0 as usize] += 1;
        }
    }
    for i in 0..cap {
        let info = store.pool().page_info(PageId(i)).unwrap();
        assert_eq!(info.refs, refs[i as usize], "page {i} references");
        match info.life {
            Life::Free => assert!(!mapped.contains_key(&PageId(i))),
            Life::Cached => assert!(
                mapped.contains_key(&PageId(i)),
                "cached page {i} is mapped (no page lost)"
            ),
            other => panic!("page {i} left {other:?}"),
        }
        if info.life == Life::Cached {
            assert_eq!(
                store.children(PageId(i)).unwrap(),
                children[i as usize],
                "page {i} children"
            );
        }
    }
}
