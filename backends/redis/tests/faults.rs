//! Faults on servers this test starts for itself: a cluster node killed by
//! its pid in the middle of a replay and started again, and a full Redis
//! (`maxmemory` with `noeviction`). No panic, no wrong data, no stuck
//! thread: lookups fall back to the local cache, spills are dropped and
//! counted, and the tier is used again once the node is back. Prints
//! `SKIPPED` without redis-server, unless `KVSLICE_REQUIRE_REDIS=1`.

mod common;

use std::time::{Duration, Instant};

use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
use kvslice_redis::{RedisTier, TierConfig, TieredStore};

fn layout() -> KvLayout {
    KvLayout::new(LayoutSpec::new(1, 2, 2, 16, 16, KvDtype::F16)).unwrap()
}

/// Chain `c`'s block `i`.
fn key(c: u64, i: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(c) << 32 | u128::from(i)),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}

/// The bytes block `key` always has: its hash, repeated.
fn bytes_of(key: &SliceKey, len: usize) -> Vec<u8> {
    key.block
        .0
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// Spills chain `c` (8 blocks) from a replica that then forgets it.
fn spill_chain(tier: &RedisTier, c: u64) {
    for i in 0..8 {
        let k = key(c, i);
        tier.spill(&k, 16, &bytes_of(&k, layout().page_bytes()));
    }
}

/// Looks chain `c` up on a fresh replica; checks every fetched block's
/// bytes and returns how many came from the tier, and how long it took.
fn fetch_chain(tier: &RedisTier, c: u64) -> (usize, Duration) {
    let store = CacheStore::new(layout(), 16, LruPolicy::new(16)).unwrap();
    let tiered = TieredStore::new(&store, tier).unwrap();
    let keys: Vec<SliceKey> = (0..8).map(|i| key(c, i)).collect();
    let (guard, req) = (store.pin(), store.begin_request());
    let mut held = Vec::new();
    let started = Instant::now();
    let hit = tiered.lookup(&req, &keys, 128, &guard, &mut held).unwrap();
    let took = started.elapsed();
    assert_eq!(hit.local, 0);
    for (r, k) in held.iter().zip(&keys) {
        assert_eq!(
            r.bytes(),
            &bytes_of(k, layout().page_bytes())[..],
            "wrong data for {k:?}"
        );
    }
    drop(held);
    store.end_request(req).unwrap();
    (hit.remote, took)
}

#[test]
fn a_node_killed_mid_replay_degrades_to_local_and_comes_back() {
    let Some(cluster) = common::OwnServers::start("faults", &["--port", "7200"]) else {
        return;
    };
    let cfg = TierConfig::new(&cluster.urls)
        .namespace("faults")
        .timeouts(Duration::from_millis(200), Duration::from_millis(300));
    let tier = RedisTier::open(layout(), cfg).unwrap();
    for c in 0..40 {
        spill_chain(&tier, c);
    }
    assert!(tier.flush(Duration::from_secs(10)));
    let before = tier.stats();
    assert_eq!(before.spilled_blocks, 320, "{before:?}");
    // Every chain whole while all nodes are up.
    for c in 0..20 {
        assert_eq!(fetch_chain(&tier, c).0, 8, "chain {c}");
    }

    cluster.run(&["kill", "1"]);
    // Chains keep being served: at most up to the first block on the
    // dead node, never wrong, never stuck.
    let (mut short, mut slowest) = (0, Duration::ZERO);
    for c in 20..40 {
        let (n, took) = fetch_chain(&tier, c);
        short += usize::from(n < 8);
        slowest = slowest.max(took);
    }
    println!("node 1 down: {short} of 20 chains cut short, slowest lookup {slowest:?}");
    assert!(
        short > 0,
        "a chain of 8 keys should touch the dead node's slots"
    );
    assert!(
        slowest < Duration::from_secs(3),
        "a lookup waited {slowest:?}"
    );
    // Spills meanwhile are dropped and counted, not waited for.
    for c in 100..110 {
        spill_chain(&tier, c);
    }
    assert!(
        tier.flush(Duration::from_secs(10)),
        "the spill thread is stuck"
    );
    let down = tier.stats();
    println!("while down: {down:?}");
    assert!(down.spill_failed + down.spill_dropped > 0 || down.fetch_errors > 0);

    cluster.run(&["restart", "1"]);
    // The node is back (empty: no persistence). Within a bounded wait the
    // tier takes spills and serves whole chains again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut whole = false;
    let mut c = 200;
    while Instant::now() < deadline && !whole {
        spill_chain(&tier, c);
        assert!(tier.flush(Duration::from_secs(10)));
        whole = fetch_chain(&tier, c).0 == 8;
        c += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        whole,
        "the tier was not used again after the node returned: {:?}",
        tier.stats()
    );
    println!("back after {} tries: {:?}", c - 200, tier.stats());
}

#[test]
fn a_full_redis_refuses_spills_and_the_cache_carries_on() {
    let Some(server) = common::OwnServers::start("full", &["--standalone", "--port", "7210"])
    else {
        return;
    };
    server.cli(7210, &["config", "set", "maxmemory", "2mb"]);
    server.cli(7210, &["config", "set", "maxmemory-policy", "noeviction"]);
    // Generous timeouts: this test is about a full Redis, not a slow one,
    // and the other tests here load the machine while it runs.
    let cfg = TierConfig::new(&server.urls)
        .spill_queue(1 << 14)
        .timeouts(Duration::from_secs(2), Duration::from_secs(5));
    let tier = RedisTier::open(layout(), cfg).unwrap();
    // One chain lands while there is room: the spill writers run side by
    // side, so which of a burst's blocks arrive before Redis is full is
    // up to the scheduler (on a loaded machine chain 0's first block once
    // arrived after 369 later ones had filled it).
    spill_chain(&tier, 0);
    assert!(tier.flush(Duration::from_secs(20)));
    // Then 1,592 more blocks of about 2 KiB: more than 2 MB.
    for c in 1..200 {
        spill_chain(&tier, c);
    }
    assert!(tier.flush(Duration::from_secs(20)));
    let s = tier.stats();
    println!("full: {s:?}");
    assert!(s.spill_rejected > 0, "{s:?}");
    assert!(s.spilled_blocks > 0, "{s:?}");
    // What did fit is served whole and right.
    assert_eq!(fetch_chain(&tier, 0).0, 8, "{:?}", tier.stats());
    // A replica's own cache is untouched by the tier's trouble.
    let store = CacheStore::new(layout(), 8, LruPolicy::new(8))
        .unwrap()
        .with_spill(Box::new(tier.sink()))
        .unwrap();
    let (guard, req) = (store.pin(), store.begin_request());
    for i in 0..20 {
        let mut page = store.allocate(1, &guard).unwrap().pop().unwrap();
        page.bytes_mut().fill(i as u8);
        drop(
            store
                .publish(&req, page, key(999, i), None, 16, &guard)
                .unwrap(),
        );
    }
    let mut held = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &[key(999, 19)], 16, &guard, &mut held)
            .unwrap(),
        1
    );
    assert!(held[0].bytes().iter().all(|&b| b == 19));
    drop(held);
    store.end_request(req).unwrap();
}

