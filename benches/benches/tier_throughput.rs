//! The Redis tier on loopback against Redis's own `redis-benchmark`, in the
//! same run, at the same value size (64 KiB pages plus the 84-byte header):
//!
//! - spill: 2 threads queue blocks as evictions would; the tier's writer
//!   pipelines them out. GB/s of blocks Redis accepted.
//! - fetch: 2 threads each look up 16-block continuations through
//!   `TieredStore` (pipelined GETs, checksum, copy into fresh pages, publish).
//! - `redis-benchmark --cluster -t set,get -c 2 -P 16 -d <value size>`.
//! - the local hit path (32-block `lookup_prefix` hits) on a store with the
//!   tier's sink attached but idle, against one without, interleaved.
//!
//! Needs the loopback cluster (`.ci/redis-cluster.sh start`, or
//! `KVSLICE_REDIS_URLS`) and `redis-benchmark`; says so and exits without.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench tier_throughput
//! KVSLICE_SPILL_THREADS=2 cargo bench -p kvslice-benches --bench tier_throughput  # more writers
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

use kvslice_core::testkit::serve_blocks;
use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
use kvslice_redis::{RedisTier, TierConfig, TieredStore};

/// 16 tokens × 8 kv heads × 128 dims × K and V × f16 = 64 KiB.
fn layout() -> KvLayout {
    KvLayout::new(LayoutSpec::new(1, 8, 8, 128, 16, KvDtype::F16)).expect("layout")
}

fn key(chain: u64, i: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(chain) << 32 | u128::from(i) | 1 << 127),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}

const CHAINS_PER_THREAD: u64 = 150;
const CHAIN: u32 = 16;

fn main() {
    let urls = kvslice_redis::default_urls();
    let namespace = format!("bench-{}", std::process::id());
    let cfg = TierConfig::new(&urls)
        .namespace(&namespace)
        .ttl(Some(Duration::from_secs(120)))
        .spill_queue(256)
        .spill_threads(
            std::env::var("KVSLICE_SPILL_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
        );
    let tier = match RedisTier::open(layout(), cfg) {
        Ok(t) => t,
        Err(e) => {
            println!("no tier to measure ({e}); start one with .ci/redis-cluster.sh start");
            return;
        }
    };
    let page_bytes = layout().page_bytes();
    let value_bytes = page_bytes + kvslice_redis::value::HEADER_BYTES;
    println!(
        "tier at {urls} ({}), values of {value_bytes} bytes",
        if tier.is_cluster() {
            "cluster"
        } else {
            "one server"
        }
    );

    // Spill: 2 producers, as fast as the queue takes them; a full queue
    // makes a producer wait a little (a real evictor would drop instead),
    // so that every block is written and the figure is the writer's.
    let page = vec![0x5au8; page_bytes];
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..2u64 {
            let (tier, page) = (&tier, &page);
            s.spawn(move || {
                for c in 0..CHAINS_PER_THREAD {
                    for i in 0..CHAIN {
                        while !tier.spill(&key(th << 20 | c, i), 16, page) {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                }
            });
        }
    });
    assert!(tier.flush(Duration::from_secs(60)), "spills did not finish");
    let spill_s = t.elapsed().as_secs_f64();
    let st = tier.stats();
    let spill_gbs = st.spilled_bytes as f64 / spill_s / 1e9;
    println!(
        "spill: {} blocks, {:.2} GB/s ({} dropped while waiting, {} failed)",
        st.spilled_blocks, spill_gbs, st.spill_dropped, st.spill_failed
    );

    // Fetch: 2 threads, fresh stores, 16-block continuations.
    let t = Instant::now();
    let fetched: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|th| {
                let tier = &tier;
                s.spawn(move || {
                    let store =
                        CacheStore::new(layout(), CHAIN, LruPolicy::new(CHAIN)).expect("store");
                    let tiered = TieredStore::new(&store, tier);
                    let mut n = 0;
                    for c in 0..CHAINS_PER_THREAD {
                        let keys: Vec<SliceKey> =
                            (0..CHAIN).map(|i| key(th << 20 | c, i)).collect();
                        let (guard, req) = (store.pin(), store.begin_request());
                        let mut held = Vec::new();
                        let hit = tiered
                            .lookup(&req, &keys, (16 * CHAIN) as usize, &guard, &mut held)
                            .expect("lookup");
                        n += hit.remote as u64;
                        drop(held);
                        store.end_request(req).expect("end");
                        // Forget them, so that the next chain is fetched too.
                        store.clear(&guard).expect("clear");
                    }
                    n
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("fetcher"))
            .sum()
    });
    let fetch_s = t.elapsed().as_secs_f64();
    let fetch_gbs = (fetched * value_bytes as u64) as f64 / fetch_s / 1e9;
    let st = tier.stats();
    println!(
        "fetch: {fetched} blocks, {fetch_gbs:.2} GB/s (p50 {} µs, p99 {} µs per 16-block continuation)",
        st.fetch_p50_us, st.fetch_p99_us
    );

    match redis_benchmark(&urls, value_bytes) {
        Some((set_rps, get_rps)) => {
            let (set_gbs, get_gbs) = (
                set_rps * value_bytes as f64 / 1e9,
                get_rps * value_bytes as f64 / 1e9,
            );
            println!(
                "redis-benchmark: SET {set_rps:.0}/s = {set_gbs:.2} GB/s, GET {get_rps:.0}/s = {get_gbs:.2} GB/s"
            );
            println!(
                "tier / redis-benchmark: spill {:.2}x of SET, fetch {:.2}x of GET",
                spill_gbs / set_gbs,
                fetch_gbs / get_gbs
            );
        }
        None => println!("redis-benchmark not found or failed: no peer figure"),
    }

    hit_path(&tier);
}

/// `redis-benchmark`'s SET and GET requests per second at `bytes` per
/// value, 2 clients, pipelines of 16, on the first node (in cluster mode
/// when it is one).
fn redis_benchmark(urls: &str, bytes: usize) -> Option<(f64, f64)> {
    let first = urls.split(',').next()?.trim_start_matches("redis://");
    let (host, port) = first.rsplit_once(':')?;
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            host,
            "-p",
            port,
            "--cluster",
            "-t",
            "set,get",
            "-c",
            "2",
            "-P",
            "16",
        ])
        .args(["-n", "100000", "-d", &bytes.to_string(), "-q", "--csv"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("\"{name}\"")))
            .and_then(|l| l.split(',').nth(1))
            .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
    };
    Some((rps("SET")?, rps("GET")?))
}

