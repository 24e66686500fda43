//! The ZeroMQ side: a publishing socket for batches and a ROUTER socket
//! that replays recent ones.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use kvslice_core::events::{KvEvent, Medium, number_is_before};
use kvslice_core::{CacheStore, EvictionPolicy};

use crate::wire::{encode, fold};

/// Where and how a [`Publisher`] sends.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// The publishing socket's endpoint, e.g. `tcp://127.0.0.1:5557`
    /// (`tcp://127.0.0.1:*` picks a free port; see
    /// [`Publisher::endpoint`]).
    pub endpoint: String,
    /// The replay socket's endpoint (ROUTER), or `None` for no replay.
    pub replay_endpoint: Option<String>,
    /// The topic frame every batch starts with.
    pub topic: String,
    /// Batches kept for replay.
    pub replay_batches: usize,
    /// Events per batch at most.
    pub max_batch_events: usize,
    /// Tokens per page of the store (sent as `block_size`).
    pub block_size: u32,
    /// The publishing socket's high-water mark: messages queued per subscriber
    /// before ZeroMQ drops (a slow consumer then sees a sequence gap).
    pub send_hwm: i32,
    /// Snapshots that peers ask for ([`RESYNC_REQUEST`]) come at most this
    /// often: a snapshot sends every cached block, so a store of millions
    /// of blocks may want a longer interval than the default
    /// ([`MIN_RESYNC_INTERVAL`]).
    pub min_resync_interval: std::time::Duration,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://127.0.0.1:*".into(),
            replay_endpoint: Some("tcp://127.0.0.1:*".into()),
            topic: "kv-events".into(),
            replay_batches: 10_000,
            max_batch_events: 1024,
            block_size: 16,
            send_hwm: 100_000,
            min_resync_interval: MIN_RESYNC_INTERVAL,
        }
    }
}

/// Replay requests one [`Publisher::serve_replay`] call answers at most.
pub const MAX_REPLAY_REQUESTS: usize = 16;

/// The largest frame a peer may send the replay socket (a request is at
/// most an empty delimiter and 8 bytes); libzmq disconnects a peer that
/// sends a larger one instead of buffering it. It bounds frames, not how
/// many a message has: see `docs/EVENTS.md` for what a peer can still
/// make the publisher hold.
pub const MAX_REPLAY_REQUEST_BYTES: i64 = 256;

/// The largest frame a consumer may send the publishing socket: a
/// subscription, one byte and the topic.
pub const MAX_SUBSCRIPTION_BYTES: i64 = 4096;

/// The start number of a resynchronisation request: no reply; the next
/// [`Publisher::pump`] at least [`PublisherConfig::min_resync_interval`]
/// after the last snapshot sends `AllBlocksCleared` and the store's
/// blocks. A subscriber asks this when a replay could not supply batches
/// it missed (the
/// publisher no longer keeps them), so its index stops naming blocks whose
/// removal it never saw. No batch carries this number.
pub const RESYNC_REQUEST: u64 = u64::MAX;

