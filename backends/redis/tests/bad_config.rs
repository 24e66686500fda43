//! A tier that cannot work fails at open, with the reason: an unreachable
//! URL, a wrong scheme, refused credentials, a cluster that is not ok,
//! several URLs that are not a cluster, settings that cannot work; and a
//! store of another layout is refused by the tier it would share. Starts
//! its own servers (`.ci/redis-cluster.sh`, or uses the shared cluster);
//! prints `SKIPPED` without redis-server, unless `KVSLICE_REQUIRE_REDIS=1`.

mod common;

use std::time::{Duration, Instant};

use kvslice_core::{CacheStore, KeyOrder, KvDtype, KvLayout, LayoutSpec, LruPolicy, SpillSink};
use kvslice_redis::{RedisTier, TierConfig, TierError, TieredStore};

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
        // A later seed that does not parse: refused now, not skipped at
        // every read of the slot map.
        (
            "redis://127.0.0.1:7100,redis://127.0.0.1:70000",
            "a later URL's port",
        ),
    ] {
        let e = open(TierConfig::new(urls));
        assert!(matches!(e, TierError::Url(_)), "{what}: {e}");
        println!("{what}: {e}");
    }
    let e = open(TierConfig::new("redis://127.0.0.1:7100").spill_queue(0));
    assert!(e.to_string().contains("spill_queue"), "{e}");
    let e = open(TierConfig::new("redis://127.0.0.1:7100").namespace("a b"));
    assert!(e.to_string().contains("namespace"), "{e}");
    // Settings that would open and then fail every spill, allocate without
    // bound, or never back off.
    let base = || TierConfig::new("redis://127.0.0.1:7100");
    let mut no_backoff = base();
    no_backoff.min_backoff = Duration::ZERO;
    let mut inverted = base();
    inverted.min_backoff = inverted.max_backoff * 2;
    let mut endless = base();
    endless.max_backoff = Duration::MAX;
    for (cfg, what) in [
        (base().ttl(Some(Duration::MAX)), "ttl"),
        (base().ttl(Some(Duration::from_micros(10))), "ttl"),
        (base().spill_queue(1 << 32), "spill_queue"),
        (base().spill_threads(1 << 40), "spill_threads"),
        (no_backoff, "min_backoff"),
        (inverted, "min_backoff"),
        (endless, "max_backoff"),
    ] {
        let e = open(cfg);
        assert!(
            matches!(&e, TierError::Url(m) if m.contains(what)),
            "{what}: {e}"
        );
    }
}

/// A password in a URL appears in no error message and no `Debug` output.
#[test]
fn passwords_stay_out_of_messages() {
    let secret = "s3cret-pw";
    let urls = format!("redis://app:{secret}@127.0.0.1:1");
    let cfg =
        TierConfig::new(&urls).timeouts(Duration::from_millis(200), Duration::from_millis(200));
    assert!(!format!("{cfg:?}").contains(secret), "{cfg:?}");
    let e = open(cfg);
    assert!(matches!(e, TierError::Connect(_)), "{e}");
    assert!(!e.to_string().contains(secret), "{e}");
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    let e = open(TierConfig::new(&format!("http://app:{secret}@127.0.0.1:1")));
    assert!(!e.to_string().contains(secret), "{e}");
    // A password with a `/` in it, which ends no authority.
    let e = open(TierConfig::new("redis://app:pa/ss-pw@127.0.0.1:1"));
    assert!(!e.to_string().contains("ss-pw"), "{e}");
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

/// A store whose layout is not the tier's would label its pages with the
/// tier's layout and read fetched pages as its own: refused, as a tiered
/// store and as the tier's spill sink (the pages are the same size). The
/// sink drops (and counts) pages of another size.
#[test]
fn a_store_of_another_layout_is_refused() {
    let spec = LayoutSpec::new(1, 2, 2, 8, 4, KvDtype::F16);
    let tier_layout = KvLayout::new(spec.with_key_order(KeyOrder::DimMajor)).unwrap();
    let Some(tier) = common::tier(tier_layout, "layout", |c| c) else {
        return;
    };
    // Same page size, another key order.
    let other = KvLayout::new(spec).unwrap();
    assert_eq!(other.page_bytes(), tier_layout.page_bytes());
    let store = CacheStore::new(other, 4, LruPolicy::new(4)).unwrap();
    assert!(matches!(
        TieredStore::new(&store, &tier),
        Err(TierError::LayoutMismatch(_))
    ));
    let refused = store.with_spill(Box::new(tier.sink())).unwrap_err();
    assert!(matches!(
        refused.error,
        kvslice_core::Error::InvalidLayout(_)
    ));
    // The store and the sink come back, each still usable.
    assert_eq!(refused.store.layout(), &other);
    assert_eq!(refused.sink.layout(), Some(&tier_layout));
    let guard = refused.store.pin();
    assert_eq!(refused.store.allocate(4, &guard).unwrap().len(), 4);
    drop(guard);
    assert!(
        CacheStore::new(tier_layout, 4, LruPolicy::new(4))
            .unwrap()
            .with_spill(refused.sink)
            .is_ok()
    );
    let same = CacheStore::new(tier_layout, 4, LruPolicy::new(4)).unwrap();
    assert!(TieredStore::new(&same, &tier).is_ok());
    assert!(same.with_spill(Box::new(tier.sink())).is_ok());
    let key = kvslice_core::SliceKey {
        block: kvslice_core::BlockHash(7),
        block_index: 0,
        layer_group: 0,
        head_shard: 0,
    };
    tier.sink().evicted(&key, 4, &[0u8; 3]);
    assert_eq!(tier.stats().spill_dropped, 1);
    assert!(tier.flush(Duration::from_secs(5)));
    assert_eq!(tier.stats().spilled_blocks, 0);
}