/// Where the concurrent replay is: the main thread moves it on.
const UP: u8 = 0;
const DOWN: u8 = 1;
const BACK: u8 = 2;
const DONE: u8 = 3;

#[test]
fn a_node_killed_under_a_concurrent_replay_costs_no_data_and_no_thread() {
    use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::SeqCst};

    let Some(cluster) = common::OwnServers::start("faults-replay", &["--port", "7220"]) else {
        return;
    };
    let cfg = TierConfig::new(&cluster.urls)
        .namespace("replay")
        .timeouts(Duration::from_millis(200), Duration::from_millis(300));
    let tier = RedisTier::open(layout(), cfg).unwrap();
    let phase = AtomicU8::new(UP);
    // Remote hits per phase, over all replicas; the slowest lookup.
    let remote = [(); 4].map(|_| AtomicU64::new(0));
    let slowest_us = AtomicU64::new(0);

    std::thread::scope(|s| {
        // 4 replicas of 2 chains' room each, taking the 40 chains in turn:
        // a chain a replica asks for was last served (and spilled) by
        // another, so most of what they serve comes through the tier.
        let replicas: Vec<_> = (0..4u64)
            .map(|r| {
                let (tier, phase, remote, slowest_us) = (&tier, &phase, &remote, &slowest_us);
                s.spawn(move || {
                    let store = CacheStore::new(layout(), 16, LruPolicy::new(16))
                        .unwrap()
                        .with_spill(Box::new(tier.sink()))
                        .unwrap();
                    let tiered = TieredStore::new(&store, tier).unwrap();
                    let mut step = 0u64;
                    loop {
                        let now = phase.load(SeqCst);
                        if now == DONE {
                            return step;
                        }
                        let c = (step * 4 + r) % 40;
                        let keys: Vec<SliceKey> = (0..8).map(|i| key(c, i)).collect();
                        let (guard, req) = (store.pin(), store.begin_request());
                        let mut held = Vec::new();
                        let started = Instant::now();
                        let hit = tiered.lookup(&req, &keys, 128, &guard, &mut held).unwrap();
                        let took = started.elapsed().as_micros() as u64;
                        slowest_us.fetch_max(took, SeqCst);
                        remote[now as usize].fetch_add(hit.remote as u64, SeqCst);
                        // Compute the rest, as a runtime would, and publish it.
                        for k in &keys[held.len()..] {
                            let mut page = store.allocate(1, &guard).unwrap().pop().unwrap();
                            page.bytes_mut()
                                .copy_from_slice(&bytes_of(k, layout().page_bytes()));
                            held.push(store.publish(&req, page, *k, None, 16, &guard).unwrap());
                        }
                        for (p, k) in held.iter().zip(&keys) {
                            assert_eq!(
                                p.bytes(),
                                &bytes_of(k, layout().page_bytes())[..],
                                "replica {r}: wrong data for {k:?}"
                            );
                        }
                        drop(held);
                        store.end_request(req).unwrap();
                        step += 1;
                    }
                })
            })
            .collect();

        let wait_for_remote = |p: u8, bound: Duration| {
            let deadline = Instant::now() + bound;
            while remote[p as usize].load(SeqCst) < 100 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        wait_for_remote(UP, Duration::from_secs(10));
        let before = tier.stats();
        cluster.run(&["kill", "1"]);
        phase.store(DOWN, SeqCst);
        std::thread::sleep(Duration::from_millis(800));
        let down = tier.stats();
        cluster.run(&["restart", "1"]);
        phase.store(BACK, SeqCst);
        wait_for_remote(BACK, Duration::from_secs(20));
        phase.store(DONE, SeqCst);
        let steps: Vec<u64> = replicas
            .into_iter()
            .map(|h| h.join().expect("a replica panicked"))
            .collect();
        let after = tier.stats();
        println!(
            "replicas' steps {steps:?}; remote hits up/down/back {:?}; slowest lookup {} µs",
            remote.each_ref().map(|a| a.load(SeqCst)),
            slowest_us.load(SeqCst)
        );
        println!("before kill {before:?}\nwhile down {down:?}\nafter {after:?}");
        assert!(
            remote[UP as usize].load(SeqCst) >= 100,
            "the tier served little while up"
        );
        assert!(steps.iter().all(|&n| n > 0));
        // The dead node cost failed spills or fetches, counted.
        let lost = |s: &kvslice_redis::TierStats| {
            s.spill_failed + s.fetch_errors + s.skipped_while_down + s.spill_rejected
        };
        assert!(
            lost(&down) > lost(&before),
            "the kill went unnoticed: {down:?}"
        );
        // Every lookup came back within the timeouts, never hung on the node.
        assert!(slowest_us.load(SeqCst) < 3_000_000, "a lookup was stuck");
        // And the tier is used again once the node is back.
        assert!(
            remote[BACK as usize].load(SeqCst) >= 100,
            "the tier was not used again after the node returned: {after:?}"
        );
    });
}

