//! What a publisher's peers can make it hold: a frame past the size a
//! replay request or a subscription can have disconnects its sender
//! instead of being buffered, peers that keep to the limits are served as
//! before, and snapshot requests cost one snapshot per interval.

use std::time::{Duration, Instant};

use kvslice_events::{
    MAX_REPLAY_REQUEST_BYTES, MAX_SUBSCRIPTION_BYTES, Publisher, PublisherConfig, RESYNC_REQUEST,
    zmq,
};

mod common;
use common::store_with_ring;

fn dealer(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::DEALER).unwrap();
    s.set_linger(0).unwrap();
    s.connect(endpoint).unwrap();
    s
}

/// Replies to a request, up to the end marker (bounded by a deadline).
fn replies(peer: &zmq::Socket) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    while Instant::now() < deadline {
        if peer.poll(zmq::POLLIN, 100).unwrap() == 0 {
            continue;
        }
        let frames = peer.recv_multipart(0).unwrap();
        n += 1;
        if frames.first().map(Vec::as_slice) == Some(&(-1i64).to_be_bytes()[..]) {
            return n;
        }
    }
    panic!("no end marker within 10 s ({n} replies)");
}

#[test]
fn an_oversized_replay_request_is_refused_and_others_are_served() {
    let store = store_with_ring(4, 16);
    let mut publisher = Publisher::bind(PublisherConfig::default()).unwrap();
    // One kept batch: the store's (empty) snapshot.
    assert_eq!(publisher.pump(&store).unwrap(), 1);
    let endpoint = publisher.replay_endpoint().unwrap();
    let ctx = zmq::Context::new();
    let big = dealer(&ctx, &endpoint);
    big.send(vec![0u8; 1 << 20], 0).unwrap();
    // Frames of the limit's size still arrive (and, not being a start
    // number, get the end marker only).
    let at_limit = dealer(&ctx, &endpoint);
    at_limit
        .send(vec![1u8; MAX_REPLAY_REQUEST_BYTES as usize], 0)
        .unwrap();
    let mut answered = 0;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        answered += publisher.serve_replay(100).unwrap();
    }
    assert_eq!(answered, 1, "the 1 MiB request was taken in");
    assert_eq!(replies(&at_limit), 1);
    // A well-formed request after the flood: the kept batch, then the end.
    let good = dealer(&ctx, &endpoint);
    good.send(&0u64.to_be_bytes()[..], 0).unwrap();
    assert_eq!(publisher.serve_replay(5_000).unwrap(), 1);
    assert_eq!(replies(&good), 2);
}

#[test]
fn an_oversized_subscription_is_refused() {
    let mut publisher = Publisher::bind(PublisherConfig::default()).unwrap();
    let ctx = zmq::Context::new();
    let connect = |topic: &[u8]| {
        let s = ctx.socket(zmq::SUB).unwrap();
        s.set_linger(0).unwrap();
        s.connect(&publisher.endpoint()).unwrap();
        s.set_subscribe(topic).unwrap();
        s
    };
    // Past the limit, not far: a SUB socket keeps its topics in a trie
    // one level per byte, which it frees recursively.
    let _big = connect(&vec![b'k'; 2 * MAX_SUBSCRIPTION_BYTES as usize]);
    let _fine = connect(b"kv-events");
    // The fine one is counted; the big one never is.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = 0;
    while Instant::now() < deadline {
        seen = seen.max(publisher.subscribers().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(seen, 1);
}

/// Snapshot requests get no reply, and however many a peer sends, the
/// publisher takes a snapshot at most once per `min_resync_interval`.
#[test]
fn snapshot_requests_are_rate_limited_and_unanswered() {
    let store = store_with_ring(4, 16);
    let interval = Duration::from_millis(300);
    let mut publisher = Publisher::bind(PublisherConfig {
        min_resync_interval: interval,
        ..PublisherConfig::default()
    })
    .unwrap();
    assert_eq!(publisher.pump(&store).unwrap(), 1, "the first snapshot");
    let first = Instant::now();
    let ctx = zmq::Context::new();
    let peer = dealer(&ctx, &publisher.replay_endpoint().unwrap());
    let request = [&[][..], &RESYNC_REQUEST.to_be_bytes()[..]];
    let mut asked = 0;
    while first.elapsed() < Duration::from_secs(1) {
        peer.send_multipart(request, 0).unwrap();
        asked += publisher.serve_replay(5).unwrap();
        publisher.pump(&store).unwrap();
    }
    let took = first.elapsed();
    assert!(asked > 20, "{asked}");
    // At least one snapshot once an interval had passed, and never two
    // within one (however slowly this loop ran).
    let most = (took.as_secs_f64() / interval.as_secs_f64()) as u64;
    let resyncs = publisher.resyncs();
    assert!((1..=most).contains(&resyncs), "{resyncs} in {took:?}");
    assert_eq!(peer.poll(zmq::POLLIN, 200).unwrap(), 0, "a reply came");
}