/// The default [`PublisherConfig::min_resync_interval`]: a peer that asks
/// for snapshots without pause costs one per second, not one per pump.
pub const MIN_RESYNC_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Publishes a store's events: drain its ring with [`pump`](Self::pump),
/// answer replay requests with [`serve_replay`](Self::serve_replay), from
/// one thread (ZeroMQ sockets are not shared between threads).
///
/// The publishing socket is an XPUB: consumers connect plain SUB sockets,
/// and the publisher sees their subscriptions
/// ([`subscribers`](Self::subscribers)), so an embedder can wait for a
/// router before its first batch instead of losing it to ZeroMQ's slow
/// joiner. [`Subscriber`](crate::Subscriber) has an example of both ends.
///
/// Each message is three frames: the topic, the batch's sequence number
/// (8 bytes, big-endian; numbers rise by one per batch), and the msgpack
/// batch ([`crate::wire`]). A replay request is an empty delimiter frame
/// and the first wanted sequence number (8 bytes, big-endian), as vLLM's
/// replay socket takes it; the reply is one `["", sequence, batch]`
/// message per kept batch from there, then `["", -1 as 8 bytes, empty]`.
/// (A request without the delimiter is answered without it.) A request
/// for [`RESYNC_REQUEST`] asks for a snapshot instead, through the
/// publishing socket.
pub struct Publisher {
    config: PublisherConfig,
    _ctx: zmq::Context,
    publish: zmq::Socket,
    replay: Option<zmq::Socket>,
    next_seq: u64,
    kept: VecDeque<(u64, Vec<u8>)>,
    /// The ring's drop count when last seen.
    dropped: u64,
    resyncs: u64,
    /// Whether a first pump sent the store's snapshot.
    started: bool,
    /// A peer asked for a snapshot ([`RESYNC_REQUEST`]).
    resync_asked: bool,
    /// When the last snapshot was sent.
    last_snapshot: Option<std::time::Instant>,
    /// After a resync: events numbered below this were in the ring, or
    /// being written to it, when the snapshot began; they are not sent.
    cut: Option<u64>,
    subscribers: usize,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.config.endpoint)
            .field("next_seq", &self.next_seq)
            .field("resyncs", &self.resyncs)
            .finish()
    }
}

impl Publisher {
    /// Binds the sockets.
    pub fn bind(config: PublisherConfig) -> Result<Self, zmq::Error> {
        let ctx = zmq::Context::new();
        let mut publish = ctx.socket(zmq::XPUB)?;
        // Every subscribe and unsubscribe reaches us, not only a topic's
        // first and last, so the count stays right as consumers come and
        // go (XPUB_VERBOSE alone forwards an unsubscribe only when a
        // topic's last subscription goes).
        publish.set_xpub_verbose(true)?;
        set_xpub_verboser(&mut publish)?;
        publish.set_sndhwm(config.send_hwm)?;
        publish.set_maxmsgsize(MAX_SUBSCRIPTION_BYTES)?;
        publish.set_linger(0)?;
        publish.bind(&config.endpoint)?;
        let replay = match &config.replay_endpoint {
            Some(ep) => {
                let s = ctx.socket(zmq::ROUTER)?;
                s.set_linger(0)?;
                // Room for one whole reply per peer (the kept batches and
                // the end marker), and no more: a peer that asks and never
                // reads holds one reply's memory, not one per request.
                // Mandatory routing makes a full pipe an EAGAIN to act on
                // instead of a silent drop.
                let reply = config.replay_batches.saturating_add(1);
                s.set_sndhwm(i32::try_from(reply).unwrap_or(i32::MAX))?;
                s.set_router_mandatory(true)?;
                // Requests are tiny: no frame of one is larger.
                s.set_maxmsgsize(MAX_REPLAY_REQUEST_BYTES)?;
                s.bind(ep)?;
                Some(s)
            }
            None => None,
        };
        Ok(Self {
            config,
            _ctx: ctx,
            publish,
            replay,
            next_seq: 0,
            kept: VecDeque::new(),
            dropped: 0,
            resyncs: 0,
            started: false,
            resync_asked: false,
            last_snapshot: None,
            cut: None,
            subscribers: 0,
        })
    }

    /// The publishing socket's bound endpoint (with the port a `*` picked).
    pub fn endpoint(&self) -> String {
        last_endpoint(&self.publish)
    }

    /// The replay socket's bound endpoint.
    pub fn replay_endpoint(&self) -> Option<String> {
        self.replay.as_ref().map(last_endpoint)
    }

    /// The sequence number the next batch gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Snapshots sent after the first pump's: the ring had dropped events,
    /// or a peer asked for one ([`RESYNC_REQUEST`]).
    pub fn resyncs(&self) -> u64 {
        self.resyncs
    }

