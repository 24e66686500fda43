//! A no_std consumer of kvslice-core, built as a staticlib by `.ci/run`.

#![no_std]

extern crate alloc;

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::panic::PanicInfo;
use core::sync::atomic::{AtomicUsize, Ordering};

use kvslice_core::{
    AttentionBatch, AttentionEngine, Coordinator, FixedSequenceMap, HashSecret, KvDtype, KvLayout,
    LayoutSpec, PageBuf, PageId, ReferenceEngine, Request, SeqAttention, SequenceTable,
};

#[panic_handler]
fn panic(_: &PanicInfo<'_>) -> ! {
    loop {}
}

/// A bump allocator over a static arena: what an embedded runtime might
/// hand to `alloc`.
struct Bump {
    arena: UnsafeCell<[u8; 1 << 20]>,
    next: AtomicUsize,
}

// SAFETY: `alloc` hands out disjoint ranges of the arena, reserved with an
// atomic bump pointer, so no two callers ever get overlapping memory.
unsafe impl Sync for Bump {}

// SAFETY: returned blocks are in-bounds, aligned as requested and never
// handed out twice; `dealloc` never frees, which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let base = self.arena.get() as usize;
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            let start = (base + cur).next_multiple_of(layout.align()) - base;
            let end = start + layout.size();
            if end > 1 << 20 {
                return core::ptr::null_mut();
            }
            match self
                .next
                .compare_exchange(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return (base + start) as *mut u8,
                Err(seen) => cur = seen,
            }
        }
    }

    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
}

#[global_allocator]
static ALLOC: Bump = Bump {
    arena: UnsafeCell::new([0; 1 << 20]),
    next: AtomicUsize::new(0),
};

/// Plans a request, tracks it in a fixed sequence table and runs decode
/// attention; returns the number of blocks, or -1 on error.
#[unsafe(no_mangle)]
pub extern "C" fn kvslice_nostd_smoke() -> i32 {
    run().unwrap_or(-1)
}

fn run() -> Result<i32, kvslice_core::Error> {
    let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 4, KvDtype::Bf16))?;
    let coord = Coordinator::new(layout, HashSecret::from_bytes([5; 16]));
    let tokens = [1u32, 2, 3, 4, 5, 6];
    let plan = coord.plan(&Request::new(&tokens))?;
    let mut seqs = FixedSequenceMap::<4, 4>::new(layout.block_tokens());
    seqs.create(1)?;
    for i in 0..plan.blocks().len() {
        seqs.push_page(1, PageId(i as u32))?;
    }
    seqs.advance(1, tokens.len())?;
    let pages = PageBuf::new(layout, 2)?;
    let batch = [SeqAttention {
        block_table: seqs.block_table(1)?,
        kv_len: tokens.len(),
        q_len: 1,
    }];
    let q = [0.5f32; 8];
    let mut out = [0f32; 8];
    let batch = AttentionBatch::new(0, 0, &batch, &q, 0.5);
    AttentionEngine::<PageBuf>::attend(&ReferenceEngine, &pages, &batch, &mut out)?;
    Ok(plan.blocks().len() as i32)
}
