//! The page pool: lifecycle, errors, and random operation sequences checked
//! against a single-threaded model.

use kvslice_core::testkit::Rng;
use kvslice_core::{
    Error, KvDtype, KvLayout, LayoutSpec, Life, PageHandle, PageId, PageMut, PagePool, PageRef,
};

fn layout() -> KvLayout {
    KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 2, KvDtype::F16)).unwrap()
}

#[test]
fn lifecycle_and_typed_errors() {
    let pool = PagePool::new(layout(), 2).unwrap();
    let mut w = pool.alloc().unwrap();
    let h = w.handle();
    assert_eq!(pool.page_info(h.id()).unwrap().life, Life::Filling);
    // Nobody can read or evict a page being filled.
    assert_eq!(
        pool.try_acquire(h).unwrap_err(),
        Error::PageBusy { page: h.id().0 }
    );
    assert_eq!(
        pool.try_begin_evict(h).unwrap_err(),
        Error::PageBusy { page: h.id().0 }
    );
    w.bytes_mut().fill(7);
    let r = w.publish();
    let r2 = r.try_clone().unwrap();
    assert_eq!(pool.page_info(h.id()).unwrap().refs, 2);
    assert_eq!(
        pool.try_evict(h).unwrap_err(),
        Error::PageBusy { page: h.id().0 }
    );
    drop(r);
    drop(r2);
    // Evicting: no new references, cancel puts it back intact.
    let ev = pool.try_begin_evict(h).unwrap();
    assert_eq!(
        pool.try_acquire(h).unwrap_err(),
        Error::PageBusy { page: h.id().0 }
    );
    ev.cancel();
    assert!(pool.try_acquire(h).unwrap().bytes().iter().all(|&b| b == 7));
    pool.try_evict(h).unwrap();
    // The handle is stale for good, even after the page is reused.
    assert_eq!(
        pool.try_acquire(h).unwrap_err(),
        Error::StaleHandle { page: h.id().0 }
    );
    let a = pool.alloc().unwrap();
    let b = pool.alloc().unwrap();
    let reused = if a.handle().id() == h.id() {
        a.handle()
    } else {
        b.handle()
    };
    assert_eq!(reused.generation(), h.generation() + 1);
    assert_eq!(
        pool.try_evict(h).unwrap_err(),
        Error::StaleHandle { page: h.id().0 }
    );
    assert!(matches!(pool.alloc(), Err(Error::CapacityExhausted(_))));
    drop((a, b));
    assert_eq!(pool.free_pages(), 2);
    assert!(pool.page_info(PageId(2)).is_err());
}

#[test]
fn tokens_release_once_and_only_into_their_pool() {
    let pool = PagePool::new(layout(), 1).unwrap();
    let other = PagePool::new(layout(), 1).unwrap();
    let r = pool.alloc().unwrap().publish();
    let h = r.handle();
    let token = r.into_token();
    assert_eq!(
        pool.page_info(h.id()).unwrap().refs,
        1,
        "token keeps the reference"
    );
    assert!(matches!(other.redeem(token), Err(Error::InvalidValue(_))));
    // The failed redeem consumed the token without touching either pool.
    assert_eq!(pool.page_info(h.id()).unwrap().refs, 1);
    assert_eq!(other.page_info(PageId(0)).unwrap().life, Life::Free);
    let token = pool.try_acquire(h).unwrap().into_token();
    pool.release(token).unwrap();
    assert_eq!(pool.page_info(h.id()).unwrap().refs, 1);
}

#[test]
fn alloc_many_is_all_or_nothing_and_returns_untaken_pages() {
    let pool = PagePool::new(layout(), 5).unwrap();
    let held: Vec<PageMut<'_, '_>> = pool.alloc_many(2).unwrap().collect();
    assert!(matches!(
        pool.alloc_many(4),
        Err(Error::CapacityExhausted(_))
    ));
    assert_eq!(pool.free_pages(), 3);
    let mut batch = pool.alloc_many(3).unwrap();
    assert_eq!(batch.len(), 3);
    let one = batch.next().unwrap();
    drop(batch); // two untaken pages go back
    assert_eq!(pool.free_pages(), 2);
    drop((held, one));
    assert_eq!(pool.free_pages(), 5);
    let all: Vec<_> = pool.alloc_many(5).unwrap().collect();
    let ids: std::collections::HashSet<_> = all.iter().map(|p| p.handle().id()).collect();
    assert_eq!(ids.len(), 5, "no page handed out twice");
}

#[test]
fn caller_memory_holds_the_pages() {
    // Pages of at least 64 bytes, so aligning the start can cost no page.
    let l = KvLayout::new(LayoutSpec::new(1, 2, 1, 16, 2, KvDtype::F16)).unwrap();
    assert!(l.page_bytes() >= 64);
    let mut arena = vec![0u8; 3 * l.page_bytes() + 63];
    {
        let pool = PagePool::with_memory(l, &mut arena).unwrap();
        let mut w = pool.alloc().unwrap();
        w.bytes_mut().fill(0xAB);
        drop(w.publish());
        assert_eq!(pool.capacity(), 3);
    }
    assert_eq!(arena.iter().filter(|&&b| b == 0xAB).count(), l.page_bytes());
    let mut tiny = vec![0u8; l.page_bytes() - 1];
    assert_eq!(PagePool::with_memory(l, &mut tiny).unwrap().capacity(), 0);
}

