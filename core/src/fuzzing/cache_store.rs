//! Sequences of lookup (prefix or windowed) / allocate / publish / release /
//! evict / pin / clear on a cache store, with every invariant checked after
//! every step: no page is lost, no referenced page is evicted, every map
//! entry names a cached page, every cached block's parent is cached
//! (windowed sequences publish without parents, so their chains get
//! gaps), blocks published twice keep the first page, and the store's
//! events, replayed, name exactly the cached blocks; a prefix
//! lookup hits exactly the cached prefix they name, a windowed one the
//! longest prefix whose window they name cached; a pinned block stays; an
//! eviction or allocation that comes up short had nothing more it could
//! take.

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

/// What the harness knows of the store besides the requests' references.
#[derive(Default)]
struct Model {
    /// The blocks the store's events, replayed, say are cached.
    index: HashSet<SliceKey>,
    /// Every block ever published.
    ever: HashSet<SliceKey>,
    /// Blocks pinned by a `set_priority` that found them.
    pinned: HashSet<SliceKey>,
    /// Blocks past the first of their chain that were published without
    /// a parent (windowed sequences are): the block before may go first.
    parentless: HashSet<SliceKey>,
}

impl Model {
    /// The block before `key` in its chain, if `key` is linked to it.
    fn parent(&self, key: &SliceKey) -> Option<SliceKey> {
        (key.block_index > 0 && !self.parentless.contains(key)).then(|| SliceKey {
            block_index: key.block_index - 1,
            block: BlockHash(key.block.0 - 1),
            ..*key
        })
    }
}

