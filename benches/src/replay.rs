//! Replaying a trace through the real Coordinator and CacheStore.
//!
//! Requests run in timestamp order. Each request's block ids become slice
//! keys through [`Coordinator::plan_block_ids`]; its cached prefix is looked
//! up (taking references), the missing blocks are allocated (evicting as
//! needed) and published, and its references are released when it is done.
//! A request whose missing blocks cannot get pages (more blocks than the
//! cache holds) keeps its hits, counts the rest as misses and caches
//! nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kvslice_core::epoch::Guard;
use kvslice_core::store::fingerprint;
use kvslice_core::{
    CacheStore, Coordinator, Error, EvictionPolicy, HashSecret, KeyScope, KvDtype, KvLayout,
    LayoutSpec, PageRef, RequestTicket, SliceKey,
};

use crate::policy::Belady;
use crate::trace::{TRACE_BLOCK_TOKENS, Trace};

/// Blocks of K/V stored as `dtype` that fit in the memory of `f16_blocks`
/// blocks of f16, for rows of head_dim 128 (the decode workload's shape;
/// the scaled types carry a 4-byte scale per row): what `kvslice replay
/// --kv-dtype` gives the cache.
///
/// ```
/// use kvslice_benches::replay::same_memory_blocks;
/// use kvslice_core::KvDtype;
///
/// assert_eq!(same_memory_blocks(1000, KvDtype::F16), 1000);
/// // 132 bytes a row against 256: 1.94x the blocks.
/// assert_eq!(same_memory_blocks(1000, KvDtype::I8), 1939);
/// assert_eq!(same_memory_blocks(1000, KvDtype::F32), 500);
/// ```
pub fn same_memory_blocks(f16_blocks: u32, dtype: KvDtype) -> u32 {
    use crate::decode_workload::layout_of;
    let bytes = |d| layout_of(d, kvslice_core::KeyOrder::TokenMajor).page_bytes() as u64;
    // Past u32::MAX saturates: no pool takes that many, and the store
    // then says so instead of running a wrapped capacity.
    let blocks = u64::from(f16_blocks) * bytes(KvDtype::F16) / bytes(dtype);
    u32::try_from(blocks).unwrap_or(u32::MAX)
}

/// What to replay with.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Policy name (see [`crate::policy::POLICIES`]).
    pub policy: String,
    /// Cache capacity in blocks (pages).
    pub capacity_blocks: u32,
    /// Worker threads serving requests concurrently (or, in
    /// [`lockstep`](Self::lockstep), requests in flight at once).
    pub threads: usize,
    /// Serve `threads` requests at a time on the calling thread, in
    /// lockstep: every one's lookup, then every one's allocation and
    /// publishes, then every one's end. Requests interleave the same way
    /// on every run, so tests can compare policies under concurrency
    /// without the scheduler deciding the outcome.
    pub lockstep: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// One replay's results.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// Policy name.
    pub policy: String,
    /// Cache capacity in blocks.
    pub capacity_blocks: u32,
    /// Requests replayed.
    pub requests: u64,
    /// Block lookups (every block of every request).
    pub blocks: u64,
    /// Blocks found cached (prefix semantics: a request's hits stop at its
    /// first miss).
    pub hit_blocks: u64,
    /// `hit_blocks / blocks`.
    pub block_hit_ratio: f64,
    /// Cached prompt tokens over all prompt tokens.
    pub token_hit_ratio: f64,
    /// Pages evicted.
    pub evictions: u64,
    /// Requests whose missing blocks could not get pages (more blocks than
    /// the cache holds, or every page referenced by concurrent requests):
    /// counted as misses, nothing cached.
    pub uncached_requests: u64,
    /// Block lookups per second of replay wall time.
    pub lookups_per_sec: f64,
    /// Median `lookup_prefix` latency per request, microseconds.
    pub p50_lookup_us: f64,
    /// 99th percentile `lookup_prefix` latency per request, microseconds.
    pub p99_lookup_us: f64,
    /// The same latencies by how many blocks the lookups hit: a policy
    /// that hits more serves longer prefixes, whose lookups take longer,
    /// so its overall percentiles are not its hit path's cost.
    pub by_hits: Vec<HitBucket>,
    /// Wall time of the requests, seconds (keys are derived and the store
    /// built before the clock starts).
    pub seconds: f64,
}

