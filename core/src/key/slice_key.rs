//! The key of one page: a block of one sequence prefix, for one layer group
//! and one head shard.

use super::BlockHash;

/// Canonical identity of a page's contents.
///
/// The block hash already covers the tenant scope, the layout and the whole
/// token prefix; the block index, layer group and head shard say which page
/// of that block this is. Two requests that name the same logical slice get
/// equal keys.
///
/// ```
/// use kvslice_core::{BlockHash, SliceKey};
///
/// let a = SliceKey { block: BlockHash(42), block_index: 0, layer_group: 1, head_shard: 0 };
/// let b = SliceKey { layer_group: 2, ..a };
/// assert_ne!(a, b);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceKey {
    /// Chained hash of the block (and so of its prefix).
    pub block: BlockHash,
    /// Position of the block in its sequence.
    pub block_index: u32,
    /// Layer group the page holds.
    pub layer_group: u32,
    /// Head shard the page holds.
    pub head_shard: u32,
}

impl SliceKey {
    /// The key as four words, for structures that store keys in atomics
    /// (the slice map's inline slots, the store's page metadata).
    #[inline]
    pub(crate) fn to_words(self) -> [u64; 4] {
        [
            self.block.0 as u64,
            (self.block.0 >> 64) as u64,
            u64::from(self.block_index) << 32 | u64::from(self.layer_group),
            u64::from(self.head_shard),
        ]
    }

    /// The key [`to_words`](Self::to_words) encoded.
    pub(crate) fn from_words(w: [u64; 4]) -> Self {
        Self {
            block: BlockHash(u128::from(w[1]) << 64 | u128::from(w[0])),
            block_index: (w[2] >> 32) as u32,
            layer_group: w[2] as u32,
            head_shard: w[3] as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_tell_every_field_apart() {
        let k = SliceKey {
            block: BlockHash(u128::MAX - 5),
            block_index: u32::MAX,
            layer_group: 7,
            head_shard: u32::MAX - 1,
        };
        assert_eq!(SliceKey::from_words(k.to_words()), k);
        let swapped = SliceKey {
            block_index: k.layer_group,
            layer_group: k.block_index,
            ..k
        };
        assert_ne!(swapped.to_words(), k.to_words());
    }
}
