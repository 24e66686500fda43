//! loom models of the page pool: what each one proves is in its doc.

use kvslice_core::{Error, KvDtype, KvLayout, LayoutSpec, Life, PageId, PagePool};
use kvslice_loom_tests::{Arc, Owners, model, thread};

fn pool(capacity: u32) -> Arc<PagePool<'static>> {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 1, KvDtype::F32)).unwrap();
    Arc::new(PagePool::new(layout, capacity).unwrap())
}

/// Every page is Free, and draining the free list yields each page once
/// (a corrupted stack would yield one twice or lose one).
fn assert_all_free(pool: &PagePool<'_>) {
    assert_eq!(pool.free_pages(), pool.capacity(), "a page was lost");
    for i in 0..pool.capacity() {
        let info = pool.page_info(PageId(i)).unwrap();
        assert_eq!((info.life, info.refs), (Life::Free, 0), "page {i}");
    }
    let all: Vec<_> = pool.alloc_many(pool.capacity()).unwrap().collect();
    let mut ids: Vec<u32> = all.iter().map(|p| p.handle().id().0).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len() as u32,
        pool.capacity(),
        "the free list held a page twice"
    );
}

/// Concurrent alloc and free: no page is handed to two owners at once and,
/// when both threads are done, every page is back on the free list.
#[test]
fn concurrent_alloc_free() {
    model(|| {
        let pool = pool(2);
        let owners = Arc::new(Owners::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (pool, owners) = (pool.clone(), owners.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        let page = pool.alloc().expect("two pages for two threads");
                        owners.claim(page.handle().id().0);
                        owners.unclaim(page.handle().id().0);
                        drop(page);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_all_free(&pool);
    });
}

/// A reader's acquire racing an eviction of the same cached page: exactly
/// one of them wins at the moment they overlap, and a reader that won
/// never sees its page freed or reused while it holds the reference.
#[test]
fn acquire_races_eviction() {
    model(|| {
        let pool = pool(1);
        let h = pool.alloc().unwrap().publish().handle();
        let reader = {
            let pool = pool.clone();
            thread::spawn(move || match pool.try_acquire(h) {
                Ok(r) => {
                    let info = pool.page_info(h.id()).unwrap();
                    assert_eq!((info.generation, info.life), (h.generation(), Life::Cached));
                    assert!(info.refs >= 1);
                    drop(r);
                    true
                }
                Err(e) => {
                    assert!(
                        matches!(e, Error::PageBusy { .. } | Error::StaleHandle { .. }),
                        "{e:?}"
                    );
                    false
                }
            })
        };
        let evictor = {
            let pool = pool.clone();
            thread::spawn(move || match pool.try_evict(h) {
                Ok(()) => {
                    // Reuse the page at once: a reader still holding it
                    // would see the generation change.
                    let w = pool.alloc().unwrap();
                    assert_ne!(w.handle().generation(), h.generation());
                    true
                }
                Err(e) => {
                    assert!(matches!(e, Error::PageBusy { .. }), "{e:?}");
                    false
                }
            })
        };
        let (read, evicted) = (reader.join().unwrap(), evictor.join().unwrap());
        assert!(
            read || evicted,
            "with no other user one of them must succeed"
        );
        if !evicted {
            pool.try_evict(h).unwrap();
        }
        assert_all_free(&pool);
    });
}

/// The free list's ABA case: while one thread is inside a pop, another
/// pops the same top page, pops the page below, and pushes the first back.
/// The tag in the head word makes the delayed pop fail and retry, so no
/// page is handed out twice; and a handle kept across the reuse is stale.
#[test]
fn free_list_aba_with_generation_reuse() {
    model(|| {
        let pool = pool(3);
        let owners = Arc::new(Owners::new(3));
        let t1 = {
            let (pool, owners) = (pool.clone(), owners.clone());
            thread::spawn(move || {
                let w = pool.alloc().unwrap();
                owners.claim(w.handle().id().0);
                owners.unclaim(w.handle().id().0);
            })
        };
        let t2 = {
            let (pool, owners) = (pool.clone(), owners.clone());
            thread::spawn(move || {
                let a = pool.alloc().unwrap();
                let b = pool.alloc().unwrap();
                owners.claim(a.handle().id().0);
                owners.claim(b.handle().id().0);
                let old = a.handle();
                owners.unclaim(old.id().0);
                drop(a); // back on top of the stack, next generation
                assert_eq!(
                    pool.try_acquire(old).unwrap_err(),
                    Error::StaleHandle { page: old.id().0 }
                );
                owners.unclaim(b.handle().id().0);
            })
        };
        t1.join().unwrap();
        t2.join().unwrap();
        assert_all_free(&pool);
    });
}

/// Two `alloc_many(2)` calls on a 3-page pool: each gets both pages or
/// none, and a failed call leaves the pool exactly as it was, so the
/// remaining page can still be allocated.
#[test]
fn alloc_many_all_or_nothing_under_contention() {
    model(|| {
        let pool = pool(3);
        let owners = Arc::new(Owners::new(3));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (pool, owners) = (pool.clone(), owners.clone());
                thread::spawn(move || match pool.alloc_many(2) {
                    Ok(batch) => {
                        let pages: Vec<_> = batch.collect();
                        assert_eq!(pages.len(), 2);
                        pages.iter().for_each(|p| owners.claim(p.handle().id().0));
                        pages.iter().for_each(|p| owners.unclaim(p.handle().id().0));
                        true
                    }
                    Err(_) => {
                        // The other thread holds at most 2 pages, so one is
                        // free unless the failed call leaked a reservation.
                        let one = pool
                            .alloc()
                            .expect("failed alloc_many left the pool unchanged");
                        owners.claim(one.handle().id().0);
                        owners.unclaim(one.handle().id().0);
                        false
                    }
                })
            })
            .collect();
        let wins = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&w| w)
            .count();
        assert!(wins >= 1);
        assert_all_free(&pool);
    });
}

/// `alloc_many` walks the free stack's links before its compare-and-swap;
/// a page popped and published meanwhile no longer holds a link where the
/// walk reads one (its reference count is there, here 4 on a 3-page
/// pool). The walk must start again, not follow it out of the pool.
#[test]
fn alloc_many_walks_past_pages_reused_under_it() {
    model(|| {
        let pool = pool(3);
        let walker = {
            let pool = pool.clone();
            thread::spawn(move || pool.alloc_many(3).map(|b| b.count()).unwrap_or(0))
        };
        let user = {
            let pool = pool.clone();
            thread::spawn(move || {
                let (Ok(a), Ok(b)) = (pool.alloc(), pool.alloc()) else {
                    return;
                };
                let cached = b.publish();
                let refs: Vec<_> = (0..3)
                    .map(|_| pool.try_acquire(cached.handle()).unwrap())
                    .collect();
                assert_eq!(pool.page_info(cached.handle().id()).unwrap().refs, 4);
                drop((a, refs, cached));
            })
        };
        let walked = walker.join().unwrap();
        user.join().unwrap();
        assert!(walked == 3 || walked == 0, "all or nothing");
    });
}
