//! Stores: a page pool, the key map and an eviction policy by name.

use std::ffi::{CStr, c_char};
use std::sync::Arc;

use kvslice_core::epoch::default_collector;
use kvslice_core::events::EventRing;
use kvslice_core::{CacheStore, EvictionPolicy, PagePool, evict};

use crate::handles::{self, Object};
use crate::memory::Claim;
use crate::status::{Failure, KvsStatus, Outcome, call};
use crate::{KvsLayout, KvsMemory, KvsStats, KvsStore, args};

/// A store, shared by its handle and its requests: it lives until the
/// handle is destroyed and the last request has ended.
pub(crate) struct StoreObj {
    // Field order is drop order: the store (and its pool in the caller's
    // memory) goes before the claim on that memory is released.
    pub(crate) store: CacheStore<'static, Box<dyn EvictionPolicy>>,
    _claim: Option<Claim>,
}

pub(crate) fn get(store: KvsStore) -> Outcome<Arc<StoreObj>> {
    handles::get(store.id, "store", |o| match o {
        Object::Store(s) => Some(Arc::clone(s)),
        _ => None,
    })
}

/// Makes a store of `capacity` pages for `layout` with the eviction policy
/// named `policy` (`"default"`, `"density"`, `"lru"`, `"clock"`,
/// `"tinylfu"`, `"chain"`; null means `"default"`). With a null `memory`
/// handle (id 0) the store allocates its pages; otherwise they live in
/// that caller-owned memory, which one store at a time may use, and a
/// `capacity` of 0 takes as many pages as fit (`kvs_store_stats` says how
/// many; with pages under 64 bytes a few more than asked may fit).
///
/// # Safety
///
/// `policy` is null or a NUL-terminated string; `out` points to writable
/// memory for a handle. Both are only used during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_store_new(
    layout: KvsLayout,
    capacity: u32,
    policy: *const c_char,
    memory: KvsMemory,
    out: *mut KvsStore,
) -> KvsStatus {
    // SAFETY: the caller's promises, passed on.
    unsafe { new_store(layout, capacity, policy, memory, Ok(None), out) }
}

/// [`kvs_store_new`], with the ring of `events` (if any) attached to the
/// store; a failed `events` fails the call before anything is made.
///
/// # Safety
///
/// As [`kvs_store_new`].
pub(crate) unsafe fn new_store(
    layout: KvsLayout,
    capacity: u32,
    policy: *const c_char,
    memory: KvsMemory,
    events: Outcome<Option<EventRing>>,
    out: *mut KvsStore,
) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let events = events?;
        let layout = crate::layout::get(layout)?;
        let name = if policy.is_null() {
            "default"
        } else {
            // SAFETY: the caller promises a NUL-terminated string.
            unsafe { CStr::from_ptr(policy) }
                .to_str()
                .map_err(|_| Failure::invalid("the policy name is not UTF-8"))?
        };
        let policy = |capacity| {
            evict::by_name(name, capacity).ok_or_else(|| {
                Failure::invalid(format!(
                    "unknown eviction policy {name:?}; one of {:?}",
                    evict::POLICY_NAMES
                ))
            })
        };
        let (store, claim) = if memory.id == 0 {
            (CacheStore::new(layout, capacity, policy(capacity)?)?, None)
        } else {
            let mem = handles::get(memory.id, "page memory", |o| match o {
                Object::Memory(m) => Some(Arc::clone(m)),
                _ => None,
            })?;
            let (claim, bytes) = mem.claim()?;
            // Up to 63 bytes go to aligning the first page.
            let wanted = (capacity as usize)
                .saturating_mul(layout.page_bytes())
                .saturating_add(63);
            let len = if capacity == 0 {
                bytes.len()
            } else {
                bytes.len().min(wanted)
            };
            let pool = PagePool::with_memory(layout, &mut bytes[..len])?;
            if pool.capacity() == 0 || pool.capacity() < capacity {
                return Err(Failure::new(
                    KvsStatus::InvalidLength,
                    format!(
                        "the page memory holds {} pages of {} bytes, not {capacity}",
                        pool.capacity(),
                        layout.page_bytes()
                    ),
                ));
            }
            let policy = policy(pool.capacity())?;
            // The default collector, as `CacheStore::new`'s: guards come
            // from `CacheStore::pin` on every thread.
            let store = CacheStore::from_parts(pool, policy, default_collector().clone())?;
            (store, Some(claim))
        };
        let obj = StoreObj {
            store: match events {
                Some(ring) => store.with_events(ring),
                None => store,
            },
            _claim: claim,
        };
        let id = handles::insert(Object::Store(Arc::new(obj)))?;
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, KvsStore { id }, "out") }
    })
}

/// Destroys a store handle. Requests still open on it keep the store
/// alive until they end; its pages (and the caller's memory, if any) are
/// given up after that.
#[unsafe(no_mangle)]
pub extern "C" fn kvs_store_destroy(store: KvsStore) -> KvsStatus {
    call(|| handles::remove(store.id, "store", |o| Ok(matches!(o, Object::Store(_)))))
}

/// The store's counters, written to `out`.
///
/// # Safety
///
/// `out` points to writable memory for a `KvsStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_store_stats(store: KvsStore, out: *mut KvsStats) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let s = get(store)?;
        let pool = s.store.pool();
        let stats = KvsStats::new(s.store.stats(), pool.capacity(), pool.free_pages());
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, stats, "out") }
    })
}
