//! The router's subscriber against real publishers over loopback: a slow
//! consumer whose ZeroMQ queues overflow finds the gaps and fills them from
//! the replay socket; a store whose event ring overflows resynchronises
//! it; a misbehaving worker costs the index nothing it knew.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kvslice_core::events::KvEvent;
use kvslice_core::testkit::serve_blocks;
use kvslice_core::{BlockHash, CacheStore, LruPolicy, SliceKey};
use kvslice_events::wire::{WireEvent, encode};
use kvslice_events::{Publisher, PublisherConfig, Source, Subscriber};

mod common;
use common::{
    poll_until, send_event, store_with_ring, stored_block, wait_for_subscriber, worker_sockets,
};

fn key(conv: u64, i: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(conv) << 64 | u128::from(i) | 1 << 126),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}

fn source(p: &Publisher) -> Source {
    Source {
        endpoint: p.endpoint(),
        replay_endpoint: p.replay_endpoint(),
    }
}

/// Everything cached in `store`, as the index names blocks.
fn holdings(store: &CacheStore<'static, LruPolicy>) -> BTreeSet<BlockHash> {
    let mut out = BTreeSet::new();
    store.snapshot(&mut |e| {
        if let KvEvent::Stored { key, .. } = e {
            out.insert(key.block);
        }
    });
    out
}

fn indexed(
    sub: &Subscriber,
    worker: usize,
    candidates: &BTreeSet<BlockHash>,
) -> BTreeSet<BlockHash> {
    candidates
        .iter()
        .copied()
        .filter(|&b| {
            let k = SliceKey {
                block: b,
                block_index: 0,
                layer_group: 0,
                head_shard: 0,
            };
            sub.index().overlaps(&[k])[worker] == 1
        })
        .collect()
}

