//! The tier: a spill queue drained by writer threads, prefix fetches on
//! the caller's thread from a small pool of per-node connections, and
//! backoff after failures, per node and, when no slot map can be read,
//! for the whole tier.

use crossbeam_queue::ArrayQueue;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{TierConfig, TierError};
use crate::nodes::{Got, Health, Item, Nodes, Outcome, backoff};
use crate::stats::{Counters, TierStats};
use crate::value;
use kvslice_core::{KvLayout, SliceKey, SpillSink};

/// One block on its way to Redis.
struct Spill {
    key: SliceKey,
    valid_tokens: u32,
    bytes: Vec<u8>,
}

/// Blocks a spill writer writes per batch.
const SPILL_BATCH: usize = 64;

/// State shared by the tier handle, its spill sinks and its spill thread.
struct Shared {
    cfg: TierConfig,
    layout: KvLayout,
    /// Whether the URLs name a cluster (else one server).
    cluster: bool,
    /// Idle per-node connections for fetches (the spill writers keep
    /// their own).
    idle: Mutex<Vec<Nodes>>,
    /// Nodes in their backoff, for fetches and writers alike.
    health: Health,
    counters: Counters,
    /// Spills queued and not yet finished (written, refused or dropped).
    pending: AtomicU64,
    /// While `Instant::now()` is before this, the tier is not tried: no
    /// URL gave a slot map.
    down_until: Mutex<Option<Instant>>,
    /// Such failures in a row, for the backoff's doubling.
    failures: AtomicU64,
    /// Page copies the writers are done with, for the next spills: a
    /// fresh 64 KiB allocation per spill costs page faults on both sides.
    free: ArrayQueue<Vec<u8>>,
}