/// 32-block prefix hits on a store with the tier's sink attached (idle:
/// nothing is evicted) and on one without, interleaved over 15 rounds;
/// prints medians.
fn hit_path(tier: &RedisTier) {
    let small = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 16, KvDtype::F16)).expect("layout");
    let plain = CacheStore::new(small, 64, LruPolicy::new(64)).expect("store");
    let tiered = CacheStore::new(small, 64, LruPolicy::new(64))
        .expect("store")
        .with_spill(Box::new(tier.sink()));
    let keys: Vec<SliceKey> = (0..32).map(|i| key(9, i)).collect();
    for s in [&plain, &tiered] {
        let (guard, req) = (s.pin(), s.begin_request());
        let mut held = Vec::new();
        serve_blocks(s, &req, &keys, 16, &guard, &mut held).expect("serve");
        drop(held);
        s.end_request(req).expect("end");
    }
    let time = |s: &CacheStore<'static, LruPolicy>| {
        let mut held = Vec::new();
        let n = 20_000;
        let t = Instant::now();
        for _ in 0..n {
            let (guard, req) = (s.pin(), s.begin_request());
            assert_eq!(
                s.lookup_prefix(&req, &keys, 512, &guard, &mut held)
                    .expect("lookup"),
                32
            );
            held.clear();
            s.end_request(req).expect("end");
        }
        t.elapsed().as_secs_f64() / n as f64 * 1e9
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        a.push(time(&plain));
        b.push(time(&tiered));
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    println!(
        "hit path, 32-block prefix: {:.0} ns without a tier, {:.0} ns with the tier attached and idle: {:.3}x",
        a[7],
        b[7],
        b[7] / a[7]
    );
}