    /// Subscriptions live now: subscribes minus unsubscribes seen so far
    /// (a consumer subscribed to two topics counts twice; one that
    /// disconnects unsubscribes). Reads what consumers sent without
    /// waiting.
    pub fn subscribers(&mut self) -> Result<usize, zmq::Error> {
        while self.publish.poll(zmq::POLLIN, 0)? > 0 {
            let msg = self.publish.recv_bytes(0)?;
            match msg.first() {
                Some(1) => self.subscribers += 1,
                Some(0) => self.subscribers = self.subscribers.saturating_sub(1),
                _ => {}
            }
        }
        Ok(self.subscribers)
    }

    /// Sends every event in `store`'s ring as batches and returns how many
    /// were sent (none if it has no ring). On the first call, and whenever
    /// the ring dropped events since the last call (consumers cannot know
    /// which), the first batch is `AllBlocksCleared` followed by the
    /// store's current blocks ([`CacheStore::snapshot`]), then the ring's
    /// newer events: a consumer's index is exact once they apply, also
    /// for a store that held blocks before this publisher existed (a
    /// publisher restarted beside a running store). It sends a snapshot
    /// too when a peer asked for one ([`RESYNC_REQUEST`]) and
    /// [`min_resync_interval`](PublisherConfig::min_resync_interval) has
    /// passed since the last. Call it from one thread, for one store.
    pub fn pump<E: EvictionPolicy>(
        &mut self,
        store: &CacheStore<'_, E>,
    ) -> Result<usize, zmq::Error> {
        let Some(ring) = store.events() else {
            return Ok(0);
        };
        let mut events = Vec::new();
        let dropped = ring.dropped();
        let asked = self.resync_asked
            && self
                .last_snapshot
                .is_none_or(|t| t.elapsed() >= self.config.min_resync_interval);
        if !self.started || dropped != self.dropped || asked {
            if self.started {
                self.resyncs += 1;
            }
            self.started = true;
            self.dropped = dropped;
            self.resync_asked = false;
            self.last_snapshot = Some(std::time::Instant::now());
            // Every event numbered below the cut was pushed, or claimed,
            // before the snapshot began: the snapshot already says it.
            // They are dropped, the ones a drain meets now and the ones
            // whose producers finish writing later (a drain stops at a
            // claimed slot not yet written, and the events after it wait).
            self.cut = Some(ring.next_number());
            events.push(KvEvent::Cleared);
            store.snapshot(&mut |e| events.push(e));
        }
        let cut = self.cut;
        let mut past_cut = false;
        ring.try_drain(&mut |n, e| match cut {
            Some(c) if number_is_before(n, c) => {}
            _ => {
                past_cut = true;
                events.push(e);
            }
        });
        if past_cut {
            // The drain passed the cut: nothing older is left, since
            // events drain in number order.
            self.cut = None;
        }
        self.send(&events, ring.medium())
    }

