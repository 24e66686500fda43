//! The slice map with threads and foreign guards. Operation sequences
//! against a `HashMap` model run through `kvslice_core::fuzzing::slice_map`
//! (see `fuzz_corpus.rs`).

use crossbeam_epoch::Collector;
use kvslice_core::testkit::Rng;
use kvslice_core::{
    BlockHash, Error, KvDtype, KvLayout, LayoutSpec, PageHandle, PagePool, SliceKey, SliceMap,
};

fn key(i: u64) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(i) * 0x9e37_79b9_7f4a_7c15),
        block_index: (i % 7) as u32,
        layer_group: 0,
        head_shard: 0,
    }
}

/// Distinct handles to use as values (any valid handle will do).
fn handles(n: u32) -> (PagePool<'static>, Vec<PageHandle>) {
    let pool = PagePool::new(
        KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 1, KvDtype::F32)).unwrap(),
        n,
    )
    .unwrap();
    let hs = pool.alloc_many(n).unwrap().map(|p| p.handle()).collect();
    (pool, hs)
}

#[test]
fn guards_from_another_collector_are_rejected() {
    let map = SliceMap::with_collector(4, Collector::new());
    // The collector outlives the handle registered with it: dropping a
    // temporary collector's last handle frees the collector from inside
    // crossbeam-epoch's `Local::finalize`, which Miri reports as a
    // deallocation through a protected reference (see `kvslice_core::epoch`).
    let collector = Collector::new();
    let other = collector.register();
    let guard = other.pin();
    assert!(matches!(
        map.get(&key(1), &guard),
        Err(Error::InvalidValue(_))
    ));
    let std_map = SliceMap::new(4);
    assert_eq!(std_map.get(&key(1), &crossbeam_epoch::pin()).unwrap(), None);
    assert!(std_map.get(&key(1), &guard).is_err());
}

#[test]
fn threads_inserting_and_removing_disjoint_and_shared_keys() {
    let (_pool, values) = handles(4);
    let map = SliceMap::new(256);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (map, values) = (&map, &values);
            s.spawn(move || {
                let mut rng = Rng::new(t);
                for i in 0..if cfg!(miri) { 300 } else { 200_000u64 } {
                    let guard = crossbeam_epoch::pin();
                    // Own keys: exact expectations. Shared keys: only sanity.
                    let own = key(1000 + t * 100 + i % 50);
                    let mine = values[t as usize];
                    assert_eq!(map.insert(own, mine, &guard).unwrap(), None);
                    assert_eq!(map.get(&own, &guard).unwrap(), Some(mine));
                    assert_eq!(map.remove(&own, &guard).unwrap(), Some(mine));
                    let shared = key(rng.below(20));
                    match rng.below(3) {
                        0 => drop(map.insert(shared, values[2 + t as usize], &guard).unwrap()),
                        1 => drop(map.remove(&shared, &guard).unwrap()),
                        _ => {
                            if let Some(v) = map.get(&shared, &guard).unwrap() {
                                assert!(v == values[2] || v == values[3]);
                            }
                        }
                    }
                }
            });
        }
    });
    let guard = crossbeam_epoch::pin();
    let census = map.census(&guard).unwrap();
    assert!(census.entries <= 20);
    for i in 0..2 * 50 {
        assert_eq!(
            map.get(&key(1000 + (i / 50) * 100 + i % 50), &guard)
                .unwrap(),
            None
        );
    }
}

/// Two threads insert the same key into a two-bucket map whose inline slots
/// are churned by other keys, round after round: whichever of inline slot
/// and overflow chain each insert lands in, exactly one wins and the other
/// is handed the winner's value.
#[test]
fn racing_inserts_of_one_key_never_duplicate() {
    let (_pool, values) = handles(4);
    let map = SliceMap::with_collector(1, Collector::new());
    let barrier = std::sync::Barrier::new(2);
    let rounds = if cfg!(miri) { 60 } else { 20_000u64 };
    let wins: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (map, values, barrier) = (&map, &values, &barrier);
                s.spawn(move || {
                    let local = map.collector().register();
                    let mine = values[t as usize];
                    let filler = key(500 + t);
                    let mut wins = 0;
                    for round in 0..rounds {
                        let k = key(round % 3);
                        // Vary what occupies the inline slots meanwhile.
                        if round % 2 == t {
                            let _ = map.insert(filler, values[2], &local.pin()).unwrap();
                        }
                        barrier.wait();
                        let guard = local.pin();
                        match map.insert(k, mine, &guard).unwrap() {
                            None => wins += 1,
                            Some(v) => assert_eq!(v, values[1 - t as usize], "round {round}"),
                        }
                        assert!(map.get(&k, &guard).unwrap().is_some());
                        drop(guard);
                        barrier.wait();
                        if t == 0 {
                            let guard = local.pin();
                            assert!(map.remove(&k, &guard).unwrap().is_some());
                            assert_eq!(map.get(&k, &guard).unwrap(), None);
                            let census = map.census(&guard).unwrap();
                            assert!(census.entries <= 2, "{census:?}");
                        } else if round % 5 == 0 {
                            let _ = map.remove(&filler, &local.pin()).unwrap();
                        }
                        barrier.wait();
                    }
                    wins
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(wins[0] + wins[1], rounds, "{wins:?}");
}
