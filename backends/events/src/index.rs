//! A router's global prefix index: which workers hold which blocks, built
//! from the workers' events.

use std::collections::{HashMap, HashSet};

use kvslice_core::{BlockHash, SliceKey};

use crate::wire::WireEvent;

/// Workers an index can tell apart.
pub const MAX_WORKERS: usize = 64;

/// Slots of the departed-block memory by default: 2^16 entries of 16
/// bytes (1 MiB once the first block departs into it). On the Mooncake
/// conversation trace 2^14 already route as well.
pub const DEFAULT_DEPARTED_SLOTS: usize = 1 << 16;

/// Most slots of the departed-block memory (2^30, 16 GiB).
pub const MAX_DEPARTED_SLOTS: usize = 1 << 30;

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
    holders: HashMap<BlockId, u64>,
    /// Each worker's blocks, for a clear.
    held: Vec<HashSet<BlockId>>,
    /// Who last held blocks that no worker holds any more (see
    /// [`PrefixIndex::last_holder`]); allocated at the first departure.
    departed: Vec<Departed>,
    /// log2 of its slots; `None` remembers nothing.
    departed_bits: Option<u32>,
    /// Blocks no worker holds since the worker named here was cleared
    /// (`AllBlocksCleared`) while holding them. Kept apart from the
    /// departed memory until that worker next removes a block or is
    /// cleared again: a publisher's resynchronisation is a clear followed
    /// by a snapshot that stores most of them again (and removes none),
    /// and written into the direct-mapped memory at once they would push
    /// out the departures it exists for. A block stored again leaves.
    cleared: HashMap<BlockId, u32>,
    /// Per worker, what its last clear put into `cleared` (some may have
    /// left since), to move into the memory or drop.
    cleared_by: Vec<Vec<BlockId>>,
    /// Bumped when a worker is forgotten, so that blocks it held stop
    /// naming it.
    epochs: Vec<u32>,
}

/// One slot of the departed-block memory: a 64-bit tag of the block, the
/// worker that held it last (plus one; 0 is an empty slot) and that
/// worker's epoch then.
#[derive(Debug, Clone, Copy, Default)]
struct Departed {
    tag: u64,
    worker: u32,
    epoch: u32,
}

type BlockId = (BlockHash, u32, u32);

/// A key as the index names blocks: without its index (removals carry
/// none; the chained hash already names the position).
fn id(k: &SliceKey) -> BlockId {
    (k.block, k.layer_group, k.head_shard)
}

