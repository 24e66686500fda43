//! Reading and writing token rows of K/V in pages, with dtype conversion.

use super::{PageGeometry, PageId, PageMemory, PageMemoryMut};
use crate::error::{Error, Result, check_index, check_len};
use crate::layout::{KeyOrder, KvLayout, KvPart};

/// Decodes the first `tokens` rows of one head's K or V matrix in `page`
/// into `out` (`tokens × head_dim` f32 values, token-major whatever the
/// layout's [`KeyOrder`]).
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, KvPart, LayoutSpec, PageBuf, PageId, read_head_rows};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F16))?;
/// let pages = PageBuf::new(layout, 1)?;
/// let mut rows = [1.0f32; 6];
/// read_head_rows(&pages, PageId(0), KvPart::V, 0, 0, &mut rows)?;
/// assert_eq!(rows, [0.0; 6]);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub fn read_head_rows<M: PageMemory + ?Sized>(
    memory: &M,
    page: PageId,
    part: KvPart,
    layer_in_group: u32,
    head_in_shard: u32,
    out: &mut [f32],
) -> Result<()> {
    let layout = memory.layout();
    let hd = layout.head_dim() as usize;
    let region = layout.head_region(part, layer_in_group, head_in_shard)?;
    if !out.len().is_multiple_of(hd) || out.len() > region.len() {
        return Err(Error::ShapeMismatch {
            what: "rows to read (elements, whole rows of one block)",
            expected: region.len() as u64,
            actual: out.len() as u64,
        });
    }
    let es = layout.dtype().size_bytes();
    let bytes = memory.page(page)?;
    let start = region.start * es;
    if let Some(sr) = layout.scale_region(part, layer_in_group, head_in_shard)? {
        return read_scaled_rows(layout, bytes, part, start, &bytes[sr], out);
    }
    if part == KvPart::K && layout.key_order() == KeyOrder::DimMajor {
        // A column of the stored matrix per row: element by element.
        for (i, x) in out.iter_mut().enumerate() {
            let at = start + layout.elem_offset(part, i / hd, i % hd) * es;
            layout
                .dtype()
                .decode_row(&bytes[at..at + es], core::slice::from_mut(x))?;
        }
        return Ok(());
    }
    layout
        .dtype()
        .decode_row(&bytes[start..start + out.len() * es], out)
}

/// [`read_head_rows`] for a scaled dtype: each row's codes times its scale.
fn read_scaled_rows(
    layout: &KvLayout,
    page: &[u8],
    part: KvPart,
    start: usize,
    scales: &[u8],
    out: &mut [f32],
) -> Result<()> {
    let hd = layout.head_dim() as usize;
    let dtype = layout.dtype();
    let mut codes = [0u8; 64];
    for (t, row) in out.chunks_exact_mut(hd).enumerate() {
        let scale = f32::from_le_bytes(scales[4 * t..4 * t + 4].try_into().expect("4 bytes"));
        for (c0, chunk) in row.chunks_mut(codes.len()).enumerate() {
            let codes = &mut codes[..chunk.len()];
            for (i, c) in codes.iter_mut().enumerate() {
                *c = page[start + layout.elem_offset(part, t, c0 * 64 + i)];
            }
            dtype.dequantize_row(codes, scale, chunk)?;
        }
    }
    Ok(())
}

/// The largest magnitude a key may have: with queries bounded to match, a
/// score `scale · q · k` stays below a quarter of `f32::MAX`, so every
/// engine and instruction set computes the same finite softmax. Real keys
/// are below 10^4.
pub const KEY_LIMIT: f32 = (1u64 << 56) as f32;

/// The largest magnitude a value may have: attention sums a context's
/// values weighted by at most 1 each before it divides, so with values
/// below 2^90 no context of fewer than 2^37 tokens can overflow f32 on
/// the way, in any engine's order of summation. Real values are below
/// 10^4.
pub const VALUE_LIMIT: f32 = (1u128 << 90) as f32;

