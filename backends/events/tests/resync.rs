//! A router that joins late, or falls further behind than a worker keeps
//! batches for replay, asks that worker for a snapshot and ends up with
//! exactly what the worker holds, evictions included; while no snapshot
//! comes it does not ask on every loss.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvslice_core::events::KvEvent;
use kvslice_core::testkit::serve_blocks;
use kvslice_core::{BlockHash, CacheStore, LruPolicy, SliceKey};
use kvslice_events::wire::WireEvent;
use kvslice_events::{Publisher, PublisherConfig, RESYNC_REQUEST, Source, Subscriber, zmq};

mod common;
use common::{
    poll_until, send_event, store_with_ring, stored_block, wait_for_subscriber, worker_sockets,
};

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
    // 8 pages for 20 conversations: 12 blocks are evicted on the way.
    let store = store_with_ring(8, 1 << 12);
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
    wait_for_subscriber(&mut publisher);
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

/// A fake worker (its publishing socket and replay socket) and a
/// subscriber to it with replay timeout 20 ms and the given first wait
/// between snapshot requests.
fn fake_worker(ctx: &zmq::Context, backoff: Duration) -> (zmq::Socket, zmq::Socket, Subscriber) {
    let (worker, replay, sub) = worker_sockets(ctx, true, 20);
    (worker, replay.unwrap(), sub.with_resync_backoff(backoff))
}

fn stored(b: u64) -> WireEvent {
    stored_block(key(b).block.0)
}

/// Polls until batch `seq` has been applied (or counted lost).
fn reach(sub: &mut Subscriber, seq: u64) {
    poll_until(sub, |s| s.next_seq(0) > seq);
}

/// Snapshot requests that reached the fake worker's replay socket.
fn resync_requests(replay: &zmq::Socket) -> usize {
    let mut n = 0;
    while replay.poll(zmq::POLLIN, 100).unwrap() > 0 {
        let m = replay.recv_multipart(0).unwrap();
        if m.last().map(Vec::as_slice) == Some(&RESYNC_REQUEST.to_be_bytes()[..]) {
            n += 1;
        }
    }
    n
}

/// A worker that never answers: losses inside the wait after a request do
/// not ask again, and neither does one after a snapshot arrived while the
/// wait lasts.
#[test]
fn losses_inside_the_wait_ask_once() {
    let ctx = zmq::Context::new();
    let (worker, replay, mut sub) = fake_worker(&ctx, Duration::from_secs(60));
    // Every other batch: five gaps, no replay answers.
    for seq in (1..10).step_by(2) {
        send_event(&worker, seq, stored(seq));
        reach(&mut sub, seq);
    }
    send_event(&worker, 10, WireEvent::Cleared);
    send_event(&worker, 12, stored(12));
    reach(&mut sub, 12);
    let stats = sub.stats();
    assert_eq!((stats.gaps, stats.resyncs_asked), (6, 1), "{stats:?}");
    assert_eq!(resync_requests(&replay), 1);
}

/// A loss inside the wait asks when the wait is over, without another
/// loss; a snapshot that arrives first cancels it.
#[test]
fn a_loss_inside_the_wait_asks_when_it_ends() {
    let ctx = zmq::Context::new();
    let wait = Duration::from_millis(500);
    let (worker, replay, mut sub) = fake_worker(&ctx, wait);
    send_event(&worker, 1, stored(1));
    reach(&mut sub, 1);
    send_event(&worker, 3, stored(3));
    reach(&mut sub, 3);
    assert_eq!(sub.stats().resyncs_asked, 1, "the second loss waits");
    // Nothing more arrives; polling past the wait sends the due request.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sub.stats().resyncs_asked < 2 {
        assert!(Instant::now() < deadline, "{:?}", sub.stats());
        sub.poll(20).unwrap();
    }
    assert_eq!(resync_requests(&replay), 2);
    // The next wait is twice as long; a loss in it, then a snapshot, then
    // the wait's end: nothing is asked.
    send_event(&worker, 5, stored(5));
    send_event(&worker, 6, WireEvent::Cleared);
    reach(&mut sub, 6);
    let until = Instant::now() + 3 * wait;
    while Instant::now() < until {
        sub.poll(20).unwrap();
    }
    assert_eq!(sub.stats().resyncs_asked, 2, "{:?}", sub.stats());
    assert_eq!(resync_requests(&replay), 0);
}