#[test]
fn a_slow_consumer_fills_its_gaps_from_the_replay_socket() {
    // Two workers; worker 1's ring is small, so a burst overflows it.
    let stores: Vec<_> = [1 << 16, 64]
        .into_iter()
        .map(|slots| store_with_ring(256, slots))
        .collect();
    let mut pubs: Vec<_> = (0..2)
        .map(|_| {
            Publisher::bind(PublisherConfig {
                max_batch_events: 4,
                send_hwm: 8,
                ..PublisherConfig::default()
            })
            .unwrap()
        })
        .collect();
    let mut sub = Subscriber::connect(&[source(&pubs[0]), source(&pubs[1])], 5_000).unwrap();
    for p in &mut pubs {
        wait_for_subscriber(p);
    }
    let mut all = BTreeSet::new();
    // The consumer does not read while 3,000 requests' events go out.
    for conv in 0..3_000u64 {
        let w = (conv % 2) as usize;
        let store = &stores[w];
        let keys: Vec<SliceKey> = (0..6).map(|i| key(conv % 700, i)).collect();
        all.extend(keys.iter().map(|k| k.block));
        let (guard, req) = (store.pin(), store.begin_request());
        let mut held = Vec::new();
        serve_blocks(store, &req, &keys, 16, &guard, &mut held).unwrap();
        assert_eq!(held.len(), 6, "every block hit or got a page");
        drop(held);
        store.end_request(req).unwrap();
        // Worker 1 forwards only now and then: its 64-slot ring overflows.
        if w == 0 || conv % 100 == 99 {
            pubs[w].pump(store).unwrap();
        }
    }
    for (p, s) in pubs.iter_mut().zip(&stores) {
        p.pump(s).unwrap();
    }
    assert!(
        stores[1].events().unwrap().dropped() > 0,
        "worker 1's ring overflowed"
    );
    assert!(pubs[1].resyncs() > 0);
    // Now read, while the workers answer replay requests.
    let targets: Vec<u64> = pubs.iter().map(Publisher::next_seq).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (pubs, stop) = (&mut pubs, &stop);
        s.spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for p in pubs.iter_mut() {
                    p.serve_replay(2).unwrap();
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while (0..2).any(|w| sub.next_seq(w) < targets[w]) {
            if Instant::now() > deadline {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("never caught up: {:?}", sub.stats());
            }
            sub.poll(50).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let stats = sub.stats();
    println!("{stats:?}");
    assert!(stats.gaps > 0, "the overflow left gaps the consumer saw");
    assert!(stats.replayed > 0, "the replay socket filled them");
    assert_eq!(stats.unfilled, 0);
    assert_eq!((stats.malformed, stats.backwards), (0, 0));
    for (w, store) in stores.iter().enumerate() {
        assert_eq!(indexed(&sub, w, &all), holdings(store), "worker {w}");
    }
}

#[test]
fn bad_input_is_counted_and_costs_nothing_known() {
    let ctx = zmq::Context::new();
    let (worker, mut sub) = one_worker(&ctx);
    let stored = stored_block;
    let send = |frames: &[&[u8]]| worker.send_multipart(frames, 0).unwrap();
    let batch = |seq: u64, events: &[WireEvent]| {
        let payload = encode(1.0, events);
        send(&[b"kv", &seq.to_be_bytes(), &payload]);
    };
    batch(0, &[stored(1)]);
    send(&[b"kv"]); // one frame
    send(&[b"kv", b"abc", b"x"]); // a 3-byte sequence
    send(&[b"kv", &1u64.to_be_bytes(), b"\xc1\xc1"]); // not a batch
    // An unknown kind next to a known one.
    let mut odd = encode(1.0, &[stored(2)]);
    assert_eq!(
        odd[..3],
        [0x93, 0xcb, 0x3f],
        "[ts, events, rank] with a float ts"
    );
    let at = odd.iter().position(|&b| b == 0x91).unwrap(); // the events array
    odd[at] = 0x92;
    odd.splice(at + 1..at + 1, [0x91, 0xa5, b'B', b'l', b'o', b'c', b'k']);
    send(&[b"kv", &2u64.to_be_bytes(), &odd]);
    batch(1, &[stored(3)]); // backwards
    batch(5, &[stored(4)]); // a gap, and no replay socket
    let deadline = Instant::now() + Duration::from_secs(30);
    while sub.next_seq(0) < 6 {
        assert!(Instant::now() < deadline, "{:?}", sub.stats());
        sub.poll(20).unwrap();
    }
    let stats = sub.stats();
    for p in sub.problems() {
        println!("problem: {p}");
    }
    assert_eq!(stats.malformed, 3, "{stats:?}");
    assert_eq!(stats.unknown_events, 1, "{stats:?}");
    assert_eq!(stats.backwards, 1, "{stats:?}");
    // Batch 1 did not decode, so its number was not taken: a gap before
    // batch 2 (lost: no replay socket), and 3 and 4 before batch 5.
    assert_eq!((stats.gaps, stats.unfilled), (2, 3), "{stats:?}");
    let k = |b| SliceKey {
        block: BlockHash(b),
        block_index: 0,
        layer_group: 0,
        head_shard: 0,
    };
    let known: Vec<usize> = [1, 2, 3, 4]
        .iter()
        .map(|&b| sub.index().overlaps(&[k(b)])[0])
        .collect();
    assert_eq!(
        known,
        [1, 1, 0, 1],
        "blocks 1, 2 and 4 arrived; 3 came backwards"
    );
    // The worker disappears: polling returns, the index keeps what it knew
    // until told the worker is gone.
    drop(worker);
    assert_eq!(sub.poll(50).unwrap(), 0);
    assert_eq!(sub.index().blocks_of(0), 3);
    sub.forget_worker(0);
    assert_eq!(sub.index().blocks_of(0), 0);
}

fn knows(sub: &Subscriber, b: u128) -> bool {
    let k = SliceKey {
        block: BlockHash(b),
        block_index: 0,
        layer_group: 0,
        head_shard: 0,
    };
    sub.index().overlaps(&[k])[0] == 1
}

/// A replay that answers after the subscriber gave up on it: its late
/// reply, end marker and all, must not be taken for the answer to the
/// next gap's request.
#[test]
fn a_late_replay_reply_answers_no_later_request() {
    let ctx = zmq::Context::new();
    let (worker, replay, mut sub) = worker_sockets(&ctx, true, 200);
    let replay = replay.unwrap();
    let payload = |seq: u64| encode(1.0, &[stored_block(100 + u128::from(seq))]);
    let (late_sent, wait_late) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let reply = |id: &[u8], seqs: std::ops::Range<u64>| {
            for seq in seqs {
                let p = payload(seq);
                replay
                    .send_multipart([id, &seq.to_be_bytes()[..], &p[..]], 0)
                    .unwrap();
            }
            let end = (-1i64).to_be_bytes();
            replay.send_multipart([id, &end[..], &[][..]], 0).unwrap();
        };
        let first = replay.recv_multipart(0).unwrap();
        // `[identity, "", start]`, the request vLLM's replay socket takes.
        assert_eq!(first.len(), 3, "{first:?}");
        assert!(first[1].is_empty(), "an empty delimiter: {first:?}");
        assert_eq!(first[2], 0u64.to_be_bytes(), "the first gap starts at 0");
        // Past the subscriber's 200 ms.
        std::thread::sleep(Duration::from_millis(600));
        reply(&first[0], 0..2);
        late_sent.send(()).unwrap();
        // The lost batches also brought a snapshot request, which gets
        // no reply, on a connection of its own.
        let (second, from) = loop {
            let m = replay.recv_multipart(0).unwrap();
            let from = u64::from_be_bytes(m[2].as_slice().try_into().unwrap());
            if from != kvslice_events::RESYNC_REQUEST {
                break (m, from);
            }
        };
        reply(&second[0], from..5);
    });
    let live = |seq: u64| {
        let p = payload(seq);
        worker
            .send_multipart([&b"kv"[..], &seq.to_be_bytes()[..], &p[..]], 0)
            .unwrap();
    };
    live(2);
    poll_until(&mut sub, |s| s.next_seq(0) == 3);
    assert_eq!(sub.stats().unfilled, 2, "the first replay timed out");
    wait_late.recv().unwrap();
    live(5);
    poll_until(&mut sub, |s| s.next_seq(0) == 6);
    server.join().unwrap();
    let stats = sub.stats();
    assert_eq!(
        (stats.gaps, stats.replayed, stats.unfilled),
        (2, 2, 2),
        "{stats:?}"
    );
    let known: Vec<bool> = (100..106).map(|b| knows(&sub, b)).collect();
    assert_eq!(known, [false, false, true, true, true, true]);
}

