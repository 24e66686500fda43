//! `kvslice route` on the Mooncake conversation trace: workers publish KV
//! events over loopback ZeroMQ, the router indexes them, and prefix-aware
//! routing beats round-robin and least-loaded on cluster hit ratio without
//! overloading a worker. Deterministic: the router applies each worker's
//! events before routing the next request.

use std::fs::File;
use std::io::BufReader;

use kvslice_benches::route::{RouteConfig, RouteReport, Strategy, route};
use kvslice_benches::trace::Trace;

fn trace() -> Trace {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/conversation_trace.jsonl");
    Trace::read(BufReader::new(File::open(path).unwrap()), false).unwrap()
}

fn run(trace: &Trace, workers: usize) -> Vec<RouteReport> {
    let cfg = RouteConfig {
        workers,
        capacity_blocks: 1000,
        policy: "default".into(),
        balance: 1.05,
        departed_slots: kvslice_events::index::DEFAULT_DEPARTED_SLOTS,
        progress: false,
    };
    Strategy::ALL
        .iter()
        .map(|&s| route(trace, &cfg, s).unwrap())
        .collect()
}

#[test]
fn prefix_routing_beats_round_robin_and_least_loaded_at_4_and_8_workers() {
    let trace = trace();
    for (workers, min_gain) in [(4, 1.85), (8, 2.6)] {
        let reports = run(&trace, workers);
        for r in &reports {
            println!(
                "{workers} workers, {:<12}: block hit ratio {:.4}, busiest/mean {:.2}, router {:?}",
                r.strategy.name(),
                r.block_hit_ratio,
                r.busiest_over_mean,
                r.router
            );
            assert!(
                r.index_exact,
                "the router's index equals the workers' stores"
            );
            assert_eq!(
                (r.router.gaps, r.router.malformed, r.router.backwards),
                (0, 0, 0)
            );
            assert!(r.router.events > 10_000);
            assert_eq!(r.requests_per_worker.iter().sum::<u64>(), r.requests);
        }
        let [rr, least, prefix] = &reports[..] else {
            unreachable!()
        };
        let gain = prefix.block_hit_ratio / rr.block_hit_ratio;
        assert!(
            gain >= min_gain,
            "{workers} workers: prefix {gain:.2}x round-robin"
        );
        assert!(prefix.block_hit_ratio > 1.5 * least.block_hit_ratio);
        assert!(
            prefix.busiest_over_mean <= 1.25,
            "{}",
            prefix.busiest_over_mean
        );
    }
}

#[test]
fn bad_configurations_are_refused() {
    let trace = Trace::default();
    let cfg = |workers, capacity_blocks, balance| RouteConfig {
        workers,
        capacity_blocks,
        policy: "default".into(),
        balance,
        departed_slots: 0,
        progress: false,
    };
    for (c, want) in [
        (cfg(0, 10, 1.1), "workers must be between 1 and 64"),
        (cfg(65, 10, 1.1), "workers must be between 1 and 64"),
        (cfg(2, 0, 1.1), "capacity must be at least one block"),
        (cfg(2, 10, 0.5), "balance must be at least 1"),
        (cfg(2, 10, f64::NAN), "balance must be at least 1"),
    ] {
        let err = route(&trace, &c, Strategy::Prefix).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
    let mut huge = cfg(2, 10, 1.1);
    huge.departed_slots = (1 << 30) + 1;
    let err = route(&trace, &huge, Strategy::Prefix)
        .unwrap_err()
        .to_string();
    assert!(err.contains("departed slots must be at most 2^30"), "{err}");
    let mut bad = cfg(2, 10, 1.1);
    bad.policy = "fifo".into();
    assert!(
        route(&trace, &bad, Strategy::Prefix)
            .unwrap_err()
            .to_string()
            .contains("unknown policy")
    );
}