/// A shared tier on Redis Cluster (or one Redis server) for blocks of one
/// page layout.
///
/// Evicted blocks reach it through [`RedisTier::sink`] (attach it with
/// [`CacheStore::with_spill`](kvslice_core::CacheStore::with_spill)), which
/// queues a copy and returns; [`TierConfig::spill_threads`] threads write
/// the queue out in pipelines. [`RedisTier::fetch`] reads a prefix's
/// continuation on the caller's thread. Neither ever fails: errors are
/// counted in [`RedisTier::stats`]. A node whose connection fails is left
/// alone for a backoff that doubles up to [`TierConfig::max_backoff`]
/// while the other nodes serve their keys; the whole tier is, when no
/// URL answers for the slot map. [`crate::TieredStore`] puts the two
/// together around a store.
///
/// ```no_run
/// use kvslice_core::{CacheStore, DensityPolicy, KvDtype, KvLayout, LayoutSpec};
/// use kvslice_redis::{RedisTier, TierConfig};
///
/// let layout = KvLayout::new(LayoutSpec::new(30, 9, 3, 64, 16, KvDtype::F16))?;
/// let tier = RedisTier::open(layout, TierConfig::new("redis://127.0.0.1:7000"))?;
/// let store = CacheStore::new(layout, 1000, DensityPolicy::new(1000))?
///     .with_spill(Box::new(tier.sink()))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisTier {
    shared: Arc<Shared>,
    queue: Option<SyncSender<Spill>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RedisTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTier")
            .field(
                "urls",
                &self
                    .shared
                    .cfg
                    .urls
                    .iter()
                    .map(|u| crate::config::redact(u))
                    .collect::<Vec<_>>(),
            )
            .field("cluster", &self.shared.cluster)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RedisTier {
    /// Connects to the tier for pages of `layout`. Fails at once, with the
    /// reason, when no URL answers, the scheme is wrong, the credentials
    /// are refused, or a cluster's state is not `ok`.
    pub fn open(layout: KvLayout, cfg: TierConfig) -> Result<Self, TierError> {
        let cluster = crate::conn::open(&cfg)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.spill_queue);
        let spill_threads = cfg.spill_threads;
        let shared = Arc::new(Shared {
            cfg,
            layout,
            cluster,
            idle: Mutex::new(Vec::new()),
            health: Health::default(),
            counters: Counters::default(),
            pending: AtomicU64::new(0),
            down_until: Mutex::new(None),
            failures: AtomicU64::new(0),
            free: ArrayQueue::new(2 * SPILL_BATCH * spill_threads),
        });
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..shared.cfg.spill_threads)
            .map(|i| {
                let (worker, rx) = (Arc::clone(&shared), Arc::clone(&rx));
                std::thread::Builder::new()
                    .name(format!("kvslice-redis-spill-{i}"))
                    .spawn(move || spill_loop(&worker, &rx))
                    .map_err(|e| TierError::Resources(format!("cannot start a spill thread: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            shared,
            queue: Some(tx),
            threads,
        })
    }

    /// Whether the tier turned out to be a cluster.
    pub fn is_cluster(&self) -> bool {
        self.shared.cluster
    }

    /// The configuration the tier was opened with.
    pub fn config(&self) -> &TierConfig {
        &self.shared.cfg
    }

    /// The counters so far.
    pub fn stats(&self) -> TierStats {
        self.shared.counters.snapshot()
    }

    /// The layout of the pages it holds.
    pub fn layout(&self) -> &KvLayout {
        &self.shared.layout
    }

    /// A sink that queues evicted blocks for this tier (see
    /// [`SpillSink`]); as many as wanted, for several stores of the
    /// tier's layout (a page of another size is dropped and counted).
    pub fn sink(&self) -> TierSink {
        TierSink {
            shared: Arc::clone(&self.shared),
            queue: self
                .queue
                .clone()
                .expect("the queue lives as long as the tier"),
        }
    }

    /// Queues block `key` for writing, without waiting: what the sink does
    /// on eviction, and what write-through does on publish. Returns
    /// whether it was queued (a full queue drops it and counts).
    pub fn spill(&self, key: &SliceKey, valid_tokens: u32, page: &[u8]) -> bool {
        let queue = self
            .queue
            .as_ref()
            .expect("the queue lives as long as the tier");
        enqueue(&self.shared, queue, key, valid_tokens, page)
    }

    /// Waits until every queued spill is written, refused or dropped, or
    /// `timeout` passes; returns whether the queue emptied.
    pub fn flush(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        // Acquire, with the writers' Release: the counters of every spill
        // done are visible once the queue reads empty.
        while self.shared.pending.load(Acquire) > 0 {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }

    /// Reads the continuation of a prefix: the values of `keys` in order,
    /// stopping at the first one Redis lacks, that is not intact, or that
    /// `take` declines (returns `false` for). `take` gets the index into
    /// `keys`, the valid-token count and the page bytes. Returns how many
    /// blocks were taken. Asks `fetch_batch` keys per round trip (one
    /// pipeline per node on a cluster).
    pub fn fetch(
        &self,
        keys: &[SliceKey],
        take: &mut dyn FnMut(usize, u32, &[u8]) -> bool,
    ) -> usize {
        let s = &*self.shared;
        if keys.is_empty() {
            return 0;
        }
        if s.is_down() {
            Counters::add(&s.counters.skipped_while_down, 1);
            return 0;
        }
        Counters::add(&s.counters.fetches, 1);
        let mut nodes = s
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| Nodes::new(s.cluster));
        // Only the round trips count: what `take` does with a page (an
        // allocation, its evictions, a publish) is the caller's time.
        let mut waited = Duration::ZERO;
        let mut taken = 0;
        'batches: for batch in keys.chunks(s.cfg.fetch_batch) {
            let names: Vec<String> = batch.iter().map(|k| s.redis_key(k)).collect();
            let sent = Instant::now();
            let answer = nodes.read(&s.cfg, &s.health, &names);
            waited += sent.elapsed();
            let Ok(replies) = answer else {
                Counters::add(&s.counters.fetch_errors, 1);
                s.failed();
                break;
            };
            // A node answered: the tier is up (a map kept while every node
            // backs off, all keys skipped, says nothing).
            if replies
                .iter()
                .any(|g| !matches!(g, Got::Skipped | Got::Failed))
            {
                s.failures.store(0, Relaxed);
            }
            let bytes_in: usize = replies
                .iter()
                .map(|g| match g {
                    Got::Data(b) => b.len(),
                    _ => 0,
                })
                .sum();
            Counters::add(&s.counters.fetched_bytes, bytes_in as u64);
            for ((key, name), got) in batch.iter().zip(&names).zip(replies) {
                let bytes = match got {
                    Got::Data(bytes) => bytes,
                    Got::Nil | Got::Elsewhere => break 'batches,
                    Got::Skipped => {
                        Counters::add(&s.counters.skipped_while_down, 1);
                        break 'batches;
                    }
                    Got::Refused | Got::Failed => {
                        Counters::add(&s.counters.fetch_errors, 1);
                        break 'batches;
                    }
                };
                match value::decode(&s.layout, key, &bytes) {
                    Ok((tokens, page)) => {
                        if !take(taken, tokens, page) {
                            break 'batches;
                        }
                        taken += 1;
                        Counters::add(&s.counters.fetched_blocks, 1);
                    }
                    Err(e) => {
                        Counters::add(&s.counters.bad_values, 1);
                        // A value of another format version or layout is
                        // someone's data: left alone. The rest is garbage.
                        if !matches!(
                            e,
                            value::ValueError::Version(_) | value::ValueError::Layout { .. }
                        ) {
                            nodes.delete(&s.cfg, &s.health, name);
                        }
                        break 'batches;
                    }
                }
            }
            if batch.len() < s.cfg.fetch_batch {
                break;
            }
        }
        s.counters.latency.record(waited);
        s.idle.lock().unwrap_or_else(|e| e.into_inner()).push(nodes);
        taken
    }

    /// The Redis key block `key` is stored under:
    /// `<namespace>:<hash>:<index>:<group>:<shard>`, the hash in hex.
    pub fn redis_key(&self, key: &SliceKey) -> String {
        self.shared.redis_key(key)
    }
}

