//! The coordinator: from a request's tokens and range to canonical slice
//! keys. Pure computation; it never touches page memory.

mod plan;
mod range;
mod truncation;

use alloc::vec::Vec;
use core::ops::Range;

pub use plan::{BlockRef, SlicePlan};
pub use range::canonical_blocks;
pub use truncation::{TokenBudget, Truncation};

use crate::error::{Error, Result, check_len};
use crate::key::{BlockHash, ChainHasher, HashSecret, KeyScope, SliceKey};
use crate::layout::KvLayout;

/// The most dimensions [`Coordinator::region_key`] takes.
pub const MAX_REGION_DIMS: usize = 8;

/// What a runtime asks the coordinator about: a token sequence, who it
/// belongs to, and which token range of it the caller wants to address.
///
/// ```
/// use kvslice_core::{KeyScope, Request};
///
/// let tokens = [1u32, 2, 3, 4, 5];
/// let req = Request::new(&tokens)
///     .with_scope(KeyScope { salt: b"tenant-7", adapter: Some(3) })
///     .with_range(0..4);
/// assert_eq!(req.range, 0..4);
/// ```
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// Tenant salt and adapter.
    pub scope: KeyScope<'a>,
    /// The whole token sequence, from position 0.
    pub tokens: &'a [u32],
    /// Half-open token range to address; widened to block boundaries.
    pub range: Range<usize>,
    /// Optional extra key per block: entry `i` is mixed into block `i`
    /// (for example the hash of an image whose placeholder tokens sit in
    /// that block). May be shorter than the number of blocks.
    pub block_extras: &'a [Option<u128>],
    /// The most tokens to keep, and how to cut a longer sequence (none:
    /// keep everything).
    pub budget: Option<TokenBudget>,
}

impl<'a> Request<'a> {
    /// The whole of `tokens`, default scope, no extra keys.
    pub fn new(tokens: &'a [u32]) -> Self {
        Self {
            scope: KeyScope::default(),
            tokens,
            range: 0..tokens.len(),
            block_extras: &[],
            budget: None,
        }
    }

    /// Sets the tenant scope.
    pub fn with_scope(mut self, scope: KeyScope<'a>) -> Self {
        self.scope = scope;
        self
    }

    /// Sets the addressed token range.
    pub fn with_range(mut self, range: Range<usize>) -> Self {
        self.range = range;
        self
    }

    /// Sets per-block extra keys.
    pub fn with_block_extras(mut self, extras: &'a [Option<u128>]) -> Self {
        self.block_extras = extras;
        self
    }

    /// Sets a token budget: a longer sequence is cut (or refused) before
    /// keys are computed, and the plan says which positions went
    /// ([`SlicePlan::dropped`]). The range is in the request's positions
    /// and may not start or end inside the dropped part; block extras
    /// count blocks of the kept tokens. Requests cut the same way share
    /// keys; a cut request shares none with one that was not cut.
    ///
    /// ```
    /// use kvslice_core::coordinator::{TokenBudget, Truncation};
    /// use kvslice_core::{Coordinator, HashSecret, KvDtype, KvLayout, LayoutSpec, Request};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 8, 4, KvDtype::F16))?;
    /// let coord = Coordinator::new(layout, HashSecret::from_bytes([2; 16]));
    /// let tokens: Vec<u32> = (0..20).collect();
    /// let budget = TokenBudget { max_tokens: 12, truncation: Truncation::KeepLast };
    /// let plan = coord.plan(&Request::new(&tokens).with_budget(budget))?;
    /// assert_eq!(plan.dropped(), Some(0..8));
    /// assert_eq!(plan.token_range(), 0..12); // three blocks of the kept tokens
    /// let refuse = TokenBudget { max_tokens: 12, truncation: Truncation::Refuse };
    /// assert!(coord.plan(&Request::new(&tokens).with_budget(refuse)).is_err());
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_budget(mut self, budget: TokenBudget) -> Self {
        self.budget = Some(budget);
        self
    }
}

/// Turns requests into canonical slice keys for one layout and secret.
///
/// ```
/// use kvslice_core::{Coordinator, HashSecret, KvDtype, KvLayout, LayoutSpec, Request};
///
/// let layout = KvLayout::new(LayoutSpec::new(2, 4, 2, 8, 4, KvDtype::F16))?;
/// let coord = Coordinator::new(layout, HashSecret::from_bytes([1; 16]));
/// let system_prompt = [9u32, 8, 7, 6, 5, 4, 3, 2];
/// let a: Vec<u32> = system_prompt.iter().copied().chain([100, 101]).collect();
/// let b: Vec<u32> = system_prompt.iter().copied().chain([200]).collect();
/// let pa = coord.plan(&Request::new(&a))?;
/// let pb = coord.plan(&Request::new(&b))?;
/// // Two full shared blocks get the same keys; the partial tails differ.
/// assert_eq!(pa.blocks()[..2], pb.blocks()[..2]);
/// assert_ne!(pa.blocks()[2].hash, pb.blocks()[2].hash);
/// assert_eq!(pa.blocks()[2].valid_tokens, 2);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Coordinator {
    layout: KvLayout,
    hasher: ChainHasher,
}

