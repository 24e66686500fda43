//! KV cache events: a store made with an event ring reports each block
//! stored and removed, and the caller drains the reports into its own
//! buffer (to forward them to a router, say), or asks for a snapshot of
//! every cached block to resynchronise after events were dropped.

use std::ffi::c_char;

use kvslice_core::events::{EventRing, KvEvent, Medium};

use crate::status::{Failure, KvsStatus, Outcome, call};
use crate::store::{self, StoreObj};
use crate::{KvsKey, KvsLayout, KvsMemory, KvsStore, args};

/// `KvsEvent::kind`: a block became findable.
pub const KVS_EVENT_STORED: u32 = 1;
/// `KvsEvent::kind`: a block was evicted.
pub const KVS_EVENT_REMOVED: u32 = 2;
/// `KvsEvent::kind`: the store holds no block any more.
pub const KVS_EVENT_CLEARED: u32 = 3;

/// Where a store's pages live, as routers name it (vLLM's `medium`).
pub const KVS_MEDIUM_GPU: u32 = 0;
/// Host memory.
pub const KVS_MEDIUM_CPU: u32 = 1;
/// Local disk.
pub const KVS_MEDIUM_DISK: u32 = 2;
/// A shared remote tier.
pub const KVS_MEDIUM_REMOTE: u32 = 3;

/// Largest ring a store may have, in events (64 bytes each: 64 MiB).
pub const KVS_EVENT_RING_MAX: u32 = 1 << 20;

/// One event.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsEvent {
    /// The event's number: 0, 1, 2, ... in the order the ring accepted
    /// them (dropped events are counted in `KvsEventStats::dropped`, not
    /// numbered); 0 in a snapshot.
    pub number: u64,
    /// `KVS_EVENT_STORED`, `KVS_EVENT_REMOVED` or `KVS_EVENT_CLEARED`.
    pub kind: u32,
    /// Stored: the tokens the block holds; otherwise 0.
    pub tokens: u32,
    /// Stored and removed: the block's key; zero for cleared.
    pub key: KvsKey,
    /// Stored: 1 if the block was published after a parent block, whose
    /// hash is `parent_lo`/`parent_hi`; otherwise 0.
    pub has_parent: u32,
    /// Low 64 bits of the parent's block hash.
    pub parent_lo: u64,
    /// High 64 bits of the parent's block hash.
    pub parent_hi: u64,
}

impl KvsEvent {
    fn new(number: u64, event: KvEvent) -> Self {
        match event {
            KvEvent::Stored {
                key,
                parent,
                tokens,
            } => Self {
                number,
                kind: KVS_EVENT_STORED,
                tokens,
                key: key.into(),
                has_parent: u32::from(parent.is_some()),
                parent_lo: parent.map_or(0, |p| p.0 as u64),
                parent_hi: parent.map_or(0, |p| (p.0 >> 64) as u64),
            },
            KvEvent::Removed { key } => Self {
                number,
                kind: KVS_EVENT_REMOVED,
                key: key.into(),
                ..Self::default()
            },
            KvEvent::Cleared => Self {
                number,
                kind: KVS_EVENT_CLEARED,
                ..Self::default()
            },
        }
    }
}

/// A store's event counters (`kvs_events_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvsEventStats {
    /// Events the store emitted, dropped ones included.
    pub emitted: u64,
    /// Events dropped because the ring was full: a consumer that sees this
    /// rise lost events and should resynchronise (`kvs_events_snapshot`).
    pub dropped: u64,
    /// Slots in the ring.
    pub capacity: u64,
    /// The number the next event will have (below 2^48). Read it just
    /// before `kvs_events_snapshot`: drained events numbered below it
    /// happened before the snapshot, which already says them. Numbers wrap
    /// at 2^48: event `n` is below `next_number` when
    /// `(next_number - n) mod 2^48` is between 1 and 2^47.
    pub next_number: u64,
}

/// [`kvs_store_new`](crate::kvs_store_new), with a ring of `ring_slots`
/// events (rounded up to a power of two; 1 to `KVS_EVENT_RING_MAX`) that
/// the store fills as it publishes and evicts, naming its pages' `medium`
/// (`KVS_MEDIUM_*`). Lookups emit nothing; a full ring drops events and
/// counts them, and never slows the store. Drain it with
/// `kvs_events_drain`.
///
/// # Safety
///
/// As `kvs_store_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_store_new_with_events(
    layout: KvsLayout,
    capacity: u32,
    policy: *const c_char,
    memory: KvsMemory,
    ring_slots: u32,
    medium: u32,
    out: *mut KvsStore,
) -> KvsStatus {
    let ring = ring(ring_slots, medium).map(Some);
    // SAFETY: the caller's promises, passed on.
    unsafe { store::new_store(layout, capacity, policy, memory, ring, out) }
}

