//! Sequences of lookup (prefix or windowed) / allocate / publish / release /
//! evict / pin / clear on a cache store, with every invariant checked after
//! every step: no page is lost, no referenced page is evicted, every map
//! entry names a cached page, every cached block's parent is cached, and
//! the store's events, replayed, name exactly the cached blocks; a prefix
//! lookup hits exactly the cached prefix they name.

use alloc::vec::Vec;

use arbitrary::Unstructured;
use hashbrown::{HashMap, HashSet};

use super::small;
use crate::events::{EventRing, KvEvent, Medium};
use crate::{
    BlockHash, CacheStore, ChainPolicy, ClockPolicy, DensityPolicy, Error, EvictionPolicy, KvDtype,
    KvLayout, LayoutSpec, Life, LruPolicy, PageId, PagePool, PageRef, Priority, SliceKey,
    TinyLfuPolicy,
};

const BT: u32 = 4;

fn chain(root: u32, depth: u32) -> Vec<SliceKey> {
    (0..depth)
        .map(|i| SliceKey {
            block: BlockHash(u128::from(root) << 64 | u128::from(i)),
            block_index: i,
            layer_group: 0,
            head_shard: 0,
        })
        .collect()
}

/// Runs one cache-store case with a policy picked from the input.
pub fn cache_store(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let cap = small(&mut u, 1, 16);
    match small(&mut u, 0, 4) {
        0 => run(&mut u, cap, LruPolicy::new(cap)),
        1 => run(&mut u, cap, ClockPolicy::new(cap)),
        2 => run(&mut u, cap, TinyLfuPolicy::new(cap)),
        3 => run(&mut u, cap, ChainPolicy::new(cap)),
        _ => run(&mut u, cap, DensityPolicy::new(cap)),
    }
}

type Held<'s> = (Vec<SliceKey>, Vec<PageRef<'s, 'static>>);

fn run<E: EvictionPolicy>(u: &mut Unstructured<'_>, cap: u32, policy: E) {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, BT, KvDtype::F32)).expect("valid");
    let pool = PagePool::new(layout, cap).expect("pool");
    let store = CacheStore::from_parts(pool, policy, crossbeam_epoch::Collector::new())
        .expect("store")
        .with_events(EventRing::new(1024, Medium::Cpu));
    let mut index: HashSet<SliceKey> = HashSet::new();
    let local = store.map().collector().register();
    let mut requests: Vec<Held<'_>> = Vec::new();
    let mut ever: HashSet<SliceKey> = HashSet::new();
    while !u.is_empty() {
        let guard = local.pin();
        match small(u, 0, 5) {
            op @ (0 | 1) => {
                let req = store.begin_request();
                let mut keys = chain(small(u, 0, 3), small(u, 1, 6));
                let mut held = Vec::new();
                let tokens = keys.len() * BT as usize;
                // Op 1 looks up under a sliding window: blocks before the
                // ones the window needs may be missing, and are not held.
                let hits = if op == 1 {
                    let window = small(u, 1, 12);
                    let hit = store
                        .lookup_window(&req, &keys, tokens, window, &guard, &mut held)
                        .expect("own guard");
                    assert_eq!(held.len(), hit.end - hit.first);
                    assert!(hit.first <= hit.end && hit.end <= keys.len());
                    if held.is_empty() && hit.end > 0 {
                        // A one-token window needs no block: nothing held
                        // to publish the rest under, so they are not.
                        store.end_request(req).expect("own request");
                        check(&store, &requests, &ever, &mut index);
                        continue;
                    }
                    keys.drain(..hit.first);
                    hit.end - hit.first
                } else {
                    let hits = store
                        .lookup_prefix(&req, &keys, tokens, &guard, &mut held)
                        .expect("own guard");
                    // One thread: every cached block of the chain's prefix
                    // is a hit, and the events (replayed into `index`) say
                    // which are cached.
                    let cached = keys.iter().take_while(|k| index.contains(*k)).count();
                    assert_eq!(hits, cached, "a cached prefix missed, or a hit on nothing");
                    hits
                };
                for (k, r) in keys.iter().zip(&held) {
                    assert_eq!(
                        r.bytes()[0],
                        k.block_index as u8 + 1,
                        "hit on the wrong page"
                    );
                }
                match store.allocate((keys.len() - hits) as u32, &guard) {
                    Ok(pages) => {
                        for (k, mut page) in keys[hits..].iter().zip(pages) {
                            page.bytes_mut()[0] = k.block_index as u8 + 1;
                            let r = store
                                .publish(&req, page, *k, held.last(), BT, &guard)
                                .expect("valid publish");
                            held.push(r);
                        }
                        ever.extend(keys.iter().copied());
                        requests.push((keys, held));
                    }
                    Err(e) => assert!(matches!(e, Error::CapacityExhausted(_)), "{e:?}"),
                }
                store.end_request(req).expect("own request");
            }
            2 if !requests.is_empty() => {
                drop(requests.swap_remove(small(u, 0, requests.len() as u32 - 1) as usize))
            }
            3 => {
                let _ = store.evict(small(u, 1, 3), &guard).expect("own guard");
            }
            5 => {
                let emptied = store.clear(&guard).expect("own guard");
                let cached = (0..cap).any(|i| {
                    store.pool().page_info(PageId(i)).expect("in range").life == Life::Cached
                });
                assert_eq!(emptied, !cached);
                // What stays is held or pinned; `check` confirms the
                // events agree.
            }
            _ => {
                let key = chain(small(u, 0, 3), 6)[small(u, 0, 5) as usize];
                let p =
                    [Priority::Normal, Priority::High, Priority::Pinned][small(u, 0, 2) as usize];
                let _ = store.set_priority(&key, p, &guard).expect("own guard");
            }
        }
        check(&store, &requests, &ever, &mut index);
    }
    drop(requests);
    check(&store, &[], &ever, &mut index);
}

