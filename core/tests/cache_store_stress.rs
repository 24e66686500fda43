//! Two threads × 10 million mixed store operations on a small, shared,
//! always-full store; then every invariant is checked.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use kvslice_core::testkit::Rng;
use kvslice_core::{
    BlockHash, CacheStore, ClockPolicy, Error, KvDtype, KvLayout, LayoutSpec, Life, PageId,
    PageRef, SliceKey,
};

const CAP: u32 = 64;
// Miri interprets every operation: a few hundred there, the same checks.
const OPS_PER_THREAD: u64 = if cfg!(miri) { 300 } else { 10_000_000 };

fn key(root: u64, i: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(root) << 64 | u128::from(i)),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}

#[test]
fn two_threads_ten_million_operations_each() {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32)).unwrap();
    let store = CacheStore::new(layout, CAP, ClockPolicy::new(CAP)).unwrap();
    let looked_up_blocks = AtomicU64::new(0);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (store, looked_up_blocks) = (&store, &looked_up_blocks);
            s.spawn(move || {
                let mut rng = Rng::new(t);
                let mut held: Vec<Vec<PageRef<'_, 'static>>> = Vec::new();
                let mut ops = 0u64;
                while ops < OPS_PER_THREAD {
                    let guard = store.pin();
                    // 24 roots sharing up to 6-block chains: heavy overlap
                    // between the threads, and more blocks than pages.
                    let root = rng.below(24);
                    let depth = 1 + rng.below(6) as u32;
                    let keys: Vec<SliceKey> = (0..depth).map(|i| key(root, i)).collect();
                    let mut refs = Vec::new();
                    let req = store.begin_request();
                    let hits = store
                        .lookup_prefix(&req, &keys, keys.len() * 4, &guard, &mut refs)
                        .unwrap();
                    looked_up_blocks.fetch_add(keys.len() as u64, Relaxed);
                    ops += 1;
                    if hits < keys.len() {
                        match store.allocate((keys.len() - hits) as u32, &guard) {
                            Ok(pages) => {
                                for (k, mut page) in keys[hits..].iter().zip(pages) {
                                    page.bytes_mut()[0] = (root as u8) ^ (k.block_index as u8);
                                    let r = store
                                        .publish(&req, page, *k, refs.last(), 4, &guard)
                                        .unwrap();
                                    refs.push(r);
                                    ops += 1;
                                }
                            }
                            Err(Error::CapacityExhausted(_)) => {}
                            Err(e) => panic!("{e:?}"),
                        }
                        ops += 1;
                    }
                    store.end_request(req).unwrap();
                    // Every page we hold has the contents its key implies:
                    // no reader ever sees a page refilled under it.
                    for (k, r) in keys.iter().zip(&refs) {
                        assert_eq!(r.bytes()[0], (root as u8) ^ (k.block_index as u8));
                    }
                    held.push(refs);
                    if held.len() > 3 {
                        held.remove(rng.below(held.len() as u64) as usize);
                        ops += 1;
                    }
                }
            });
        }
    });
    println!(
        "2 × {OPS_PER_THREAD} operations in {:.2?}",
        started.elapsed()
    );

    // Invariants, all threads done.
    let stats = store.stats();
    let mut cached = 0u64;
    for i in 0..CAP {
        let info = store.pool().page_info(PageId(i)).unwrap();
        assert_eq!(info.refs, 0, "page {i} still referenced");
        match info.life {
            Life::Cached => cached += 1,
            Life::Free => {}
            other => panic!("page {i} left {other:?}"),
        }
    }
    assert_eq!(
        cached + u64::from(store.pool().free_pages()),
        u64::from(CAP),
        "no page lost"
    );
    assert_eq!(
        cached,
        stats.inserts - stats.evictions,
        "every inserted page is cached or was evicted"
    );
    assert_eq!(
        stats.hit_blocks + stats.miss_blocks,
        looked_up_blocks.load(Relaxed)
    );
    // In Miri's few hundred operations, two publishes of one key may never
    // race; natively they always do.
    assert!(
        stats.hit_blocks > 0
            && stats.evictions > 0
            && (cfg!(miri) || stats.duplicate_publishes > 0),
        "{stats:?}"
    );
    println!("{stats:?}");
}
