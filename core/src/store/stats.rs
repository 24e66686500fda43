//! Hit, miss and eviction counters, striped across cache lines so that
//! threads counting different requests do not contend on one line.

use crate::sync::{AtomicU64, Ordering::Relaxed};

const STRIPES: usize = 8;

#[repr(align(64))]
#[derive(Default)]
struct Stripe {
    lookups: AtomicU64,
    hit_blocks: AtomicU64,
    miss_blocks: AtomicU64,
    hit_tokens: AtomicU64,
    miss_tokens: AtomicU64,
    inserts: AtomicU64,
    duplicates: AtomicU64,
    evictions: AtomicU64,
    evicted_tokens: AtomicU64,
}

#[derive(Default)]
pub(super) struct Counters {
    stripes: [Stripe; STRIPES],
}

/// Which counter to bump.
#[derive(Clone, Copy)]
pub(super) enum Count {
    Lookups,
    HitBlocks,
    MissBlocks,
    HitTokens,
    MissTokens,
    Inserts,
    Duplicates,
    Evictions,
    EvictedTokens,
}

impl Counters {
    /// Adds `n` to a counter on the stripe picked by `spread` (any value
    /// that differs between concurrent callers, e.g. a key fingerprint).
    pub(super) fn add(&self, spread: u64, what: Count, n: u64) {
        if n == 0 {
            return;
        }
        let s = &self.stripes[(spread as usize) % STRIPES];
        let c = match what {
            Count::Lookups => &s.lookups,
            Count::HitBlocks => &s.hit_blocks,
            Count::MissBlocks => &s.miss_blocks,
            Count::HitTokens => &s.hit_tokens,
            Count::MissTokens => &s.miss_tokens,
            Count::Inserts => &s.inserts,
            Count::Duplicates => &s.duplicates,
            Count::Evictions => &s.evictions,
            Count::EvictedTokens => &s.evicted_tokens,
        };
        c.fetch_add(n, Relaxed);
    }

    pub(super) fn snapshot(&self) -> StoreStats {
        let mut t = StoreStats::default();
        for s in &self.stripes {
            t.lookups += s.lookups.load(Relaxed);
            t.hit_blocks += s.hit_blocks.load(Relaxed);
            t.miss_blocks += s.miss_blocks.load(Relaxed);
            t.hit_tokens += s.hit_tokens.load(Relaxed);
            t.miss_tokens += s.miss_tokens.load(Relaxed);
            t.inserts += s.inserts.load(Relaxed);
            t.duplicate_publishes += s.duplicates.load(Relaxed);
            t.evictions += s.evictions.load(Relaxed);
            t.evicted_tokens += s.evicted_tokens.load(Relaxed);
        }
        t
    }
}

/// A snapshot of a store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// `lookup_prefix` and `lookup_window` calls.
    pub lookups: u64,
    /// Blocks found (the cached prefixes, summed; for a windowed lookup,
    /// the blocks its window needs).
    pub hit_blocks: u64,
    /// Blocks not found: everything from each lookup's first miss on (a
    /// windowed lookup's hit end). A windowed lookup's blocks before its
    /// window count as neither hit nor miss: nothing needs them.
    pub miss_blocks: u64,
    /// Valid tokens in hit blocks.
    pub hit_tokens: u64,
    /// Tokens the lookups asked for beyond their hits (for a windowed
    /// lookup, beyond its hit's end; tokens before its window count as
    /// neither).
    pub miss_tokens: u64,
    /// Pages published into the map.
    pub inserts: u64,
    /// Publishes that found the key already cached and handed back the
    /// cached page instead (the duplicate went back to the pool).
    pub duplicate_publishes: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Valid tokens in evicted pages.
    pub evicted_tokens: u64,
    /// Accesses a policy that buffers them never saw: recorded while their
    /// read buffer stripe was full (see [`ReadBuffer`](crate::evict::ReadBuffer)).
    pub dropped_accesses: u64,
}

impl StoreStats {
    /// Hit blocks over looked-up blocks (0 when nothing was looked up).
    pub fn block_hit_ratio(&self) -> f64 {
        let total = self.hit_blocks + self.miss_blocks;
        if total == 0 {
            0.0
        } else {
            self.hit_blocks as f64 / total as f64
        }
    }

    /// Hit tokens over looked-up tokens (0 when nothing was looked up).
    pub fn token_hit_ratio(&self) -> f64 {
        let total = self.hit_tokens + self.miss_tokens;
        if total == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / total as f64
        }
    }
}
