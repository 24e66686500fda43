//! Handles: generation-checked keys into one global slab of objects.
//!
//! A C caller holds a 64-bit id, never a pointer, so a destroyed handle,
//! a handle used twice after destroy, an id of another kind or a made-up
//! id is an error instead of a use after free. Looking a handle up is
//! lock-free (sharded-slab); destroying one while another thread uses it
//! waits for nothing: the object goes when the last lookup is done.

use std::sync::{Arc, LazyLock, Mutex, MutexGuard, TryLockError};

use kvslice_core::{Coordinator, KvLayout};
use kvslice_cpu::CpuEngine;
use sharded_slab::Slab;

use crate::memory::Memory;
use crate::request::RequestObj;
use crate::status::{Failure, KvsStatus, Outcome};
use crate::store::StoreObj;

/// Everything a handle can name.
pub(crate) enum Object {
    Layout(KvLayout),
    Coordinator(Coordinator),
    Memory(Arc<Memory>),
    Store(Arc<StoreObj>),
    Request(Mutex<RequestObj>),
    Engine(CpuEngine),
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Layout(_) => "layout",
            Object::Coordinator(_) => "coordinator",
            Object::Memory(_) => "page memory",
            Object::Store(_) => "store",
            Object::Request(_) => "request",
            Object::Engine(_) => "engine",
        }
    }
}

/// The slab's shape. A key packs a slot's generation above its address
/// and thread: the default shape leaves the generation 13 bits, so a
/// slot reused 8,192 times would make a stale handle name a live object
/// again. Sixteen pages of slots per thread (up to 2 million live
/// handles each) leave it 29 bits: half a billion reuses of one slot.
pub(crate) struct HandleShape;

// The figures above hold for 64-bit keys. With a 32-bit `usize` this
// shape leaves the generation 2 bits: a slot's id would come round after
// three reuses, and a destroyed handle would name a live object again.
const _: () = assert!(
    usize::BITS >= 64,
    "the C ABI's handles need a 64-bit target (generation bits)"
);

impl sharded_slab::Config for HandleShape {
    const MAX_PAGES: usize = 16;
}

static OBJECTS: LazyLock<Slab<Object, HandleShape>> = LazyLock::new(Slab::new_with_config);

/// A live object, borrowed from the slab for one call.
pub(crate) type Entry = sharded_slab::Entry<'static, Object, HandleShape>;

/// Stores `object` and returns its id (never 0: 0 is the null handle).
pub(crate) fn insert(object: Object) -> Outcome<u64> {
    let key = OBJECTS.insert(object).ok_or_else(|| {
        Failure::new(
            KvsStatus::CapacityExhausted,
            "too many live handles on this thread's shard",
        )
    })?;
    u64::try_from(key)
        .ok()
        .and_then(|k| k.checked_add(1))
        .ok_or_else(|| Failure::new(KvsStatus::CapacityExhausted, "handle ids exhausted"))
}

fn key(id: u64) -> Outcome<usize> {
    if id == 0 {
        return Err(Failure::new(KvsStatus::InvalidHandle, "null handle (id 0)"));
    }
    usize::try_from(id - 1)
        .map_err(|_| Failure::new(KvsStatus::InvalidHandle, format!("no handle has id {id}")))
}

/// The live object `id` names; `kind` is for the message.
fn lookup(id: u64, kind: &'static str) -> Outcome<Entry> {
    OBJECTS.get(key(id)?).ok_or_else(|| gone(id, kind))
}

/// The object `id` names, which must be a `kind` (checked by `pick`).
pub(crate) fn get<T>(
    id: u64,
    kind: &'static str,
    pick: impl FnOnce(&Object) -> Option<T>,
) -> Outcome<T> {
    let entry = lookup(id, kind)?;
    pick(&entry).ok_or_else(|| wrong_kind(id, kind, entry.kind()))
}

/// The slab entry of `id`, checked to be a `kind`, for objects used in
/// place (a request's lock, the engine).
pub(crate) fn entry(id: u64, kind: &'static str, is: fn(&Object) -> bool) -> Outcome<Entry> {
    let entry = lookup(id, kind)?;
    if !is(&entry) {
        return Err(wrong_kind(id, kind, entry.kind()));
    }
    Ok(entry)
}

/// Destroys the `kind` named by `id`; `check` may refuse (the object is
/// still in use), and then the handle stays valid.
pub(crate) fn remove(id: u64, kind: &'static str, check: fn(&Object) -> Outcome<bool>) -> Outcome {
    {
        let entry = lookup(id, kind)?;
        if !check(&entry)? {
            return Err(wrong_kind(id, kind, entry.kind()));
        }
    }
    if OBJECTS.remove(key(id)?) {
        Ok(())
    } else {
        Err(gone(id, kind))
    }
}

/// Locks a request for one call: a request is used by one thread at a
/// time, and a second thread is told so instead of waiting.
pub(crate) fn lock_request(entry: &Entry) -> Outcome<MutexGuard<'_, RequestObj>> {
    let Object::Request(m) = &**entry else {
        unreachable!("checked by `entry`")
    };
    match m.try_lock() {
        Ok(g) => Ok(g),
        // A panic inside an earlier call was caught at the boundary. The
        // pages that call had taken out of the request were released by
        // their guards as it unwound (see `request::Lanes::take`): the
        // request is consistent, if shorter.
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(Failure::new(
            KvsStatus::Busy,
            "the request is in use by another thread (a request is used by one thread at a time)",
        )),
    }
}

fn gone(id: u64, kind: &str) -> Failure {
    Failure::new(
        KvsStatus::InvalidHandle,
        format!("{kind} handle {id} is not live (destroyed, or never made)"),
    )
}

fn wrong_kind(id: u64, want: &str, is: &str) -> Failure {
    Failure::new(
        KvsStatus::InvalidHandle,
        format!("handle {id} names a {is}, not a {want}"),
    )
}