/// A master's id, port and slot ranges.
type Master = (String, u16, Vec<(u16, u16)>);

/// The masters, from `CLUSTER NODES`.
fn masters(cluster: &common::OwnServers, port: u16) -> Vec<Master> {
    cluster
        .cli(port, &["cluster", "nodes"])
        .lines()
        .filter(|l| l.contains("master"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
            let ranges = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (r.parse().unwrap(), r.parse().unwrap()),
                })
                .collect();
            (f[0].to_string(), port, ranges)
        })
        .collect()
}

/// Moves the slot of `redis_key` to another master, its keys with it
/// (`CLUSTER SETSLOT ... IMPORTING / MIGRATING`, `MIGRATE`, then `NODE`
/// on every master), as a resharding does.
fn move_slot(cluster: &common::OwnServers, ports: &[u16], redis_key: &str) {
    let slot: u16 = cluster
        .cli(ports[0], &["cluster", "keyslot", redis_key])
        .trim()
        .parse()
        .unwrap();
    let nodes = masters(cluster, ports[0]);
    let from = nodes
        .iter()
        .find(|n| n.2.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        .expect("an owner");
    let to = nodes
        .iter()
        .find(|n| n.0 != from.0)
        .expect("another master");
    let s = slot.to_string();
    cluster.cli(to.1, &["cluster", "setslot", &s, "importing", &from.0]);
    cluster.cli(from.1, &["cluster", "setslot", &s, "migrating", &to.0]);
    let keys = cluster.cli(from.1, &["cluster", "getkeysinslot", &s, "1000"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(!keys.is_empty(), "slot {slot} holds {redis_key}");
    let to_port = to.1.to_string();
    let mut migrate = vec!["migrate", "127.0.0.1", &to_port, "", "0", "5000", "keys"];
    migrate.extend(&keys);
    assert_eq!(cluster.cli(from.1, &migrate).trim(), "OK");
    for &p in ports {
        cluster.cli(p, &["cluster", "setslot", &s, "node", &to.0]);
    }
}

/// A slot moved to another node (a resharding, a failover): a fetch that
/// meets the redirect drops its connection, whose slot map is stale,
/// without backing off, and the next fetch reads the new map and serves
/// every block.
#[test]
fn a_moved_slot_is_followed_by_the_next_fetch() {
    let Some(cluster) = common::OwnServers::start("moved", &["--port", "7240"]) else {
        return;
    };
    let tier = RedisTier::open(layout(), TierConfig::new(&cluster.urls)).unwrap();
    spill_chain(&tier, 7);
    assert!(tier.flush(Duration::from_secs(20)));
    assert_eq!(fetch_chain(&tier, 7).0, 8, "{:?}", tier.stats());
    move_slot(&cluster, &[7240, 7241, 7242], &tier.redis_key(&key(7, 0)));
    // The pooled connection still has the old map: this fetch may miss.
    let first = fetch_chain(&tier, 7).0;
    assert_eq!(
        fetch_chain(&tier, 7).0,
        8,
        "first {first}, {:?}",
        tier.stats()
    );
    let s = tier.stats();
    assert_eq!(s.skipped_while_down, 0, "a redirect is no failure: {s:?}");
}

/// The port of the master that owns `redis_key`'s slot.
fn owner_port(cluster: &common::OwnServers, port: u16, redis_key: &str) -> u16 {
    let slot: u16 = cluster
        .cli(port, &["cluster", "keyslot", redis_key])
        .trim()
        .parse()
        .unwrap();
    masters(cluster, port)
        .iter()
        .find(|n| n.2.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        .expect("an owner")
        .1
}

/// A master that hangs (stopped: its socket accepts, nothing answers)
/// costs its own keys only, and no lookup waits on it past the timeouts:
/// each chain is served up to its first block on that node, whichever
/// nodes the blocks before it are on; spills to the other nodes all land;
/// and once the node answers again, chains are whole again.
#[test]
fn a_hung_node_costs_its_own_keys_and_no_lookup_waits_on_it() {
    let Some(cluster) = common::OwnServers::start("faults-hung", &["--port", "7250"]) else {
        return;
    };
    let cfg = TierConfig::new(&cluster.urls)
        .namespace("hung")
        .timeouts(Duration::from_millis(200), Duration::from_millis(300));
    let tier = std::sync::Arc::new(RedisTier::open(layout(), cfg).unwrap());
    for c in 0..60 {
        spill_chain(&tier, c);
    }
    assert!(tier.flush(Duration::from_secs(10)));
    for c in 0..10 {
        assert_eq!(fetch_chain(&tier, c).0, 8, "chain {c}");
    }
    // Each chain's blocks before its first one on node 1 (port 7251).
    let on_hung = |c: u64, i: u32| owner_port(&cluster, 7250, &tier.redis_key(&key(c, i))) == 7251;
    let expected: Vec<usize> = (0..60)
        .map(|c| (0..8).position(|i| on_hung(c, i)).unwrap_or(8))
        .collect();
    assert!(
        expected[10..40].iter().any(|&n| n > 0 && n < 8),
        "some chain should start on a live node and reach the hung one: {expected:?}"
    );

    cluster.run(&["pause", "1"]);
    let (mut slowest, mut served) = (Duration::ZERO, Vec::new());
    for c in 10..40 {
        // On a thread, so that a lookup stuck on the node fails the test
        // instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::sync::Arc::clone(&tier);
        std::thread::spawn(move || {
            let _ = tx.send(fetch_chain(&t, c));
        });
        let (n, took) = rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("chain {c}: a lookup hung on the stopped node"));
        slowest = slowest.max(took);
        served.push(n);
    }
    println!("node 1 hung: served {served:?}, slowest lookup {slowest:?}");
    assert_eq!(served, expected[10..40], "{:?}", tier.stats());
    assert!(
        slowest < Duration::from_secs(2),
        "a lookup waited {slowest:?}"
    );

    // Spills: the hung node's are counted failed, every other one lands.
    let before = tier.stats();
    for c in 100..120 {
        spill_chain(&tier, c);
    }
    assert!(
        tier.flush(Duration::from_secs(20)),
        "the spill writers are stuck"
    );
    let after = tier.stats();
    let live = (100..120)
        .flat_map(|c| (0..8).map(move |i| (c, i)))
        .filter(|&(c, i)| !on_hung(c, i))
        .count() as u64;
    assert_eq!(
        after.spilled_blocks - before.spilled_blocks,
        live,
        "{after:?}"
    );
    // Failed, or unrouted once the cluster marks the node failed and its
    // slots drop out of the map.
    let lost = |s: &kvslice_redis::TierStats| s.spill_failed + s.spill_unrouted;
    assert_eq!(lost(&after) - lost(&before), 160 - live, "{after:?}");

    cluster.run(&["resume", "1"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut whole = false;
    while Instant::now() < deadline && !whole {
        whole = fetch_chain(&tier, 0).0 == 8;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        whole,
        "the node answered again but chains stayed cut: {:?}",
        tier.stats()
    );
}

/// A node restarted while the tier's connections to it idled: the first
/// batch on each such connection finds it closed, and goes again on a new
/// one instead of counting the node failed. Spills and fetches right after
/// the restart land and come back whole, with nothing lost or skipped.
#[test]
fn connections_a_restart_closed_are_replaced_not_counted_failed() {
    let Some(cluster) = common::OwnServers::start("faults-restart", &["--port", "7260"]) else {
        return;
    };
    let cfg = TierConfig::new(&cluster.urls)
        .namespace("restart")
        .timeouts(Duration::from_millis(500), Duration::from_secs(2));
    let tier = RedisTier::open(layout(), cfg).unwrap();
    // Every writer and the fetchers' pool hold a connection to every node.
    for c in 0..20 {
        spill_chain(&tier, c);
    }
    assert!(tier.flush(Duration::from_secs(10)));
    for c in 0..20 {
        assert_eq!(fetch_chain(&tier, c).0, 8, "chain {c}");
    }
    cluster.run(&["kill", "1"]);
    cluster.run(&["restart", "1"]);
    let before = tier.stats();
    for c in 100..110 {
        spill_chain(&tier, c);
    }
    assert!(tier.flush(Duration::from_secs(10)));
    for c in 100..110 {
        assert_eq!(fetch_chain(&tier, c).0, 8, "chain {c}: {:?}", tier.stats());
    }
    let after = tier.stats();
    println!("after the restart: {after:?}");
    assert_eq!(
        after.spilled_blocks - before.spilled_blocks,
        80,
        "{after:?}"
    );
    assert_eq!(
        (
            after.spill_failed - before.spill_failed,
            after.fetch_errors - before.fetch_errors,
            after.skipped_while_down - before.skipped_while_down
        ),
        (0, 0, 0),
        "{after:?}"
    );
}

/// A slot no node serves (dropped from the map here with `CLUSTER
/// DELSLOTS`) makes the map stale on every fetch that routes a key there;
/// the map is read again at most once per `min_backoff`, not with a new
/// connection to the seed on every lookup.
#[test]
fn an_unserved_slot_does_not_reread_the_map_on_every_lookup() {
    let Some(cluster) = common::OwnServers::start("faults-unserved", &["--port", "7270"]) else {
        return;
    };
    let mut cfg = TierConfig::new(&cluster.urls).namespace("unserved");
    cfg.min_backoff = Duration::from_secs(5);
    cfg.max_backoff = Duration::from_secs(5);
    let tier = RedisTier::open(layout(), cfg).unwrap();
    // A chain whose first block the seed (port 7270) serves.
    let c = (0..)
        .find(|&c| owner_port(&cluster, 7270, &tier.redis_key(&key(c, 0))) == 7270)
        .unwrap();
    spill_chain(&tier, c);
    assert!(tier.flush(Duration::from_secs(10)));
    assert_eq!(fetch_chain(&tier, c).0, 8);
    let slot = cluster
        .cli(7270, &["cluster", "keyslot", &tier.redis_key(&key(c, 0))])
        .trim()
        .to_string();
    assert_eq!(
        cluster.cli(7270, &["cluster", "delslots", &slot]).trim(),
        "OK"
    );
    let connections = || -> u64 {
        let info = cluster.cli(7270, &["info", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = connections();
    for _ in 0..50 {
        assert_eq!(
            fetch_chain(&tier, c).0,
            0,
            "its first block's slot is unserved"
        );
    }
    // Each `connections()` call is one redis-cli connection itself.
    let made = connections() - before - 1;
    println!("50 lookups of an unserved slot: {made} connections to the seed");
    assert!(made <= 3, "{made} new connections for 50 lookups");
}
