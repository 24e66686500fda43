//! Replicas sharing a Redis tier (`kvslice tier`).
//!
//! R replicas, each a thread with its own [`CacheStore`] of C blocks,
//! serve a trace's requests round-robin (request `i` on replica `i mod R`,
//! so that a conversation's turns land on different replicas), paced so
//! that no replica runs more than a few requests ahead of the trace order.
//! Three setups, same requests:
//!
//! - **alone**: each replica with its own cache only;
//! - **tier**: every store spills evicted blocks into one [`RedisTier`] and
//!   fetches the continuation of a local prefix from it;
//! - **pooled**: one store of R×C blocks shared by all replicas, the ideal
//!   a shared tier approaches.
//!
//! Pages carry their block's hash in their first bytes, so every block
//! fetched from the tier is checked to be the one asked for.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvslice_core::epoch::Guard;
use kvslice_core::{CacheStore, Error, EvictionPolicy, PageRef, SliceKey};
use kvslice_redis::{RedisTier, TierConfig, TierStats, TieredStore};

use crate::replay::{Keys, keys, trace_layout};
use crate::trace::{TRACE_BLOCK_TOKENS, Trace};

/// How the replicas' caches are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// Each replica with its own cache only.
    Alone,
    /// Each replica's cache with the shared tier behind it.
    Tier,
    /// One cache of every replica's memory, shared.
    Pooled,
}

impl Setup {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Setup::Alone => "alone",
            Setup::Tier => "tier",
            Setup::Pooled => "pooled",
        }
    }
}

/// What to replay with.
#[derive(Debug, Clone)]
pub struct TierReplayConfig {
    /// Replicas (threads), at least 1.
    pub replicas: usize,
    /// Each replica's cache, in trace blocks.
    pub capacity_blocks: u32,
    /// Each cache's eviction policy (see [`kvslice_core::evict::by_name`]).
    pub policy: String,
    /// The tier (for [`Setup::Tier`]); its namespace should be fresh.
    pub tier: TierConfig,
    /// How many requests (in trace order) a replica may run ahead of the
    /// slowest unfinished one.
    pub lead: usize,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// One replica's share of a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplicaReport {
    /// Requests it served.
    pub requests: u64,
    /// Block lookups.
    pub blocks: u64,
    /// Blocks found in its own cache.
    pub local_hits: u64,
    /// Blocks fetched from the tier.
    pub remote_hits: u64,
}

impl ReplicaReport {
    /// Local hits over blocks.
    pub fn local_ratio(&self) -> f64 {
        self.local_hits as f64 / self.blocks.max(1) as f64
    }

    /// Remote hits over blocks.
    pub fn remote_ratio(&self) -> f64 {
        self.remote_hits as f64 / self.blocks.max(1) as f64
    }
}

