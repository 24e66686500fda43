//! Helpers the event tests share: stores with a ring, fake workers a
//! subscriber follows, and waits with deadlines. Each test file uses some
//! of them.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use kvslice_core::events::{EventRing, Medium};
use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy};
use kvslice_events::wire::{WireEvent, encode};
use kvslice_events::{Publisher, Source, Subscriber, zmq};

/// A store of `pages` one-block pages with an event ring of `slots`.
pub fn store_with_ring(pages: u32, slots: usize) -> CacheStore<'static, LruPolicy> {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 16, KvDtype::F32)).unwrap();
    CacheStore::new(layout, pages, LruPolicy::new(pages))
        .unwrap()
        .with_events(EventRing::new(slots, Medium::Gpu))
}

/// Waits (30 s at most) until `p` has a subscriber.
pub fn wait_for_subscriber(p: &mut Publisher) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.subscribers().unwrap() == 0 {
        assert!(Instant::now() < deadline, "no subscriber arrived");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A `BlockStored` of one full 16-token block, hash `b`, no parent.
pub fn stored_block(b: u128) -> WireEvent {
    WireEvent::Stored {
        hashes: vec![BlockHash(b)],
        parent: None,
        tokens: vec![16],
        block_size: 16,
        medium: "GPU".into(),
        layer_group: 0,
        head_shard: 0,
        first_block_index: 0,
    }
}

/// Polls until `done` or 30 seconds pass.
pub fn poll_until(sub: &mut Subscriber, done: impl Fn(&Subscriber) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(sub) {
        assert!(Instant::now() < deadline, "{:?}", sub.stats());
        sub.poll(20).unwrap();
    }
}

/// A worker's XPUB socket, and its replay ROUTER socket if asked, with
/// one subscriber connected to them (replays timed out after
/// `replay_timeout_ms`), the subscription received.
pub fn worker_sockets(
    ctx: &zmq::Context,
    with_replay: bool,
    replay_timeout_ms: i64,
) -> (zmq::Socket, Option<zmq::Socket>, Subscriber) {
    let worker = ctx.socket(zmq::XPUB).unwrap();
    worker.bind("tcp://127.0.0.1:*").unwrap();
    let replay = with_replay.then(|| {
        let replay = ctx.socket(zmq::ROUTER).unwrap();
        replay.bind("tcp://127.0.0.1:*").unwrap();
        replay
    });
    let sub = Subscriber::connect(
        &[Source {
            endpoint: worker.get_last_endpoint().unwrap().unwrap(),
            replay_endpoint: replay
                .as_ref()
                .map(|r| r.get_last_endpoint().unwrap().unwrap()),
        }],
        replay_timeout_ms,
    )
    .unwrap();
    assert_eq!(worker.recv_bytes(0).unwrap(), [1], "the subscription");
    (worker, replay, sub)
}

/// Sends batch `seq` holding `event` from a fake worker's socket.
pub fn send_event(worker: &zmq::Socket, seq: u64, event: WireEvent) {
    let p = encode(1.0, &[event]);
    worker
        .send_multipart([&b"kv"[..], &seq.to_be_bytes()[..], &p[..]], 0)
        .unwrap();
}
