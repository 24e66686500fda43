//! What KV events cost the store: the same workload on a store without an
//! event ring and on one whose ring a second thread drains (as a
//! publisher's forwarding thread does), in the same run, interleaved; the
//! thread drains every millisecond (as a publisher pumps) or continuously
//! (spinning, so every event's cache line crosses cores while it is hot).
//!
//! - publish + evict: requests of 8 blocks no store holds, on a full store
//!   of 1024 pages, so every publish evicts (two events per block);
//! - lookup hits: 8-block prefix lookups that all hit (no events).
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench event_overhead
//! ```

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use kvslice_core::events::{EventRing, Medium};
use kvslice_core::testkit::serve_blocks;
use kvslice_core::{
    BlockHash, CacheStore, EvictionPolicy, KvDtype, KvLayout, LayoutSpec, SliceKey,
};

const PAGES: u32 = 1024;
const BLOCKS: u32 = 8;
/// Interleaved rounds, and requests timed per round.
const ROUNDS: usize = 15;
const REQUESTS: u64 = 20_000;

fn key(conv: u64, i: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(conv) << 64 | u128::from(i) | 1 << 127),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}

fn store(events: bool) -> CacheStore<'static, Box<dyn EvictionPolicy>> {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 16, KvDtype::F16)).expect("layout");
    let policy = kvslice_core::evict::by_name("default", PAGES).expect("default policy");
    let store = CacheStore::new(layout, PAGES, policy).expect("store");
    if events {
        store.with_events(EventRing::new(1 << 14, Medium::Gpu))
    } else {
        store
    }
}

/// Serves requests `from..from + n` of fresh conversations, calling
/// `after` after each; returns seconds per request.
fn publish_evict(
    store: &CacheStore<'static, Box<dyn EvictionPolicy>>,
    from: u64,
    n: u64,
    after: &mut dyn FnMut(u64),
) -> f64 {
    let mut held = Vec::new();
    let t = Instant::now();
    for conv in from..from + n {
        let (guard, req) = (store.pin(), store.begin_request());
        let keys: Vec<SliceKey> = (0..BLOCKS).map(|i| key(conv, i)).collect();
        serve_blocks(store, &req, &keys, 16, &guard, &mut held).expect("serve");
        debug_assert_eq!(held.len(), BLOCKS as usize);
        held.clear();
        store.end_request(req).expect("end");
        after(conv);
    }
    t.elapsed().as_secs_f64() / n as f64
}

/// Looks up the cached conversation `conv` `n` times; seconds per lookup.
fn lookup_hits(store: &CacheStore<'static, Box<dyn EvictionPolicy>>, conv: u64, n: u64) -> f64 {
    let keys: Vec<SliceKey> = (0..BLOCKS).map(|i| key(conv, i)).collect();
    let mut held = Vec::new();
    let t = Instant::now();
    for _ in 0..n {
        let (guard, req) = (store.pin(), store.begin_request());
        let hits = store
            .lookup_prefix(&req, &keys, (BLOCKS * 16) as usize, &guard, &mut held)
            .expect("lookup");
        assert_eq!(hits, BLOCKS as usize);
        held.clear();
        store.end_request(req).expect("end");
    }
    t.elapsed().as_secs_f64() / n as f64
}

fn median(t: &mut [f64]) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Who drains the ring, and when.
const INTERVAL: u8 = 0;
const SPIN: u8 = 1;
const INLINE: u8 = 2;
const STOP: u8 = 3;
const MODES: [(u8, &str); 3] = [
    (INTERVAL, "a thread, every 1 ms"),
    (INLINE, "the serving thread, every 64 requests"),
    (SPIN, "a thread, continuously"),
];

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: one round.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (rounds, requests) = if quick {
        (1, 2_000)
    } else {
        (ROUNDS, REQUESTS)
    };
    let plain = store(false);
    let evented = store(true);
    let mode = AtomicU8::new(INTERVAL);
    let drained = AtomicU64::new(0);
    let count = |_, _| {
        drained.fetch_add(1, Relaxed);
    };
    // Per mode: publish + evict without and with events, then lookups.
    let mut t: [[Vec<f64>; 4]; 3] = Default::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            let ring = evented.events().expect("ring");
            let mut count = count;
            loop {
                match mode.load(Relaxed) {
                    INTERVAL => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        ring.try_drain(&mut count);
                    }
                    SPIN => {
                        ring.try_drain(&mut count);
                    }
                    INLINE => std::thread::sleep(std::time::Duration::from_millis(1)),
                    _ => break,
                }
            }
        });
        // Fill both stores so that every later publish evicts.
        let mut nothing = |_| {};
        publish_evict(&plain, 0, u64::from(PAGES / BLOCKS), &mut nothing);
        publish_evict(&evented, 0, u64::from(PAGES / BLOCKS), &mut nothing);
        let ring = evented.events().expect("ring");
        let mut next = u64::from(PAGES / BLOCKS);
        for _ in 0..rounds {
            for (m, _) in MODES {
                mode.store(m, Relaxed);
                let mut inline = |conv: u64| {
                    if m == INLINE && conv.is_multiple_of(64) {
                        ring.try_drain(&mut count.clone());
                    }
                };
                let t = &mut t[m as usize];
                t[0].push(publish_evict(&plain, next, requests, &mut inline));
                t[1].push(publish_evict(&evented, next, requests, &mut inline));
                ring.try_drain(&mut count.clone());
                next += requests;
                t[2].push(lookup_hits(&plain, next - 1, requests));
                t[3].push(lookup_hits(&evented, next - 1, requests));
            }
        }
        mode.store(STOP, Relaxed);
    });
    let ring = evented.events().expect("ring");
    ring.try_drain(&mut count.clone());
    let emitted = ring.emitted();
    assert_eq!(
        drained.load(Relaxed) + ring.dropped(),
        emitted,
        "every event drained or counted"
    );
    let ns = |t: f64| t / f64::from(BLOCKS) * 1e9;
    println!(
        "{rounds} rounds × {requests} requests of {BLOCKS} blocks per mode, store of {PAGES} pages, \
         default policy, ring of {} slots; medians, ratios paired per round; {emitted} events, {} dropped",
        ring.capacity(),
        ring.dropped()
    );
    println!("| per block | ring drained by | no events (ns) | events (ns) | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    for (m, how) in MODES {
        let t = &mut t[m as usize];
        let ratio = |a: &[f64], b: &[f64]| {
            let mut r: Vec<f64> = a.iter().zip(b).map(|(a, b)| b / a).collect();
            median(&mut r)
        };
        let (pe, lk) = (ratio(&t[0], &t[1]), ratio(&t[2], &t[3]));
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| median(&mut t[i]));
        println!(
            "| publish + evict | {how} | {:.1} | {:.1} | {pe:.3} |",
            ns(a),
            ns(b)
        );
        println!(
            "| lookup hit | {how} | {:.1} | {:.1} | {lk:.3} |",
            ns(c),
            ns(d)
        );
    }
    println!("targets: publish + evict ≤ 1.10; lookup hits unchanged (no events on the hit path)");
}
