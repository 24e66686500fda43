//! Paged attention: the engine trait, the batch it consumes, the checks
//! every engine runs before computing, and the reference engine.

mod batch;
mod reference;

pub use batch::{AttentionBatch, BatchShape, SeqAttention};
pub use reference::ReferenceEngine;

use crate::error::Result;
use crate::page::KvWrite;

/// A stateless attention backend over paged K/V of memory type `P`.
///
/// Decode is a batch whose sequences all have `q_len == 1`; causal prefill
/// has longer `q_len`. Query `i` of `q_len` attends to keys
/// `0..=kv_len - q_len + i` (the mask is aligned bottom-right, as in
/// FlashInfer). Accumulation is f32 whatever the storage dtype.
///
/// ```
/// use kvslice_core::{
///     AttentionBatch, AttentionEngine, KvDtype, KvLayout, KvWrite, LayoutSpec, PageBuf, PageId,
///     ReferenceEngine, SeqAttention,
/// };
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 2, 4, KvDtype::F32))?;
/// let mut pages = PageBuf::new(layout, 1)?;
/// let engine = ReferenceEngine;
/// let table = [PageId(0)];
/// // Two tokens of one kv head: keys and values.
/// let k = [1.0, 0.0, 0.0, 1.0];
/// let v = [10.0, 0.0, 0.0, 20.0];
/// engine.write_kv(&mut pages, &KvWrite { layer: 0, shard: 0, block_table: &table, start: 0, k: &k, v: &v })?;
/// // Decode one query per query head (2 heads share the kv head).
/// let seqs = [SeqAttention { block_table: &table, kv_len: 2, q_len: 1 }];
/// let q = [0.0, 0.0, 50.0, 0.0];
/// let mut out = [0.0f32; 4];
/// engine.attend(&pages, &AttentionBatch::new(0, 0, &seqs, &q, 1.0), &mut out)?;
/// assert_eq!(&out[..2], &[5.0, 10.0]); // uniform weights
/// assert!((out[2] - 10.0).abs() < 1e-6); // all weight on token 0
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub trait AttentionEngine<P: ?Sized> {
    /// Computes attention for `batch` into `out`
    /// (`total q tokens × shard q heads × head_dim`).
    ///
    /// All input is validated before any compute; on error `out` may hold
    /// anything but `pages` is untouched.
    fn attend(&self, pages: &P, batch: &AttentionBatch<'_>, out: &mut [f32]) -> Result<()>;

    /// Stores new K/V tokens into pages. On error nothing was written.
    fn write_kv(&self, pages: &mut P, write: &KvWrite<'_>) -> Result<()>;
}
