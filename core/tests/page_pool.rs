//! The page pool: lifecycle, errors and threads. Random operation sequences
//! against a model run through `kvslice_core::fuzzing::page_pool` (see
//! `fuzz_corpus.rs`).

use kvslice_core::testkit::Rng;
use kvslice_core::{Error, KvDtype, KvLayout, LayoutSpec, Life, PageId, PageMut, PagePool};

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

/// Steps per thread; Miri interprets every one, and explores its
/// interleavings in far fewer.
const CHURN_STEPS: u32 = if cfg!(miri) { 2_000 } else { 20_000 };

#[test]
fn two_threads_churn_without_losing_pages() {
    let pool = PagePool::new(layout(), 8).unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let pool = &pool;
            s.spawn(move || {
                let mut rng = Rng::new(t);
                let mut mine = Vec::new();
                for i in 0..CHURN_STEPS {
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
                        KvRowsMut::Scaled { .. } => unreachable!("an unscaled layout"),
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

/// Scaled dtypes: the codes and scales of every head region are their own,
/// and a view decodes each element with its token's scale.
#[test]
fn scaled_views_pair_codes_with_their_tokens_scales() {
    use kvslice_core::{KeyOrder, KvPart, KvRows, KvRowsMut};
    for order in [KeyOrder::TokenMajor, KeyOrder::DimMajor] {
        let l = KvLayout::new(LayoutSpec::new(2, 4, 2, 8, 3, KvDtype::I8).with_key_order(order))
            .unwrap();
        let pool = PagePool::new(l, 1).unwrap();
        let mut w = pool.alloc().unwrap();
        let mut n = 0.0f32;
        for layer in 0..2 {
            for part in [KvPart::K, KvPart::V] {
                for head in 0..2 {
                    n += 1.0;
                    let KvRowsMut::Scaled { codes, scales, .. } =
                        w.rows_mut(part, layer, head).unwrap()
                    else {
                        panic!("int8 rows are scaled");
                    };
                    assert_eq!((codes.len(), scales.len()), (24, 3));
                    codes.fill(2);
                    // Token t of this region has scale n · (t + 1).
                    for (t, s) in scales.iter_mut().enumerate() {
                        *s = n * (t + 1) as f32;
                    }
                }
            }
        }
        let r = w.publish();
        let mut n = 0.0f32;
        for layer in 0..2 {
            for part in [KvPart::K, KvPart::V] {
                for head in 0..2 {
                    n += 1.0;
                    let KvRows::Scaled(rows) = r.rows(part, layer, head).unwrap() else {
                        panic!("int8 rows are scaled");
                    };
                    let dim_major = part == KvPart::K && order == KeyOrder::DimMajor;
                    for i in 0..24 {
                        let t = if dim_major { i % 3 } else { i / 8 };
                        assert_eq!(rows.get_f32(i), Some(2.0 * n * (t + 1) as f32));
                    }
                }
            }
        }
    }
}

#[test]
fn page_views_expose_only_held_pages() {
    use kvslice_core::{PageGeometry, PageMemory, PageMemoryMut, PageView};
    let pool = PagePool::new(layout(), 3).unwrap();
    let mut w = pool.alloc().unwrap();
    w.bytes_mut().fill(5);
    let r = pool.alloc().unwrap().publish();
    let other = pool.alloc().unwrap();
    let (wid, rid, oid) = (w.handle().id(), r.handle().id(), other.handle().id());
    let mut view = PageView::new(&pool);
    view.add_mut(&mut w);
    view.add_ref(&r);
    assert_eq!(view.num_pages(), 3);
    assert!(view.page(wid).unwrap().iter().all(|&b| b == 5));
    assert!(view.page(rid).is_ok());
    view.page_mut(wid).unwrap()[0] = 9;
    assert!(
        matches!(view.page_mut(rid), Err(Error::InvalidValue(_))),
        "cached pages are immutable"
    );
    assert!(
        matches!(view.page(oid), Err(Error::OutOfRange { .. })),
        "pages not held are invisible"
    );
    drop(view);
    assert_eq!(w.bytes()[0], 9);
}

/// A page of another pool (here of a smaller layout) added to a view is
/// never read or written through it: every access is a typed error, where
/// a write sized by the view's layout would index past the page.
#[test]
fn page_views_refuse_pages_of_another_pool() {
    use kvslice_core::{AttentionEngine, KvWrite, PageMemory, PageView, ReferenceEngine};
    let big = KvLayout::new(LayoutSpec::new(1, 2, 2, 8, 4, KvDtype::F32)).unwrap();
    let small = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 2, KvDtype::F32)).unwrap();
    let (a, b) = (
        PagePool::new(big, 2).unwrap(),
        PagePool::new(small, 2).unwrap(),
    );
    let mut mine = a.alloc().unwrap();
    let mut theirs = b.alloc().unwrap();
    let table = [theirs.handle().id()];
    let mut view = PageView::new(&a);
    view.add_mut(&mut mine);
    view.add_mut(&mut theirs);
    let kv = vec![1.0f32; 2 * 8];
    let write = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &table,
        start: 0,
        k: &kv,
        v: &kv,
    };
    assert!(matches!(
        ReferenceEngine.write_kv(&mut view, &write),
        Err(Error::InvalidValue(_))
    ));
    assert!(matches!(view.page(table[0]), Err(Error::InvalidValue(_))));
    drop(view);
    assert!(theirs.bytes().iter().all(|&b| b == 0), "untouched");
}