/// `lookup_prefix` latency of the lookups whose hits fall in one range.
#[derive(Debug, Clone, PartialEq)]
pub struct HitBucket {
    /// Fewest and most blocks hit, inclusive.
    pub hits: (u32, u32),
    /// Lookups in the range.
    pub lookups: u64,
    /// Their median latency, microseconds.
    pub p50_us: f64,
    /// Their 99th percentile latency, microseconds.
    pub p99_us: f64,
}

/// The hit ranges of [`ReplayReport::by_hits`].
pub const HIT_BUCKETS: [(u32, u32); 5] = [(0, 0), (1, 8), (9, 32), (33, 128), (129, u32::MAX)];

/// Percentile `q` of sorted nanoseconds, in microseconds (0 if empty).
fn percentile_us(sorted_ns: &[u64], q: f64) -> f64 {
    let at = ((sorted_ns.len() as f64 * q) as usize).min(sorted_ns.len().saturating_sub(1));
    sorted_ns.get(at).map_or(0.0, |ns| *ns as f64 / 1e3)
}

/// Latency percentiles of `(nanoseconds, hits)` lookups per hit range.
fn by_hits(lat: &[(u64, u32)]) -> Vec<HitBucket> {
    HIT_BUCKETS
        .iter()
        .map(|&(lo, hi)| {
            let mut ns: Vec<u64> = lat
                .iter()
                .filter(|(_, h)| (lo..=hi).contains(h))
                .map(|(ns, _)| *ns)
                .collect();
            ns.sort_unstable();
            HitBucket {
                hits: (lo, hi),
                lookups: ns.len() as u64,
                p50_us: percentile_us(&ns, 0.5),
                p99_us: percentile_us(&ns, 0.99),
            }
        })
        .collect()
}

impl ReplayReport {
    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "policy": self.policy,
            "capacity_blocks": self.capacity_blocks,
            "requests": self.requests,
            "blocks": self.blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_ratio": self.block_hit_ratio,
            "token_hit_ratio": self.token_hit_ratio,
            "evictions": self.evictions,
            "uncached_requests": self.uncached_requests,
            "lookups_per_sec": self.lookups_per_sec,
            "p50_lookup_us": self.p50_lookup_us,
            "p99_lookup_us": self.p99_lookup_us,
            "by_hits": self.by_hits.iter().map(|b| serde_json::json!({
                "min_hits": b.hits.0,
                "max_hits": b.hits.1,
                "lookups": b.lookups,
                "p50_lookup_us": b.p50_us,
                "p99_lookup_us": b.p99_us,
            })).collect::<Vec<_>>(),
            "seconds": self.seconds,
        })
    }
}

/// The keys of every request, derived once per replay.
pub(crate) struct Keys {
    pub(crate) per_request: Vec<Vec<SliceKey>>,
}

/// The store layout of a trace replay: pages carry metadata only, so the
/// smallest page of one trace block.
pub(crate) fn trace_layout() -> Result<KvLayout, Error> {
    KvLayout::new(LayoutSpec::new(
        1,
        1,
        1,
        1,
        TRACE_BLOCK_TOKENS,
        KvDtype::F16,
    ))
}

pub(crate) fn keys(trace: &Trace, layout: KvLayout) -> Result<Keys, Error> {
    let coord = Coordinator::new(layout, HashSecret::from_bytes(*b"kvslice-replay!!"));
    let scope = KeyScope::default();
    let per_request = trace
        .requests
        .iter()
        .map(|r| {
            let plan = coord.plan_block_ids(&scope, &r.hash_ids, r.input_length as usize)?;
            Ok(plan.keys_for(0, 0)?.collect())
        })
        .collect::<Result<_, Error>>()?;
    Ok(Keys { per_request })
}

