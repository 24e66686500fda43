//! The router's side: one SUB socket per worker, gap repair through each
//! worker's replay socket, and the prefix index the batches build.

use std::collections::VecDeque;

use crate::index::PrefixIndex;
use crate::sequence::{Live, RESTART_RUN, Replayed, Sequence};
use crate::wire::{Batch, decode};

/// One worker's publisher, as a subscriber reaches it.
#[derive(Debug, Clone)]
pub struct Source {
    /// Its publishing endpoint ([`Publisher::endpoint`](crate::Publisher::endpoint)).
    pub endpoint: String,
    /// Its replay endpoint, if it has one.
    pub replay_endpoint: Option<String>,
}

/// What a [`Subscriber`] received and what it made of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Batches applied to the index, live or replayed.
    pub batches: u64,
    /// Events applied.
    pub events: u64,
    /// Batches received out of a replay rather than live.
    pub replayed: u64,
    /// Sequence gaps found (each repaired, or counted in `unfilled`).
    pub gaps: u64,
    /// Batches a replay could not supply (the worker no longer kept them).
    pub unfilled: u64,
    /// Snapshots asked of workers ([`RESYNC_REQUEST`](crate::RESYNC_REQUEST))
    /// after losses of batches: until the snapshot arrives, the index may
    /// name blocks whose removal was in a lost batch, or miss blocks stored
    /// in one. A loss within the wait after a request (1 s by default,
    /// doubling with each request up to 60 times the first;
    /// [`Subscriber::with_resync_backoff`]) asks when the wait is over,
    /// unless a snapshot came meanwhile. Only workers whose [`Source`]
    /// names a replay endpoint are asked.
    pub resyncs_asked: u64,
    /// Messages that were not `[topic, 8-byte sequence, payload]`, or whose
    /// payload was not a batch: dropped, their sequence numbers not taken
    /// (a batch that was due is then a gap, replayed if the worker still
    /// keeps it).
    pub malformed: u64,
    /// Events of kinds the decoder does not know: skipped.
    pub unknown_events: u64,
    /// Live batches numbered below the newest one seen live: dropped as
    /// duplicates (or a publisher that went backwards), except a run of
    /// them that turns out to be a restarted publisher's new stream, which
    /// is applied then (and still counted here).
    pub backwards: u64,
    /// Publishers taken to have restarted: [`RESTART_RUN`](crate::RESTART_RUN) batches in a
    /// row numbered one after another below what was seen before.
    pub restarts: u64,
}

/// Batches one replay reply is read for at most; a reply still going
/// past them is cut off like one that timed out.
const MAX_REPLAY_BATCHES: usize = 1 << 16;

/// Messages one [`Subscriber::poll`] handles at most.
pub const MAX_POLL_MESSAGES: usize = 4096;

/// The wait after a worker's first snapshot request before the next; it
/// doubles with each request, up to 60 times this, and starts again from
/// here once 60 times this has passed since the last wait ended. A
/// snapshot that itself loses batches (one larger than what the worker
/// keeps for replay) is then not asked for on every gap.
pub const RESYNC_BACKOFF: std::time::Duration = std::time::Duration::from_secs(1);
const RESYNC_BACKOFF_ROUNDS: u32 = 60;

/// Problems kept for a log: the most recent ones.
const PROBLEMS_KEPT: usize = 32;

struct Worker {
    sub: zmq::Socket,
    /// The replay socket and where it connects (to connect anew).
    replay: Option<(zmq::Socket, String)>,
    /// A second connection to the replay socket for snapshot requests,
    /// never read: a publisher that answered them (one that does not know
    /// them, and answers an end marker) could not have its answer taken
    /// for a replay's.
    resync: Option<zmq::Socket>,
    /// Batches were lost since the last request or `AllBlocksCleared`: a
    /// snapshot is to be asked for.
    resync_due: bool,
    /// No snapshot is asked for before this.
    resync_after: Option<std::time::Instant>,
    /// The wait after the next request.
    resync_backoff: std::time::Duration,
    /// Its batch numbers.
    seq: Sequence,
    /// The decoded batches of the current run behind (at most
    /// `RESTART_RUN - 1`): if the run turns out to be a restart, they are
    /// the new stream's first batches, applied then instead of lost.
    behind: Vec<(u64, Batch)>,
}

