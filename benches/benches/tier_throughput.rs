//! The Redis tier on loopback against Redis's own `redis-benchmark`, in the
//! same run, at the same value size (64 KiB pages plus the 84-byte header):
//!
//! - spill: 2 threads queue blocks as evictions would; the tier's 2
//!   writers pipeline them out. GB/s of blocks Redis accepted.
//! - fetch: 2 threads each look up 16-block continuations through
//!   `TieredStore` (pipelined GETs, checksum, copy into fresh pages, publish).
//! - `redis-benchmark -c 2 -P 16`, one per node, all at once, at the same
//!   value size, on as many keys as the tier wrote, with the tier's own
//!   commands: `SET key value PX 120000` on fresh keys (each spill is a new
//!   key Redis allocates for), then `GET` of keys that exist (each fetch
//!   reads a different, cold value). Also SET and GET of one key per node,
//!   whose value stays in the CPU's cache and whose memory Redis reuses:
//!   its best case.
//! - the local hit path (32-block `lookup_prefix` hits) on a store with the
//!   tier's sink attached but idle, against one without, interleaved.
//!
//! Needs the loopback cluster (`.ci/redis-cluster.sh start`, or
//! `KVSLICE_REDIS_URLS`, every master's URL) and `redis-benchmark` and
//! `redis-cli`; says so and exits without.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench tier_throughput
//! KVSLICE_SPILL_THREADS=1 cargo bench -p kvslice-benches --bench tier_throughput  # one writer
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

const CHAINS_PER_THREAD: u64 = 300;
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
                .unwrap_or(2),
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
                    let tiered = TieredStore::new(&store, tier).expect("one layout");
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

    // The peer, at the same value size (see the top of this file).
    let n = st.spilled_blocks.max(1);
    let value = "x".repeat(value_bytes);
    let nodes = peer_nodes(&urls);
    let set = [
        "SET",
        "kvslice-peer:{T}:__rand_int__",
        &value,
        "PX",
        "120000",
    ];
    let get = ["GET", "kvslice-peer:{T}:__rand_int__"];
    let (set_one, get_one) = (
        ["SET", "kvslice-peer:{T}", &value],
        ["GET", "kvslice-peer:{T}"],
    );
    let spread = u64::try_from(nodes.len()).unwrap_or(1).max(1);
    let set_fresh = redis_benchmark(&nodes, n, Some(1_000_000_000), &set);
    // Fills the n keys (unmeasured), so that the GETs after it find them.
    let _ = redis_benchmark(&nodes, 5 * n, Some(n / spread), &set);
    let get_fresh = redis_benchmark(&nodes, n, Some(n / spread), &get);
    let set_one = redis_benchmark(&nodes, 3 * n, None, &set_one);
    let get_one = redis_benchmark(&nodes, 3 * n, None, &get_one);
    match (set_fresh, get_fresh, set_one, get_one) {
        (Some(set_fresh), Some(get_fresh), Some(set_one), Some(get_one)) => {
            let gbs = |rps: f64| rps * value_bytes as f64 / 1e9;
            println!(
                "redis-benchmark, {n} keys like the tier's: SET {:.2} GB/s, GET {:.2} GB/s; one key per node: SET {:.2} GB/s, GET {:.2} GB/s",
                gbs(set_fresh),
                gbs(get_fresh),
                gbs(set_one),
                gbs(get_one)
            );
            println!(
                "tier / redis-benchmark: spill {:.2}x of SET, fetch {:.2}x of GET ({:.2}x and {:.2}x of one key's)",
                spill_gbs / gbs(set_fresh),
                fetch_gbs / gbs(get_fresh),
                spill_gbs / gbs(set_one),
                fetch_gbs / gbs(get_one)
            );
        }
        _ => println!("redis-benchmark not found or failed: no peer figure"),
    }

    hit_path(&tier);
}

