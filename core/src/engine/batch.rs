//! What an engine is asked to compute, and its validation.

use crate::error::{Error, Result, check_index, check_len};
use crate::layout::{HeadShard, KvLayout};
use crate::page::KEY_LIMIT;
use crate::page::{PageGeometry, PageId};

/// One sequence of a batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqAttention<'a> {
    /// Pages of the sequence for the batch's layer group and shard.
    pub block_table: &'a [PageId],
    /// Tokens of context, including the `q_len` new ones.
    pub kv_len: usize,
    /// New query tokens (1 for decode).
    pub q_len: usize,
}

impl SeqAttention<'_> {
    /// The keys query token `t` (of `0..q_len`) sees: causal, aligned
    /// bottom-right, and within `window` tokens of it if set (the token
    /// itself and the `window - 1` before it).
    ///
    /// ```
    /// use kvslice_core::{PageId, SeqAttention};
    ///
    /// let seq = SeqAttention { block_table: &[PageId(0); 4], kv_len: 10, q_len: 2 };
    /// assert_eq!(seq.keys_seen(0, None), 0..9);
    /// assert_eq!(seq.keys_seen(1, Some(4)), 6..10);
    /// // A window longer than the context is no window.
    /// assert_eq!(seq.keys_seen(1, Some(100)), 0..10);
    /// ```
    pub fn keys_seen(&self, t: usize, window: Option<u32>) -> core::ops::Range<usize> {
        let end = (self.kv_len - self.q_len + t + 1).min(self.kv_len);
        let start = window.map_or(0, |w| end.saturating_sub(w as usize));
        start..end
    }

    /// The first block any query token reads: blocks before it lie wholly
    /// before every query's window, and their entries of the block table
    /// may be [`PageId::PLACEHOLDER`].
    pub fn first_block(&self, window: Option<u32>, block_tokens: u32) -> usize {
        self.keys_seen(0, window).start / block_tokens as usize
    }
}

/// A layer's attention for several sequences on one head shard.
///
/// `queries` is `Σ q_len × shard q heads × head_dim`, sequences in order,
/// token-major, then head.
#[derive(Debug, Clone, Copy)]
pub struct AttentionBatch<'a> {
    /// Global layer index.
    pub layer: u32,
    /// Head shard whose query heads are computed.
    pub shard: u32,
    /// The sequences.
    pub seqs: &'a [SeqAttention<'a>],
    /// Query vectors.
    pub queries: &'a [f32],
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Sliding attention window in tokens (Mistral, Gemma 2/3, Phi-3):
    /// query token at position `p` sees keys `max(0, p - W + 1)..=p`;
    /// `None` is full causal attention. Set it with
    /// [`window`](Self::window).
    pub window: Option<u32>,
}