/// Subscribes to every worker's events and keeps a [`PrefixIndex`] of what
/// each holds. Never panics on what arrives: bad messages are counted
/// ([`stats`](Self::stats)) and described ([`problems`](Self::problems)),
/// and the index keeps what it knew.
///
/// A batch whose sequence number skips ahead asks that worker's replay
/// socket for the missing range before it applies, so the index sees every
/// batch in order; the first batch from a worker asks for everything
/// before it the same way. A replay that times out is left behind with
/// its socket, so its late reply cannot answer a later request. A worker
/// whose numbers start again ([`RESTART_RUN`](crate::RESTART_RUN) batches in a row below
/// what it sent before) is taken to have restarted: forgotten, then
/// followed from its new start. Batches a replay cannot supply (a router
/// that joins late, or falls further behind than the worker keeps) make
/// it ask that worker for a snapshot
/// ([`RESYNC_REQUEST`](crate::RESYNC_REQUEST)), which comes as a live
/// `AllBlocksCleared` and the worker's blocks.
///
/// ```
/// use kvslice_core::events::{EventRing, Medium};
/// use kvslice_core::{BlockHash, CacheStore, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey};
/// use kvslice_events::{Publisher, PublisherConfig, Source, Subscriber};
///
/// // A worker: a store with an event ring, and its publisher.
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 16, KvDtype::F32))?;
/// let store = CacheStore::new(layout, 8, LruPolicy::new(8))?
///     .with_events(EventRing::new(256, Medium::Gpu));
/// let mut publisher = Publisher::bind(PublisherConfig::default())?;
/// // The router.
/// let mut router = Subscriber::connect(
///     &[Source { endpoint: publisher.endpoint(), replay_endpoint: publisher.replay_endpoint() }],
///     1_000,
/// )?;
/// while publisher.subscribers()? == 0 {
///     std::thread::sleep(std::time::Duration::from_millis(1));
/// }
/// // The worker caches a block and forwards its events.
/// let key = SliceKey { block: BlockHash(42), block_index: 0, layer_group: 0, head_shard: 0 };
/// let (guard, req) = (store.pin(), store.begin_request());
/// let page = store.allocate(1, &guard)?.pop().unwrap();
/// drop(store.publish(&req, page, key, None, 16, &guard)?);
/// store.end_request(req)?;
/// publisher.pump(&store)?;
/// // The router learns that worker 0 holds it.
/// assert!(router.sync(0, publisher.next_seq(), 5_000)?);
/// assert_eq!(router.index().overlaps(&[key]), [1]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Subscriber {
    ctx: zmq::Context,
    workers: Vec<Worker>,
    index: PrefixIndex,
    stats: SubscriberStats,
    problems: VecDeque<String>,
    replay_timeout_ms: i64,
    /// The first wait between snapshot requests.
    resync_backoff: std::time::Duration,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("workers", &self.workers.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl Subscriber {
    /// Connects to `sources` (worker `i` is `sources[i]`, at most
    /// [`MAX_WORKERS`](crate::index::MAX_WORKERS)), subscribing to every
    /// topic. A replay that does not answer within `replay_timeout_ms`
    /// leaves its gap unfilled.
    pub fn connect(sources: &[Source], replay_timeout_ms: i64) -> Result<Self, zmq::Error> {
        if sources.is_empty() || sources.len() > crate::index::MAX_WORKERS {
            return Err(zmq::Error::EINVAL);
        }
        let ctx = zmq::Context::new();
        let mut workers = Vec::with_capacity(sources.len());
        for s in sources {
            let sub = ctx.socket(zmq::SUB)?;
            sub.set_linger(0)?;
            sub.set_subscribe(b"")?;
            sub.connect(&s.endpoint)?;
            let (replay, resync) = match &s.replay_endpoint {
                Some(ep) => (
                    Some((replay_socket(&ctx, ep, None)?, ep.clone())),
                    // Whatever comes back on it is never read: keep little.
                    Some(replay_socket(&ctx, ep, Some(16))?),
                ),
                None => (None, None),
            };
            workers.push(Worker {
                sub,
                replay,
                resync,
                resync_due: false,
                resync_after: None,
                resync_backoff: RESYNC_BACKOFF,
                seq: Sequence::default(),
                behind: Vec::new(),
            });
        }
        Ok(Self {
            ctx,
            index: PrefixIndex::new(sources.len()),
            workers,
            stats: SubscriberStats::default(),
            problems: VecDeque::new(),
            replay_timeout_ms,
            resync_backoff: RESYNC_BACKOFF,
        })
    }

    /// Sets the first wait between a worker's snapshot requests (see
    /// [`RESYNC_BACKOFF`], the default).
    pub fn with_resync_backoff(mut self, wait: std::time::Duration) -> Self {
        self.resync_backoff = wait;
        for w in &mut self.workers {
            w.resync_backoff = wait;
        }
        self
    }

    /// The index built so far.
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Sizes the index's memory of departed blocks (see
    /// [`PrefixIndex::with_departed_slots`]); call it before the first
    /// event, as it forgets what the memory held.
    pub fn with_departed_slots(mut self, slots: usize) -> Self {
        self.index.resize_departed(slots);
        self
    }

    /// Counters.
    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// The most recent problems, oldest first, for a log.
    pub fn problems(&self) -> impl Iterator<Item = &str> {
        self.problems.iter().map(String::as_str)
    }

    /// The sequence number the next batch of `worker` should carry: every
    /// batch below it has been applied (or counted as unfilled).
    pub fn next_seq(&self, worker: usize) -> u64 {
        self.workers[worker].seq.next()
    }

    /// Forgets what `worker` held, and that it held anything: for a
    /// worker known to be gone or restarted ([`PrefixIndex::forget_worker`]).
    /// Its sequence numbers are forgotten too, so the next batch it sends
    /// starts a new stream, replayed from 0 where the publisher kept it.
    pub fn forget_worker(&mut self, worker: usize) {
        self.index.forget_worker(worker);
        self.workers[worker].seq.restart();
    }

    /// Applies the messages waiting now, after waiting up to `timeout_ms`
    /// for the first (0: no wait; -1: forever); returns how many messages
    /// were handled. At most [`MAX_POLL_MESSAGES`] per call, taken from
    /// the workers in turn, so that workers sending faster than the router
    /// applies cannot keep the call from returning; the rest wait for the
    /// next call.
    pub fn poll(&mut self, timeout_ms: i64) -> Result<usize, zmq::Error> {
        for w in 0..self.workers.len() {
            self.ask_resync(w)?;
        }
        let mut handled = 0;
        let mut wait = timeout_ms;
        while handled < MAX_POLL_MESSAGES {
            let mut items: Vec<zmq::PollItem<'_>> = self
                .workers
                .iter()
                .map(|w| w.sub.as_poll_item(zmq::POLLIN))
                .collect();
            if zmq::poll(&mut items, wait)? == 0 {
                return Ok(handled);
            }
            let ready: Vec<usize> = items
                .iter()
                .enumerate()
                .filter(|(_, i)| i.is_readable())
                .map(|(w, _)| w)
                .collect();
            drop(items);
            // A share each, then poll again: one busy worker cannot starve
            // the others or hold the call.
            let share = (MAX_POLL_MESSAGES / self.workers.len().max(1)).max(1);
            for w in ready {
                for _ in 0..share {
                    if handled == MAX_POLL_MESSAGES
                        || self.workers[w].sub.poll(zmq::POLLIN, 0)? == 0
                    {
                        break;
                    }
                    let frames = self.workers[w].sub.recv_multipart(0)?;
                    self.handle(w, &frames)?;
                    handled += 1;
                }
            }
            wait = 0;
        }
        Ok(handled)
    }

    /// Waits until every batch of `worker` below `seq` has been applied, or
    /// `timeout_ms` passed; returns whether it got there.
    pub fn sync(&mut self, worker: usize, seq: u64, timeout_ms: u64) -> Result<bool, zmq::Error> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
        while self.workers[worker].seq.next() < seq {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.poll(left.as_millis().max(1) as i64)?;
        }
        Ok(true)
    }

    fn problem(&mut self, what: String) {
        if self.problems.len() == PROBLEMS_KEPT {
            self.problems.pop_front();
        }
        self.problems.push_back(what);
    }

    fn handle(&mut self, w: usize, frames: &[Vec<u8>]) -> Result<(), zmq::Error> {
        let (seq, payload) = match frames {
            [_topic, seq, payload] => match <[u8; 8]>::try_from(seq.as_slice()) {
                Ok(b) => (u64::from_be_bytes(b), payload),
                Err(_) => {
                    self.stats.malformed += 1;
                    self.problem(format!(
                        "worker {w}: a sequence frame of {} bytes",
                        seq.len()
                    ));
                    return Ok(());
                }
            },
            _ => {
                self.stats.malformed += 1;
                self.problem(format!("worker {w}: a message of {} frames", frames.len()));
                return Ok(());
            }
        };
        if seq == u64::MAX {
            // Nothing can follow it: a publisher does not get there.
            self.stats.malformed += 1;
            self.problem(format!("worker {w}: sequence number {seq}"));
            return Ok(());
        }
        // A batch that does not decode does not move the numbers either:
        // its number may be as broken as its payload, and a wild one would
        // count real batches lost or behind. Its own number, if it was
        // right, becomes a gap that a replay can fill.
        let batch = match decode(payload) {
            Ok(batch) => batch,
            Err(e) => {
                self.stats.malformed += 1;
                self.problem(format!("worker {w}: batch {seq}: {e}"));
                return Ok(());
            }
        };
        let live = self.workers[w].seq.live(seq);
        if live == Live::Restarted {
            self.stats.restarts += 1;
            self.problem(format!("worker {w}: restarted (batch {seq})"));
            // The run that showed the restart began the new stream: offer
            // its batches again, in order, then this one.
            let run = std::mem::take(&mut self.workers[w].behind);
            self.forget_worker(w);
            for (s, b) in run {
                self.offer(w, s, b)?;
            }
            return self.offer(w, seq, batch);
        }
        self.settle(w, seq, batch, live)
    }

    /// Offers live batch `seq` of `w` to its numbers, as [`Self::handle`]
    /// does, after a restart.
    fn offer(&mut self, w: usize, seq: u64, batch: Batch) -> Result<(), zmq::Error> {
        let live = self.workers[w].seq.live(seq);
        self.settle(w, seq, batch, live)
    }

    /// Does what `live` says with batch `seq` of `w`.
    fn settle(&mut self, w: usize, seq: u64, batch: Batch, live: Live) -> Result<(), zmq::Error> {
        let behind = &mut self.workers[w].behind;
        match live {
            Live::Behind { last } => {
                // Kept while they run on one past another, the newest last.
                if behind
                    .last()
                    .is_some_and(|&(s, _)| s.wrapping_add(1) != seq)
                {
                    behind.clear();
                }
                if behind.len() + 1 >= RESTART_RUN as usize {
                    behind.remove(0);
                }
                behind.push((seq, batch));
                self.stats.backwards += 1;
                self.problem(format!("worker {w}: batch {seq} after {last}"));
            }
            Live::Gap { .. } => {
                behind.clear();
                self.stats.gaps += 1;
                self.fill(w, seq)?;
                // The replay may have brought this batch already.
                if seq == self.workers[w].seq.next() {
                    self.apply(w, seq, batch);
                }
            }
            Live::Next => {
                behind.clear();
                self.apply(w, seq, batch);
            }
            Live::Done | Live::Restarted => behind.clear(),
        }
        Ok(())
    }

    /// Asks `w`'s replay socket for every batch from the next one to apply
    /// on, and applies them in order: those below `to`, whatever below
    /// `to` it cannot supply being counted lost, then those from `to` on
    /// as long as they run on without a hole (the live stream may have
    /// dropped them too). A reply that starts past `to`, or leaves a hole
    /// after it, never decides the fate of the batches from `to` on: the
    /// live stream brings them, or shows them missing, a new gap.
    fn fill(&mut self, w: usize, to: u64) -> Result<(), zmq::Error> {
        let from = self.workers[w].seq.next();
        let mut got = Vec::new();
        let mut undecoded = Vec::new();
        let mut ended = true;
        if let Some((replay, _)) = &self.workers[w].replay {
            // Never wait to send: a replay socket that is not there would
            // queue requests until it blocked the router.
            ended = false;
            // An empty delimiter first, as a REQ socket would send: vLLM's
            // replay socket requires it, and ours echoes it back.
            let request = [&[][..], &from.to_be_bytes()[..]];
            let sent = match replay.send_multipart(request, zmq::DONTWAIT) {
                Ok(()) => true,
                Err(zmq::Error::EAGAIN) => false,
                Err(e) => return Err(e),
            };
            let deadline = std::time::Instant::now()
                + std::time::Duration::from_millis(self.replay_timeout_ms.max(0) as u64);
            // Every message counts toward the cap and the deadline holds
            // while messages keep coming: a peer that streams malformed
            // replies without an end cannot hold the router here.
            let mut received = 0;
            // The batch after the last one kept, while they run on.
            let mut expect = from;
            while sent && received < MAX_REPLAY_BATCHES {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if received > 0 && left.is_zero() {
                    break;
                }
                if replay.poll(zmq::POLLIN, left.as_millis() as i64)? == 0 {
                    break;
                }
                let frames = replay.recv_multipart(0)?;
                received += 1;
                let body = match frames.split_first() {
                    Some((delimiter, rest)) if delimiter.is_empty() => rest,
                    _ => &frames[..],
                };
                let [seq, payload] = body else {
                    self.stats.malformed += 1;
                    continue;
                };
                let Ok(seq) = <[u8; 8]>::try_from(seq.as_slice()).map(i64::from_be_bytes) else {
                    self.stats.malformed += 1;
                    continue;
                };
                if seq < 0 {
                    ended = true;
                    break;
                }
                // Nothing decoded or held for the rest: repeats, wild
                // numbers, and batches from `to` on after a hole.
                let seq = seq as u64;
                if seq < expect || (seq >= to && seq != expect) {
                    continue;
                }
                // As live: an undecodable batch takes no number.
                match decode(payload) {
                    Ok(batch) => {
                        expect = seq + 1;
                        got.push((seq, batch));
                    }
                    Err(e) => {
                        self.stats.malformed += 1;
                        undecoded.push(format!("worker {w}: replayed batch {seq}: {e}"));
                    }
                }
            }
        }
        for what in undecoded {
            self.problem(what);
        }
        if !ended {
            // What is left of this reply would answer the next request:
            // a new socket leaves it behind.
            self.problem(format!(
                "worker {w}: replay from {from} unanswered or cut off"
            ));
            self.reset_replay(w)?;
        }
        for (seq, batch) in got {
            let Replayed::Apply { lost } = self.workers[w].seq.replayed(seq) else {
                continue;
            };
            if !lost.is_empty() {
                self.unfilled(w, lost)?;
            }
            self.stats.replayed += 1;
            self.apply(w, seq, batch);
        }
        if let Some(lost) = self.workers[w].seq.filled(to) {
            self.unfilled(w, lost)?;
        }
        Ok(())
    }

    fn reset_replay(&mut self, w: usize) -> Result<(), zmq::Error> {
        if let Some((socket, ep)) = &mut self.workers[w].replay {
            // The old socket closes without lingering, late replies and all.
            *socket = replay_socket(&self.ctx, ep, None)?;
        }
        Ok(())
    }

    fn unfilled(&mut self, w: usize, lost: std::ops::Range<u64>) -> Result<(), zmq::Error> {
        let n = lost.end - lost.start;
        self.stats.unfilled = self.stats.unfilled.saturating_add(n);
        self.problem(format!("worker {w}: batches {lost:?} lost"));
        // What the lost batches did is unknown: ask for the whole state,
        // which comes live.
        self.workers[w].resync_due = true;
        self.ask_resync(w)
    }

    /// Asks `w` for a snapshot if one is due and the wait after the last
    /// request is over. Called on a loss and on every poll, so that a
    /// loss inside the wait asks when it ends.
    fn ask_resync(&mut self, w: usize) -> Result<(), zmq::Error> {
        let first = self.resync_backoff;
        let worker = &mut self.workers[w];
        let now = std::time::Instant::now();
        if !worker.resync_due || worker.resync_after.is_some_and(|t| now < t) {
            return Ok(());
        }
        let Some(resync) = &worker.resync else {
            worker.resync_due = false;
            return Ok(());
        };
        // Long quiet since the last request: start the waits over.
        if worker
            .resync_after
            .is_some_and(|t| now > t + first * RESYNC_BACKOFF_ROUNDS)
        {
            worker.resync_backoff = first;
        }
        let request = [&[][..], &crate::RESYNC_REQUEST.to_be_bytes()[..]];
        match resync.send_multipart(request, zmq::DONTWAIT) {
            Ok(()) => {
                worker.resync_due = false;
                worker.resync_after = Some(now + worker.resync_backoff);
                worker.resync_backoff =
                    (worker.resync_backoff * 2).min(first * RESYNC_BACKOFF_ROUNDS);
                self.stats.resyncs_asked += 1;
            }
            // Stays due: the next poll tries again.
            Err(zmq::Error::EAGAIN) => {
                self.problem(format!("worker {w}: could not ask for a snapshot"));
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Applies batch `seq` of worker `w`, decoded.
    fn apply(&mut self, w: usize, seq: u64, batch: Batch) {
        self.workers[w].seq.applied(seq);
        let Batch {
            events, skipped, ..
        } = batch;
        self.stats.batches += 1;
        self.stats.events += events.len() as u64;
        for e in &events {
            if matches!(e, crate::wire::WireEvent::Cleared) {
                // A snapshot follows (or the store was cleared): what was
                // lost before it no longer matters. The wait stays: a
                // snapshot that loses batches itself asks again only
                // after it.
                self.workers[w].resync_due = false;
            }
            self.index.apply(w, e);
        }
        if !skipped.is_empty() {
            self.stats.unknown_events += skipped.len() as u64;
            self.problem(format!("worker {w}: skipped events {skipped:?}"));
        }
    }
}

/// A DEALER connected to a worker's replay socket, not lingering on
/// close, with a receive high-water mark if given.
fn replay_socket(
    ctx: &zmq::Context,
    endpoint: &str,
    rcvhwm: Option<i32>,
) -> Result<zmq::Socket, zmq::Error> {
    let d = ctx.socket(zmq::DEALER)?;
    d.set_linger(0)?;
    if let Some(hwm) = rcvhwm {
        d.set_rcvhwm(hwm)?;
    }
    d.connect(endpoint)?;
    Ok(d)
}
