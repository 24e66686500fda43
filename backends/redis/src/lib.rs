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
//!   match is a miss, counted and deleted, never data.
//! - **Failures** are counted in [`TierStats`], never raised: after a
//!   connection failure the tier is skipped for a backoff (50 ms doubling
//!   to 2 s by default), so lookups fall back to the local cache within the
//!   connect timeout.
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
mod stats;
#[cfg(feature = "client")]
mod tier;
#[cfg(feature = "client")]
mod tiered;
pub mod value;
#[cfg(feature = "client")]
mod writer;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;

#[cfg(feature = "client")]
pub use config::{LOOPBACK_CLUSTER, TierConfig, TierError, default_urls};
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
