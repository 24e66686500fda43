//! What the tier tests share: finding the loopback cluster (or skipping,
//! loudly), unique namespaces, and clusters of their own for the tests that
//! break them.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use kvslice_core::KvLayout;
use kvslice_redis::{RedisTier, TierConfig, TierError};

/// The cluster `.ci/redis-cluster.sh start` runs, unless
/// `KVSLICE_REDIS_URLS` names another.
pub fn urls() -> String {
    kvslice_redis::default_urls()
}

/// `None` (after printing `SKIPPED` and why) when there is no tier to
/// test against, or a panic when `KVSLICE_REQUIRE_REDIS=1`.
pub fn skip(why: &str) {
    assert!(
        std::env::var("KVSLICE_REQUIRE_REDIS").as_deref() != Ok("1"),
        "KVSLICE_REQUIRE_REDIS=1 but {why}"
    );
    println!("SKIPPED: {why} (start one with .ci/redis-cluster.sh start)");
}

/// A namespace no other run or test shares.
pub fn namespace(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test-{test}-{}-{nanos}", std::process::id())
}

/// The shared cluster's tier for `layout`, or `None` (skipped).
pub fn tier(
    layout: KvLayout,
    test: &str,
    tweak: impl FnOnce(TierConfig) -> TierConfig,
) -> Option<RedisTier> {
    let cfg = tweak(TierConfig::new(&urls()).namespace(&namespace(test)));
    match RedisTier::open(layout, cfg) {
        Ok(t) => Some(t),
        // Only a cluster that is not there is a reason to skip.
        Err(e @ TierError::Connect(_)) => {
            skip(&format!("no Redis cluster at {}: {e}", urls()));
            None
        }
        Err(e) => panic!("the tier at {} refused to open: {e}", urls()),
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.ci/redis-cluster.sh")
}

/// Servers a test starts for itself (so that it can kill, fill or lock
/// them), stopped by their pids when dropped.
pub struct OwnServers {
    pub dir: PathBuf,
    pub urls: String,
}

impl OwnServers {
    /// Runs `.ci/redis-cluster.sh start` with `args` in its own folder
    /// under `target/`; `None` (skipped) when redis-server is missing.
    pub fn start(name: &str, args: &[&str]) -> Option<Self> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            skip("redis-server is not installed");
            return None;
        }
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target")
            .join(format!("redis-{name}"));
        // A run killed before its cleanup leaves pids behind: stop them.
        let _ = Command::new(script())
            .arg("stop")
            .arg("--dir")
            .arg(&dir)
            .status();
        let out = Command::new(script())
            .arg("start")
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .output()
            .expect("run .ci/redis-cluster.sh");
        assert!(
            out.status.success(),
            "redis-cluster.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let urls = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Some(Self { dir, urls })
    }

    /// Runs a script command (`kill 1`, `restart 1`) on these servers.
    pub fn run(&self, args: &[&str]) {
        let status = Command::new(script())
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .status()
            .expect("run .ci/redis-cluster.sh");
        assert!(status.success(), "redis-cluster.sh {args:?} failed");
    }

    /// `redis-cli -p port args...`, its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .arg("-p")
            .arg(port.to_string())
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for OwnServers {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg("--dir")
            .arg(&self.dir)
            .status();
    }
}