/// A replay whose window starts past the batch that opened the gap (the
/// publisher kept only later batches), or that names a wild number: the
/// batches it lacks below the gap are lost, and only those; the live batch
/// in hand and the live ones queued after it are applied, not dropped as
/// already replayed or counted lost.
#[test]
fn a_replay_past_the_gap_decides_only_the_gap() {
    let ctx = zmq::Context::new();
    let (worker, replay, mut sub) = worker_sockets(&ctx, true, 2000);
    let replay = replay.unwrap();
    let server = std::thread::spawn(move || {
        let request = replay.recv_multipart(0).unwrap();
        assert_eq!(request[2], 1u64.to_be_bytes(), "the gap starts at 1");
        // The publisher kept only batch 3 on, and one wild number. Replies
        // as vLLM's replay socket sends them, the delimiter echoed.
        for (seq, b) in [(3u64, 103u128), (1 << 40, 999)] {
            let p = encode(1.0, &[stored_block(b)]);
            replay
                .send_multipart([&request[0][..], b"", &seq.to_be_bytes()[..], &p[..]], 0)
                .unwrap();
        }
        let end = (-1i64).to_be_bytes();
        replay
            .send_multipart([&request[0][..], b"", &end[..], &[][..]], 0)
            .unwrap();
    });
    send_batch(&worker, 0, 100);
    poll_until(&mut sub, |s| s.next_seq(0) == 1);
    // Batch 1 is lost on the way; 2, then 3 and 4, arrive live.
    send_batch(&worker, 2, 102);
    send_batch(&worker, 3, 103);
    send_batch(&worker, 4, 104);
    poll_until(&mut sub, |s| s.next_seq(0) == 5);
    server.join().unwrap();
    let stats = sub.stats();
    assert_eq!((stats.gaps, stats.unfilled), (1, 1), "{stats:?}");
    let known: Vec<bool> = [100, 102, 103, 104, 999].map(|b| knows(&sub, b)).to_vec();
    assert_eq!(known, [true, true, true, true, false], "{stats:?}");
}

/// A worker's XPUB socket with one subscriber (no replay socket)
/// connected to it, the subscription received.
fn one_worker(ctx: &zmq::Context) -> (zmq::Socket, Subscriber) {
    let (worker, _, sub) = worker_sockets(ctx, false, 100);
    (worker, sub)
}