/// Each node the tier was given (`host`, `port`) with a hash tag whose
/// slot that node serves (asked with `redis-cli`: a key it does not serve
/// answers `MOVED`). On one server, any tag.
fn peer_nodes(urls: &str) -> Vec<(String, String, String)> {
    urls.split(',')
        .filter_map(|url| {
            let (host, port) = url.trim().trim_start_matches("redis://").rsplit_once(':')?;
            let tag = (0..1000)
                .map(|t| format!("{{kvslice-peer-{t}}}"))
                .find(|tag| {
                    Command::new("redis-cli")
                        .args(["-h", host, "-p", port, "EXISTS", tag])
                        .output()
                        .is_ok_and(|o| o.status.success() && !o.stdout.starts_with(b"MOVED"))
                })?;
            Some((host.to_owned(), port.to_owned(), tag))
        })
        .collect()
}

/// `redis-benchmark`'s requests per second over all `nodes`: one plain
/// (not `--cluster`) `redis-benchmark` per node, all at once, each with 2
/// clients and pipelines of 16 (as the tier's 2 writers keep a connection
/// per node), `n` requests in all, `{T}` in `cmd` replaced by the node's
/// tag and keys drawn from `range` per node. The rate is the requests over
/// the slowest node's own time. Not `--cluster`: its run ends on a 250 ms
/// timer tick here, which made a 0.3 s run read as 0.5 s.
fn redis_benchmark(
    nodes: &[(String, String, String)],
    n: u64,
    range: Option<u64>,
    cmd: &[&str],
) -> Option<f64> {
    let per_node = n / u64::try_from(nodes.len()).ok()?.max(1);
    let runs: Vec<_> = nodes
        .iter()
        .map(|(host, port, tag)| {
            let mut c = Command::new("redis-benchmark");
            c.args(["-h", host, "-p", port, "-c", "2", "-P", "16", "-q", "--csv"]);
            c.args(["-n", &per_node.to_string()]);
            if let Some(r) = range {
                c.args(["-r", &r.to_string()]);
            }
            c.args(cmd.iter().map(|a| a.replace("{T}", tag)));
            c.stdout(std::process::Stdio::piped()).spawn()
        })
        .collect();
    let mut slowest = 0f64;
    for run in runs {
        let out = run.ok()?.wait_with_output().ok()?;
        // The last line is the test's: `"name","rps",...`.
        let text = String::from_utf8_lossy(&out.stdout);
        let rps: f64 = text.lines().last()?.split("\",\"").nth(1)?.parse().ok()?;
        slowest = slowest.max(per_node as f64 / rps);
    }
    (slowest > 0.0).then(|| (per_node * nodes.len() as u64) as f64 / slowest)
}

/// 32-block prefix hits on stores with the tier's sink attached (idle:
/// nothing is evicted) and on stores without, interleaved over 15 rounds;
/// prints medians. Two of each, made in the order plain, tiered, tiered,
/// plain: where a store's memory lands moves its hit path by about 5%
/// here, more than the sink could, so each kind gets an early and a late
/// one.
fn hit_path(tier: &RedisTier) {
    // The tier's layout: a sink refuses a store of another.
    let plain = || CacheStore::new(layout(), 64, LruPolicy::new(64)).expect("store");
    let tiered = || {
        plain()
            .with_spill(Box::new(tier.sink()))
            .expect("the tier's layout")
    };
    let (p1, t1, t2, p2) = (plain(), tiered(), tiered(), plain());
    let keys: Vec<SliceKey> = (0..32).map(|i| key(9, i)).collect();
    for s in [&p1, &t1, &t2, &p2] {
        let (guard, req) = (s.pin(), s.begin_request());
        let mut held = Vec::new();
        serve_blocks(s, &req, &keys, 16, &guard, &mut held).expect("serve");
        drop(held);
        s.end_request(req).expect("end");
    }
    let time = |s: &CacheStore<'static, LruPolicy>| {
        let mut held = Vec::new();
        let n = 10_000;
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
        a.push(time(&p1));
        b.push(time(&t1));
        b.push(time(&t2));
        a.push(time(&p2));
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (a, b) = ((a[14] + a[15]) / 2.0, (b[14] + b[15]) / 2.0);
    println!(
        "hit path, 32-block prefix: {a:.0} ns without a tier, {b:.0} ns with the tier attached and idle: {:.3}x",
        b / a
    );
}
