//! The decode workload every attention benchmark measures, so the CPU and
//! GPU numbers are comparable: 32 query heads, 8 kv heads, head_dim 128,
//! f16 K/V in 16-token pages, a batch of 8 sequences of one context length.
//! The CPU decodes it with keys dim-major ([`CPU_KEY_ORDER`]), the GPU
//! token-major (the one order its shaders take); the values are the same.

use kvslice_core::testkit::{Rng, dim_major_blocks};
use kvslice_core::{
    KeyOrder, KvDtype, KvLayout, KvPart, KvWrite, LayoutSpec, PageBuf, PageId, PageMemoryMut,
    SeqAttention, write_kv,
};

/// Query heads.
pub const Q_HEADS: u32 = 32;
/// Key/value heads.
pub const KV_HEADS: u32 = 8;
/// Elements per head.
pub const HEAD_DIM: u32 = 128;
/// Tokens per page.
pub const BLOCK: u32 = 16;
/// Sequences per batch.
pub const BATCH: usize = 8;
/// The key order the CPU benches decode: kvslice-cpu's four-row kernels
/// score dim-major keys without horizontal sums, 11.8 ns per key against
/// 13.1 token-major on a Zen 4 VM. There, over eight interleaved runs,
/// decode over them read a median 81.5% and 83% of the read loop at 8k
/// and 32k, and token-major keys 79% and 78.5% in the same rounds, from a
/// pool placed where decode ran faster (docs/notes/cpu-decode.md).
pub const CPU_KEY_ORDER: KeyOrder = KeyOrder::DimMajor;

/// The workload's layout (one layer), keys token-major.
///
/// ```
/// assert_eq!(kvslice_benches::decode_workload::layout().page_bytes(), 2 * 8 * 16 * 128 * 2);
/// ```
pub fn layout() -> KvLayout {
    layout_with(KeyOrder::TokenMajor)
}

/// The workload's layout with keys in `order`.
pub fn layout_with(order: KeyOrder) -> KvLayout {
    KvLayout::new(
        LayoutSpec::new(1, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK, KvDtype::F16).with_key_order(order),
    )
    .expect("a valid layout")
}

/// Pages for [`BATCH`] sequences of `ctx` tokens with keys in `order`,
/// every value random (never zero; encoded directly, as this is setup and
/// not what is measured, and the same values whatever the order), and
/// their block tables: consecutive pages per sequence, or a random
/// permutation with `shuffle`.
///
/// ```
/// use kvslice_core::{KeyOrder, KvPart, PageId, read_head_rows};
/// use kvslice_benches::decode_workload::fill;
///
/// let (pages, tables) = fill(40, true, KeyOrder::TokenMajor);
/// assert_eq!((tables.len(), tables[0].len()), (8, 3));
/// let (dim_major, _) = fill(40, true, KeyOrder::DimMajor);
/// let (mut a, mut b) = (vec![0f32; 16 * 128], vec![0f32; 16 * 128]);
/// read_head_rows(&pages, PageId(2), KvPart::K, 0, 5, &mut a)?;
/// read_head_rows(&dim_major, PageId(2), KvPart::K, 0, 5, &mut b)?;
/// assert_eq!(a, b);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub fn fill(ctx: usize, shuffle: bool, order: KeyOrder) -> (PageBuf, Vec<Vec<PageId>>) {
    let l = layout_with(order);
    let per_seq = ctx.div_ceil(BLOCK as usize);
    let total = per_seq * BATCH;
    let mut pages = PageBuf::new(l, total as u32).expect("pages");
    let mut rng = Rng::new(ctx as u64);
    let mut vals = vec![0f32; l.page_elems()];
    let mut bytes = vec![0u8; l.page_bytes()];
    for p in 0..total as u32 {
        // Drawn token-major, then each head's keys put in the order's place.
        vals.iter_mut().for_each(|v| *v = rng.unit());
        if order == KeyOrder::DimMajor {
            for h in 0..KV_HEADS {
                let r = l.head_region(KvPart::K, 0, h).expect("head");
                let keys = dim_major_blocks(&vals[r.clone()], BLOCK as usize, HEAD_DIM as usize);
                vals[r].copy_from_slice(&keys);
            }
        }
        KvDtype::F16.encode_row(&vals, &mut bytes).expect("encode");
        pages
            .page_mut(PageId(p))
            .expect("page")
            .copy_from_slice(&bytes);
    }
    let mut ids: Vec<PageId> = (0..total as u32).map(PageId).collect();
    if shuffle {
        rng.shuffle(&mut ids);
    }
    let tables = ids.chunks(per_seq).map(<[PageId]>::to_vec).collect();
    (pages, tables)
}