/// Sends batch `seq` storing block `b`.
fn send_batch(worker: &zmq::Socket, seq: u64, b: u128) {
    send_event(worker, seq, stored_block(b));
}

/// A message whose payload is not a batch takes no sequence number: one
/// with a wild number (1,000 after 4) neither counts the real batches
/// between lost nor, when they come, makes them look behind or a restart
/// that would forget the worker.
#[test]
fn an_undecodable_batch_with_a_wild_number_moves_nothing() {
    let ctx = zmq::Context::new();
    let (worker, mut sub) = one_worker(&ctx);
    for seq in 0..5 {
        send_batch(&worker, seq, 1 + u128::from(seq));
    }
    worker
        .send_multipart([&b"kv"[..], &1000u64.to_be_bytes()[..], b"\xc1"], 0)
        .unwrap();
    for seq in 5..8 {
        send_batch(&worker, seq, 1 + u128::from(seq));
    }
    poll_until(&mut sub, |s| s.next_seq(0) == 8);
    let stats = sub.stats();
    assert_eq!(stats.malformed, 1, "{stats:?}");
    assert_eq!(
        (stats.gaps, stats.unfilled, stats.backwards, stats.restarts),
        (0, 0, 0, 0),
        "{stats:?}"
    );
    assert!((1..=8).all(|b| knows(&sub, b)), "{stats:?}");
}

/// A publisher that starts again from 0 (its worker restarted) is
/// followed from its new start once its numbers run on for
/// `RESTART_RUN` batches, what the worker held before is forgotten, and
/// the run's batches, received while they still looked like duplicates,
/// are applied then; a sequence number nothing can follow is refused.
#[test]
fn a_restarted_publisher_is_followed_from_its_new_start() {
    let ctx = zmq::Context::new();
    let (worker, mut sub) = one_worker(&ctx);
    let batch = |seq: u64, b: u128| send_batch(&worker, seq, b);
    for seq in 0..4 {
        batch(seq, 1 + u128::from(seq));
    }
    poll_until(&mut sub, |s| s.next_seq(0) == 4);
    assert!((1..5).all(|b| knows(&sub, b)));
    // Restarted: 0, 1, 2 again, with other blocks.
    for seq in 0..u64::from(kvslice_events::RESTART_RUN) {
        batch(seq, 10 + u128::from(seq));
    }
    poll_until(&mut sub, |s| s.stats().restarts == 1);
    let stats = sub.stats();
    let run = u64::from(kvslice_events::RESTART_RUN);
    assert_eq!(sub.next_seq(0), run);
    // The run was the new stream, applied, and nothing was lost.
    assert_eq!((stats.backwards, stats.unfilled), (run - 1, 0), "{stats:?}");
    assert!(
        (1..5).all(|b| !knows(&sub, b)),
        "the old blocks are forgotten"
    );
    assert!(
        (0..run).all(|s| knows(&sub, 10 + u128::from(s))),
        "{stats:?}"
    );
    batch(u64::MAX, 99);
    batch(run, 50);
    poll_until(&mut sub, |s| s.next_seq(0) == run + 1);
    let stats = sub.stats();
    assert_eq!(stats.malformed, 1, "{stats:?}");
    assert!(knows(&sub, 50) && !knows(&sub, 99));
}

/// A publisher that restarts after two batches, fewer than
/// `RESTART_RUN`: its new 0 and 1 come behind and its 2 runs on past
/// them, which is the restart; the old blocks are forgotten.
#[test]
fn a_publisher_restarted_after_two_batches_is_seen() {
    let ctx = zmq::Context::new();
    let (worker, mut sub) = one_worker(&ctx);
    for seq in 0..2 {
        send_batch(&worker, seq, 1 + u128::from(seq));
    }
    poll_until(&mut sub, |s| s.next_seq(0) == 2);
    assert!(knows(&sub, 1) && knows(&sub, 2));
    for seq in 0..3 {
        send_batch(&worker, seq, 10 + u128::from(seq));
    }
    poll_until(&mut sub, |s| s.stats().restarts == 1);
    assert_eq!(sub.next_seq(0), 3);
    assert!(
        !knows(&sub, 1) && !knows(&sub, 2),
        "the old blocks are forgotten"
    );
    assert!((10..13).all(|b| knows(&sub, b)), "{:?}", sub.stats());
    assert_eq!(sub.stats().unfilled, 0);
}

