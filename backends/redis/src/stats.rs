//! The tier's counters and its fetch-latency histogram.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What the tier did, since it was opened. Every failure the tier absorbs
/// (so that the local cache carries on) shows up here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Blocks written to Redis.
    pub spilled_blocks: u64,
    /// Bytes written to Redis, headers included.
    pub spilled_bytes: u64,
    /// Spills dropped because the queue was full, or because the page was
    /// not the size of the tier's pages (a store of another layout).
    pub spill_dropped: u64,
    /// Spills lost to a failed connection, or not sent because their node
    /// (or, with no slot map, the whole tier) was backing off.
    pub spill_failed: u64,
    /// Spills Redis refused with an error reply (for example `OOM` under
    /// `maxmemory` with `noeviction`).
    pub spill_rejected: u64,
    /// Spills not sent because no node owned their slot in the cluster's
    /// slot map (the map is read again before the next batch).
    pub spill_unrouted: u64,
    /// Continuations asked of the tier.
    pub fetches: u64,
    /// Blocks the tier returned: remote hits.
    pub fetched_blocks: u64,
    /// Bytes of every value Redis sent, headers included: those taken, and
    /// those read in the same round trip past a miss or a bad value.
    pub fetched_bytes: u64,
    /// Values that were not the block asked for (checksum, layout, key,
    /// size, format version): counted as misses; corrupt ones deleted.
    pub bad_values: u64,
    /// Fetches cut short by an error reply, a failed connection, or no
    /// slot map.
    pub fetch_errors: u64,
    /// Fetches not tried, or cut short at a key, because the tier or that
    /// key's node was backing off after a failure.
    pub skipped_while_down: u64,
    /// Median time a fetch waited on Redis (its round trips, not what the
    /// caller did with the pages), in microseconds (0 before any fetch).
    pub fetch_p50_us: u64,
    /// 99th percentile of the same, in microseconds.
    pub fetch_p99_us: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub spilled_blocks: AtomicU64,
    pub spilled_bytes: AtomicU64,
    pub spill_dropped: AtomicU64,
    pub spill_failed: AtomicU64,
    pub spill_rejected: AtomicU64,
    pub spill_unrouted: AtomicU64,
    pub fetches: AtomicU64,
    pub fetched_blocks: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub bad_values: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub skipped_while_down: AtomicU64,
    pub latency: Histogram,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> TierStats {
        let get = |c: &AtomicU64| c.load(Relaxed);
        TierStats {
            spilled_blocks: get(&self.spilled_blocks),
            spilled_bytes: get(&self.spilled_bytes),
            spill_dropped: get(&self.spill_dropped),
            spill_failed: get(&self.spill_failed),
            spill_rejected: get(&self.spill_rejected),
            spill_unrouted: get(&self.spill_unrouted),
            fetches: get(&self.fetches),
            fetched_blocks: get(&self.fetched_blocks),
            fetched_bytes: get(&self.fetched_bytes),
            bad_values: get(&self.bad_values),
            fetch_errors: get(&self.fetch_errors),
            skipped_while_down: get(&self.skipped_while_down),
            fetch_p50_us: self.latency.quantile(0.50),
            fetch_p99_us: self.latency.quantile(0.99),
        }
    }
}

/// Sub-buckets per power of two: quantiles within 1/8 (12.5%).
const SUB: usize = 8;
/// Powers of two of microseconds covered: up to about 4,000 s.
const POWERS: usize = 32;

/// A log-linear histogram of microseconds, lock-free to record.
pub(crate) struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..POWERS * SUB).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Histogram {
    fn bucket(us: u64) -> usize {
        let us = us.max(1);
        let power = 63 - us.leading_zeros() as usize;
        // The three bits below the leading one pick the sub-bucket.
        let sub = if power >= 3 {
            (us >> (power - 3)) as usize & (SUB - 1)
        } else {
            ((us << (3 - power)) as usize) & (SUB - 1)
        };
        (power * SUB + sub).min(POWERS * SUB - 1)
    }

    /// The lower edge of bucket `i`, in microseconds.
    fn lower(i: usize) -> u64 {
        let (power, sub) = (i / SUB, (i % SUB) as u64);
        if power >= 3 {
            (8 + sub) << (power - 3)
        } else {
            ((8 + sub) >> (3 - power)).max(1)
        }
    }

    pub(crate) fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[Self::bucket(us)].fetch_add(1, Relaxed);
    }

    /// The lower edge of the bucket holding quantile `q`.
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::lower(i);
            }
        }
        Self::lower(counts.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_within_an_eighth() {
        let mut last = 0;
        for us in 1..100_000u64 {
            let b = Histogram::bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let lo = Histogram::lower(b);
            assert!(
                lo <= us && us - lo <= us / 8 + 1,
                "{us} in bucket from {lo}"
            );
        }
    }

    #[test]
    fn quantiles_follow_the_samples() {
        let h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        assert!((448..=500).contains(&p50), "{p50}");
        assert!((896..=990).contains(&p99), "{p99}");
    }
}
