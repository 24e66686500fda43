//! loom model of the spin lock behind `LruPolicy` and `TinyLfuPolicy`,
//! driven through `LruPolicy`'s public API: concurrent list updates and
//! evictions never lose, duplicate or corrupt a page.

use kvslice_core::{EvictionPolicy, LruPolicy, PageEvent, PageId};
use kvslice_loom_tests::{Arc, model, thread};

fn ev(page: u32) -> PageEvent {
    PageEvent {
        page: PageId(page),
        fingerprint: u64::from(page),
        block_index: 0,
        request: 0,
        partial: false,
    }
}

/// One thread inserts and touches pages while another evicts: each page
/// comes out of the list exactly once, whatever the interleaving.
#[test]
fn lru_list_under_concurrent_insert_and_evict() {
    model(|| {
        let lru = Arc::new(LruPolicy::new(3));
        lru.on_insert(ev(0));
        let inserter = {
            let lru = lru.clone();
            thread::spawn(move || {
                lru.on_insert(ev(1));
                lru.on_access(ev(0));
                lru.on_insert(ev(2));
            })
        };
        let evictor = {
            let lru = lru.clone();
            thread::spawn(move || lru.evict_one(&mut |_, _| true))
        };
        inserter.join().unwrap();
        let first = evictor
            .join()
            .unwrap()
            .expect("page 0 was listed before both threads");
        let mut out = vec![first.0];
        while let Some(p) = lru.evict_one(&mut |_, _| true) {
            out.push(p.0);
        }
        out.sort_unstable();
        assert_eq!(out, [0, 1, 2], "every page evicted exactly once");
    });
}
