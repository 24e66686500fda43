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

/// The loopback cluster's URLs, or `None` after printing `SKIPPED` (a
/// panic when `KVSLICE_REQUIRE_REDIS=1`).
fn cluster() -> Option<String> {
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
    match RedisTier::open(layout, TierConfig::new(&urls)) {
        Ok(_) => Some(urls),
        Err(e) => {
            assert!(
                std::env::var("KVSLICE_REQUIRE_REDIS").as_deref() != Ok("1"),
                "KVSLICE_REQUIRE_REDIS=1 but no Redis cluster at {urls}: {e}"
            );
            println!(
                "SKIPPED: no Redis cluster at {urls}: {e} (start one with .ci/redis-cluster.sh start)"
            );
            None
        }
    }
}

/// `kvslice replay` with `args`: its stdout's JSON lines, or its stderr
/// when it fails.
fn replay(args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvslice"))
        .arg("replay")
        .args(["--capacity-blocks", "1000", "--policy", "default", "--json"])
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

#[test]
fn replay_with_a_tier_adds_remote_hits_to_the_local_ones() {
    let Some(urls) = cluster() else { return };
    let alone = replay(&[]).unwrap();
    let tiered = replay(&["--tier", &urls]).unwrap();
    let (alone, tiered) = (&alone[0], &tiered[0]);
    println!("alone {alone}\nwith the tier {tiered}");
    let ratio = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    // The same local cache finds what it found alone (the same policy on
    // the same trace), and the tier serves what it had evicted.
    let local = tiered["local_hits"].as_u64().unwrap() as f64 / ratio(tiered, "blocks");
    assert!(
        (local - ratio(alone, "block_hit_ratio")).abs() < 0.02,
        "{local}"
    );
    assert!(tiered["remote_hits"].as_u64().unwrap() > 0);
    assert!(ratio(tiered, "hit_ratio") > 2.0 * ratio(alone, "block_hit_ratio"));
    assert_eq!(tiered["wrong_blocks"].as_u64(), Some(0));
    assert!(tiered["tier_bytes_out"].as_u64().unwrap() > 0);

    // Bad tiers fail with their reason, before replaying anything.
    let e = replay(&["--tier", "http://127.0.0.1:7100"]).unwrap_err();
    assert!(e.contains("redis://"), "{e}");
    let e = replay(&["--tier", "redis://127.0.0.1:1"]).unwrap_err();
    assert!(e.contains("cannot reach"), "{e}");
    let e = replay(&["--tier", &urls, "--threads", "2"]).unwrap_err();
    assert!(e.contains("kvslice tier --replicas"), "{e}");
}

#[test]
fn the_tier_recovers_most_of_the_gap_to_a_pooled_store() {
    let Some(urls) = cluster() else { return };
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