/// New K/V tokens for one layer and head shard, to be stored at positions
/// `start..start + n` of a sequence whose pages are `block_table`.
///
/// `k` and `v` are `n × shard_kv_heads × head_dim` f32 values, token-major.
///
/// Values are checked before anything is written: every value must be
/// finite (else [`Error::InvalidValue`]) and fit the layout's dtype
/// (70,000 does not fit f16), keys must stay within ±[`KEY_LIMIT`]
/// (2^56), so that no attention score can overflow f32 (queries are
/// bounded to match, see
/// [`AttentionBatch::validate`](crate::AttentionBatch::validate)), and
/// values within ±[`VALUE_LIMIT`] (2^90), so that no weighted sum can;
/// else [`Error::ValueTooLarge`] names the token and element. A page the write
/// touches must not appear at another position of the block table
/// ([`Error::DuplicatePage`]); attention itself may read one page at two
/// positions.
#[derive(Debug, Clone, Copy)]
pub struct KvWrite<'a> {
    /// Global layer index.
    pub layer: u32,
    /// Head shard the values belong to.
    pub shard: u32,
    /// Pages of the sequence for this layer's group and this shard.
    pub block_table: &'a [PageId],
    /// Position of the first new token.
    pub start: usize,
    /// Keys of the new tokens.
    pub k: &'a [f32],
    /// Values of the new tokens.
    pub v: &'a [f32],
}

impl KvWrite<'_> {
    /// Checks the write against `memory` before anything is stored: layer
    /// and shard in range, `k`/`v` whole rows of equal length, finite
    /// values, positions inside the block table, and every touched page
    /// inside the memory. Every backend's `write_kv` calls this first.
    ///
    /// ```
    /// use kvslice_core::{KvDtype, KvLayout, KvWrite, LayoutSpec, PageBuf, PageId};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 2, 2, 2, 4, KvDtype::F16))?;
    /// let pages = PageBuf::new(layout, 1)?;
    /// let kv = [0.5f32; 2 * 2 * 2]; // two tokens, two kv heads
    /// let w = KvWrite { layer: 0, shard: 0, block_table: &[PageId(0)], start: 2, k: &kv, v: &kv };
    /// assert_eq!(w.validate(&pages)?.tokens, 2);
    /// // Past the table's 4 slots:
    /// assert!(KvWrite { start: 3, ..w }.validate(&pages).is_err());
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn validate<M: PageGeometry + ?Sized>(&self, memory: &M) -> Result<WriteShape> {
        let w = self;
        let layout = *memory.layout();
        let (_, layer_in_group) = layout.layer_group(w.layer)?;
        let shard = layout.head_shard(w.shard)?;
        let heads = shard.num_kv_heads() as usize;
        let hd = layout.head_dim() as usize;
        let bt = layout.block_tokens() as usize;
        let row = heads * hd;
        if !w.k.len().is_multiple_of(row) {
            return Err(Error::ShapeMismatch {
                what: "k length (whole tokens of shard kv heads × head_dim)",
                // The whole tokens the caller was closest to providing.
                expected: (w.k.len().div_ceil(row).max(1) * row) as u64,
                actual: w.k.len() as u64,
            });
        }
        check_len("v length", w.k.len(), w.v.len())?;
        let n = w.k.len() / row;
        let end = w
            .start
            .checked_add(n)
            .ok_or(Error::Overflow("token position"))?;
        let capacity = w.block_table.len().saturating_mul(bt);
        if end > capacity {
            return Err(Error::OutOfRange {
                what: "token position (past the block table)",
                index: end as u64 - 1,
                bound: capacity as u64,
            });
        }
        if w.k.iter().chain(w.v).any(|x| !x.is_finite()) {
            return Err(Error::InvalidValue("non-finite K/V value"));
        }
        let dtype = layout.dtype();
        for (what, src, limit) in [("key", w.k, KEY_LIMIT), ("value", w.v, VALUE_LIMIT)] {
            if let Some(i) = src.iter().position(|&x| x.abs() > limit || !dtype.fits(x)) {
                return Err(Error::ValueTooLarge {
                    what,
                    token: (w.start + i / row) as u64,
                    element: (i % row) as u64,
                });
            }
        }
        let touched = if n == 0 {
            0..0
        } else {
            w.start / bt..(end - 1) / bt + 1
        };
        for (i, &page) in w
            .block_table
            .iter()
            .enumerate()
            .skip(touched.start)
            .take(touched.len())
        {
            if page == PageId::PLACEHOLDER {
                return Err(Error::ReleasedBlockWrite { block: i as u64 });
            }
            check_index("page", page.0 as usize, memory.num_pages() as usize)?;
            // A page written here must hold no other position of the
            // table: the write would overwrite that block's K/V.
            if w.block_table
                .iter()
                .enumerate()
                .any(|(j, &p)| p == page && j != i)
            {
                return Err(Error::DuplicatePage { page: page.0 });
            }
        }
        Ok(WriteShape {
            layout,
            layer_in_group,
            kv_heads: heads,
            tokens: n,
        })
    }
}