fn run<E: EvictionPolicy>(u: &mut Unstructured<'_>, cap: u32, policy: E) {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, BT, KvDtype::F32)).expect("valid");
    let pool = PagePool::new(layout, cap).expect("pool");
    let store = CacheStore::from_parts(pool, policy, crossbeam_epoch::Collector::new())
        .expect("store")
        .with_events(EventRing::new(1024, Medium::Cpu));
    let local = store.map().collector().register();
    let mut requests: Vec<Held<'_>> = Vec::new();
    let mut m = Model::default();
    while !u.is_empty() {
        let guard = local.pin();
        match small(u, 0, 7) {
            op @ (0 | 1) => {
                let req = store.begin_request();
                let mut keys = chain(small(u, 0, 3), small(u, 1, 6));
                let mut held = Vec::new();
                let tokens = keys.len() * BT as usize;
                // Op 1 looks up under a sliding window: blocks before the
                // ones the window needs may be missing, and are not held.
                let hits = if op == 1 {
                    let window = small(u, 1, 12);
                    // Sometimes the last block is partial.
                    let tokens = tokens - small(u, 0, BT - 1) as usize;
                    let hit = store
                        .lookup_window(&req, &keys, tokens, window, &guard, &mut held)
                        .expect("own guard");
                    assert_eq!(held.len(), hit.end - hit.first);
                    let want = window_hit(&keys, tokens, window as usize, &m.index);
                    assert_eq!(
                        (hit.first, hit.end),
                        want,
                        "window {window}, {tokens} tokens"
                    );
                    if held.is_empty() && hit.end > 0 {
                        // A one-token window needs no block: nothing held
                        // to publish the rest under, so they are not.
                        store.end_request(req).expect("own request");
                        check(&store, &requests, &mut m);
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
                    let cached = keys.iter().take_while(|k| m.index.contains(*k)).count();
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
                            let new = page.handle();
                            // A windowed sequence's blocks go without a
                            // parent, as the store's docs advise: evicting
                            // early blocks then leaves gaps in chains.
                            let parent = if op == 1 { None } else { held.last() };
                            let linked = parent.is_some();
                            let r = store
                                .publish(&req, page, *k, parent, BT, &guard)
                                .expect("valid publish");
                            if r.handle() == new {
                                if linked || k.block_index == 0 {
                                    m.parentless.remove(k);
                                } else {
                                    m.parentless.insert(*k);
                                }
                            }
                            held.push(r);
                        }
                        m.ever.extend(keys.iter().copied());
                        requests.push((keys, held));
                    }
                    Err(e) => {
                        assert!(matches!(e, Error::CapacityExhausted(_)), "{e:?}");
                        let refs = held_refs(&requests, &held);
                        let room = store.pool().free_pages() + freeable(&store, &refs, &m);
                        assert!(
                            room < (keys.len() - hits) as u32,
                            "allocating {} failed with room for {room}",
                            keys.len() - hits
                        );
                    }
                }
                store.end_request(req).expect("own request");
            }
            2 if !requests.is_empty() => {
                drop(requests.swap_remove(small(u, 0, requests.len() as u32 - 1) as usize))
            }
            3 => {
                let n = small(u, 1, 3);
                let went = store.evict(n, &guard).expect("own guard");
                if went < n {
                    // Short: every cached page left is held, pinned or a
                    // parent.
                    let refs = held_refs(&requests, &[]);
                    let evictable = (0..store.pool().capacity()).find(|&i| {
                        let info = store.pool().page_info(PageId(i)).expect("in range");
                        info.life == Life::Cached
                            && refs.get(&i).is_none()
                            && store.children(PageId(i)).expect("in range") == 0
                            && !m.pinned.iter().any(|k| {
                                store
                                    .map()
                                    .get(k, &guard)
                                    .expect("own guard")
                                    .map(|h| h.id())
                                    == Some(PageId(i))
                            })
                    });
                    assert_eq!(evictable, None, "evicted {went} of {n}");
                }
            }
            6 => {
                // Advance the epoch so removed entries' inline slots are
                // reclaimed and reused by later publishes.
                drop(guard);
                for _ in 0..3 {
                    local.pin().flush();
                }
            }
            5 => {
                let emptied = store.clear(&guard).expect("own guard");
                // What stays is what is held or pinned, and the blocks
                // they hang from (parents outlive children).
                let mut kept: HashSet<SliceKey> = HashSet::new();
                for k in requests.iter().flat_map(|(keys, _)| keys).chain(&m.pinned) {
                    let mut at = Some(*k);
                    while let Some(k) = at {
                        kept.insert(k);
                        at = m.parent(&k);
                    }
                }
                let cached: HashSet<SliceKey> = m
                    .ever
                    .iter()
                    .filter(|k| store.map().get(k, &guard).expect("own guard").is_some())
                    .copied()
                    .collect();
                assert_eq!(cached, kept, "what a clear kept");
                assert_eq!(emptied, kept.is_empty());
            }
            7 => {
                // A block published again (as a second worker would): the
                // cached page stays, the new one goes back to the pool.
                let req = store.begin_request();
                let keys = chain(small(u, 0, 3), small(u, 1, 6));
                let mut held = Vec::new();
                let tokens = keys.len() * BT as usize;
                let hits = store
                    .lookup_prefix(&req, &keys, tokens, &guard, &mut held)
                    .expect("own guard");
                if hits > 0
                    && let Ok(mut pages) = store.allocate(1, &guard)
                {
                    let mut page = pages.pop().expect("one page");
                    page.bytes_mut()[0] = 0xff;
                    let (free, dups) =
                        (store.pool().free_pages(), store.stats().duplicate_publishes);
                    let parent = hits.checked_sub(2).map(|i| &held[i]);
                    let r = store
                        .publish(&req, page, keys[hits - 1], parent, BT, &guard)
                        .expect("valid publish");
                    assert_eq!(r.handle(), held[hits - 1].handle(), "the cached page");
                    assert_eq!(r.bytes()[0], keys[hits - 1].block_index as u8 + 1);
                    assert_eq!(store.pool().free_pages(), free + 1, "the copy went back");
                    assert_eq!(store.stats().duplicate_publishes, dups + 1);
                }
                drop(held);
                store.end_request(req).expect("own request");
            }
            _ => {
                let key = chain(small(u, 0, 3), 6)[small(u, 0, 5) as usize];
                let p =
                    [Priority::Normal, Priority::High, Priority::Pinned][small(u, 0, 2) as usize];
                if store.set_priority(&key, p, &guard).expect("own guard") {
                    if p == Priority::Pinned {
                        m.pinned.insert(key);
                    } else {
                        m.pinned.remove(&key);
                    }
                }
            }
        }
        check(&store, &requests, &mut m);
    }
    drop(requests);
    check(&store, &[], &mut m);
}