/// A block's tag in the departed memory. Block hashes are keyed PRF
/// outputs, so folding the words keeps them uniform.
fn tag(k: &BlockId) -> u64 {
    let h = k.0.0;
    (h as u64) ^ ((h >> 64) as u64).rotate_left(17) ^ (u64::from(k.1) << 32 | u64::from(k.2))
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
            departed: Vec::new(),
            departed_bits: Some(DEFAULT_DEPARTED_SLOTS.trailing_zeros()),
            cleared: HashMap::new(),
            cleared_by: vec![Vec::new(); workers],
            epochs: vec![0; workers],
        }
    }

    /// The same index remembering the last holder of up to about `slots`
    /// departed blocks (rounded up to a power of two, at most
    /// [`MAX_DEPARTED_SLOTS`]; 0 remembers none).
    ///
    /// ```
    /// use kvslice_core::{BlockHash, SliceKey};
    /// use kvslice_events::index::PrefixIndex;
    /// use kvslice_events::wire::WireEvent;
    ///
    /// let key = SliceKey { block: BlockHash(7), block_index: 0, layer_group: 0, head_shard: 0 };
    /// let stored = WireEvent::Stored {
    ///     hashes: vec![key.block],
    ///     parent: None,
    ///     tokens: vec![16],
    ///     block_size: 16,
    ///     medium: "GPU".into(),
    ///     layer_group: 0,
    ///     head_shard: 0,
    ///     first_block_index: 0,
    /// };
    /// for (slots, remembered) in [(1 << 12, Some((1, 0))), (0, None)] {
    ///     let mut index = PrefixIndex::new(2).with_departed_slots(slots);
    ///     index.apply(0, &stored);
    ///     index.apply(0, &WireEvent::Cleared);
    ///     assert_eq!(index.last_holder(&[key]), remembered);
    /// }
    /// ```
    pub fn with_departed_slots(mut self, slots: usize) -> Self {
        self.resize_departed(slots);
        self
    }

    /// Sizes the departed memory, forgetting what it held.
    pub(crate) fn resize_departed(&mut self, slots: usize) {
        self.departed_bits = (slots > 0).then(|| {
            slots
                .min(MAX_DEPARTED_SLOTS)
                .next_power_of_two()
                .trailing_zeros()
        });
        self.departed = Vec::new();
        self.cleared = HashMap::new();
        self.cleared_by.iter_mut().for_each(Vec::clear);
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
                    // Held again: what departed before is over.
                    if !self.cleared.is_empty() {
                        self.cleared.remove(&k);
                    }
                    self.forget_departed(&k);
                }
            }
            WireEvent::Removed {
                hashes,
                layer_group,
                head_shard,
                ..
            } => {
                // A removal comes after the snapshot that follows a clear:
                // what that clear dropped and the snapshot did not store
                // again departed for good.
                if !self.cleared_by[worker].is_empty() {
                    self.settle_cleared(worker, true);
                }
                for &h in hashes {
                    let k = (h, *layer_group, *head_shard);
                    if self.held[worker].remove(&k) && self.forget(k, bit) {
                        self.remember_departed(&k, worker);
                    }
                }
            }
            WireEvent::Cleared => self.clear_worker(worker),
        }
    }

    /// `worker` dropped everything it held (`AllBlocksCleared`: its store
    /// was cleared, or its publisher resynchronises after lost events and
    /// a snapshot follows). Its blocks that no other worker holds depart
    /// from it: its eviction policy outlives a clear. What the snapshot
    /// stores again is held, not departed, and costs the departed memory
    /// nothing: a clear's departures wait apart until the worker next
    /// removes a block or is cleared, and leave when stored again.
    pub fn clear_worker(&mut self, worker: usize) {
        self.settle_cleared(worker, true);
        let bit = 1u64 << worker;
        let remember = self.departed_bits.is_some();
        for k in std::mem::take(&mut self.held[worker]) {
            if self.forget(k, bit) && remember {
                self.cleared.insert(k, worker as u32);
                self.cleared_by[worker].push(k);
            }
        }
    }

    /// `worker` is gone (its process left or restarted): forgets what it
    /// held, and stops naming it as the last holder of anything.
    pub fn forget_worker(&mut self, worker: usize) {
        self.settle_cleared(worker, false);
        let bit = 1u64 << worker;
        for k in std::mem::take(&mut self.held[worker]) {
            self.forget(k, bit);
        }
        self.epochs[worker] = self.epochs[worker].wrapping_add(1);
    }

    /// Takes the blocks `worker`'s last clear set apart out of `cleared`;
    /// with `depart`, those still there depart from it for good.
    fn settle_cleared(&mut self, worker: usize, depart: bool) {
        for k in std::mem::take(&mut self.cleared_by[worker]) {
            if self.cleared.get(&k) == Some(&(worker as u32)) {
                self.cleared.remove(&k);
                if depart {
                    self.remember_departed(&k, worker);
                }
            }
        }
        // A resync of a large worker grew the map; give the room back.
        if self.cleared.is_empty() {
            self.cleared = HashMap::new();
        } else if self.cleared.capacity() > 4 * self.cleared.len() + 64 {
            self.cleared.shrink_to_fit();
        }
    }

    /// Drops `bit` from `k`'s holders; true when no worker holds it now.
    fn forget(&mut self, k: BlockId, bit: u64) -> bool {
        let Some(set) = self.holders.get_mut(&k) else {
            return false;
        };
        *set &= !bit;
        if *set == 0 {
            self.holders.remove(&k);
            return true;
        }
        false
    }

    /// The slot of `tag` in a memory of `2^bits` slots: the top bits of a
    /// multiplicative hash (every tag bit moves them); the whole tag is
    /// compared on a read.
    fn slot(tag: u64, bits: u32) -> usize {
        tag.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .checked_shr(64 - bits)
            .unwrap_or(0) as usize
    }

    fn remember_departed(&mut self, k: &BlockId, worker: usize) {
        let Some(bits) = self.departed_bits else {
            return;
        };
        if self.departed.is_empty() {
            self.departed = vec![Departed::default(); 1 << bits];
        }
        let tag = tag(k);
        let at = Self::slot(tag, bits);
        self.departed[at] = Departed {
            tag,
            worker: worker as u32 + 1,
            epoch: self.epochs[worker],
        };
    }

    /// Empties `k`'s slot if it holds `k`: a block stored again has not
    /// departed, whoever held it before.
    fn forget_departed(&mut self, k: &BlockId) {
        let Some(bits) = self.departed_bits else {
            return;
        };
        if self.departed.is_empty() {
            return;
        }
        let tag = tag(k);
        let slot = &mut self.departed[Self::slot(tag, bits)];
        if slot.tag == tag {
            *slot = Departed::default();
        }
    }

    /// The departed-memory slot of `key`, if the memory is on (the fuzz
    /// harness checks its blocks do not collide).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn departed_slot(&self, key: &SliceKey) -> Option<usize> {
        self.departed_bits
            .map(|bits| Self::slot(tag(&id(key)), bits))
    }

    /// `Some((depth, worker))`: `worker` last held `keys[depth - 1]`, the
    /// deepest of `keys` that no worker holds now, that departed from
    /// `worker` (evicted, or dropped in a clear) and has not been stored
    /// since, and that the index remembers (a bounded, direct-mapped
    /// memory: a later departure may take its slot; a clear's departures
    /// take none until the worker next removes a block or is cleared). A
    /// request whose cached prefix was evicted everywhere continues a
    /// conversation that worker served: its eviction policy may still
    /// remember the conversation (its turns), where another worker would
    /// take it for a new one.
    ///
    /// ```
    /// use kvslice_core::{BlockHash, SliceKey};
    /// use kvslice_events::index::PrefixIndex;
    /// use kvslice_events::wire::WireEvent;
    ///
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
    /// let removed = WireEvent::Removed {
    ///     hashes: vec![BlockHash(2)],
    ///     medium: "GPU".into(),
    ///     layer_group: 0,
    ///     head_shard: 0,
    /// };
    /// let mut index = PrefixIndex::new(2);
    /// index.apply(1, &stored);
    /// index.apply(1, &removed);
    /// let key = |b, i| SliceKey { block: BlockHash(b), block_index: i, layer_group: 0, head_shard: 0 };
    /// let request = [key(1, 0), key(2, 1), key(3, 2)];
    /// assert_eq!(index.overlaps(&request), [0, 1]);
    /// assert_eq!(index.last_holder(&request), Some((2, 1)));
    /// // A worker that is gone is no one's last holder.
    /// index.forget_worker(1);
    /// assert_eq!(index.last_holder(&request), None);
    /// ```
    pub fn last_holder(&self, keys: &[SliceKey]) -> Option<(usize, usize)> {
        let bits = self.departed_bits?;
        if self.departed.is_empty() && self.cleared.is_empty() {
            return None;
        }
        keys.iter().enumerate().rev().find_map(|(depth, k)| {
            let id = id(k);
            // A clear's departure is the block's newest: a later store
            // takes it out of `cleared`, and that store emptied its slot.
            if let Some(&w) = self.cleared.get(&id) {
                return (!self.holders.contains_key(&id)).then_some((depth + 1, w as usize));
            }
            if self.departed.is_empty() {
                return None;
            }
            let tag = tag(&id);
            let d = self.departed[Self::slot(tag, bits)];
            let w = (d.worker as usize).checked_sub(1)?;
            (d.tag == tag
                && w < self.workers
                && d.epoch == self.epochs[w]
                && !self.holders.contains_key(&id))
            .then_some((depth + 1, w))
        })
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
            let set = self.holders.get(&id(k)).copied().unwrap_or(0);
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
