//! An independent consumer: a Python script with pyzmq, msgpack and
//! msgspec (no kvslice code) subscribes over loopback, decodes every batch
//! (also into structs of vLLM's array-encoded event schema), fills the
//! batches it missed from the replay socket, and reports the blocks it
//! believes the store holds; they must be the store's own, after
//! evictions, a clear, and a burst that overflowed the event ring.
//!
//! Needs Python 3 with pyzmq, msgpack and msgspec (`python3 -m pip install
//! pyzmq msgpack msgspec`; `KVSLICE_PYZMQ_PYTHON` names another
//! interpreter). Without them the test prints `SKIPPED`, unless
//! `KVSLICE_REQUIRE_PYZMQ=1` (CI sets it).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvslice_core::events::{EventRing, KvEvent, Medium};
use kvslice_core::testkit::serve_blocks;
use kvslice_core::{
    BlockHash, CacheStore, EvictionPolicy, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey,
};
use kvslice_events::{Publisher, PublisherConfig};

fn python() -> Option<String> {
    let python = std::env::var("KVSLICE_PYZMQ_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import zmq, msgpack, msgspec"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some(python);
    }
    let why = format!(
        "{python} cannot import zmq, msgpack and msgspec \
         (python3 -m pip install pyzmq msgpack msgspec)"
    );
    assert!(
        std::env::var("KVSLICE_REQUIRE_PYZMQ").as_deref() != Ok("1"),
        "KVSLICE_REQUIRE_PYZMQ=1 but {why}"
    );
    println!("SKIPPED: {why}");
    None
}

fn key(seq: u128, block: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(seq << 64 | u128::from(block) | 1 << 120),
        block_index: block,
        layer_group: 0,
        head_shard: 0,
    }
}

/// Serves a request of `blocks` blocks of conversation `conv`: its cached
/// prefix, then the rest published in order.
fn serve<E: EvictionPolicy>(store: &CacheStore<'static, E>, conv: u128, blocks: u32) {
    let keys: Vec<SliceKey> = (0..blocks).map(|b| key(conv, b)).collect();
    let guard = store.pin();
    let req = store.begin_request();
    let mut held = Vec::new();
    serve_blocks(store, &req, &keys, 4, &guard, &mut held).unwrap();
    drop(held);
    store.end_request(req).unwrap();
}

fn holdings<E: EvictionPolicy>(store: &CacheStore<'static, E>) -> BTreeSet<(String, u32, u32)> {
    let mut out = BTreeSet::new();
    store.snapshot(&mut |e| {
        if let KvEvent::Stored { key, .. } = e {
            let hex: String = key
                .block
                .0
                .to_be_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            out.insert((hex, key.layer_group, key.head_shard));
        }
    });
    out
}

#[test]
fn a_python_consumer_sees_what_the_store_holds() {
    let Some(python) = python() else { return };
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32)).unwrap();
    let store = CacheStore::new(layout, 24, LruPolicy::new(24))
        .unwrap()
        .with_events(EventRing::new(32, Medium::Gpu));
    let mut publisher = Publisher::bind(PublisherConfig {
        block_size: 4,
        max_batch_events: 8,
        ..PublisherConfig::default()
    })
    .unwrap();
    let ring = store.events().unwrap();
    let pump = |publisher: &mut Publisher| {
        publisher.pump(&store).unwrap();
    };

    // Before anyone subscribes: only the replay socket can tell of these.
    for conv in 0..4 {
        serve(&store, conv, 3);
        pump(&mut publisher);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/consumer.py");
    let mut child = Command::new(&python)
        .arg(script)
        .arg(publisher.endpoint())
        .arg(publisher.replay_endpoint().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), "ready");
    // The consumer's subscription reaches the publisher before the next
    // batch, so what follows arrives live.
    let deadline = Instant::now() + Duration::from_secs(30);
    while publisher.subscribers().unwrap() == 0 {
        assert!(Instant::now() < deadline, "the consumer never subscribed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Evictions (24 pages, conversations of 5 blocks), a clear, more.
    for conv in 4..12 {
        serve(&store, conv, 5);
        pump(&mut publisher);
    }
    assert!(store.clear(&store.pin()).unwrap());
    pump(&mut publisher);
    for conv in 12..15 {
        serve(&store, conv, 4);
        pump(&mut publisher);
    }
    // A burst the 32-slot ring cannot hold: dropped events, a resync.
    for conv in 15..30 {
        serve(&store, conv, 4);
    }
    assert!(ring.dropped() > 0);
    pump(&mut publisher);
    assert_eq!(publisher.resyncs(), 1);
    let last = publisher.next_seq() - 1;
    writeln!(child.stdin.as_mut().unwrap(), "done {last}").unwrap();

    // Answer replay requests until the consumer reports.
    let deadline = Instant::now() + Duration::from_secs(60);
    let report = loop {
        assert!(Instant::now() < deadline, "the consumer did not report");
        publisher.serve_replay(50).unwrap();
        if let Ok(line) = rx.try_recv() {
            break line;
        }
    };
    assert!(child.wait().unwrap().success());
    println!("consumer: {report}");
    let report = parse(&report);
    assert_eq!(report.missing, 0, "batches the replay could not fill");
    assert!(
        report.replayed >= 4,
        "the early batches came from the replay"
    );
    assert!(report.live > 0, "the later batches arrived live");
    assert_eq!(
        report.cleared, 3,
        "the first pump's, the clear and the resync"
    );
    assert_eq!(
        report.vllm_schema_batches,
        last + 1,
        "every batch decodes with vLLM's event schema"
    );
    assert_eq!(report.blocks, holdings(&store));
    assert!(!report.blocks.is_empty());
}

struct Report {
    blocks: BTreeSet<(String, u32, u32)>,
    replayed: u64,
    live: u64,
    missing: usize,
    cleared: u64,
    vllm_schema_batches: u64,
}

/// Reads the consumer's JSON line (a few fields; the blocks are
/// `[hex, group, shard]` triples).
fn parse(line: &str) -> Report {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let blocks = v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b[0].as_str().unwrap().to_string(),
                b[1].as_u64().unwrap() as u32,
                b[2].as_u64().unwrap() as u32,
            )
        })
        .collect();
    Report {
        blocks,
        replayed: v["replayed"].as_u64().unwrap(),
        live: v["live"].as_u64().unwrap(),
        missing: v["missing"].as_array().unwrap().len(),
        cleared: v["cleared"].as_u64().unwrap(),
        vllm_schema_batches: v["vllm_schema_batches"].as_u64().unwrap(),
    }
}
