//! The pool's page bytes: one region, owned or borrowed, sliced per page.
//!
//! This is the only place the pool touches raw memory. It hands out page
//! slices only through `unsafe` functions whose callers (the guards in
//! `guard.rs`) uphold the aliasing rules via the page lifecycle.

use alloc::boxed::Box;
use alloc::vec;
use core::marker::PhantomData;
use core::ptr::NonNull;

pub(crate) struct Storage<'m> {
    base: NonNull<u8>,
    len: usize,
    page_bytes: usize,
    owned: bool,
    _borrow: PhantomData<&'m mut [u8]>,
    /// Under loom, one cell per page that every access to its bytes goes
    /// through (see [`Storage::track`]).
    #[cfg(kvslice_loom)]
    access: Box<[loom::cell::UnsafeCell<()>]>,
}

// SAFETY: `Storage` is a uniquely owned or uniquely borrowed byte region;
// moving it to another thread moves that ownership.
unsafe impl Send for Storage<'_> {}
// SAFETY: shared access only produces page slices through the `unsafe`
// accessors below, whose contracts forbid conflicting access to one page.
unsafe impl Sync for Storage<'_> {}

/// Page memory is aligned to this many bytes (a cache line; enough for
/// any SIMD load and for typed views of every dtype).
pub(crate) const ALIGN: usize = 64;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; ALIGN]);

impl Storage<'static> {
    /// Allocates `len` zeroed bytes, 64-byte aligned, once.
    pub(crate) fn allocate(len: usize, page_bytes: usize) -> Self {
        let lines = len.div_ceil(ALIGN);
        let raw = Box::into_raw(vec![Line([0; ALIGN]); lines].into_boxed_slice());
        Self {
            // A `Box` pointer is never null (dangling but non-null when empty).
            base: NonNull::new(raw.cast::<u8>()).unwrap_or(NonNull::dangling()),
            len: lines * ALIGN,
            page_bytes,
            owned: true,
            _borrow: PhantomData,
            #[cfg(kvslice_loom)]
            access: access_cells(lines * ALIGN, page_bytes),
        }
    }
}

impl<'m> Storage<'m> {
    /// Uses the caller's bytes for the lifetime `'m`; the caller aligns
    /// them to [`ALIGN`].
    pub(crate) fn borrow(bytes: &'m mut [u8], page_bytes: usize) -> Self {
        debug_assert!(bytes.is_empty() || bytes.as_ptr().align_offset(ALIGN) == 0);
        #[cfg(kvslice_loom)]
        let access = access_cells(bytes.len(), page_bytes);
        Self {
            len: bytes.len(),
            base: NonNull::from(bytes).cast::<u8>(),
            page_bytes,
            owned: false,
            _borrow: PhantomData,
            #[cfg(kvslice_loom)]
            access,
        }
    }

    fn page_ptr(&self, index: u32) -> *mut u8 {
        let offset = index as usize * self.page_bytes;
        assert!(
            offset + self.page_bytes <= self.len,
            "page index past storage"
        );
        // Never dereferenced here; in bounds by the assert above.
        self.base.as_ptr().wrapping_add(offset)
    }

    /// Tells loom that page `index`'s bytes are read (`write` false) or
    /// written now: an access the page lifecycle does not order after
    /// every conflicting one (a write against anything, on another thread)
    /// fails the model. Every slice of a page's bytes is tracked here, and
    /// the guards call it when they are dropped or published (the last
    /// moment their slices were usable). Does nothing outside loom.
    #[inline(always)]
    pub(crate) fn track(&self, index: u32, write: bool) {
        #[cfg(kvslice_loom)]
        {
            let cell = &self.access[index as usize];
            if write {
                cell.with_mut(|_| ());
            } else {
                cell.with(|_| ());
            }
        }
        #[cfg(not(kvslice_loom))]
        let _ = (index, write);
    }

    /// # Safety
    /// No `&mut` to page `index` may exist while the returned slice lives.
    pub(crate) unsafe fn page(&self, index: u32) -> &[u8] {
        let ptr = self.page_ptr(index);
        self.track(index, false);
        // SAFETY: `ptr..ptr + page_bytes` lies inside the region (checked in
        // `page_ptr`), the region is valid for `'m`, and the caller promises
        // no concurrent writer.
        unsafe { core::slice::from_raw_parts(ptr, self.page_bytes) }
    }

    /// # Safety
    /// The caller must be the only one accessing page `index` while the
    /// returned slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn page_mut(&self, index: u32) -> &mut [u8] {
        let ptr = self.page_ptr(index);
        self.track(index, true);
        // SAFETY: in bounds as above; the caller promises exclusive access,
        // and pages never overlap, so this aliases nothing else.
        unsafe { core::slice::from_raw_parts_mut(ptr, self.page_bytes) }
    }
}

/// One access cell per whole page of `len` bytes.
#[cfg(kvslice_loom)]
fn access_cells(len: usize, page_bytes: usize) -> Box<[loom::cell::UnsafeCell<()>]> {
    (0..len.checked_div(page_bytes).unwrap_or(0))
        .map(|_| loom::cell::UnsafeCell::new(()))
        .collect()
}

impl Drop for Storage<'_> {
    fn drop(&mut self) {
        if self.owned {
            let lines = self.len / ALIGN;
            let slice =
                core::ptr::slice_from_raw_parts_mut(self.base.as_ptr().cast::<Line>(), lines);
            // SAFETY: `slice` is exactly the pointer `Box::into_raw` gave in
            // `allocate`, dropped once, here.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}
