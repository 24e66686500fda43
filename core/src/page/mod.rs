//! Page memory: where K/V bytes live, addressed by page id.
//!
//! The attention engines read and write pages through [`PageMemory`] and
//! [`PageMemoryMut`]; the reference storage is [`PageBuf`], one allocation
//! made at construction.

mod buf;
mod kv_io;
mod typed;

pub use buf::PageBuf;
pub use kv_io::{KEY_LIMIT, KvWrite, VALUE_LIMIT, WriteShape, read_head_rows, write_kv};
pub use typed::{KvRows, KvRowsMut, ScaledRows};
pub(crate) use typed::{rows, rows_mut};

use crate::error::Result;
use crate::layout::KvLayout;

/// Index of a page in its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

impl PageId {
    /// Stands in a block table for a page no query reads: one wholly
    /// before a sliding window (see [`crate::AttentionBatch::window`]),
    /// released to the store. Engines refuse it where a window needs it.
    pub const PLACEHOLDER: PageId = PageId(u32::MAX);
}

/// How many pages of which layout a memory holds, wherever the bytes live
/// (host memory, or a device buffer the host cannot borrow from).
///
/// Validation ([`crate::AttentionBatch::validate`], [`KvWrite::validate`])
/// needs only this, so device-resident memories share it.
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageBuf, PageGeometry};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 4, 2, KvDtype::F32))?;
/// let pages = PageBuf::new(layout, 3)?;
/// // K and V of 2 tokens × 4 f32 values: 64 bytes a page.
/// assert_eq!((pages.num_pages(), pages.layout().page_bytes()), (3, 64));
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub trait PageGeometry {
    /// The layout every page follows.
    fn layout(&self) -> &KvLayout;
    /// Number of pages.
    fn num_pages(&self) -> u32;
}

/// Read access to page bytes.
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageBuf, PageGeometry, PageId, PageMemory};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 4, 2, KvDtype::F32))?;
/// let pages = PageBuf::new(layout, 3)?;
/// assert_eq!(pages.page(PageId(2))?.len(), layout.page_bytes());
/// assert!(pages.page(PageId(3)).is_err());
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub trait PageMemory: PageGeometry {
    /// The bytes of page `id`; an error if it does not exist.
    fn page(&self, id: PageId) -> Result<&[u8]>;
}

/// Write access to page bytes.
pub trait PageMemoryMut: PageMemory {
    /// The bytes of page `id`, writable; an error if it does not exist.
    fn page_mut(&mut self, id: PageId) -> Result<&mut [u8]>;
}