impl Drop for RedisTier {
    fn drop(&mut self) {
        // Closing the queue ends the spill threads once they have written
        // what was queued (sinks still held elsewhere keep it open; the
        // threads are then left to finish on their own).
        self.queue = None;
        if Arc::strong_count(&self.shared) <= 1 + self.threads.len() {
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

/// Queues evicted blocks for a [`RedisTier`]; what
/// [`CacheStore::with_spill`](kvslice_core::CacheStore::with_spill) takes.
/// Copies the page and returns; never waits on the network.
pub struct TierSink {
    shared: Arc<Shared>,
    queue: SyncSender<Spill>,
}

impl SpillSink for TierSink {
    fn evicted(&self, key: &SliceKey, valid_tokens: u32, page: &[u8]) {
        enqueue(&self.shared, &self.queue, key, valid_tokens, page);
    }

    fn layout(&self) -> Option<&KvLayout> {
        Some(&self.shared.layout)
    }
}

fn enqueue(
    s: &Shared,
    queue: &SyncSender<Spill>,
    key: &SliceKey,
    valid_tokens: u32,
    page: &[u8],
) -> bool {
    if page.len() != s.layout.page_bytes() {
        Counters::add(&s.counters.spill_dropped, 1);
        return false;
    }
    s.pending.fetch_add(1, Relaxed);
    let mut bytes = s.free.pop().unwrap_or_default();
    bytes.clear();
    bytes.extend_from_slice(page);
    let item = Spill {
        key: *key,
        valid_tokens,
        bytes,
    };
    match queue.try_send(item) {
        Ok(()) => true,
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            Counters::add(&s.counters.spill_dropped, 1);
            s.pending.fetch_sub(1, Release);
            false
        }
    }
}

/// One of the spill writers: takes up to [`SPILL_BATCH`] queued blocks at a
/// time and writes them, one packed pipeline per node, on its own
/// connections ([`Nodes`]).
fn spill_loop(s: &Shared, rx: &Mutex<Receiver<Spill>>) {
    let mut batch: Vec<Spill> = Vec::with_capacity(SPILL_BATCH);
    let mut writer = Nodes::new(s.cluster);
    let ttl_ms = s
        .cfg
        .ttl
        .map(|t| t.as_millis().clamp(1, u128::from(u64::MAX)) as u64);
    loop {
        {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(first) => batch.push(first),
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
            while batch.len() < SPILL_BATCH {
                match rx.try_recv() {
                    Ok(more) => batch.push(more),
                    Err(_) => break,
                }
            }
        }
        let n = batch.len() as u64;
        if s.is_down() {
            Counters::add(&s.counters.spill_failed, n);
        } else {
            let keys: Vec<String> = batch.iter().map(|b| s.redis_key(&b.key)).collect();
            let headers: Vec<[u8; value::HEADER_BYTES]> = batch
                .iter()
                .map(|b| value::header(&s.layout, &b.key, b.valid_tokens, &b.bytes))
                .collect();
            let items: Vec<Item<'_>> = batch
                .iter()
                .zip(&keys)
                .zip(&headers)
                .map(|((b, key), header)| Item {
                    key,
                    header,
                    page: &b.bytes,
                })
                .collect();
            let written =
                writer.write(
                    &s.cfg,
                    &s.health,
                    &items,
                    ttl_ms,
                    &mut |i, outcome| match outcome {
                        Outcome::Stored => {
                            Counters::add(&s.counters.spilled_blocks, 1);
                            Counters::add(
                                &s.counters.spilled_bytes,
                                (value::HEADER_BYTES + batch[i].bytes.len()) as u64,
                            );
                        }
                        Outcome::Refused => Counters::add(&s.counters.spill_rejected, 1),
                        Outcome::Unrouted => Counters::add(&s.counters.spill_unrouted, 1),
                        Outcome::Failed => Counters::add(&s.counters.spill_failed, 1),
                    },
                );
            if written.is_ok() {
                s.failures.store(0, Relaxed);
            } else {
                s.failed();
            }
        }
        s.pending.fetch_sub(n, Release);
        for b in batch.drain(..) {
            // A full free list drops the copy instead.
            let _ = s.free.push(b.bytes);
        }
    }
}

impl Shared {
    fn redis_key(&self, key: &SliceKey) -> String {
        format!(
            "{}:{:032x}:{}:{}:{}",
            self.cfg.namespace, key.block.0, key.block_index, key.layer_group, key.head_shard
        )
    }

    fn is_down(&self) -> bool {
        let down = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        down.is_some_and(|t| Instant::now() < t)
    }

    /// No slot map: the whole tier is left alone for a backoff.
    fn failed(&self) {
        let n = self.failures.fetch_add(1, Relaxed).min(16) as u32;
        let wait = backoff(&self.cfg, n);
        *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + wait);
    }
}