/// The workload's layout with K/V stored as `dtype`, keys in `order`.
///
/// ```
/// use kvslice_core::{KeyOrder, KvDtype};
/// use kvslice_benches::decode_workload::layout_of;
///
/// // int8 codes and a 4-byte scale per row of 128: 132 bytes where f16 takes 256.
/// let l = layout_of(KvDtype::I8, KeyOrder::DimMajor);
/// assert_eq!(l.page_bytes(), 2 * 8 * 16 * 132);
/// ```
pub fn layout_of(dtype: KvDtype, order: KeyOrder) -> KvLayout {
    KvLayout::new(
        LayoutSpec::new(1, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype).with_key_order(order),
    )
    .expect("a valid layout")
}

/// [`fill`] for K/V stored as `dtype` (any dtype, scaled ones included),
/// written through [`write_kv`] as a runtime writes them: consecutive
/// pages per sequence, random values (the same for every dtype and order).
///
/// ```
/// use kvslice_core::{KeyOrder, KvDtype, PageGeometry};
/// use kvslice_benches::decode_workload::fill_as;
///
/// let (pages, tables) = fill_as(40, KvDtype::F8E4M3, KeyOrder::DimMajor);
/// assert_eq!((pages.num_pages(), tables[7][2].0), (24, 23));
/// ```
pub fn fill_as(ctx: usize, dtype: KvDtype, order: KeyOrder) -> (PageBuf, Vec<Vec<PageId>>) {
    let l = layout_of(dtype, order);
    let per_seq = ctx.div_ceil(BLOCK as usize);
    let total = per_seq * BATCH;
    let mut pages = PageBuf::new(l, total as u32).expect("pages");
    let mut rng = Rng::new(ctx as u64);
    let row = (BLOCK * KV_HEADS * HEAD_DIM) as usize;
    for p in 0..total as u32 {
        let (k, v) = (rng.vec(row), rng.vec(row));
        let w = KvWrite {
            layer: 0,
            shard: 0,
            block_table: &[PageId(p)],
            start: 0,
            k: &k,
            v: &v,
        };
        write_kv(&mut pages, &w).expect("write");
    }
    let ids: Vec<PageId> = (0..total as u32).map(PageId).collect();
    let tables = ids.chunks(per_seq).map(<[PageId]>::to_vec).collect();
    (pages, tables)
}

/// The same block tables cycling over each sequence's first two pages
/// (for this workload's batch, 1 MiB in all): the work of a decode step
/// over `tables` with its K and V cache-resident, which says what compute
/// alone allows.
///
/// ```
/// use kvslice_core::PageId;
///
/// let tables = vec![(0..5).map(PageId).collect::<Vec<_>>()];
/// let hot = kvslice_benches::decode_workload::cached_tables(&tables);
/// assert_eq!(hot[0], [0, 1, 0, 1, 0].map(PageId));
/// ```
pub fn cached_tables(tables: &[Vec<PageId>]) -> Vec<Vec<PageId>> {
    tables
        .iter()
        .map(|t| (0..t.len()).map(|i| t[i % 2.min(t.len())]).collect())
        .collect()
}

/// One decode step (one query token) per sequence over `tables`.
pub fn decode_seqs(tables: &[Vec<PageId>], ctx: usize) -> Vec<SeqAttention<'_>> {
    tables
        .iter()
        .map(|t| SeqAttention {
            block_table: t,
            kv_len: ctx,
            q_len: 1,
        })
        .collect()
}

/// Bytes a decode step over `ctx` tokens reads from pages of `layout`:
/// K and V, and a scaled dtype's scales.
///
/// ```
/// use kvslice_core::{KeyOrder, KvDtype};
/// use kvslice_benches::decode_workload::{kv_bytes, kv_bytes_of, layout_of};
///
/// assert_eq!(kv_bytes_of(&layout_of(KvDtype::F16, KeyOrder::DimMajor), 1024), kv_bytes(1024));
/// ```
pub fn kv_bytes_of(layout: &KvLayout, ctx: usize) -> u64 {
    let per_token = layout.page_bytes() / layout.block_tokens() as usize;
    (BATCH * ctx * per_token) as u64
}

/// Bytes of K and V a decode step over `ctx` tokens reads.
pub fn kv_bytes(ctx: usize) -> u64 {
    (BATCH * ctx * KV_HEADS as usize * HEAD_DIM as usize * 2 * 2) as u64
}