/// A replay peer that answers with an endless stream of malformed
/// messages and no end holds the subscriber no longer than its replay
/// timeout: the gap is counted unfilled and the live batch applied.
#[test]
fn an_endless_malformed_replay_is_cut_off() {
    let ctx = zmq::Context::new();
    let (worker, replay, mut sub) = worker_sockets(&ctx, true, 50);
    let replay = replay.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let request = replay.recv_multipart(0).unwrap();
            // One-frame replies, never an end, for at most 20 s.
            let until = Instant::now() + Duration::from_secs(20);
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                if replay
                    .send_multipart([&request[0][..], b"x"], zmq::DONTWAIT)
                    .is_ok()
                {
                    sent += 1;
                }
            }
            sent
        })
    };
    send_batch(&worker, 3, 7);
    let start = Instant::now();
    poll_until(&mut sub, |s| s.next_seq(0) == 4);
    let took = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = server.join().unwrap();
    let stats = sub.stats();
    assert!(sent > 0 && stats.malformed > 0, "{sent} sent, {stats:?}");
    assert_eq!(stats.unfilled, 3, "{stats:?}");
    assert!(knows(&sub, 7));
    assert!(took < Duration::from_secs(10), "held for {took:?}");
}

/// A peer that floods a publisher's replay socket with requests and never
/// reads cannot hold `serve_replay`: one call answers at most
/// `MAX_REPLAY_REQUESTS`, and replies past the peer's full pipe are
/// dropped rather than queued without bound.
#[test]
fn a_replay_flood_cannot_hold_the_publisher() {
    let store = store_with_ring(16, 1 << 12);
    let mut publisher = Publisher::bind(PublisherConfig {
        max_batch_events: 1,
        replay_batches: 2_000,
        ..PublisherConfig::default()
    })
    .unwrap();
    // The first pump sends the (empty) store's snapshot.
    assert_eq!(publisher.pump(&store).unwrap(), 1);
    // 2,000 kept batches of one event each: every reply is 2,001 messages.
    for _ in 0..2_000 {
        assert!(store.events().unwrap().push(KvEvent::Cleared));
    }
    assert_eq!(publisher.pump(&store).unwrap(), 2_000);
    let endpoint = publisher.replay_endpoint().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let ctx = zmq::Context::new();
            let peer = ctx.socket(zmq::DEALER).unwrap();
            peer.set_linger(0).unwrap();
            peer.connect(&endpoint).unwrap();
            // Requests for everything, never a read, for at most 20 s.
            let until = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                let _ = peer.send(&0u64.to_be_bytes()[..], zmq::DONTWAIT);
            }
        })
    };
    // The first call waits for the flood to arrive; the second finds it
    // queued. Neither may stay while it lasts.
    let start = Instant::now();
    let answered = publisher.serve_replay(5_000).unwrap() + publisher.serve_replay(0).unwrap();
    let took = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    assert!(
        answered <= 2 * kvslice_events::MAX_REPLAY_REQUESTS,
        "{answered}"
    );
    assert!(took < Duration::from_secs(10), "held for {took:?}");
}

