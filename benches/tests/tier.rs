//! `kvslice tier` on the Mooncake conversation trace: 4 replicas of 1,000
//! blocks, requests round-robin, each alone, sharing the loopback Redis
//! cluster as a tier, and as one pooled store. Every block fetched from
//! the tier is the one asked for, and the tier recovers at least 70% of
//! the gap between "each alone" and "one pooled store". Needs the cluster
//! (`.ci/redis-cluster.sh start`); prints `SKIPPED` without it, unless
//! `KVSLICE_REQUIRE_REDIS=1`.

use std::fs::File;
use std::io::BufReader;

use kvslice_benches::tier::{Setup, TierReplayConfig, tier_replay};
use kvslice_benches::trace::Trace;
use kvslice_redis::{RedisTier, TierConfig};

#[test]
fn the_tier_recovers_most_of_the_gap_to_a_pooled_store() {
    let urls = kvslice_redis::default_urls();
    let layout = kvslice_core::KvLayout::new(kvslice_core::LayoutSpec::new(
        1,
        1,
        1,
        1,
        512,
        kvslice_core::KvDtype::F16,
    ))
    .unwrap();
    if let Err(e) = RedisTier::open(layout, TierConfig::new(&urls)) {
        assert!(
            std::env::var("KVSLICE_REQUIRE_REDIS").as_deref() != Ok("1"),
            "KVSLICE_REQUIRE_REDIS=1 but no Redis cluster at {urls}: {e}"
        );
        println!(
            "SKIPPED: no Redis cluster at {urls}: {e} (start one with .ci/redis-cluster.sh start)"
        );
        return;
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/conversation_trace.jsonl");
    let trace = Trace::read(BufReader::new(File::open(path).unwrap()), false).unwrap();
    for write_through in [false, true] {
        let cfg = TierReplayConfig {
            replicas: 4,
            capacity_blocks: 1000,
            policy: "default".into(),
            tier: TierConfig::new(&urls)
                .namespace(&format!("test-tier-{}-{write_through}", std::process::id()))
                .write_through(write_through),
            lead: 8,
            progress: false,
        };
        let run = |s| tier_replay(&trace, &cfg, s).unwrap();
        let (alone, tier, pooled) = (run(Setup::Alone), run(Setup::Tier), run(Setup::Pooled));
        let recovered =
            (tier.hit_ratio() - alone.hit_ratio()) / (pooled.hit_ratio() - alone.hit_ratio());
        println!(
            "write-through {write_through}: alone {:.4}, tier {:.4} (local {:.4}, remote {:.4}), pooled {:.4}: {:.1}% of the gap; {:?}",
            alone.hit_ratio(),
            tier.hit_ratio(),
            tier.total.local_ratio(),
            tier.total.remote_ratio(),
            pooled.hit_ratio(),
            100.0 * recovered,
            tier.tier
        );
        assert_eq!(
            tier.wrong_blocks, 0,
            "a fetched block was not the one asked for"
        );
        let stats = tier.tier.unwrap();
        assert_eq!(stats.bad_values + stats.fetch_errors, 0, "{stats:?}");
        assert!(tier.total.remote_hits > 0);
        assert_eq!(alone.total.blocks, tier.total.blocks);
        assert!(
            recovered >= 0.7,
            "the tier recovers {:.1}% of the gap",
            100.0 * recovered
        );
    }
}