/// What [`KvWrite::validate`] derives for the backend.
#[derive(Debug, Clone, Copy)]
pub struct WriteShape {
    /// The memory's layout.
    pub layout: KvLayout,
    /// The layer's index inside its page.
    pub layer_in_group: u32,
    /// Kv heads of the write's shard.
    pub kv_heads: usize,
    /// Tokens written.
    pub tokens: usize,
}

/// Stores `w`'s tokens into pages, rounding to the layout's dtype.
///
/// Everything is checked before the first byte is written, so an error
/// leaves memory untouched.
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, KvPart, KvWrite, LayoutSpec, PageBuf, PageId, read_head_rows, write_kv};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 2, KvDtype::F32))?;
/// let mut pages = PageBuf::new(layout, 2)?;
/// let table = [PageId(1), PageId(0)];
/// // Three tokens: two fill page 1, the third lands in page 0.
/// let k = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
/// write_kv(&mut pages, &KvWrite { layer: 0, shard: 0, block_table: &table, start: 0, k: &k, v: &k })?;
/// let mut row = [0.0f32; 2];
/// read_head_rows(&pages, PageId(0), KvPart::K, 0, 0, &mut row)?;
/// assert_eq!(row, [5.0, 6.0]);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub fn write_kv<M: PageMemoryMut + ?Sized>(memory: &mut M, w: &KvWrite<'_>) -> Result<()> {
    let WriteShape {
        layout,
        layer_in_group,
        kv_heads: heads,
        tokens: n,
    } = w.validate(&*memory)?;
    let hd = layout.head_dim() as usize;
    let bt = layout.block_tokens() as usize;
    // Memory may refuse writes to a page it can read (a view's cached
    // pages, or pages it does not hold): asked of every touched page
    // before the first byte, so a refusal past the first page leaves the
    // earlier ones as they were.
    if n > 0 {
        for block in w.start / bt..=(w.start + n - 1) / bt {
            memory.page_mut(w.block_table[block])?;
        }
    }
    let row = heads * hd;
    let dtype = layout.dtype();
    let es = dtype.size_bytes();
    let mut codes = alloc::vec![0u8; if dtype.is_scaled() { hd } else { 0 }];
    for t in 0..n {
        let pos = w.start + t;
        let page = memory.page_mut(w.block_table[pos / bt])?;
        let slot = pos % bt;
        for h in 0..heads {
            for (part, src) in [(KvPart::K, w.k), (KvPart::V, w.v)] {
                let region = layout.head_region(part, layer_in_group, h as u32)?;
                let values = &src[t * row + h * hd..t * row + (h + 1) * hd];
                if let Some(sr) = layout.scale_region(part, layer_in_group, h as u32)? {
                    let scale = dtype.quantize_row(values, &mut codes)?;
                    page[sr.start + 4 * slot..sr.start + 4 * slot + 4]
                        .copy_from_slice(&scale.to_le_bytes());
                    for (d, &c) in codes.iter().enumerate() {
                        page[region.start + layout.elem_offset(part, slot, d)] = c;
                    }
                    continue;
                }
                if part == KvPart::K && layout.key_order() == KeyOrder::DimMajor {
                    // A column of the stored matrix: element by element.
                    for (d, x) in values.iter().enumerate() {
                        let at = (region.start + layout.elem_offset(part, slot, d)) * es;
                        dtype.encode_row(core::slice::from_ref(x), &mut page[at..at + es])?;
                    }
                    continue;
                }
                let at = (region.start + slot * hd) * es;
                dtype.encode_row(values, &mut page[at..at + hd * es])?;
            }
        }
    }
    Ok(())
}