/// A ring of `slots` events for pages on `medium` (`KVS_MEDIUM_*`).
fn ring(slots: u32, medium: u32) -> Outcome<EventRing> {
    if !(1..=KVS_EVENT_RING_MAX).contains(&slots) {
        return Err(Failure::invalid(format!(
            "ring_slots is {slots}, not 1 to {KVS_EVENT_RING_MAX}"
        )));
    }
    let medium = match medium {
        KVS_MEDIUM_GPU => Medium::Gpu,
        KVS_MEDIUM_CPU => Medium::Cpu,
        KVS_MEDIUM_DISK => Medium::Disk,
        KVS_MEDIUM_REMOTE => Medium::Remote,
        _ => return Err(Failure::invalid(format!("unknown medium {medium}"))),
    };
    Ok(EventRing::new(slots as usize, medium))
}

fn ring_of(s: &StoreObj) -> Outcome<&EventRing> {
    s.store.events().ok_or_else(|| {
        Failure::invalid("the store has no event ring (make it with kvs_store_new_with_events)")
    })
}

/// Moves up to `cap` events, oldest first, from the store's ring into
/// `events`, and their number into `written`. Events beyond `cap` stay for
/// the next call. While another thread drains the same store:
/// `KVS_STATUS_BUSY`, nothing moved.
///
/// # Safety
///
/// `events` points to `cap` writable `KvsEvent` (null when `cap` is 0);
/// `written` to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_events_drain(
    store: KvsStore,
    events: *mut KvsEvent,
    cap: usize,
    written: *mut usize,
) -> KvsStatus {
    call(|| {
        args::check_out(written, "written")?;
        // SAFETY: the caller's promise on `events`.
        let out = unsafe { args::slice_out(events, cap, "events") }?;
        let s = store::get(store)?;
        let ring = ring_of(&s)?;
        let mut n = 0;
        let drained = ring.try_drain_up_to(out.len(), &mut |number, event| {
            out[n] = KvsEvent::new(number, event);
            n += 1;
        });
        if drained.is_none() {
            return Err(Failure::new(
                KvsStatus::Busy,
                "another thread is draining this store's events",
            ));
        }
        // SAFETY: checked above; the caller's promise on `written`.
        unsafe { args::write_out(written, n, "written") }
    })
}

/// Writes a `KVS_EVENT_STORED` event (number 0) for every block the store
/// holds now to `events` (room for `cap`) and their number to `total`:
/// what a consumer that lost events rebuilds its view from. With too
/// little room: `KVS_STATUS_BUFFER_TOO_SMALL`, `total` written, no events.
/// To resynchronise: read `next_number` (`kvs_events_stats`), take the
/// snapshot, then keep draining as before but drop the events numbered
/// below `next_number`; a drain cannot clear them first, since it stops
/// at an event another thread is still writing, and older events wait
/// behind it.
///
/// # Safety
///
/// `events` points to `cap` writable `KvsEvent` (null when `cap` is 0);
/// `total` to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_events_snapshot(
    store: KvsStore,
    events: *mut KvsEvent,
    cap: usize,
    total: *mut usize,
) -> KvsStatus {
    call(|| {
        args::check_out(total, "total")?;
        // SAFETY: the caller's promise on `events`.
        let out = unsafe { args::slice_out(events, cap, "events") }?;
        let s = store::get(store)?;
        let mut held = Vec::new();
        s.store.snapshot(&mut |e| held.push(KvsEvent::new(0, e)));
        // SAFETY: checked above; the caller's promise on `total`.
        unsafe { args::write_out(total, held.len(), "total") }?;
        if held.len() > out.len() {
            return Err(Failure::too_small("events", held.len(), cap));
        }
        out[..held.len()].copy_from_slice(&held);
        Ok(())
    })
}

/// The store's event counters, written to `out`.
///
/// # Safety
///
/// `out` points to writable memory for a `KvsEventStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_events_stats(store: KvsStore, out: *mut KvsEventStats) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let s = store::get(store)?;
        let ring = ring_of(&s)?;
        let stats = KvsEventStats {
            emitted: ring.emitted(),
            dropped: ring.dropped(),
            capacity: ring.capacity() as u64,
            next_number: ring.next_number(),
        };
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, stats, "out") }
    })
}
