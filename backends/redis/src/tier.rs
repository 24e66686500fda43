//! The tier: a spill queue drained by one thread, prefix fetches on the
//! caller's thread, a small pool of connections, and backoff after
//! failures.

use crossbeam_queue::ArrayQueue;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvslice_core::{KvLayout, SliceKey, SpillSink};
use redis::Cmd;

use crate::config::{TierConfig, TierError};
use crate::conn::{Conn, Connector, Reply};
use crate::stats::{Counters, TierStats};
use crate::value;
use crate::writer::{Item, Outcome, Writer};

/// One block on its way to Redis.
struct Spill {
    key: SliceKey,
    valid_tokens: u32,
    bytes: Vec<u8>,
}

/// Blocks the spill thread writes per pipeline.
const SPILL_BATCH: usize = 64;

/// State shared by the tier handle, its spill sinks and its spill thread.
struct Shared {
    cfg: TierConfig,
    layout: KvLayout,
    connector: Connector,
    /// Idle connections, for fetches and the spill thread alike.
    idle: Mutex<Vec<Conn>>,
    counters: Counters,
    /// Spills queued and not yet finished (written, refused or dropped).
    pending: AtomicU64,
    /// While `Instant::now()` is before this, the tier is not tried.
    down_until: Mutex<Option<Instant>>,
    /// Failures in a row, for the backoff's doubling.
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
/// the queue out in pipelines. [`RedisTier::fetch`] reads a prefix's continuation on the
/// caller's thread. Neither ever fails: errors are counted in
/// [`RedisTier::stats`], and after a connection failure the tier is left
/// alone for a backoff that doubles up to
/// [`TierConfig::max_backoff`]. [`crate::TieredStore`] puts the two
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
            .field("urls", &self.shared.cfg.urls)
            .field("cluster", &self.shared.connector.is_cluster())
            .field("stats", &self.stats())
            .finish()
    }
}

impl RedisTier {
    /// Connects to the tier for pages of `layout`. Fails at once, with the
    /// reason, when no URL answers, the scheme is wrong, the credentials
    /// are refused, or a cluster's state is not `ok`.
    pub fn open(layout: KvLayout, cfg: TierConfig) -> Result<Self, TierError> {
        let (connector, first) = Connector::open(&cfg)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.spill_queue);
        let spill_threads = cfg.spill_threads;
        let shared = Arc::new(Shared {
            cfg,
            layout,
            connector,
            idle: Mutex::new(vec![first]),
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
                    .map_err(|e| TierError::Connect(format!("cannot start a spill thread: {e}")))
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
        self.shared.connector.is_cluster()
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
        let Some(mut con) = s.take_conn() else {
            Counters::add(&s.counters.fetch_errors, 1);
            return 0;
        };
        // Only the round trips count: what `take` does with a page (an
        // allocation, its evictions, a publish) is the caller's time.
        let mut waited = Duration::ZERO;
        let mut taken = 0;
        let mut outcome = ConnState::Healthy;
        'batches: for batch in keys.chunks(s.cfg.fetch_batch) {
            let cmds: Vec<Cmd> = batch
                .iter()
                .map(|k| {
                    let mut c = redis::cmd("GET");
                    c.arg(s.redis_key(k));
                    c
                })
                .collect();
            let sent = Instant::now();
            let answer = con.run(cmds);
            waited += sent.elapsed();
            let values = match answer {
                Ok(v) => v,
                Err(e) => {
                    Counters::add(&s.counters.fetch_errors, 1);
                    outcome = if crate::conn::is_redirect(&e) {
                        ConnState::Stale
                    } else {
                        ConnState::Failed
                    };
                    break;
                }
            };
            for (key, v) in batch.iter().zip(values) {
                let Reply::Data(bytes) = v else {
                    if v != Reply::Nil {
                        Counters::add(&s.counters.fetch_errors, 1);
                    }
                    break 'batches;
                };
                match value::decode(&s.layout, key, &bytes) {
                    Ok((tokens, page)) => {
                        if !take(taken, tokens, page) {
                            break 'batches;
                        }
                        taken += 1;
                        Counters::add(&s.counters.fetched_blocks, 1);
                        Counters::add(&s.counters.fetched_bytes, bytes.len() as u64);
                    }
                    Err(_) => {
                        Counters::add(&s.counters.bad_values, 1);
                        let mut del = redis::cmd("DEL");
                        del.arg(s.redis_key(key));
                        // Best effort: a failure here is the next fetch's.
                        let _ = con.run(vec![del]);
                        break 'batches;
                    }
                }
            }
            if batch.len() < s.cfg.fetch_batch {
                break;
            }
        }
        s.counters.latency.record(waited);
        s.give_back(con, outcome);
        taken
    }

    /// The Redis key block `key` is stored under:
    /// `{namespace}:{hash}:{index}:{group}:{shard}`.
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
/// connections ([`Writer`]).
fn spill_loop(s: &Shared, rx: &Mutex<Receiver<Spill>>) {
    let mut batch: Vec<Spill> = Vec::with_capacity(SPILL_BATCH);
    let mut writer = Writer::new(s.connector.is_cluster());
    let ttl_ms = s.cfg.ttl.map(|t| t.as_millis().max(1) as u64);
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
            let healthy = writer.write(&s.cfg, &items, ttl_ms, &mut |i, outcome| match outcome {
                Outcome::Stored => {
                    Counters::add(&s.counters.spilled_blocks, 1);
                    Counters::add(
                        &s.counters.spilled_bytes,
                        (value::HEADER_BYTES + batch[i].bytes.len()) as u64,
                    );
                }
                Outcome::Refused => Counters::add(&s.counters.spill_rejected, 1),
                Outcome::Failed => Counters::add(&s.counters.spill_failed, 1),
            });
            if healthy {
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

    /// An idle connection, or a new one; `None` (and a backoff) when none
    /// can be made.
    fn take_conn(&self) -> Option<Conn> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(c) = idle {
            return Some(c);
        }
        match self.connector.connect(&self.cfg) {
            Ok(c) => Some(c),
            Err(_) => {
                self.failed();
                None
            }
        }
    }

    /// Returns a connection to the pool, or drops it: and the idle ones
    /// with it, which most likely point at the same failed node or hold
    /// the same stale slot map; after a failure, backs off too.
    fn give_back(&self, con: Conn, outcome: ConnState) {
        if outcome == ConnState::Healthy {
            self.failures.store(0, Relaxed);
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(con);
            return;
        }
        drop(con);
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        if outcome == ConnState::Failed {
            self.failed();
        }
    }

    fn failed(&self) {
        let n = self.failures.fetch_add(1, Relaxed).min(16);
        let wait = self
            .cfg
            .min_backoff
            .saturating_mul(1 << n)
            .min(self.cfg.max_backoff);
        *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + wait);
    }
}

/// How a connection came out of a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Healthy,
    /// Redirected (MOVED, ASK): the cluster moved slots since the
    /// connection read its map. Nothing failed; a new connection reads
    /// the map again.
    Stale,
    Failed,
}
