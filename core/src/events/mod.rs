//! KV cache events for routers: what a store publishes when a block becomes
//! findable, when one goes, and when all went.
//!
//! A store built with [`CacheStore::with_events`](crate::CacheStore::with_events)
//! pushes one [`KvEvent`] per block into an [`EventRing`] as it publishes
//! and evicts; the lookup hit path pushes nothing. The ring is bounded and
//! lossy: a push never allocates and never waits, and a full ring drops the
//! event and counts it, so a consumer that falls behind learns that it
//! lost events (and resynchronises from a snapshot) instead of slowing the
//! store. An embedder drains the ring from its own thread and forwards the
//! events, for instance to `kvslice-events`' ZeroMQ publisher, whose wire
//! format is vLLM's `KVEventBatch`.
//!
//! Whoever removes a block's entry reports the removal, so one thread's
//! events of a block arrive in the order it caused them. Across threads two
//! races remain: an evictor that has removed a block's entry but not yet
//! pushed `Removed` while another thread publishes the same block again
//! and pushes `Stored` first; and a `clear` that found the store empty
//! while another thread publishes a block and pushes `Stored` before the
//! clear pushes `Cleared`. A consumer then believes the block gone while
//! it is cached. That costs a router one missed prefix hit (the index is
//! a hint), and the block's next event corrects it.

mod ring;

#[cfg(feature = "testkit")]
pub use ring::UnwrittenSlot;
pub use ring::{EventRing, number_is_before};

use crate::key::{BlockHash, SliceKey};

/// What happened to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEvent {
    /// A block became findable.
    Stored {
        /// Its key.
        key: SliceKey,
        /// The block before it in its sequence, if it was published with
        /// one.
        parent: Option<BlockHash>,
        /// Tokens it holds (its page's valid tokens).
        tokens: u32,
    },
    /// A block was evicted.
    Removed {
        /// Its key.
        key: SliceKey,
    },
    /// The store holds no block any more.
    Cleared,
}

/// Where the pages of a store live, as routers name it (vLLM's `medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Medium {
    /// Accelerator memory.
    Gpu,
    /// Host memory.
    #[default]
    Cpu,
    /// Local disk.
    Disk,
    /// A shared remote tier.
    Remote,
}

impl Medium {
    /// The name routers use: `"GPU"`, `"CPU"`, `"DISK"`, `"REMOTE"`.
    ///
    /// ```
    /// assert_eq!(kvslice_core::events::Medium::Gpu.as_str(), "GPU");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Disk => "DISK",
            Medium::Remote => "REMOTE",
        }
    }
}

const KIND_STORED: u64 = 1;
const KIND_REMOVED: u64 = 2;
const KIND_CLEARED: u64 = 3;
const HAS_PARENT: u64 = 1 << 8;

/// Words an event takes in a ring slot.
pub(crate) const EVENT_WORDS: usize = 7;
/// Where the event's number starts in the last word (below: kind, flags).
const NUMBER_SHIFT: u32 = 16;

impl KvEvent {
    /// The event and its number (below 2^48) as words.
    pub(crate) fn encode(&self, number: u64) -> [u64; EVENT_WORDS] {
        let mut w = self.words();
        w[EVENT_WORDS - 1] |= number << NUMBER_SHIFT;
        w
    }

    fn words(&self) -> [u64; EVENT_WORDS] {
        let key_words = |k: &SliceKey| {
            let w = k.to_words();
            [w[0], w[1], w[2], w[3]]
        };
        match *self {
            KvEvent::Stored {
                key,
                parent,
                tokens,
            } => {
                let k = key_words(&key);
                let p = parent.map_or(0, |b| b.0);
                let flags = KIND_STORED | if parent.is_some() { HAS_PARENT } else { 0 };
                [
                    k[0],
                    k[1],
                    k[2],
                    k[3] | u64::from(tokens) << 32,
                    p as u64,
                    (p >> 64) as u64,
                    flags,
                ]
            }
            KvEvent::Removed { key } => {
                let k = key_words(&key);
                [k[0], k[1], k[2], k[3], 0, 0, KIND_REMOVED]
            }
            KvEvent::Cleared => [0, 0, 0, 0, 0, 0, KIND_CLEARED],
        }
    }

    /// The number and the event `encode` wrote.
    pub(crate) fn decode(w: [u64; EVENT_WORDS]) -> (u64, Self) {
        (w[6] >> NUMBER_SHIFT, Self::from_words(w))
    }

    fn from_words(w: [u64; EVENT_WORDS]) -> Self {
        let key = SliceKey::from_words([w[0], w[1], w[2], w[3] & u64::from(u32::MAX)]);
        match w[6] & 0xff {
            KIND_STORED => KvEvent::Stored {
                key,
                parent: (w[6] & HAS_PARENT != 0)
                    .then(|| BlockHash(u128::from(w[5]) << 64 | u128::from(w[4]))),
                tokens: (w[3] >> 32) as u32,
            },
            KIND_REMOVED => KvEvent::Removed { key },
            _ => KvEvent::Cleared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_words() {
        let key = SliceKey {
            block: BlockHash(u128::MAX - 7),
            block_index: u32::MAX,
            layer_group: 3,
            head_shard: u32::MAX,
        };
        for e in [
            KvEvent::Stored {
                key,
                parent: Some(BlockHash(1 << 100 | 5)),
                tokens: u32::MAX,
            },
            KvEvent::Stored {
                key,
                parent: None,
                tokens: 0,
            },
            KvEvent::Removed { key },
            KvEvent::Cleared,
        ] {
            for n in [0, 7, (1 << 48) - 1] {
                assert_eq!(KvEvent::decode(e.encode(n)), (n, e));
            }
        }
    }
}