/// One run's results.
#[derive(Debug, Clone)]
pub struct TierReport {
    /// The setup.
    pub setup: Setup,
    /// Replicas.
    pub replicas: usize,
    /// Each replica's cache, in blocks.
    pub capacity_blocks: u32,
    /// Per replica (one entry for all of them when pooled).
    pub per_replica: Vec<ReplicaReport>,
    /// All replicas together.
    pub total: ReplicaReport,
    /// The tier's counters (tier setup only).
    pub tier: Option<TierStats>,
    /// Fetched blocks whose bytes were not the block asked for (must be 0).
    pub wrong_blocks: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl TierReport {
    /// Hits of either kind over blocks.
    pub fn hit_ratio(&self) -> f64 {
        (self.total.local_hits + self.total.remote_hits) as f64 / self.total.blocks.max(1) as f64
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let t = self.tier.unwrap_or_default();
        serde_json::json!({
            "setup": self.setup.name(),
            "replicas": self.replicas,
            "capacity_blocks": self.capacity_blocks,
            "blocks": self.total.blocks,
            "local_hits": self.total.local_hits,
            "remote_hits": self.total.remote_hits,
            "hit_ratio": self.hit_ratio(),
            "per_replica": self.per_replica.iter().map(|r| serde_json::json!({
                "requests": r.requests, "blocks": r.blocks,
                "local_ratio": r.local_ratio(), "remote_ratio": r.remote_ratio(),
            })).collect::<Vec<_>>(),
            "tier_bytes_out": t.spilled_bytes,
            "tier_bytes_in": t.fetched_bytes,
            "spilled_blocks": t.spilled_blocks,
            "spill_dropped": t.spill_dropped,
            "spill_failed": t.spill_failed,
            "spill_rejected": t.spill_rejected,
            "spill_unrouted": t.spill_unrouted,
            "bad_values": t.bad_values,
            "fetch_errors": t.fetch_errors,
            "fetch_p50_us": t.fetch_p50_us,
            "fetch_p99_us": t.fetch_p99_us,
            "wrong_blocks": self.wrong_blocks,
            "seconds": self.seconds,
        })
    }
}

/// Why a run stopped.
#[derive(Debug)]
pub enum TierReplayError {
    /// Bad configuration or a store error.
    Store(Error),
    /// The tier could not be opened.
    Tier(kvslice_redis::TierError),
}

impl std::fmt::Display for TierReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Store(e) => write!(f, "{e}"),
            Self::Tier(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TierReplayError {}

impl From<Error> for TierReplayError {
    fn from(e: Error) -> Self {
        Self::Store(e)
    }
}

/// Replays `trace` over `cfg.replicas` replicas in `setup`.
pub fn tier_replay(
    trace: &Trace,
    cfg: &TierReplayConfig,
    setup: Setup,
) -> Result<TierReport, TierReplayError> {
    if cfg.replicas == 0 {
        return Err(Error::InvalidValue("replicas must be at least 1").into());
    }
    if cfg.capacity_blocks == 0 {
        return Err(Error::InvalidValue("capacity must be at least one block").into());
    }
    // All replicas' memory, as the pooled setup holds it, must fit a
    // pool: every setup is then the same memory.
    crate::policy::times(cfg.capacity_blocks, cfg.replicas)
        .and_then(crate::policy::check_capacity)?;
    let layout = trace_layout()?;
    let keys = keys(trace, layout)?;
    let policy = |capacity| crate::policy::online(&cfg.policy, capacity);
    let tier = match setup {
        Setup::Tier => {
            Some(RedisTier::open(layout, cfg.tier.clone()).map_err(TierReplayError::Tier)?)
        }
        _ => None,
    };
    let stores = match setup {
        Setup::Pooled => {
            let capacity = crate::policy::times(cfg.capacity_blocks, cfg.replicas)?;
            vec![CacheStore::new(layout, capacity, policy(capacity)?)?]
        }
        _ => (0..cfg.replicas)
            .map(|_| {
                let store =
                    CacheStore::new(layout, cfg.capacity_blocks, policy(cfg.capacity_blocks)?)?;
                // Write-through spills on publish; otherwise on evict.
                Ok(match &tier {
                    Some(t) if !t.config().write_through => store.with_spill(Box::new(t.sink()))?,
                    _ => store,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?,
    };
    let bar = progress_bar(cfg, setup, trace.requests.len());
    let done = AtomicUsize::new(0);
    let finished: Vec<AtomicBool> = (0..trace.requests.len())
        .map(|_| AtomicBool::new(false))
        .collect();
    let wrong = AtomicU64::new(0);
    let started = Instant::now();
    let per_replica: Vec<Result<ReplicaReport, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.replicas)
            .map(|r| {
                let store = &stores[r.min(stores.len() - 1)];
                let (keys, tier, done, finished, wrong, bar) =
                    (&keys, tier.as_ref(), &done, &finished, &wrong, &bar);
                s.spawn(move || {
                    let mut report = ReplicaReport::default();
                    for i in (r..trace.requests.len()).step_by(cfg.replicas) {
                        // Pacing: wait while this request is more than `lead`
                        // ahead of the oldest unfinished one.
                        wait_for(done, finished, i.saturating_sub(cfg.lead));
                        serve(store, tier, trace, keys, i, &mut report, wrong)?;
                        finished[i].store(true, Relaxed);
                        advance(done, finished);
                        if i % 256 == 0 {
                            bar.set_position(done.load(Relaxed) as u64);
                        }
                    }
                    Ok(report)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("replica thread"))
            .collect()
    });
    bar.finish_and_clear();
    let per_replica = per_replica.into_iter().collect::<Result<Vec<_>, _>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let mut total = ReplicaReport::default();
    for r in &per_replica {
        total.requests += r.requests;
        total.blocks += r.blocks;
        total.local_hits += r.local_hits;
        total.remote_hits += r.remote_hits;
    }
    if let Some(t) = &tier {
        t.flush(Duration::from_secs(10));
    }
    Ok(TierReport {
        setup,
        replicas: cfg.replicas,
        capacity_blocks: cfg.capacity_blocks,
        per_replica,
        total,
        tier: tier.as_ref().map(RedisTier::stats),
        wrong_blocks: wrong.load(Relaxed),
        seconds,
    })
}

/// Waits (bounded: 60 s, then proceeds) until every request before `upto`
/// has finished.
fn wait_for(done: &AtomicUsize, finished: &[AtomicBool], upto: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(Relaxed) < upto && Instant::now() < deadline {
        advance(done, finished);
        std::thread::yield_now();
    }
}

/// Moves `done` past every finished request at its front.
fn advance(done: &AtomicUsize, finished: &[AtomicBool]) {
    loop {
        let d = done.load(Relaxed);
        if d >= finished.len() || !finished[d].load(Relaxed) {
            return;
        }
        let _ = done.compare_exchange(d, d + 1, Relaxed, Relaxed);
    }
}

/// Serves request `i` on `store`: local prefix, then the tier's
/// continuation, then fills and publishes the rest.
fn serve<E: EvictionPolicy>(
    store: &CacheStore<'static, E>,
    tier: Option<&RedisTier>,
    trace: &Trace,
    keys: &Keys,
    i: usize,
    report: &mut ReplicaReport,
    wrong: &AtomicU64,
) -> Result<(), Error> {
    let (keys, input) = (&keys.per_request[i], trace.requests[i].input_length);
    let guard = store.pin();
    let req = store.begin_request();
    let mut held: Vec<PageRef<'_, 'static>> = Vec::new();
    let (local, remote) = match tier {
        Some(t) => {
            let hit = tiered(store, t)?.lookup(&req, keys, input as usize, &guard, &mut held)?;
            for (r, key) in held[hit.local..].iter().zip(&keys[hit.local..]) {
                if r.bytes()[..16] != key.block.0.to_le_bytes() {
                    wrong.fetch_add(1, Relaxed);
                }
            }
            (hit.local, hit.remote)
        }
        None => (
            store.lookup_prefix(&req, keys, input as usize, &guard, &mut held)?,
            0,
        ),
    };
    fill(
        store,
        tier,
        keys,
        input,
        local + remote,
        &req,
        &guard,
        &mut held,
    )?;
    drop(held);
    store.end_request(req)?;
    report.requests += 1;
    report.blocks += keys.len() as u64;
    report.local_hits += local as u64;
    report.remote_hits += remote as u64;
    Ok(())
}

/// Allocates and publishes `keys[from..]` (through the tier, for its
/// write-through), each page stamped with its block's hash (a request
/// whose blocks get no pages caches nothing).
#[allow(clippy::too_many_arguments)]
fn fill<'s, E: EvictionPolicy>(
    store: &'s CacheStore<'static, E>,
    tier: Option<&'s RedisTier>,
    keys: &[SliceKey],
    input: u64,
    from: usize,
    req: &kvslice_core::RequestTicket,
    guard: &Guard,
    held: &mut Vec<PageRef<'s, 'static>>,
) -> Result<(), Error> {
    let missing = (keys.len() - from) as u32;
    if missing == 0 {
        return Ok(());
    }
    let pages = match store.allocate(missing, guard) {
        Ok(p) => p,
        Err(Error::CapacityExhausted(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let bt = u64::from(TRACE_BLOCK_TOKENS);
    for (key, mut page) in keys[from..].iter().zip(pages) {
        page.bytes_mut()[..16].copy_from_slice(&key.block.0.to_le_bytes());
        let valid = (input - u64::from(key.block_index) * bt).min(bt) as u32;
        let r = match tier {
            Some(t) => tiered(store, t)?.publish(req, page, *key, held.last(), valid, guard)?,
            None => store.publish(req, page, *key, held.last(), valid, guard)?,
        };
        held.push(r);
    }
    Ok(())
}

fn progress_bar(cfg: &TierReplayConfig, setup: Setup, n: usize) -> ProgressBar {
    if !cfg.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{bar:30}] {pos}/{len} requests ({per_sec}, eta {eta})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("{} x{}", setup.name(), cfg.replicas));
    bar
}

/// The three setups' reports as a table, with the share of the gap between
/// "alone" and "pooled" that the tier recovers.
pub fn table(reports: &[TierReport]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:>8} {:>9} {:>10} {:>10} {:>9} {:>11} {:>11} {:>8} {:>8} {:>8}",
        "setup",
        "replicas",
        "hit ratio",
        "local",
        "remote",
        "MB out",
        "MB in",
        "spill drop",
        "p50 µs",
        "p99 µs",
        "seconds"
    );
    for r in reports {
        let t = r.tier.unwrap_or_default();
        let _ = writeln!(
            s,
            "{:<8} {:>8} {:>9.4} {:>10.4} {:>10.4} {:>9.1} {:>11.1} {:>11} {:>8} {:>8} {:>8.1}",
            r.setup.name(),
            r.replicas,
            r.hit_ratio(),
            r.total.local_ratio(),
            r.total.remote_ratio(),
            t.spilled_bytes as f64 / 1e6,
            t.fetched_bytes as f64 / 1e6,
            t.spill_dropped,
            t.fetch_p50_us,
            t.fetch_p99_us,
            r.seconds
        );
    }
    let get = |setup| {
        reports
            .iter()
            .find(|r| r.setup == setup)
            .map(TierReport::hit_ratio)
    };
    if let (Some(alone), Some(tier), Some(pooled)) =
        (get(Setup::Alone), get(Setup::Tier), get(Setup::Pooled))
    {
        let gap = pooled - alone;
        if gap > 0.0 {
            let _ = writeln!(
                s,
                "\nthe tier recovers {:.1}% of the gap between each replica alone ({alone:.4}) and one pooled store ({pooled:.4})",
                100.0 * (tier - alone) / gap
            );
        }
    }
    for r in reports.iter().filter(|r| r.setup == Setup::Tier) {
        for (i, p) in r.per_replica.iter().enumerate() {
            let _ = writeln!(
                s,
                "  replica {i}: {} requests, local {:.4}, remote {:.4}",
                p.requests,
                p.local_ratio(),
                p.remote_ratio()
            );
        }
    }
    s
}

/// `store` with `tier` behind it: both are built from the trace's layout.
fn tiered<'a, E: EvictionPolicy>(
    store: &'a CacheStore<'static, E>,
    tier: &'a RedisTier,
) -> Result<TieredStore<'a, E>, Error> {
    TieredStore::new(store, tier).map_err(|_| Error::InvalidValue("store and tier layouts differ"))
}