fn check<E: EvictionPolicy>(
    store: &CacheStore<'static, E>,
    requests: &[Held<'_>],
    ever: &HashSet<SliceKey>,
    index: &mut HashSet<SliceKey>,
) {
    let local = store.map().collector().register();
    let guard = local.pin();
    let cap = store.pool().capacity();
    let mut refs = alloc::vec![0u32; cap as usize];
    for (keys, held) in requests {
        for (k, r) in keys.iter().zip(held) {
            refs[r.handle().id().0 as usize] += 1;
            let info = store.pool().page_info(r.handle().id()).expect("in range");
            assert_eq!(
                (info.life, info.generation),
                (Life::Cached, r.handle().generation()),
                "a held page was evicted"
            );
            assert_eq!(
                store.map().get(k, &guard).expect("own guard"),
                Some(r.handle())
            );
        }
    }
    let mut mapped: HashMap<PageId, SliceKey> = HashMap::new();
    for k in ever {
        if let Some(h) = store.map().get(k, &guard).expect("own guard") {
            let info = store.pool().page_info(h.id()).expect("in range");
            assert_eq!(
                (info.life, info.generation),
                (Life::Cached, h.generation()),
                "map entry names a cached page"
            );
            assert!(mapped.insert(h.id(), *k).is_none(), "two keys share a page");
        }
    }
    let mut children = alloc::vec![0u32; cap as usize];
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
                .expect("own guard")
                .expect("a cached block's parent is cached");
            children[ph.id().0 as usize] += 1;
        }
    }
    for i in 0..cap {
        let info = store.pool().page_info(PageId(i)).expect("in range");
        assert_eq!(info.refs, refs[i as usize], "page {i} references");
        match info.life {
            Life::Free => assert!(!mapped.contains_key(&PageId(i))),
            Life::Cached => {
                assert!(
                    mapped.contains_key(&PageId(i)),
                    "cached page {i} is mapped (no page lost)"
                );
                assert_eq!(
                    store.children(PageId(i)).expect("in range"),
                    children[i as usize],
                    "page {i} children"
                );
            }
            other => panic!("page {i} left {other:?}"),
        }
    }
    let ring = store.events().expect("attached");
    ring.try_drain(&mut |_, e| match e {
        KvEvent::Stored { key, .. } => assert!(index.insert(key), "{key:?} stored twice"),
        KvEvent::Removed { key } => assert!(index.remove(&key), "{key:?} removed, not stored"),
        KvEvent::Cleared => {
            assert!(mapped.is_empty(), "cleared, but blocks are cached");
            index.clear();
        }
    });
    assert_eq!(ring.dropped(), 0);
    let cached: HashSet<SliceKey> = mapped.values().copied().collect();
    assert_eq!(*index, cached, "the events name the cached blocks");
}
