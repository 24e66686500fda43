//! A router's global prefix index: which workers hold which blocks, built
//! from the workers' events.

use std::collections::{HashMap, HashSet};

use kvslice_core::{BlockHash, SliceKey};

use crate::wire::WireEvent;

/// Workers an index can tell apart.
pub const MAX_WORKERS: usize = 64;

/// Block (hash, layer group, head shard) to the set of workers holding it,
/// as a bit set. Removals in vLLM's shape carry no block index, so the
/// index keys blocks without one; keys are chained hashes, so the hash
/// already names the position.
///
/// ```
/// use kvslice_core::{BlockHash, SliceKey};
/// use kvslice_events::index::PrefixIndex;
/// use kvslice_events::wire::WireEvent;
///
/// let mut index = PrefixIndex::new(2);
/// let stored = WireEvent::Stored {
///     hashes: vec![BlockHash(1), BlockHash(2)],
///     parent: None,
///     tokens: vec![16, 16],
///     block_size: 16,
///     medium: "GPU".into(),
///     layer_group: 0,
///     head_shard: 0,
///     first_block_index: 0,
/// };
/// index.apply(1, &stored);
/// let key = |b, i| SliceKey { block: BlockHash(b), block_index: i, layer_group: 0, head_shard: 0 };
/// // Worker 1 holds both blocks of [1, 2, 3]; worker 0 none.
/// assert_eq!(index.overlaps(&[key(1, 0), key(2, 1), key(3, 2)]), [0, 2]);
/// ```
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    workers: usize,
    holders: HashMap<(BlockHash, u32, u32), u64>,
    /// Each worker's blocks, for a clear.
    held: Vec<HashSet<(BlockHash, u32, u32)>>,
}

impl PrefixIndex {
    /// An empty index of `workers` workers (at most [`MAX_WORKERS`]).
    ///
    /// # Panics
    /// If `workers` is 0 or above [`MAX_WORKERS`].
    pub fn new(workers: usize) -> Self {
        assert!(
            (1..=MAX_WORKERS).contains(&workers),
            "an index tells 1 to {MAX_WORKERS} workers apart, not {workers}"
        );
        Self {
            workers,
            holders: HashMap::new(),
            held: vec![HashSet::new(); workers],
        }
    }

    /// Workers indexed.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Applies one of `worker`'s events.
    ///
    /// # Panics
    /// If `worker` is out of range.
    pub fn apply(&mut self, worker: usize, event: &WireEvent) {
        let bit = 1u64 << worker;
        match event {
            WireEvent::Stored {
                hashes,
                layer_group,
                head_shard,
                ..
            } => {
                for &h in hashes {
                    let k = (h, *layer_group, *head_shard);
                    *self.holders.entry(k).or_default() |= bit;
                    self.held[worker].insert(k);
                }
            }
            WireEvent::Removed {
                hashes,
                layer_group,
                head_shard,
                ..
            } => {
                for &h in hashes {
                    let k = (h, *layer_group, *head_shard);
                    self.forget(k, bit);
                    self.held[worker].remove(&k);
                }
            }
            WireEvent::Cleared => self.clear_worker(worker),
        }
    }

    /// Forgets everything `worker` held (it cleared, restarted or left).
    pub fn clear_worker(&mut self, worker: usize) {
        let bit = 1u64 << worker;
        for k in std::mem::take(&mut self.held[worker]) {
            self.forget(k, bit);
        }
    }

    fn forget(&mut self, k: (BlockHash, u32, u32), bit: u64) {
        if let Some(set) = self.holders.get_mut(&k) {
            *set &= !bit;
            if *set == 0 {
                self.holders.remove(&k);
            }
        }
    }

    /// Blocks `worker` holds, as far as its events said.
    pub fn blocks_of(&self, worker: usize) -> usize {
        self.held[worker].len()
    }

    /// For each worker, how many leading blocks of `keys` it holds (the
    /// prefix it could reuse: a hit stops at the first missing block).
    pub fn overlaps(&self, keys: &[SliceKey]) -> Vec<usize> {
        let mut out = vec![0; self.workers];
        let mut alive = u64::MAX >> (MAX_WORKERS - self.workers);
        for (depth, k) in keys.iter().enumerate() {
            let set = self
                .holders
                .get(&(k.block, k.layer_group, k.head_shard))
                .copied()
                .unwrap_or(0);
            // Workers that held every block so far but not this one stop.
            let stopped = alive & !set;
            for (w, o) in out.iter_mut().enumerate() {
                if stopped >> w & 1 == 1 {
                    *o = depth;
                }
            }
            alive &= set;
            if alive == 0 {
                return out;
            }
        }
        for (w, o) in out.iter_mut().enumerate() {
            if alive >> w & 1 == 1 {
                *o = keys.len();
            }
        }
        out
    }
}
