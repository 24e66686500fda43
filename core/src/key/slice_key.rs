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