/// What a windowed lookup of `keys` should find, by the rule stated
/// plainly: the longest prefix of `end` blocks whose last block and every
/// block the token after it attends to (`window` tokens back) are cached;
/// `(first needed, end)`, or `(0, 0)`.
fn window_hit(
    keys: &[SliceKey],
    tokens: usize,
    window: usize,
    cached: &HashSet<SliceKey>,
) -> (usize, usize) {
    let bt = BT as usize;
    (1..=keys.len())
        .rev()
        .find_map(|end| {
            let next = (end * bt).min(tokens);
            let first = (next + 1).saturating_sub(window) / bt;
            keys[first.min(end - 1)..end]
                .iter()
                .all(|k| cached.contains(k))
                .then_some((first, end))
        })
        .unwrap_or((0, 0))
}

/// References held per page: by the requests, and by `more`.
fn held_refs(requests: &[Held<'_>], more: &[PageRef<'_, 'static>]) -> HashMap<u32, u32> {
    let mut refs = HashMap::new();
    let all = requests.iter().flat_map(|(_, held)| held).chain(more);
    for r in all {
        *refs.entry(r.handle().id().0).or_insert(0) += 1;
    }
    refs
}

/// Cached pages an allocation could take: unreferenced, not pinned, and
/// with every cached block hanging from them the same (a chain goes
/// together).
fn freeable<E: EvictionPolicy>(
    store: &CacheStore<'static, E>,
    refs: &HashMap<u32, u32>,
    m: &Model,
) -> u32 {
    let local = store.map().collector().register();
    let guard = local.pin();
    let mut n = 0;
    for root in 0..4 {
        // From the deepest block up: a block is freeable if it is and the
        // next block of its chain is not cached, not linked to it, or
        // freeable.
        let mut below = true;
        let keys = chain(root, 6);
        for (i, key) in keys.iter().enumerate().rev() {
            let Some(h) = store.map().get(key, &guard).expect("own guard") else {
                below = true;
                continue;
            };
            let child_linked = keys.get(i + 1).is_some_and(|c| {
                m.parent(c).is_some() && store.map().get(c, &guard).expect("own guard").is_some()
            });
            below = (below || !child_linked)
                && !refs.contains_key(&h.id().0)
                && !m.pinned.contains(key);
            n += u32::from(below);
        }
    }
    n
}

fn check<E: EvictionPolicy>(store: &CacheStore<'static, E>, requests: &[Held<'_>], m: &mut Model) {
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
    for k in &m.ever {
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
        if let Some(parent) = m.parent(key) {
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
        KvEvent::Stored { key, .. } => assert!(m.index.insert(key), "{key:?} stored twice"),
        KvEvent::Removed { key } => assert!(m.index.remove(&key), "{key:?} removed, not stored"),
        KvEvent::Cleared => {
            assert!(mapped.is_empty(), "cleared, but blocks are cached");
            m.index.clear();
        }
    });
    assert_eq!(ring.dropped(), 0);
    let cached: HashSet<SliceKey> = mapped.values().copied().collect();
    assert_eq!(m.index, cached, "the events name the cached blocks");
    assert!(m.pinned.is_subset(&cached), "a pinned block went");
}
