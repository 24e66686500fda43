//! KV cache events from kvslice stores, for routers.
//!
//! A store built with
//! [`CacheStore::with_events`](kvslice_core::CacheStore::with_events) pushes
//! one event per published or evicted block into a lock-free ring
//! ([`kvslice_core::events`]). A [`Publisher`] drains that ring into
//! batches, numbers them, encodes them as msgpack in the shape of vLLM's
//! `KVEventBatch` ([`wire`], field table in `docs/EVENTS.md`) and sends
//! them on a ZeroMQ PUB socket as `[topic, sequence, payload]`, keeping the
//! recent batches for a ROUTER replay socket. A consumer that finds a gap
//! in the sequence asks the replay socket for it; when the store's ring
//! itself dropped events, or a consumer asked for one
//! ([`RESYNC_REQUEST`]), the next batch starts with `AllBlocksCleared` and
//! a snapshot of the store, so consumers are exact again.
//!
//! On the router's side, a [`Subscriber`] follows many workers, repairs
//! gaps from their replay sockets (asking for a snapshot when a replay
//! cannot fill one) and keeps a [`PrefixIndex`](index::PrefixIndex):
//! which workers hold which blocks, and so how long a prefix of a new
//! request each could reuse.
//!
//! The ZeroMQ parts need the `zmq` feature (on by default; its build
//! compiles libzmq from source, so it needs a C++ compiler); the wire
//! format and the index do not.

pub mod index;
#[cfg(feature = "zmq")]
mod publisher;
#[cfg(any(feature = "zmq", feature = "fuzzing"))]
mod sequence;
#[cfg(feature = "zmq")]
mod subscriber;
pub mod wire;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;

#[cfg(feature = "zmq")]
pub use publisher::{
    MAX_REPLAY_REQUEST_BYTES, MAX_REPLAY_REQUESTS, MAX_SUBSCRIPTION_BYTES, MIN_RESYNC_INTERVAL,
    Publisher, PublisherConfig, RESYNC_REQUEST,
};
#[cfg(feature = "zmq")]
pub use sequence::RESTART_RUN;
#[cfg(feature = "zmq")]
pub use subscriber::{MAX_POLL_MESSAGES, RESYNC_BACKOFF, Source, Subscriber, SubscriberStats};
/// The ZeroMQ bindings the publisher and subscriber use (their errors are
/// `zmq::Error`).
#[cfg(feature = "zmq")]
pub use zmq;
