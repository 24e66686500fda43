//! loom model of the KV event ring between a store's publishers and
//! evictors and the thread that forwards events: producers racing each
//! other for positions on a ring that fills, and a drainer. Every event is
//! delivered exactly once and intact, or dropped and counted; delivered
//! events are numbered 0, 1, 2, ... in the order they arrive; one
//! producer's events arrive in the order it pushed them.

use kvslice_core::events::{EventRing, KvEvent, Medium};
use kvslice_core::{BlockHash, SliceKey};
use kvslice_loom_tests::{Arc, Mutex, model, thread};

fn removed(producer: u32, i: u32) -> KvEvent {
    KvEvent::Removed {
        key: SliceKey {
            block: BlockHash(u128::from(producer) << 64 | u128::from(i) | 1 << 100),
            block_index: i,
            layer_group: producer,
            head_shard: 7,
        },
    }
}

/// Two producers (two events each) on a ring of two slots, so it fills and
/// producers race for positions, against a drainer that takes at most one
/// event (as the C ABI's bounded drain does); then a final drain.
#[test]
fn producers_race_a_drainer() {
    model(|| {
        let ring = Arc::new(EventRing::new(2, Medium::Gpu));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let ring = ring.clone();
                thread::spawn(move || (0..2u32).filter(|&i| ring.push(removed(p, i))).count())
            })
            .collect();
        let drainer = {
            let (ring, seen) = (ring.clone(), seen.clone());
            thread::spawn(move || {
                let took = ring.try_drain_up_to(1, &mut |n, e| seen.lock().unwrap().push((n, e)));
                assert!(took.is_none_or(|n| n <= 1), "a bounded drain took more");
            })
        };
        let pushed: usize = producers.into_iter().map(|p| p.join().unwrap()).sum();
        drainer.join().unwrap();
        assert!(ring.try_drain(&mut |n, e| seen.lock().unwrap().push((n, e))));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), pushed, "every accepted event arrives once");
        assert_eq!(pushed as u64 + ring.dropped(), 4);
        assert_eq!(ring.emitted(), 4);
        let numbers: Vec<u64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            numbers,
            (0..pushed as u64).collect::<Vec<_>>(),
            "numbers rise by one"
        );
        for p in 0..2 {
            let mine: Vec<KvEvent> = seen
                .iter()
                .map(|s| s.1)
                .filter(|e| matches!(e, KvEvent::Removed { key } if key.layer_group == p))
                .collect();
            let valid = [removed(p, 0), removed(p, 1)];
            assert!(mine.iter().all(|e| valid.contains(e)), "a torn event");
            if mine.len() == 2 {
                assert_eq!(mine, valid, "one producer's events out of order");
            }
        }
    });
}

/// Two producers of one event each on a ring of two slots, against a
/// drainer: the ring never holds more than it has room for, so nothing
/// may be dropped, however stale a producer's view of the tail is when
/// the drainer moves the head past it.
#[test]
fn a_ring_with_room_drops_nothing() {
    model(|| {
        let ring = Arc::new(EventRing::new(2, Medium::Gpu));
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let ring = ring.clone();
                thread::spawn(move || ring.push(removed(p, 0)))
            })
            .collect();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let drainer = {
            let (ring, seen) = (ring.clone(), seen.clone());
            thread::spawn(move || ring.try_drain(&mut |_, e| seen.lock().unwrap().push(e)))
        };
        for p in producers {
            assert!(p.join().unwrap(), "an event dropped from a ring with room");
        }
        drainer.join().unwrap();
        assert_eq!(ring.dropped(), 0);
        assert!(ring.try_drain(&mut |_, e| seen.lock().unwrap().push(e)));
        assert_eq!(ring.emitted(), 2);
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|e| match e {
            KvEvent::Removed { key } => key.layer_group,
            _ => u32::MAX,
        });
        assert_eq!(seen, [removed(0, 0), removed(1, 0)], "both events, once");
    });
}
