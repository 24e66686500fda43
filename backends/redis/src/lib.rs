//! A shared KV cache tier behind kvslice stores, on Redis Cluster (or one
//! Redis server; Valkey speaks the same protocol).
//!
//! Replicas that each keep a local [`CacheStore`](kvslice_core::CacheStore)
//! share one tier:
//!
//! - **Spill on evict.** A store built with
//!   [`with_spill`](kvslice_core::CacheStore::with_spill)`(Box::new(tier.sink()))?`
//!   copies each evicted block into a bounded queue; writer threads (two
//!   by default) write the queue to Redis in pipelines. Eviction never waits on the network: a
//!   full queue drops the spill and counts it. With
//!   [`TierConfig::write_through`], blocks go out when published as well.
//! - **Fetch on miss.** [`TieredStore::lookup`] serves the local prefix,
//!   then asks the tier for the keys after it, in order, a batch per round
//!   trip (one pipeline per node on a cluster), up to the first remote
//!   miss; fetched blocks land in fresh pages and are published.
//! - **Values** carry a versioned header (block key, layout fingerprint,
//!   valid tokens, length) and a CRC-32C ([`value`]). A value that does not
//!   match is a miss, counted, never data; a corrupt one is deleted (one of
//!   another format version or layout is left for its writer).
//! - **Failures** are counted in [`TierStats`], never raised. Each node has
//!   its own connection with its timeouts set before its first command;
//!   a node that fails is skipped for a backoff (50 ms doubling to 2 s by
//!   default) while the others serve their keys, so a lookup waits at most
//!   about the connect timeout plus the reply timeout per failing node,
//!   and then not again until that node's backoff ends.
//!
//! The `client` feature (on by default) holds everything but [`value`].
//!
//! `.ci/redis-cluster.sh start` runs a three-node cluster on loopback for
//! the tests and `kvslice tier`.

#[cfg(feature = "client")]
mod config;
#[cfg(feature = "client")]
mod conn;
#[cfg(feature = "client")]
mod nodes;
#[cfg(feature = "client")]
mod stats;
#[cfg(feature = "client")]
mod tier;
#[cfg(feature = "client")]
mod tiered;
pub mod value;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;

#[cfg(feature = "client")]
pub use config::{
    LOOPBACK_CLUSTER, MAX_BACKOFF, MAX_FETCH_BATCH, MAX_SPILL_QUEUE, MAX_SPILL_THREADS, MAX_TTL,
    TierConfig, TierError, default_urls, redact,
};
#[cfg(feature = "client")]
pub use stats::TierStats;
#[cfg(feature = "client")]
pub use tier::{RedisTier, TierSink};
#[cfg(feature = "client")]
pub use tiered::{TieredHit, TieredStore};

/// `docs/TIER.md`, whose example compiles as this module's doc test.
#[cfg(feature = "client")]
#[doc = include_str!("../../../docs/TIER.md")]
#[doc(hidden)]
pub mod tier_doc {}