/// The publisher's subscription count follows consumers both ways: two
/// arrive, one leaves while the other stays, then the other leaves.
#[test]
fn the_subscription_count_follows_consumers_that_leave() {
    let mut publisher = Publisher::bind(PublisherConfig::default()).unwrap();
    let ctx = zmq::Context::new();
    let connect = || {
        let s = ctx.socket(zmq::SUB).unwrap();
        s.set_linger(0).unwrap();
        s.connect(&publisher.endpoint()).unwrap();
        s.set_subscribe(b"").unwrap();
        s
    };
    let until = |p: &mut Publisher, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.subscribers().unwrap() != n {
            assert!(
                Instant::now() < deadline,
                "{} not {n}",
                p.subscribers().unwrap()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let (first, second) = (connect(), connect());
    until(&mut publisher, 2);
    drop(first);
    until(&mut publisher, 1);
    drop(second);
    until(&mut publisher, 0);
}

/// Serves conversation `conv`'s one block: a hit, or a page published.
fn serve_one(store: &CacheStore<'static, LruPolicy>, conv: u64) {
    let (guard, req) = (store.pin(), store.begin_request());
    let mut held = Vec::new();
    serve_blocks(store, &req, &[key(conv, 0)], 16, &guard, &mut held).unwrap();
    drop(held);
    store.end_request(req).unwrap();
}

/// Polls until `sub` applied every batch `publisher` sent (30 s at most).
fn catch_up(sub: &mut Subscriber, publisher: &Publisher) {
    let target = publisher.next_seq();
    poll_until(sub, |s| s.next_seq(0) >= target);
}

/// A resync while a producer sits between claiming a ring slot and writing
/// it: the drain that follows the snapshot stops at that slot, and the
/// events after it (older than the snapshot) wait in the ring. They must
/// not be sent over the snapshot: here a store of block X, whose removal
/// the full ring dropped, would leave the router naming X for good.
#[test]
fn events_older_than_a_resync_snapshot_are_not_sent_after_it() {
    let store = store_with_ring(2, 2);
    let mut publisher = Publisher::bind(PublisherConfig::default()).unwrap();
    let mut sub = Subscriber::connect(&[source(&publisher)], 1_000).unwrap();
    wait_for_subscriber(&mut publisher);
    // The first pump's snapshot (of an empty store).
    publisher.pump(&store).unwrap();
    let ring = store.events().unwrap();
    // A producer claims slot 0 and stalls.
    let stalled = ring.claim_unwritten().unwrap();
    // X is stored (slot 1); the ring is full, so what follows is dropped:
    // block 2 stored, then X evicted for block 3.
    let x = key(1, 0).block;
    for conv in 1..=3 {
        serve_one(&store, conv);
    }
    assert_eq!(ring.dropped(), 3, "the ring overflowed");
    assert!(!holdings(&store).contains(&x), "X was evicted");
    publisher.pump(&store).unwrap();
    assert_eq!(publisher.resyncs(), 1);
    // The producer finishes (an event of a block long gone); the next pump,
    // no resync, drains slot 0 and the Stored X that waited behind it.
    stalled.write(KvEvent::Removed { key: key(9, 0) });
    publisher.pump(&store).unwrap();
    assert_eq!(
        (ring.dropped(), publisher.resyncs()),
        (3, 1),
        "no second resync"
    );
    catch_up(&mut sub, &publisher);
    let all: BTreeSet<BlockHash> = (1..=3).map(|c| key(c, 0).block).collect();
    assert_eq!(
        indexed(&sub, 0, &all),
        holdings(&store),
        "{:?}",
        sub.stats()
    );
}

/// A worker that sends faster than the router applies cannot keep `poll`
/// from returning: one call handles at most `MAX_POLL_MESSAGES`.
#[test]
fn a_flooding_worker_cannot_hold_poll() {
    let ctx = zmq::Context::new();
    let (worker, _, mut sub) = worker_sockets(&ctx, false, 100);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seq = 0u64;
            let until = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                send_batch(&worker, seq, u128::from(seq % 64));
                seq += 1;
            }
            seq
        })
    };
    // Let the queue build up, then poll while the flood goes on.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let handled = sub.poll(0).unwrap();
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flood.join().unwrap();
    println!("{handled} handled in {took:?}; {sent} sent");
    assert!(handled <= kvslice_events::MAX_POLL_MESSAGES, "{handled}");
    assert!(handled > 0);
    assert!(took < Duration::from_secs(5), "poll held for {took:?}");
}

/// A publisher started beside a store that already holds blocks (one
/// restarted while its worker ran on): its first pump sends what the
/// store holds, so the router does not lose sight of it.
#[test]
fn a_new_publisher_sends_what_its_store_already_holds() {
    let store = store_with_ring(8, 64);
    // An earlier publisher forwarded these; it is gone.
    for conv in 0..3 {
        serve_one(&store, conv);
    }
    store.events().unwrap().try_drain(&mut |_, _| {});
    let mut publisher = Publisher::bind(PublisherConfig::default()).unwrap();
    let mut sub = Subscriber::connect(&[source(&publisher)], 1_000).unwrap();
    wait_for_subscriber(&mut publisher);
    serve_one(&store, 3);
    publisher.pump(&store).unwrap();
    catch_up(&mut sub, &publisher);
    let all: BTreeSet<BlockHash> = (0..4).map(|c| key(c, 0).block).collect();
    assert_eq!(indexed(&sub, 0, &all), all);
    assert_eq!(publisher.resyncs(), 0, "the first snapshot is no resync");
}
