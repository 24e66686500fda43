//! KV cache events through the C ABI: what a store reports as it publishes
//! and evicts, drained in bounded pieces, counted when the ring drops, and
//! a snapshot that matches the store; bad input refused with nothing made
//! or moved.

mod common;

use std::ptr;

use common::{last_error, plan_keys, tiny_layout};
use kvslice_capi::*;

/// A layout of 2-token blocks and the keys of an 8-token sequence (four
/// blocks, chained).
fn layout_and_keys() -> (KvsLayout, Vec<KvsKey>) {
    let layout = tiny_layout();
    (
        layout,
        plan_keys(layout, 9, &[5, 6, 7, 8, 9, 10, 11, 12], 4),
    )
}

fn store_with_events(layout: KvsLayout, pages: u32, slots: u32) -> KvsStore {
    let mut store = KvsStore { id: 0 };
    // SAFETY: `store` is a live local.
    let status = unsafe {
        kvs_store_new_with_events(
            layout,
            pages,
            c"lru".as_ptr(),
            KvsMemory { id: 0 },
            slots,
            KVS_MEDIUM_CPU,
            &mut store,
        )
    };
    assert_eq!(status, KvsStatus::Ok, "{}", last_error());
    store
}

/// Publishes `keys` (whole 2-token blocks) in one request.
fn publish(store: KvsStore, keys: &[KvsKey]) {
    let mut req = KvsRequest { id: 0 };
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(kvs_request_begin(store, &mut req), KvsStatus::Ok);
        let mut hits = 0;
        let tokens = 2 * keys.len();
        assert_eq!(
            kvs_lookup_prefix(req, keys.as_ptr(), keys.len(), tokens, &mut hits),
            KvsStatus::Ok
        );
        let fresh = keys.len() - hits;
        if fresh > 0 {
            let mut first = 0;
            assert_eq!(
                kvs_allocate(req, 0, 0, fresh as u32, &mut first),
                KvsStatus::Ok,
                "{}",
                last_error()
            );
            let mut page = 0;
            for (slot, key) in keys.iter().enumerate().skip(hits) {
                assert_eq!(kvs_publish(req, slot, key, 2, &mut page), KvsStatus::Ok);
            }
        }
    }
    assert_eq!(kvs_request_end(req), KvsStatus::Ok);
}

fn drain(store: KvsStore, cap: usize) -> Vec<KvsEvent> {
    let mut buf = vec![KvsEvent::default(); cap];
    let mut n = usize::MAX;
    // SAFETY: `buf` holds `cap` events, `n` is a live local.
    let status = unsafe { kvs_events_drain(store, buf.as_mut_ptr(), cap, &mut n) };
    assert_eq!(status, KvsStatus::Ok, "{}", last_error());
    buf.truncate(n);
    buf
}

fn stats(store: KvsStore) -> KvsEventStats {
    let mut s = KvsEventStats::default();
    // SAFETY: `s` is a live local.
    assert_eq!(unsafe { kvs_events_stats(store, &mut s) }, KvsStatus::Ok);
    s
}

fn same_key(a: &KvsKey, b: &KvsKey) -> bool {
    (
        a.block_lo,
        a.block_hi,
        a.block_index,
        a.layer_group,
        a.head_shard,
    ) == (
        b.block_lo,
        b.block_hi,
        b.block_index,
        b.layer_group,
        b.head_shard,
    )
}

#[test]
fn published_and_evicted_blocks_are_drained_in_order_in_pieces() {
    let (layout, keys) = layout_and_keys();
    let store = store_with_events(layout, 3, 64);
    publish(store, &keys[..3]);
    // Three stored blocks, two per drain: numbers 0, 1, then 2.
    let first = drain(store, 2);
    let second = drain(store, 2);
    assert_eq!((first.len(), second.len()), (2, 1));
    let stored: Vec<KvsEvent> = first.into_iter().chain(second).collect();
    for (i, e) in stored.iter().enumerate() {
        assert_eq!(
            (e.number, e.kind, e.tokens),
            (i as u64, KVS_EVENT_STORED, 2)
        );
        assert!(same_key(&e.key, &keys[i]), "event {i}: {e:?}");
        // The parent is the block before it in the sequence.
        assert_eq!(e.has_parent, u32::from(i > 0));
        if i > 0 {
            assert_eq!(
                (e.parent_lo, e.parent_hi),
                (keys[i - 1].block_lo, keys[i - 1].block_hi)
            );
        }
    }
    assert!(drain(store, 8).is_empty());
    // A fourth block in a store of three pages evicts one: LRU's oldest
    // leaf, the third block (the first two are its ancestors).
    publish(store, &keys[..1]);
    let other = {
        let mut k = keys[3];
        k.block_lo ^= 1;
        k.block_index = 0;
        k
    };
    publish(store, &[other]);
    let events = drain(store, 8);
    let kinds: Vec<u32> = events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [KVS_EVENT_REMOVED, KVS_EVENT_STORED], "{events:?}");
    assert!(same_key(&events[0].key, &keys[2]));
    assert!(same_key(&events[1].key, &other));
    assert_eq!((events[0].number, events[1].number), (3, 4));
    assert_eq!(
        stats(store),
        KvsEventStats {
            emitted: 5,
            dropped: 0,
            capacity: 64,
            next_number: 5,
        }
    );
    assert_eq!(kvs_store_destroy(store), KvsStatus::Ok);
    assert_eq!(kvs_layout_destroy(layout), KvsStatus::Ok);
}

