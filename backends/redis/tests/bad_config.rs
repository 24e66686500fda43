//! A tier that cannot work fails at open, with the reason: an unreachable
//! URL, a wrong scheme, refused credentials, a cluster that is not ok,
//! several URLs that are not a cluster, settings that cannot work. Starts
//! its own servers (`.ci/redis-cluster.sh`); prints `SKIPPED` without
//! redis-server, unless `KVSLICE_REQUIRE_REDIS=1`.

mod common;

use std::time::{Duration, Instant};

use kvslice_core::{KvDtype, KvLayout, LayoutSpec};
use kvslice_redis::{RedisTier, TierConfig, TierError};

fn layout() -> KvLayout {
    KvLayout::new(LayoutSpec::new(1, 1, 1, 4, 4, KvDtype::F32)).unwrap()
}

fn open(cfg: TierConfig) -> TierError {
    RedisTier::open(layout(), cfg).expect_err("the tier must refuse this")
}

#[test]
fn settings_that_cannot_work_are_refused_before_connecting() {
    for (urls, what) in [
        ("", "no URL"),
        ("http://127.0.0.1:7100", "wrong scheme"),
        ("rediss://127.0.0.1:7100", "TLS"),
        ("127.0.0.1:7100", "no scheme"),
    ] {
        let e = open(TierConfig::new(urls));
        assert!(matches!(e, TierError::Url(_)), "{what}: {e}");
        println!("{what}: {e}");
    }
    let e = open(TierConfig::new("redis://127.0.0.1:7100").spill_queue(0));
    assert!(e.to_string().contains("spill_queue"), "{e}");
    let e = open(TierConfig::new("redis://127.0.0.1:7100").namespace("a b"));
    assert!(e.to_string().contains("namespace"), "{e}");
}

#[test]
fn an_unreachable_server_fails_within_the_connect_timeout() {
    // Nothing listens on port 1 of loopback: refused at once. A
    // non-routable address would take the whole timeout instead.
    let started = Instant::now();
    let e = open(
        TierConfig::new("redis://127.0.0.1:1")
            .timeouts(Duration::from_millis(200), Duration::from_millis(200)),
    );
    assert!(matches!(e, TierError::Connect(_)), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    println!("unreachable: {e}");
}

#[test]
fn refused_credentials_and_clusters_that_are_not_ok() {
    let Some(locked) = common::OwnServers::start(
        "auth",
        &["--standalone", "--port", "7220", "--requirepass", "s3cret"],
    ) else {
        return;
    };
    for url in [
        "redis://127.0.0.1:7220",
        "redis://:wrong@127.0.0.1:7220",
        "redis://nobody:s3cret@127.0.0.1:7220",
    ] {
        let e = open(TierConfig::new(url));
        assert!(matches!(e, TierError::Auth(_)), "{url}: {e}");
        println!("{url}: {e}");
    }
    // The right password works, and it is one server, not a cluster.
    let tier =
        RedisTier::open(layout(), TierConfig::new("redis://:s3cret@127.0.0.1:7220")).unwrap();
    assert!(!tier.is_cluster());
    drop(tier);
    // Two URLs of one standalone server: not a cluster.
    let e = open(TierConfig::new(
        "redis://:s3cret@127.0.0.1:7220,redis://:s3cret@127.0.0.1:7220",
    ));
    assert!(matches!(e, TierError::NotACluster(_)), "{e}");
    drop(locked);

    // Cluster-mode nodes that never formed a cluster: state fail.
    let Some(bare) =
        common::OwnServers::start("bare", &["--bare", "--port", "7230", "--nodes", "2"])
    else {
        return;
    };
    let e = open(TierConfig::new(&bare.urls));
    assert!(matches!(e, TierError::ClusterNotOk(_)), "{e}");
    println!("bare nodes: {e}");
}