impl<'a> AttentionBatch<'a> {
    /// Layer `layer`'s attention for `seqs` on head shard 0; set another
    /// shard with [`shard`](Self::shard). Unlike [`new`](Self::new), no two
    /// arguments of the same type stand side by side.
    ///
    /// ```
    /// use kvslice_core::{AttentionBatch, PageId, SeqAttention};
    ///
    /// let seqs = [SeqAttention { block_table: &[PageId(0)], kv_len: 1, q_len: 1 }];
    /// let q = [0.0f32; 4];
    /// let batch = AttentionBatch::for_layer(3, &seqs, &q, 0.5).shard(1);
    /// assert_eq!((batch.layer, batch.shard), (3, 1));
    /// ```
    pub fn for_layer(
        layer: u32,
        seqs: &'a [SeqAttention<'a>],
        queries: &'a [f32],
        scale: f32,
    ) -> Self {
        Self::new(layer, 0, seqs, queries, scale)
    }

    /// The largest query magnitude a batch may have: with keys within
    /// ±[`KEY_LIMIT`], a score's sum of `head_dim` products, scaled or not,
    /// stays under a quarter of `f32::MAX`, so every engine computes the
    /// same finite softmax (larger queries are
    /// [`Error::ValueTooLarge`]).
    ///
    /// ```
    /// use kvslice_core::{AttentionBatch, KEY_LIMIT};
    ///
    /// let limit = AttentionBatch::query_limit(128, 0.088);
    /// assert!(limit * KEY_LIMIT * 128.0 <= f32::MAX / 4.0);
    /// assert!(limit > 1e18);
    /// ```
    pub fn query_limit(head_dim: u32, scale: f32) -> f32 {
        f32::MAX / 4.0 / (KEY_LIMIT * head_dim as f32 * scale.max(1.0))
    }

    /// The same batch on head shard `shard`.
    pub fn shard(mut self, shard: u32) -> Self {
        self.shard = shard;
        self
    }

    /// The same batch with a sliding attention window of `tokens` (zero is
    /// refused by [`validate`](Self::validate)). Engines read no page that
    /// lies wholly before every query's window, so decode costs follow the
    /// window, not the context; those block-table entries may be
    /// [`PageId::PLACEHOLDER`].
    ///
    /// ```
    /// use kvslice_core::{
    ///     AttentionBatch, AttentionEngine, KvDtype, KvLayout, KvWrite, LayoutSpec, PageBuf,
    ///     PageId, ReferenceEngine, SeqAttention,
    /// };
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 2, KvDtype::F32))?;
    /// let mut pages = PageBuf::new(layout, 2)?;
    /// let table = [PageId(0), PageId(1)];
    /// let (k, v) = ([0.0; 4], [1.0, 2.0, 3.0, 4.0]);
    /// let write = KvWrite { layer: 0, shard: 0, block_table: &table, start: 0, k: &k, v: &v };
    /// ReferenceEngine.write_kv(&mut pages, &write)?;
    /// // Decode at position 3 with a window of 2 tokens: values 3 and 4,
    /// // equal weights. The first page is never read.
    /// let table = [PageId::PLACEHOLDER, PageId(1)];
    /// let seqs = [SeqAttention { block_table: &table, kv_len: 4, q_len: 1 }];
    /// let mut out = [0.0f32];
    /// let batch = AttentionBatch::for_layer(0, &seqs, &[1.0], 1.0).window(2);
    /// ReferenceEngine.attend(&pages, &batch, &mut out)?;
    /// assert_eq!(out, [3.5]);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn window(mut self, tokens: u32) -> Self {
        self.window = Some(tokens);
        self
    }

    /// Bundles a batch (`layer`, then `shard`; [`for_layer`](Self::for_layer)
    /// names them apart).
    pub fn new(
        layer: u32,
        shard: u32,
        seqs: &'a [SeqAttention<'a>],
        queries: &'a [f32],
        scale: f32,
    ) -> Self {
        Self {
            layer,
            shard,
            seqs,
            queries,
            scale,
            window: None,
        }
    }

    /// Checks the batch against `memory` and the output length, and returns
    /// the shape an engine needs. Every backend calls this before computing.
    ///
    /// Catches: layer or shard out of range, bad scale, a window of zero
    /// tokens, `q_len` of zero or beyond `kv_len`, a context longer than
    /// its block table, a page id past the memory or a placeholder where a
    /// query's window needs a page, non-finite queries, and query or
    /// output lengths that do not match.
    pub fn validate<M: PageGeometry + ?Sized>(
        &self,
        memory: &M,
        out_len: usize,
    ) -> Result<BatchShape> {
        let shape = self.validate_shape(memory)?;
        let layout = shape.layout;
        let row = shape.shard.num_q_heads() as usize * layout.head_dim() as usize;
        let elems = shape
            .q_tokens
            .checked_mul(row)
            .ok_or(Error::Overflow("query elements"))?;
        check_len("queries length", elems, self.queries.len())?;
        check_len("output length", elems, out_len)?;
        if self.queries.iter().any(|x| !x.is_finite()) {
            return Err(Error::InvalidValue("non-finite query value"));
        }
        let q_limit = Self::query_limit(layout.head_dim(), self.scale);
        if let Some(i) = self.queries.iter().position(|x| x.abs() > q_limit) {
            return Err(Error::ValueTooLarge {
                what: "query",
                token: (i / row) as u64,
                element: (i % row) as u64,
            });
        }
        Ok(shape)
    }

    /// [`validate`](Self::validate) without the queries and the output:
    /// for engines whose queries and output live elsewhere (device
    /// buffers), which check their sizes themselves. `queries` is ignored.
    ///
    /// ```
    /// use kvslice_core::{AttentionBatch, KvDtype, KvLayout, LayoutSpec, PageBuf, PageId, SeqAttention};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 4, KvDtype::F16))?;
    /// let pages = PageBuf::new(layout, 4)?;
    /// let table = [PageId(1), PageId(2)];
    /// let seqs = [SeqAttention { block_table: &table, kv_len: 6, q_len: 1 }];
    /// let shape = AttentionBatch::new(0, 0, &seqs, &[], 0.5).validate_shape(&pages)?;
    /// assert_eq!(shape.q_tokens, 1);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn validate_shape<M: PageGeometry + ?Sized>(&self, memory: &M) -> Result<BatchShape> {
        let layout = *memory.layout();
        let (_, layer_in_group) = layout.layer_group(self.layer)?;
        let shard = layout.head_shard(self.shard)?;
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(Error::InvalidValue("scale must be finite and positive"));
        }
        if self.window == Some(0) {
            return Err(Error::InvalidValue(
                "attention window must be at least one token",
            ));
        }
        let bt = layout.block_tokens() as usize;
        let mut q_tokens = 0usize;
        for s in self.seqs {
            if s.q_len == 0 || s.q_len > s.kv_len {
                return Err(Error::OutOfRange {
                    what: "q_len (must be 1..=kv_len)",
                    index: s.q_len as u64,
                    bound: s.kv_len as u64 + 1,
                });
            }
            let blocks = s.kv_len.div_ceil(bt);
            if blocks > s.block_table.len() {
                return Err(Error::ContextPastTable {
                    kv_len: s.kv_len as u64,
                    table_tokens: (s.block_table.len() * bt) as u64,
                });
            }
            let first = s.first_block(self.window, layout.block_tokens());
            for (b, p) in s.block_table[..blocks].iter().enumerate().skip(first) {
                if *p == PageId::PLACEHOLDER {
                    return Err(Error::ReleasedBlockRead {
                        block: b as u64,
                        first: first as u64,
                    });
                }
                check_index("page", p.0 as usize, memory.num_pages() as usize)?;
            }
            q_tokens = q_tokens
                .checked_add(s.q_len)
                .ok_or(Error::Overflow("query tokens"))?;
        }
        Ok(BatchShape {
            layout,
            shard,
            layer_in_group,
            q_tokens,
        })
    }
}

/// What [`AttentionBatch::validate`] derives for the engine.
#[derive(Debug, Clone)]
pub struct BatchShape {
    /// The memory's layout.
    pub layout: KvLayout,
    /// The shard's heads.
    pub shard: HeadShard,
    /// The layer's index inside its page.
    pub layer_in_group: u32,
    /// Total query tokens in the batch.
    pub q_tokens: usize,
}
