//! The coordinator's answer: blocks with their hashes, and the slice keys
//! of every (block, layer group, head shard) page.

use alloc::vec::Vec;
use core::ops::Range;

use crate::error::{Result, check_index};
use crate::key::{BlockHash, SliceKey};
use crate::layout::KvLayout;

/// One block of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// Chained hash; covers the scope, the layout and every earlier token.
    pub hash: BlockHash,
    /// Position of the block in the sequence.
    pub index: u32,
    /// Tokens of the block present in the sequence (`block_tokens` unless
    /// this is a partial tail). A page filled for this block records it.
    pub valid_tokens: u32,
}

/// Canonical blocks for a request's range.
///
/// ```
/// use kvslice_core::{Coordinator, HashSecret, KvDtype, KvLayout, LayerGrouping, LayoutSpec, Request};
///
/// let layout = KvLayout::new(
///     LayoutSpec::new(4, 4, 2, 8, 16, KvDtype::F32)
///         .with_grouping(LayerGrouping::Groups(2))
///         .with_head_shards(2),
/// )?;
/// let coord = Coordinator::new(layout, HashSecret::from_bytes([0; 16]));
/// let tokens: Vec<u32> = (0..40).collect();
/// let plan = coord.plan(&Request::new(&tokens).with_range(16..20))?;
/// assert_eq!(plan.token_range(), 16..32);
/// assert_eq!(plan.full_blocks(), 1);
/// // One block × 2 layer groups × 2 head shards.
/// assert_eq!(plan.slice_keys().count(), 4);
/// let worker1: Vec<_> = plan.keys_for(0, 1)?.collect();
/// assert_eq!(worker1[0].head_shard, 1);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePlan {
    blocks: Vec<BlockRef>,
    block_tokens: u32,
    layer_groups: u32,
    head_shards: u32,
    dropped: Option<Range<usize>>,
}

impl SlicePlan {
    pub(super) fn new(layout: &KvLayout, blocks: Vec<BlockRef>) -> Self {
        Self {
            blocks,
            block_tokens: layout.block_tokens(),
            layer_groups: layout.num_layer_groups(),
            head_shards: layout.num_head_shards(),
            dropped: None,
        }
    }

    pub(super) fn with_dropped(mut self, dropped: Option<Range<usize>>) -> Self {
        self.dropped = dropped;
        self
    }

    /// The token positions of the request that its budget dropped before
    /// any key was computed (see [`Request::with_budget`]); `None` if it
    /// kept them all. The plan's blocks and ranges are over the kept tokens.
    ///
    /// [`Request::with_budget`]: super::Request::with_budget
    pub fn dropped(&self) -> Option<Range<usize>> {
        self.dropped.clone()
    }

    /// The blocks, in sequence order.
    pub fn blocks(&self) -> &[BlockRef] {
        &self.blocks
    }

    /// Number of leading full blocks: the part of the plan that can be
    /// shared with other requests.
    pub fn full_blocks(&self) -> usize {
        self.blocks
            .iter()
            .take_while(|b| b.valid_tokens == self.block_tokens)
            .count()
    }

    /// The token positions the plan's blocks hold.
    pub fn token_range(&self) -> Range<usize> {
        match (self.blocks.first(), self.blocks.last()) {
            (Some(first), Some(last)) => {
                let bt = self.block_tokens as usize;
                first.index as usize * bt..last.index as usize * bt + last.valid_tokens as usize
            }
            _ => 0..0,
        }
    }

    /// The key of `block`'s page for one layer group and head shard.
    fn key(&self, block: &BlockRef, layer_group: u32, head_shard: u32) -> SliceKey {
        SliceKey {
            block: block.hash,
            block_index: block.index,
            layer_group,
            head_shard,
        }
    }

    /// Keys of one (layer group, head shard) across the plan's blocks: what
    /// one tensor-parallel worker looks up for one layer group.
    pub fn keys_for(
        &self,
        layer_group: u32,
        head_shard: u32,
    ) -> Result<impl ExactSizeIterator<Item = SliceKey> + '_> {
        check_index(
            "layer group",
            layer_group as usize,
            self.layer_groups as usize,
        )?;
        check_index("head shard", head_shard as usize, self.head_shards as usize)?;
        Ok(self
            .blocks
            .iter()
            .map(move |b| self.key(b, layer_group, head_shard)))
    }

    /// Every page key of the plan: block-major, then layer group, then head
    /// shard.
    pub fn slice_keys(&self) -> impl Iterator<Item = SliceKey> + '_ {
        self.blocks.iter().flat_map(move |b| {
            (0..self.layer_groups)
                .flat_map(move |g| (0..self.head_shards).map(move |s| self.key(b, g, s)))
        })
    }
}