#[test]
fn metadata_fits_in_16_bytes_per_page() {
    assert_eq!(PagePool::METADATA_BYTES_PER_PAGE, 8);
    let l = layout();
    assert!(matches!(
        PagePool::new(l, PagePool::MAX_PAGES + 1),
        Err(Error::CapacityExhausted(_))
    ));
}

/// What the model believes about one page.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Model {
    generation: u32,
    refs: u32,
    life: Life,
    fill: u8,
}

#[test]
fn random_operations_match_a_model() {
    const CAP: u32 = 6;
    for seed in 0..200 {
        let mut rng = Rng::new(seed);
        let pool = PagePool::new(layout(), CAP).unwrap();
        let mut model = vec![
            Model {
                generation: 0,
                refs: 0,
                life: Life::Free,
                fill: 0
            };
            CAP as usize
        ];
        let mut writers: Vec<PageMut<'_, '_>> = Vec::new();
        let mut readers: Vec<PageRef<'_, '_>> = Vec::new();
        let mut handles: Vec<PageHandle> = Vec::new(); // every handle ever made, some stale
        for _ in 0..300 {
            let free = model.iter().filter(|m| m.life == Life::Free).count() as u32;
            match rng.below(9) {
                0 => match pool.alloc() {
                    Ok(w) => {
                        let m = &mut model[w.handle().id().0 as usize];
                        assert_eq!(m.life, Life::Free);
                        assert_eq!(w.handle().generation(), m.generation);
                        (m.life, m.refs) = (Life::Filling, 1);
                        handles.push(w.handle());
                        writers.push(w);
                    }
                    Err(e) => assert!(free == 0 && matches!(e, Error::CapacityExhausted(_))),
                },
                1 => {
                    let n = rng.below(4) as u32;
                    match pool.alloc_many(n) {
                        Ok(batch) => {
                            assert!(n <= free);
                            for w in batch {
                                let m = &mut model[w.handle().id().0 as usize];
                                assert_eq!(m.life, Life::Free);
                                (m.life, m.refs) = (Life::Filling, 1);
                                handles.push(w.handle());
                                writers.push(w);
                            }
                        }
                        Err(_) => assert!(n > free),
                    }
                }
                2 if !writers.is_empty() => {
                    let i = rng.below(writers.len() as u64) as usize;
                    let byte = rng.below(256) as u8;
                    writers[i].bytes_mut().fill(byte);
                    model[writers[i].handle().id().0 as usize].fill = byte;
                }
                3 if !writers.is_empty() => {
                    let w = writers.swap_remove(rng.below(writers.len() as u64) as usize);
                    let m = &mut model[w.handle().id().0 as usize];
                    if rng.below(2) == 0 {
                        m.life = Life::Cached;
                        readers.push(w.publish());
                    } else {
                        (m.life, m.refs, m.generation) = (Life::Free, 0, m.generation + 1);
                        drop(w);
                    }
                }
                4 | 5 if !handles.is_empty() => {
                    let h = handles[rng.below(handles.len() as u64) as usize];
                    let m = &mut model[h.id().0 as usize];
                    match pool.try_acquire(h) {
                        Ok(r) => {
                            assert!(m.generation == h.generation() && m.life == Life::Cached);
                            assert!(r.bytes().iter().all(|&b| b == m.fill));
                            m.refs += 1;
                            readers.push(r);
                        }
                        Err(Error::StaleHandle { .. }) => {
                            assert!(m.generation != h.generation() || m.life == Life::Free)
                        }
                        Err(Error::PageBusy { .. }) => {
                            assert!(matches!(m.life, Life::Filling | Life::Evicting))
                        }
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                6 if !readers.is_empty() => {
                    let r = readers.swap_remove(rng.below(readers.len() as u64) as usize);
                    model[r.handle().id().0 as usize].refs -= 1;
                    if rng.below(2) == 0 {
                        drop(r);
                    } else {
                        pool.release(r.into_token()).unwrap();
                    }
                }
                7 if !handles.is_empty() => {
                    let h = handles[rng.below(handles.len() as u64) as usize];
                    let m = &mut model[h.id().0 as usize];
                    let current = m.generation == h.generation();
                    match pool.try_begin_evict(h) {
                        Ok(ev) => {
                            assert!(current && m.life == Life::Cached && m.refs == 0);
                            if rng.below(3) == 0 {
                                ev.cancel();
                            } else {
                                ev.finish();
                                (m.life, m.generation) = (Life::Free, m.generation + 1);
                            }
                        }
                        Err(Error::StaleHandle { .. }) => assert!(!current || m.life == Life::Free),
                        Err(Error::PageBusy { .. }) => {
                            assert!(current && (m.life != Life::Cached || m.refs > 0))
                        }
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                8 if !readers.is_empty() => {
                    let src = &readers[rng.below(readers.len() as u64) as usize];
                    let fill = model[src.handle().id().0 as usize].fill;
                    match pool.copy_page(src) {
                        Ok(w) => {
                            assert!(w.bytes().iter().all(|&b| b == fill));
                            let m = &mut model[w.handle().id().0 as usize];
                            (m.life, m.refs, m.fill) = (Life::Filling, 1, fill);
                            handles.push(w.handle());
                            writers.push(w);
                        }
                        Err(e) => assert!(free == 0 && matches!(e, Error::CapacityExhausted(_))),
                    }
                }
                _ => {}
            }
            // Invariants after every operation.
            for (i, m) in model.iter().enumerate() {
                let info = pool.page_info(PageId(i as u32)).unwrap();
                assert_eq!(
                    (info.generation, info.refs, info.life),
                    (m.generation, m.refs, m.life),
                    "page {i}"
                );
            }
            let free = model.iter().filter(|m| m.life == Life::Free).count() as u32;
            assert_eq!(pool.free_pages(), free);
        }
        drop((writers, readers));
        let cached: Vec<PageHandle> = (0..CAP)
            .filter_map(|i| {
                let info = pool.page_info(PageId(i)).unwrap();
                (info.life == Life::Cached).then(|| {
                    handles
                        .iter()
                        .rev()
                        .find(|h| h.id().0 == i)
                        .copied()
                        .unwrap()
                })
            })
            .collect();
        for h in cached {
            pool.try_evict(h).unwrap();
        }
        assert_eq!(pool.free_pages(), CAP, "seed {seed}: no page lost");
    }
}

#[test]
fn two_threads_churn_without_losing_pages() {
    let pool = PagePool::new(layout(), 8).unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let pool = &pool;
            s.spawn(move || {
                let mut rng = Rng::new(t);
                let mut mine = Vec::new();
                for i in 0..20_000u32 {
                    match rng.below(4) {
                        0 | 1 => {
                            if let Ok(mut w) = pool.alloc() {
                                w.bytes_mut()[0] = t as u8;
                                mine.push(w.publish().into_token());
                            }
                        }
                        2 if !mine.is_empty() => {
                            let tok = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            let r = pool.redeem(tok).unwrap();
                            assert_eq!(
                                r.bytes()[0],
                                t as u8,
                                "iteration {i}: another thread's data"
                            );
                            let h = r.handle();
                            drop(r);
                            // Only this thread knows h, so eviction must win.
                            pool.try_evict(h).unwrap();
                        }
                        _ => {
                            if let Ok(batch) = pool.alloc_many(2) {
                                drop(batch.collect::<Vec<_>>());
                            }
                        }
                    }
                }
                for tok in mine {
                    let h = tok.handle();
                    pool.release(tok).unwrap();
                    pool.try_evict(h).unwrap();
                }
            });
        }
    });
    assert_eq!(pool.free_pages(), 8);
    for i in 0..8 {
        let info = pool.page_info(PageId(i)).unwrap();
        assert_eq!((info.life, info.refs), (Life::Free, 0));
    }
}

#[test]
fn typed_views_cover_each_head_region() {
    use kvslice_core::{KvPart, KvRows, KvRowsMut, bf16, f16};
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
        let l = KvLayout::new(LayoutSpec::new(2, 4, 2, 8, 3, dtype)).unwrap();
        let pool = PagePool::new(l, 1).unwrap();
        let mut w = pool.alloc().unwrap();
        let mut value = 0.0f32;
        for layer in 0..2 {
            for part in [KvPart::K, KvPart::V] {
                for head in 0..2 {
                    value += 1.0;
                    match w.rows_mut(part, layer, head).unwrap() {
                        KvRowsMut::F32(x) => x.fill(value),
                        KvRowsMut::F16(x) => x.fill(f16::from_f32(value)),
                        KvRowsMut::Bf16(x) => x.fill(bf16::from_f32(value)),
                    }
                }
            }
        }
        assert!(w.rows_mut(KvPart::K, 2, 0).is_err());
        let r = w.publish();
        let mut value = 0.0f32;
        for layer in 0..2 {
            for part in [KvPart::K, KvPart::V] {
                for head in 0..2 {
                    value += 1.0;
                    let rows = r.rows(part, layer, head).unwrap();
                    assert_eq!(rows.len(), 3 * 8);
                    assert!(matches!(
                        (dtype, rows),
                        (KvDtype::F32, KvRows::F32(_))
                            | (KvDtype::F16, KvRows::F16(_))
                            | (KvDtype::Bf16, KvRows::Bf16(_))
                    ));
                    assert!(
                        (0..rows.len()).all(|i| rows.get_f32(i) == Some(value)),
                        "{dtype:?} {layer} {part:?} {head}"
                    );
                }
            }
        }
        // The views tile the page: the same bytes, decoded directly.
        let mut decoded = vec![0f32; l.page_elems()];
        dtype.decode_row(r.bytes(), &mut decoded).unwrap();
        let mut want: Vec<f32> = Vec::new();
        for v in 1..=8 {
            want.extend(std::iter::repeat_n(v as f32, 24));
        }
        assert_eq!(decoded, want);
    }
}