/// Replays `trace` with `cfg`.
pub fn replay(trace: &Trace, cfg: &ReplayConfig) -> Result<ReplayReport, Error> {
    // Before the oracle or a policy sizes its tables by the capacity.
    crate::policy::check_capacity(cfg.capacity_blocks)?;
    if cfg.threads == 0 {
        return Err(Error::InvalidValue("threads must be at least 1"));
    }
    let layout = trace_layout()?;
    let keys = keys(trace, layout)?;
    if cfg.policy == "belady" {
        if cfg.threads != 1 {
            return Err(Error::InvalidValue(
                "belady is an offline oracle: run it with --threads 1",
            ));
        }
        let oracle = Belady::new(
            cfg.capacity_blocks,
            keys.per_request.iter().map(|ks| ks.iter().map(fingerprint)),
        );
        let store = CacheStore::new(layout, cfg.capacity_blocks, oracle)?;
        return run(trace, cfg, &keys, &store, |t| store.policy().set_now(t));
    }
    let policy = crate::policy::online(&cfg.policy, cfg.capacity_blocks)?;
    let store = CacheStore::new(layout, cfg.capacity_blocks, policy)?;
    run(trace, cfg, &keys, &store, |_| {})
}

fn run<E: EvictionPolicy>(
    trace: &Trace,
    cfg: &ReplayConfig,
    keys: &Keys,
    store: &CacheStore<'static, E>,
    before_request: impl Fn(u32) + Sync,
) -> Result<ReplayReport, Error> {
    let n = trace.requests.len();
    let bar = if cfg.progress {
        let bar = ProgressBar::new(n as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>18} [{bar:30}] {pos}/{len} requests ({per_sec}, eta {eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_message(format!("{} @ {}", cfg.policy, cfg.capacity_blocks));
        bar
    } else {
        ProgressBar::hidden()
    };
    let next = AtomicUsize::new(0);
    let uncached = AtomicU64::new(0);
    let latencies = Mutex::new(Vec::with_capacity(n));
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    // The requests alone: keys derived and the store built beforehand are
    // the same work for every policy, and would pull their ratios to 1.
    let started = Instant::now();
    if cfg.lockstep {
        let mut lat = Vec::with_capacity(n);
        let mut held: Vec<Vec<_>> = (0..cfg.threads).map(|_| Vec::new()).collect();
        for first in (0..n).step_by(cfg.threads) {
            let group = first..(first + cfg.threads).min(n);
            let mut open = Vec::with_capacity(group.len());
            for (i, held) in group.clone().zip(&mut held) {
                before_request(i as u32);
                let guard = store.pin();
                let (req, hits) = lookup(store, trace, keys, i, &guard, held, &mut lat)?;
                open.push((req, hits));
            }
            for ((i, held), (req, hits)) in group.clone().zip(&mut held).zip(&open) {
                let guard = store.pin();
                fill(store, trace, keys, i, *hits, req, &guard, held, &uncached)?;
            }
            for (held, (req, _)) in held.iter_mut().zip(open) {
                held.clear();
                store.end_request(req)?;
            }
            if first % 256 < cfg.threads {
                bar.set_position(first as u64);
            }
        }
        latencies.lock().unwrap().extend(lat);
    } else {
        std::thread::scope(|s| {
            for _ in 0..cfg.threads {
                s.spawn(|| {
                    let mut lat = Vec::new();
                    let mut held = Vec::new();
                    // Requests this thread finished since it last moved the
                    // bar: added, so that the bar never runs backwards.
                    let mut done = 0u64;
                    loop {
                        let i = next.fetch_add(1, Relaxed);
                        if i >= n {
                            break;
                        }
                        if let Err(e) = serve(
                            store,
                            trace,
                            keys,
                            i,
                            &before_request,
                            &mut held,
                            &mut lat,
                            &uncached,
                        ) {
                            *failure.lock().unwrap() = Some(e);
                            next.store(n, Relaxed);
                            break;
                        }
                        done += 1;
                        if done == 256 {
                            bar.inc(done);
                            done = 0;
                        }
                    }
                    bar.inc(done);
                    latencies.lock().unwrap().extend(lat);
                });
            }
        });
    }
    bar.finish_and_clear();
    if let Some(e) = failure.into_inner().unwrap() {
        return Err(e);
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = store.stats();
    let lat: Vec<(u64, u32)> = latencies.into_inner().unwrap();
    let mut ns: Vec<u64> = lat.iter().map(|(ns, _)| *ns).collect();
    ns.sort_unstable();
    let blocks = trace.blocks();
    let tokens: u64 = trace.requests.iter().map(|r| r.input_length).sum();
    Ok(ReplayReport {
        policy: cfg.policy.clone(),
        capacity_blocks: cfg.capacity_blocks,
        requests: n as u64,
        blocks,
        hit_blocks: stats.hit_blocks,
        block_hit_ratio: stats.hit_blocks as f64 / blocks.max(1) as f64,
        token_hit_ratio: stats.hit_tokens as f64 / tokens.max(1) as f64,
        evictions: stats.evictions,
        uncached_requests: uncached.load(Relaxed),
        lookups_per_sec: blocks as f64 / seconds,
        p50_lookup_us: percentile_us(&ns, 0.5),
        p99_lookup_us: percentile_us(&ns, 0.99),
        by_hits: by_hits(&lat),
        seconds,
    })
}

/// Serves one request: lookup, allocate, publish, release.
#[allow(clippy::too_many_arguments)]
fn serve<'s, E: EvictionPolicy>(
    store: &'s CacheStore<'static, E>,
    trace: &Trace,
    keys: &Keys,
    i: usize,
    before_request: &impl Fn(u32),
    held: &mut Vec<PageRef<'s, 'static>>,
    lat: &mut Vec<(u64, u32)>,
    uncached: &AtomicU64,
) -> Result<(), Error> {
    before_request(i as u32);
    let guard = store.pin();
    let (req, hits) = lookup(store, trace, keys, i, &guard, held, lat)?;
    fill(store, trace, keys, i, hits, &req, &guard, held, uncached)?;
    held.clear();
    store.end_request(req)
}

/// Starts request `i` and takes references on its cached prefix
/// (appended to `held`), timing the lookup; returns the ticket and hits.
pub(crate) fn lookup<'s, E: EvictionPolicy>(
    store: &'s CacheStore<'static, E>,
    trace: &Trace,
    keys: &Keys,
    i: usize,
    guard: &Guard,
    held: &mut Vec<PageRef<'s, 'static>>,
    lat: &mut Vec<(u64, u32)>,
) -> Result<(RequestTicket, usize), Error> {
    let req = store.begin_request();
    let request_keys = &keys.per_request[i];
    let tokens = trace.requests[i].input_length as usize;
    // A runtime hashes a request's tokens into its keys just before the
    // lookup, so they are in cache then. The replay computed every key up
    // front (9 MB for the conversation trace); reading them here, outside
    // the timing, stands in for that hashing.
    std::hint::black_box(request_keys.iter().fold(0, |a, k| a ^ k.block.0));
    let t0 = Instant::now();
    let hits = store.lookup_prefix(&req, request_keys, tokens, guard, held)?;
    lat.push((t0.elapsed().as_nanos() as u64, hits as u32));
    Ok((req, hits))
}

/// Allocates and publishes request `i`'s blocks after its `hits`, holding
/// them in `held` (a request whose blocks get no pages caches nothing).
#[allow(clippy::too_many_arguments)]
pub(crate) fn fill<'s, E: EvictionPolicy>(
    store: &'s CacheStore<'static, E>,
    trace: &Trace,
    keys: &Keys,
    i: usize,
    hits: usize,
    req: &RequestTicket,
    guard: &Guard,
    held: &mut Vec<PageRef<'s, 'static>>,
    uncached: &AtomicU64,
) -> Result<(), Error> {
    let (keys, input_length) = (&keys.per_request[i], trace.requests[i].input_length);
    let missing = (keys.len() - hits) as u32;
    if missing == 0 {
        return Ok(());
    }
    match store.allocate(missing, guard) {
        Ok(pages) => {
            let bt = u64::from(TRACE_BLOCK_TOKENS);
            for (key, page) in keys[hits..].iter().zip(pages) {
                let start = u64::from(key.block_index) * bt;
                let valid = (input_length - start).min(bt) as u32;
                let r = store.publish(req, page, *key, held.last(), valid, guard)?;
                held.push(r);
            }
            Ok(())
        }
        Err(Error::CapacityExhausted(_)) => {
            uncached.fetch_add(1, Relaxed);
            Ok(())
        }
        Err(e) => Err(e),
    }
}