impl Coordinator {
    /// A coordinator for `layout`, keyed by `secret`.
    pub fn new(layout: KvLayout, secret: HashSecret) -> Self {
        Self {
            hasher: ChainHasher::new(&layout, secret),
            layout,
        }
    }

    /// The layout keys are made for.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The chain root `h_{-1}` of `scope`.
    pub fn root(&self, scope: &KeyScope<'_>) -> BlockHash {
        self.hasher.root(scope)
    }

    /// The key of a rectangular region of a tensor: for caches of slices
    /// of anything that is not a token sequence (a weight or activation
    /// tensor cut into chunks, or K/V addressed as (batch, head, seq_start,
    /// seq_end, head_dim) as the first design sketched). `ranges` gives
    /// each dimension's half-open range, in order; the same region of the
    /// same tensor under the same scope always gets the same key, and two
    /// regions get different keys even when their shapes are equal.
    /// `index` becomes the key's `block_index` (a position the eviction
    /// policy may learn from, such as the chunk's order in a scan).
    ///
    /// Errors for no dimension, more than [`MAX_REGION_DIMS`], or an
    /// empty or reversed range.
    ///
    /// ```
    /// use kvslice_core::{Coordinator, HashSecret, KeyScope, KvDtype, KvLayout, LayoutSpec};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 100, 100, KvDtype::F32))?;
    /// let coord = Coordinator::new(layout, HashSecret::from_bytes([1; 16]));
    /// let scope = KeyScope::default();
    /// let a = coord.region_key(&scope, 7, &[0..100, 100..200], 1)?;
    /// assert_eq!(a, coord.region_key(&scope, 7, &[0..100, 100..200], 1)?);
    /// // Same shape, another place: another key.
    /// assert_ne!(a.block, coord.region_key(&scope, 7, &[100..200, 0..100], 1)?.block);
    /// assert!(coord.region_key(&scope, 7, &[5..5], 0).is_err());
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn region_key(
        &self,
        scope: &KeyScope<'_>,
        tensor: u64,
        ranges: &[Range<u64>],
        index: u32,
    ) -> Result<SliceKey> {
        if ranges.is_empty() {
            return Err(Error::InvalidValue("a region of no dimensions"));
        }
        if ranges.len() > MAX_REGION_DIMS {
            return Err(Error::OutOfRange {
                what: "dimensions of a region",
                index: ranges.len() as u64,
                bound: MAX_REGION_DIMS as u64 + 1,
            });
        }
        if let Some(r) = ranges.iter().find(|r| r.start >= r.end) {
            return Err(Error::InvalidRange {
                start: r.start,
                end: r.end,
            });
        }
        Ok(SliceKey {
            block: self.hasher.region(self.root(scope), tensor, ranges),
            block_index: index,
            layer_group: 0,
            head_shard: 0,
        })
    }

    /// The next link of a chain: block `index` holding `tokens`, after the
    /// block (or root) `prev`. For sequences that grow one block at a time.
    ///
    /// Errors if `tokens` is empty or longer than a block.
    pub fn next_block(
        &self,
        prev: BlockHash,
        index: u32,
        tokens: &[u32],
        extra: Option<u128>,
    ) -> Result<BlockRef> {
        let bt = self.layout.block_tokens() as usize;
        if tokens.is_empty() || tokens.len() > bt {
            return Err(Error::ShapeMismatch {
                what: "tokens in a block",
                expected: bt as u64,
                actual: tokens.len() as u64,
            });
        }
        let full = tokens.len() == bt;
        Ok(BlockRef {
            hash: self.hasher.link(prev, index, tokens, extra, full),
            index,
            valid_tokens: tokens.len() as u32,
        })
    }

    /// The block chain of the first `blocks` blocks of `tokens`.
    fn chain(
        &self,
        root: BlockHash,
        tokens: &[u32],
        extras: &[Option<u128>],
        blocks: u32,
    ) -> Result<Vec<BlockRef>> {
        let bt = self.layout.block_tokens() as usize;
        let mut out = Vec::with_capacity(blocks as usize);
        let mut prev = root;
        for (i, tokens) in tokens.chunks(bt).take(blocks as usize).enumerate() {
            let extra = extras.get(i).copied().flatten();
            let block = self.next_block(prev, i as u32, tokens, extra)?;
            prev = block.hash;
            out.push(block);
        }
        Ok(out)
    }

