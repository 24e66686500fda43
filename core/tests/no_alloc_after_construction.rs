//! The page pool allocates nothing after construction: counted with a
//! global allocator that tallies this thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

#[test]
fn pool_operations_do_not_allocate() {
    let layout = KvLayout::new(LayoutSpec::new(2, 4, 2, 16, 8, KvDtype::Bf16)).unwrap();
    let pool = PagePool::new(layout, 16).unwrap();
    let before = allocations();
    for round in 0..1000u32 {
        let mut w = pool.alloc().unwrap();
        w.bytes_mut()[0] = round as u8;
        let r = w.publish();
        let h = r.handle();
        let r2 = pool.try_acquire(h).unwrap();
        let copy = pool.copy_page(&r2).unwrap();
        drop(copy);
        let token = r.into_token();
        pool.release(token).unwrap();
        drop(r2);
        let mut batch = pool.alloc_many(4).unwrap();
        let first = batch.next();
        drop((first, batch));
        assert!(pool.alloc_many(100).is_err());
        pool.try_evict(h).unwrap();
        assert!(pool.try_acquire(h).is_err());
    }
    assert_eq!(
        allocations() - before,
        0,
        "the pool allocated after construction"
    );
    // The counter works: a Vec does allocate.
    let v: Vec<u8> = Vec::with_capacity(1);
    assert!(allocations() > before);
    drop(v);
}
