//! Page memory the caller owns (its host arena), wrapped for one store.

use std::ffi::c_void;
use std::sync::Arc;

use crate::claim::ClaimFlag;
use crate::handles::{self, Object};
use crate::status::{Failure, KvsStatus, Outcome, call};
use crate::{KvsMemory, args};

/// The caller's bytes. kvslice never frees them.
pub(crate) struct Memory {
    ptr: *mut u8,
    len: usize,
    /// Held while a store's pool lives in these bytes; taken for good
    /// by `kvs_memory_destroy`.
    in_use: ClaimFlag,
}

// SAFETY: `Memory` only carries the address; the bytes are reached through
// the one pool that claims them (see `claim`), whose own synchronisation
// covers every access.
unsafe impl Send for Memory {}
// SAFETY: as above: shared `Memory` only hands out its address once.
unsafe impl Sync for Memory {}

/// A store's hold on its memory, released when the store is gone.
pub(crate) struct Claim(Arc<Memory>);

impl Memory {
    /// The bytes, for the one store that claims them.
    pub(crate) fn claim(self: &Arc<Self>) -> Outcome<(Claim, &'static mut [u8])> {
        if !self.in_use.try_claim() {
            return Err(Failure::new(
                KvsStatus::Busy,
                "this page memory is already used by another store",
            ));
        }
        // SAFETY: the caller of `kvs_memory_wrap` promised `len` writable
        // bytes at `ptr` that stay valid, and that nothing else touches,
        // until every store on them is destroyed; `in_use` makes this the
        // only slice; the returned `Claim` is dropped after the pool (see
        // `StoreObj`'s field order), ending the borrow before the flag is
        // cleared.
        let bytes = unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) };
        Ok((Claim(Arc::clone(self)), bytes))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.in_use.release();
    }
}

/// Wraps `len` bytes at `ptr`, which the caller owns, as page memory for
/// one store (`kvs_store_new`'s `memory`). The store lays pages out from
/// the first address aligned for the layout's dtype; `kvs_layout_info`'s
/// `page_bytes` times the capacity, plus up to 64 bytes of alignment
/// slack, must fit. The bytes are zeroed here, so a store's pages start
/// zeroed, as the pages of a store that allocates its own do.
///
/// # Safety
///
/// `ptr` must point to `len` writable bytes that stay valid, and that the
/// caller neither reads nor writes, until the store using them and every
/// request on that store are destroyed. `kvs_memory_destroy` reports
/// `KVS_STATUS_BUSY` while a store still uses the memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_memory_wrap(
    ptr: *mut c_void,
    len: usize,
    out: *mut KvsMemory,
) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        if ptr.is_null() {
            return Err(Failure::new(
                KvsStatus::NullPointer,
                "memory is a null pointer",
            ));
        }
        if len == 0 || len > isize::MAX as usize {
            return Err(Failure::new(
                KvsStatus::InvalidLength,
                format!("memory length {len} is zero or too large"),
            ));
        }
        let memory = Arc::new(Memory {
            ptr: ptr.cast(),
            len,
            in_use: ClaimFlag::new(),
        });
        let id = handles::insert(Object::Memory(memory))?;
        // Rust may only make a `&mut [u8]` of initialised bytes, and C's
        // `malloc` gives none: write every byte before a store can claim
        // them (the handle is not the caller's yet, so nothing can).
        // SAFETY: the caller promises `len` writable bytes at `ptr`.
        unsafe { core::ptr::write_bytes(ptr.cast::<u8>(), 0, len) };
        // SAFETY: checked non-null and aligned above; the caller promises
        // it is writable.
        unsafe { args::write_out(out, KvsMemory { id }, "out") }
    })
}

/// Destroys a page-memory handle. Refused with `KVS_STATUS_BUSY` while a
/// store still uses the memory; the caller frees its bytes after this
/// returns `KVS_STATUS_OK`.
#[unsafe(no_mangle)]
pub extern "C" fn kvs_memory_destroy(memory: KvsMemory) -> KvsStatus {
    call(|| {
        handles::remove(memory.id, "page memory", |o| match o {
            // Claimed for good on success, so that a store made on
            // another thread meanwhile cannot take the memory either.
            Object::Memory(m) => {
                if m.in_use.try_claim() {
                    Ok(true)
                } else {
                    Err(Failure::new(
                        KvsStatus::Busy,
                        "a store still uses this page memory: destroy the store (and end its requests) first",
                    ))
                }
            }
            _ => Ok(false),
        })
    })
}