    /// A plan for a sequence whose blocks are already identified by content
    /// hashes computed elsewhere (a trace's block ids, another system's
    /// block hashes): block `i` is keyed by `ids[i]` as its extra key,
    /// chained under `scope` like any other block. `total_tokens` sets the
    /// blocks' valid tokens (every block full but possibly the last); a
    /// partial last block is keyed by its length too.
    ///
    /// ```
    /// use kvslice_core::{Coordinator, HashSecret, KeyScope, KvDtype, KvLayout, LayoutSpec};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 512, KvDtype::F16))?;
    /// let coord = Coordinator::new(layout, HashSecret::from_bytes([0; 16]));
    /// let a = coord.plan_block_ids(&KeyScope::default(), &[0, 1, 2], 1100)?;
    /// let b = coord.plan_block_ids(&KeyScope::default(), &[0, 1, 9], 1536)?;
    /// assert_eq!(a.blocks()[..2], b.blocks()[..2]);
    /// assert_eq!(a.blocks()[2].valid_tokens, 1100 - 1024);
    /// // Block 2 of 76 tokens is not block 2 of 512 with the same id.
    /// let full = coord.plan_block_ids(&KeyScope::default(), &[0, 1, 2], 1536)?;
    /// assert_ne!(a.blocks()[2].hash, full.blocks()[2].hash);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn plan_block_ids(
        &self,
        scope: &KeyScope<'_>,
        ids: &[u64],
        total_tokens: usize,
    ) -> Result<SlicePlan> {
        let bt = self.layout.block_tokens() as usize;
        if ids.is_empty() || total_tokens.div_ceil(bt) != ids.len() {
            return Err(Error::ShapeMismatch {
                what: "block ids (one per block of total_tokens)",
                expected: total_tokens.div_ceil(bt) as u64,
                actual: ids.len() as u64,
            });
        }
        let _ = u32::try_from(ids.len()).map_err(|_| Error::Overflow("block index"))?;
        let mut prev = self.root(scope);
        let mut blocks = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            let valid = (total_tokens - i * bt).min(bt) as u32;
            // A partial tail is keyed apart from a full block with the same
            // id, and by its length: the id alone may not tell them apart.
            let full = valid as usize == bt;
            let extra = u128::from(id) | if full { 0 } else { u128::from(valid) << 64 };
            let block = BlockRef {
                hash: self.hasher.link(prev, i as u32, &[], Some(extra), full),
                index: i as u32,
                valid_tokens: valid,
            };
            prev = block.hash;
            blocks.push(block);
        }
        Ok(SlicePlan::new(&self.layout, blocks))
    }

    /// Canonical plan for `req`: the blocks its range touches, with their
    /// chained hashes and valid token counts.
    ///
    /// Errors for an empty, reversed or out-of-bounds range, and for more
    /// block extras than the sequence has blocks.
    pub fn plan(&self, req: &Request<'_>) -> Result<SlicePlan> {
        let root = self.root(&req.scope);
        let dropped = match req.budget {
            Some(b) => b.dropped(req.tokens.len())?,
            None => None,
        };
        let Some(d) = dropped else {
            return self.plan_tokens(root, req.tokens, &req.range, req.block_extras);
        };
        // The caller's range, in the caller's positions, before the cut
        // moves them.
        range::check_range(&req.range, req.tokens.len())?;
        if d.start <= req.range.start && req.range.end <= d.end {
            return Err(Error::InvalidValue(
                "the range holds only tokens the budget drops",
            ));
        }
        let cut = d.end - d.start;
        let shift = |p: usize, what: &'static str| -> Result<usize> {
            if p <= d.start {
                Ok(p)
            } else if p >= d.end {
                Ok(p - cut)
            } else {
                Err(Error::OutOfRange {
                    what,
                    index: p as u64,
                    bound: d.start as u64 + 1,
                })
            }
        };
        let range = shift(req.range.start, "range start inside the dropped tokens")?
            ..shift(req.range.end, "range end inside the dropped tokens")?;
        let kept = truncation::without(req.tokens, &d);
        let root = self
            .hasher
            .truncated_root(root, d.start as u64..d.end as u64);
        Ok(self
            .plan_tokens(root, &kept, &range, req.block_extras)?
            .with_dropped(Some(d)))
    }

    fn plan_tokens(
        &self,
        root: BlockHash,
        tokens: &[u32],
        range: &Range<usize>,
        extras: &[Option<u128>],
    ) -> Result<SlicePlan> {
        let bt = self.layout.block_tokens();
        let total_blocks = tokens.len().div_ceil(bt as usize);
        if extras.len() > total_blocks {
            check_len("block extras", total_blocks, extras.len())?;
        }
        let blocks = canonical_blocks(range, tokens.len(), bt)?;
        let mut chain = self.chain(root, tokens, extras, blocks.end)?;
        chain.drain(..blocks.start as usize);
        Ok(SlicePlan::new(&self.layout, chain))
    }
}
