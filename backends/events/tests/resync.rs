//! A router that joins late, or falls further behind than a worker keeps
//! batches for replay, asks that worker for a snapshot and ends up with
//! exactly what the worker holds, evictions included; while no snapshot
//! comes it does not ask on every loss.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvslice_core::events::{EventRing, KvEvent, Medium};
use kvslice_core::testkit::serve_blocks;
use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
use kvslice_events::wire::{WireEvent, encode};
use kvslice_events::{Publisher, PublisherConfig, RESYNC_REQUEST, Source, Subscriber, zmq};

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

/// A worker that never answers: each loss does not ask again at once; a
/// snapshot that arrives (`AllBlocksCleared`) lets the next loss ask.
#[test]
fn unanswered_snapshot_requests_back_off() {
    let ctx = zmq::Context::new();
    let worker = ctx.socket(zmq::XPUB).unwrap();
    worker.bind("tcp://127.0.0.1:*").unwrap();
    let replay = ctx.socket(zmq::ROUTER).unwrap();
    replay.bind("tcp://127.0.0.1:*").unwrap();
    let mut sub = Subscriber::connect(
        &[Source {
            endpoint: worker.get_last_endpoint().unwrap().unwrap(),
            replay_endpoint: Some(replay.get_last_endpoint().unwrap().unwrap()),
        }],
        20,
    )
    .unwrap();
    assert_eq!(worker.recv_bytes(0).unwrap(), [1], "the subscription");
    let send = |seq: u64, event: WireEvent| {
        let p = encode(1.0, &[event]);
        worker
            .send_multipart([&b"kv"[..], &seq.to_be_bytes()[..], &p[..]], 0)
            .unwrap();
    };
    let stored = |b: u64| WireEvent::Stored {
        hashes: vec![key(b).block],
        parent: None,
        tokens: vec![16],
        block_size: 16,
        medium: "GPU".into(),
        layer_group: 0,
        head_shard: 0,
        first_block_index: 0,
    };
    // Every other batch: five gaps, no replay answers.
    for seq in (1..10).step_by(2) {
        send(seq, stored(seq));
        let deadline = Instant::now() + Duration::from_secs(10);
        while sub.next_seq(0) <= seq {
            assert!(Instant::now() < deadline, "{:?}", sub.stats());
            sub.poll(20).unwrap();
        }
    }
    assert_eq!(sub.stats().gaps, 5);
    assert_eq!(sub.stats().resyncs_asked, 1, "{:?}", sub.stats());
    // A snapshot arrives; the next loss asks again.
    send(10, WireEvent::Cleared);
    send(12, stored(12));
    let deadline = Instant::now() + Duration::from_secs(10);
    while sub.next_seq(0) <= 12 {
        assert!(Instant::now() < deadline, "{:?}", sub.stats());
        sub.poll(20).unwrap();
    }
    assert_eq!(sub.stats().resyncs_asked, 2, "{:?}", sub.stats());
    // What reached the worker's replay socket: the snapshot requests, on
    // a connection that asks nothing else.
    let mut resync_requests = 0;
    while replay.poll(zmq::POLLIN, 100).unwrap() > 0 {
        let m = replay.recv_multipart(0).unwrap();
        if m.last().map(Vec::as_slice) == Some(&RESYNC_REQUEST.to_be_bytes()[..]) {
            resync_requests += 1;
        }
    }
    assert_eq!(resync_requests, 2);
}
