//! A router that joins late, or falls further behind than a worker keeps
//! batches for replay, asks that worker for a snapshot and ends up with
//! exactly what the worker holds, evictions included.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvslice_core::events::{EventRing, KvEvent, Medium};
use kvslice_core::testkit::serve_blocks;
use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
use kvslice_events::{Publisher, PublisherConfig, Source, Subscriber};

fn key(conv: u64) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(conv) << 64 | 1 << 126),
        block_index: 0,
        layer_group: 0,
        head_shard: 0,
    }
}

fn serve(store: &CacheStore<'static, LruPolicy>, conv: u64) {
    let (guard, req) = (store.pin(), store.begin_request());
    let mut held = Vec::new();
    serve_blocks(store, &req, &[key(conv)], 16, &guard, &mut held).unwrap();
    drop(held);
    store.end_request(req).unwrap();
}

fn holdings(store: &CacheStore<'static, LruPolicy>) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    store.snapshot(&mut |e| {
        if let KvEvent::Stored { key, .. } = e {
            out.insert((key.block.0 >> 64) as u64 & 0xffff);
        }
    });
    out
}

fn indexed(sub: &Subscriber, convs: u64) -> BTreeSet<u64> {
    (0..convs)
        .filter(|&c| sub.index().overlaps(&[key(c)])[0] == 1)
        .collect()
}

#[test]
fn a_late_router_asks_for_a_snapshot_and_knows_every_block() {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 16, KvDtype::F32)).unwrap();
    // 8 pages for 20 conversations: 12 blocks are evicted on the way.
    let store = CacheStore::new(layout, 8, LruPolicy::new(8))
        .unwrap()
        .with_events(EventRing::new(1 << 12, Medium::Gpu));
    let mut publisher = Publisher::bind(PublisherConfig {
        max_batch_events: 1,
        replay_batches: 4,
        ..PublisherConfig::default()
    })
    .unwrap();
    for conv in 0..20 {
        serve(&store, conv);
        publisher.pump(&store).unwrap();
    }
    // The router arrives now: the worker keeps only its last 4 batches.
    let source = Source {
        endpoint: publisher.endpoint(),
        replay_endpoint: publisher.replay_endpoint(),
    };
    let mut sub = Subscriber::connect(&[source], 2_000).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while publisher.subscribers().unwrap() == 0 {
        assert!(Instant::now() < deadline, "no subscriber arrived");
        std::thread::sleep(Duration::from_millis(2));
    }
    serve(&store, 20);
    let want = holdings(&store);
    assert_eq!(want.len(), 8);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (publisher, store, stop) = (&mut publisher, &store, &stop);
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                publisher.pump(store).unwrap();
                publisher.serve_replay(2).unwrap();
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while indexed(&sub, 21) != want && Instant::now() < deadline {
            sub.poll(20).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = sub.stats();
    assert_eq!(indexed(&sub, 21), want, "{stats:?}");
    assert!(stats.unfilled > 0, "the early batches were gone: {stats:?}");
    assert!(stats.resyncs_asked > 0, "{stats:?}");
    assert_eq!(publisher.resyncs(), 1, "one snapshot after the first");
}
