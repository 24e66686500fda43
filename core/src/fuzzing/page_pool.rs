//! Arbitrary operation sequences on a page pool against a single-threaded
//! model; every invariant is checked after every operation.

use alloc::vec;
use alloc::vec::Vec;

use arbitrary::Unstructured;

use super::small;
use crate::{
    Error, KvDtype, KvLayout, LayoutSpec, Life, PageHandle, PageId, PageMut, PagePool, PageRef,
};

/// What the model believes about one page.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Model {
    generation: u32,
    refs: u32,
    life: Life,
    fill: u8,
}

/// Runs one page-pool case. Panics if the pool disagrees with the model.
pub fn page_pool(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let cap = small(&mut u, 1, 8);
    let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 2, KvDtype::F16)).expect("valid layout");
    let pool = PagePool::new(layout, cap).expect("small pool");
    let mut model = vec![
        Model {
            generation: 0,
            refs: 0,
            life: Life::Free,
            fill: 0
        };
        cap as usize
    ];
    let mut writers: Vec<PageMut<'_, '_>> = Vec::new();
    let mut readers: Vec<PageRef<'_, '_>> = Vec::new();
    let mut handles: Vec<PageHandle> = Vec::new(); // every handle ever made, some stale
    let pick = |u: &mut Unstructured<'_>, len: usize| small(u, 0, len as u32 - 1) as usize;
    while !u.is_empty() {
        let free = model.iter().filter(|m| m.life == Life::Free).count() as u32;
        match small(&mut u, 0, 8) {
            0 => match pool.alloc() {
                Ok(w) => {
                    let m = &mut model[w.handle().id().0 as usize];
                    assert_eq!(
                        (m.life, w.handle().generation()),
                        (Life::Free, m.generation)
                    );
                    (m.life, m.refs) = (Life::Filling, 1);
                    handles.push(w.handle());
                    writers.push(w);
                }
                Err(e) => assert!(free == 0 && matches!(e, Error::CapacityExhausted(_))),
            },
            1 => {
                let n = small(&mut u, 0, cap + 1);
                match pool.alloc_many(n) {
                    Ok(batch) => {
                        assert!(n <= free);
                        assert_eq!(batch.len(), n as usize);
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
                let i = pick(&mut u, writers.len());
                let byte: u8 = u.arbitrary().unwrap_or(0);
                writers[i].bytes_mut().fill(byte);
                model[writers[i].handle().id().0 as usize].fill = byte;
            }
            3 if !writers.is_empty() => {
                let w = writers.swap_remove(pick(&mut u, writers.len()));
                let m = &mut model[w.handle().id().0 as usize];
                if u.arbitrary().unwrap_or(false) {
                    m.life = Life::Cached;
                    readers.push(w.publish());
                } else {
                    (m.life, m.refs, m.generation) = (Life::Free, 0, m.generation.wrapping_add(1));
                    drop(w);
                }
            }
            4 if !handles.is_empty() => {
                let h = handles[pick(&mut u, handles.len())];
                let m = &mut model[h.id().0 as usize];
                match pool.try_acquire(h) {
                    Ok(r) => {
                        assert!(m.generation == h.generation() && m.life == Life::Cached);
                        assert!(
                            r.bytes().iter().all(|&b| b == m.fill),
                            "read another owner's data"
                        );
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
            5 if !readers.is_empty() => {
                let r = readers.swap_remove(pick(&mut u, readers.len()));
                model[r.handle().id().0 as usize].refs -= 1;
                if u.arbitrary().unwrap_or(false) {
                    drop(r);
                } else {
                    pool.release(r.into_token()).expect("own token");
                }
            }
            6 if !handles.is_empty() => {
                let h = handles[pick(&mut u, handles.len())];
                let m = &mut model[h.id().0 as usize];
                let current = m.generation == h.generation();
                match pool.try_begin_evict(h) {
                    Ok(ev) => {
                        assert!(current && m.life == Life::Cached && m.refs == 0);
                        match small(&mut u, 0, 2) {
                            0 => ev.cancel(),
                            1 => {
                                ev.finish();
                                (m.life, m.generation) = (Life::Free, m.generation.wrapping_add(1));
                            }
                            _ => {
                                let w = ev.refill();
                                (m.life, m.refs, m.generation) =
                                    (Life::Filling, 1, m.generation.wrapping_add(1));
                                handles.push(w.handle());
                                writers.push(w);
                            }
                        }
                    }
                    Err(Error::StaleHandle { .. }) => assert!(!current || m.life == Life::Free),
                    Err(Error::PageBusy { .. }) => {
                        assert!(current && (m.life != Life::Cached || m.refs > 0))
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            7 if !readers.is_empty() => {
                let src = &readers[pick(&mut u, readers.len())];
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
        for (i, m) in model.iter().enumerate() {
            let info = pool.page_info(PageId(i as u32)).expect("in range");
            assert_eq!(
                (info.generation, info.refs, info.life),
                (m.generation, m.refs, m.life),
                "page {i}"
            );
        }
        assert_eq!(
            pool.free_pages(),
            model.iter().filter(|m| m.life == Life::Free).count() as u32
        );
    }
    // Everything released and evicted: no page lost.
    drop((writers, readers));
    for i in 0..cap {
        let info = pool.page_info(PageId(i)).expect("in range");
        if info.life == Life::Cached {
            pool.try_evict(PageHandle::from_parts(i, info.generation))
                .expect("unreferenced");
        }
    }
    assert_eq!(pool.free_pages(), cap, "a page was lost");
    let all: Vec<_> = pool.alloc_many(cap).expect("all free").collect();
    assert_eq!(all.len(), cap as usize);
}