#[test]
fn a_full_ring_drops_and_counts_and_a_snapshot_resynchronises() {
    let (layout, keys) = layout_and_keys();
    let store = store_with_events(layout, 8, 2);
    publish(store, &keys);
    // Four stored blocks on a ring of two: two arrive, two are counted.
    assert_eq!(drain(store, 8).len(), 2);
    let s = stats(store);
    assert_eq!((s.emitted, s.dropped, s.capacity), (4, 2, 2));
    // Dropped events take no number: the next one is the third pushed.
    assert_eq!(s.next_number, 2);
    // The snapshot names every cached block, whatever the ring lost.
    let mut total = 0;
    let mut small = [KvsEvent::default(); 3];
    // SAFETY: `small` holds 3 events, `total` is a live local.
    let status = unsafe { kvs_events_snapshot(store, small.as_mut_ptr(), 3, &mut total) };
    assert_eq!((status, total), (KvsStatus::BufferTooSmall, 4));
    assert!(
        small.iter().all(|e| *e == KvsEvent::default()),
        "nothing written"
    );
    let mut all = [KvsEvent::default(); 4];
    // SAFETY: `all` holds 4 events.
    let status = unsafe { kvs_events_snapshot(store, all.as_mut_ptr(), 4, &mut total) };
    assert_eq!((status, total), (KvsStatus::Ok, 4));
    for key in &keys {
        let found = all
            .iter()
            .filter(|e| same_key(&e.key, key))
            .collect::<Vec<_>>();
        assert_eq!(found.len(), 1, "{key:?} in the snapshot");
        assert_eq!((found[0].kind, found[0].tokens), (KVS_EVENT_STORED, 2));
    }
    assert_eq!(kvs_store_destroy(store), KvsStatus::Ok);
    assert_eq!(kvs_layout_destroy(layout), KvsStatus::Ok);
}

#[test]
fn bad_input_is_refused_and_nothing_is_made_or_moved() {
    let (layout, keys) = layout_and_keys();
    let mut store = KvsStore { id: 0 };
    for (slots, medium, what) in [
        (0, KVS_MEDIUM_GPU, "ring_slots"),
        (KVS_EVENT_RING_MAX + 1, KVS_MEDIUM_GPU, "ring_slots"),
        (16, 9, "medium"),
    ] {
        // SAFETY: `store` is a live local.
        let status = unsafe {
            kvs_store_new_with_events(
                layout,
                4,
                ptr::null(),
                KvsMemory { id: 0 },
                slots,
                medium,
                &mut store,
            )
        };
        assert_eq!(status, KvsStatus::InvalidArgument);
        assert!(last_error().contains(what), "{}", last_error());
        assert_eq!(store.id, 0, "no store made");
    }
    // A store without a ring has no events to drain or count.
    // SAFETY: `store` is a live local.
    unsafe {
        assert_eq!(
            kvs_store_new(layout, 4, ptr::null(), KvsMemory { id: 0 }, &mut store),
            KvsStatus::Ok
        );
        let mut n = 0;
        assert_eq!(
            kvs_events_drain(store, ptr::null_mut(), 0, &mut n),
            KvsStatus::InvalidArgument
        );
        assert!(last_error().contains("no event ring"));
        let mut s = KvsEventStats::default();
        assert_eq!(kvs_events_stats(store, &mut s), KvsStatus::InvalidArgument);
    }
    assert_eq!(kvs_store_destroy(store), KvsStatus::Ok);
    let store = store_with_events(layout, 4, 8);
    publish(store, &keys[..2]);
    let mut buf = [KvsEvent::default(); 4];
    let mut n = 7usize;
    // SAFETY: the pointers are to live locals or deliberately bad.
    unsafe {
        // Null `written`, a null buffer with room claimed, a misaligned
        // buffer, a destroyed handle: refused, the events still there.
        assert_eq!(
            kvs_events_drain(store, buf.as_mut_ptr(), 4, ptr::null_mut()),
            KvsStatus::NullPointer
        );
        assert_eq!(
            kvs_events_drain(store, ptr::null_mut(), 4, &mut n),
            KvsStatus::NullPointer
        );
        let misaligned = buf.as_mut_ptr().cast::<u8>().add(1).cast::<KvsEvent>();
        assert_eq!(
            kvs_events_drain(store, misaligned, 2, &mut n),
            KvsStatus::Misaligned
        );
        assert_eq!(
            kvs_events_drain(KvsStore { id: 12345 }, buf.as_mut_ptr(), 4, &mut n),
            KvsStatus::InvalidHandle
        );
        assert_eq!(n, 7, "written untouched");
        // Room for none: nothing moves.
        assert_eq!(
            kvs_events_drain(store, ptr::null_mut(), 0, &mut n),
            KvsStatus::Ok
        );
        assert_eq!(n, 0);
    }
    assert_eq!(drain(store, 4).len(), 2, "every event still there");
    assert_eq!(kvs_store_destroy(store), KvsStatus::Ok);
    assert_eq!(kvs_layout_destroy(layout), KvsStatus::Ok);
}