    /// Sends `events` as batches of at most the configured size; returns
    /// how many batches. If a send fails, that batch and the rest are
    /// still numbered (and kept for replay, where there is a replay
    /// socket), and the first error is returned.
    pub fn send(&mut self, events: &[KvEvent], medium: Medium) -> Result<usize, zmq::Error> {
        let (mut sent, mut failed) = (0, None);
        for chunk in events.chunks(self.config.max_batch_events.max(1)) {
            let wire = fold(chunk, self.config.block_size, medium);
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let payload = encode(ts, &wire);
            let seq = self.next_seq;
            self.next_seq += 1;
            // A batch that fails to send keeps its number, and so do the
            // rest of the call's: kept for replay all the same, they are
            // a gap a subscriber can fill, not a hole.
            if failed.is_none() {
                match self.publish.send_multipart(
                    [
                        self.config.topic.as_bytes(),
                        &seq.to_be_bytes()[..],
                        &payload[..],
                    ],
                    0,
                ) {
                    Ok(()) => sent += 1,
                    Err(e) => failed = Some(e),
                }
            }
            if self.replay.is_some() && self.config.replay_batches > 0 {
                if self.kept.len() == self.config.replay_batches {
                    self.kept.pop_front();
                }
                self.kept.push_back((seq, payload));
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(sent),
        }
    }

    /// Answers replay requests: waits up to `timeout_ms` for the first (0:
    /// only those waiting now), then answers those already queued, at most
    /// [`MAX_REPLAY_REQUESTS`] in one call, so a peer that floods requests
    /// cannot hold the caller; returns how many were handled (snapshot
    /// requests included, which get no reply). A request whose last frame
    /// (after the peer's identity and any empty delimiters) is not 8 bytes
    /// gets the end marker only; one for [`RESYNC_REQUEST`] gets no reply,
    /// and a later [`pump`](Self::pump) sends a snapshot. A peer whose pipe
    /// is full (it asked before and has not read) or that is gone gets the
    /// rest of that reply dropped; a [`Subscriber`](crate::Subscriber) then
    /// times out and asks again.
    pub fn serve_replay(&mut self, timeout_ms: i64) -> Result<usize, zmq::Error> {
        let Some(replay) = &self.replay else {
            return Ok(0);
        };
        let mut answered = 0;
        let mut wait = timeout_ms;
        while answered < MAX_REPLAY_REQUESTS && replay.poll(zmq::POLLIN, wait)? > 0 {
            wait = 0;
            let frames = replay.recv_multipart(0)?;
            let Some((identity, rest)) = frames.split_first() else {
                continue;
            };
            // A REQ peer puts an empty delimiter before its request; the
            // reply needs it back. (Such a peer reads only the reply's
            // first message: DEALER is the documented peer.)
            let envelope: Vec<&[u8]> = std::iter::once(identity.as_slice())
                .chain(rest.iter().take_while(|f| f.is_empty()).map(Vec::as_slice))
                .collect();
            let start = match rest.last().map(|f| <[u8; 8]>::try_from(f.as_slice())) {
                Some(Ok(b)) => Some(u64::from_be_bytes(b)),
                _ => None,
            };
            answered += 1;
            if start == Some(RESYNC_REQUEST) {
                self.resync_asked = true;
                continue;
            }
            // Sends `[seq, payload]` after the envelope; false when the rest
            // of this reply is to be dropped (the peer's pipe is full, or
            // the peer is gone).
            let send = |seq: &[u8], payload: &[u8]| -> Result<bool, zmq::Error> {
                let mut msg = envelope.clone();
                msg.extend([seq, payload]);
                match replay.send_multipart(msg, zmq::DONTWAIT) {
                    Ok(()) => Ok(true),
                    Err(zmq::Error::EAGAIN | zmq::Error::EHOSTUNREACH) => Ok(false),
                    Err(e) => Err(e),
                }
            };
            let batches = start
                .into_iter()
                .flat_map(|start| self.kept.iter().filter(move |(s, _)| *s >= start));
            let mut whole = true;
            for (seq, payload) in batches {
                whole = send(&seq.to_be_bytes(), payload)?;
                if !whole {
                    break;
                }
            }
            if whole {
                send(&(-1i64).to_be_bytes(), &[])?;
            }
        }
        Ok(answered)
    }
}

/// Sets libzmq's `ZMQ_XPUB_VERBOSER` on `s` (the zmq crate has no setter):
/// unsubscribes are forwarded too, every one.
fn set_xpub_verboser(s: &mut zmq::Socket) -> Result<(), zmq::Error> {
    let on: std::ffi::c_int = 1;
    // SAFETY: `s` is a live socket, so its pointer is valid for the call;
    // the option takes an int, passed by address with its size.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            s.as_mut_ptr(),
            zmq_sys::ZMQ_XPUB_VERBOSER as std::ffi::c_int,
            (&raw const on).cast(),
            std::mem::size_of::<std::ffi::c_int>(),
        )
    };
    match rc {
        0 => Ok(()),
        // SAFETY: reads the calling thread's errno as libzmq set it.
        _ => Err(zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })),
    }
}

fn last_endpoint(s: &zmq::Socket) -> String {
    match s.get_last_endpoint() {
        Ok(Ok(ep)) => ep,
        _ => String::new(),
    }
}
