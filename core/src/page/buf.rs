//! A fixed number of pages in one allocation.

use alloc::vec;
use alloc::vec::Vec;

use super::{PageGeometry, PageId, PageMemory, PageMemoryMut};
use crate::error::{Error, Result, check_index};
use crate::layout::KvLayout;

/// `num_pages` pages of `layout`, zeroed, allocated once.
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageBuf, PageId, PageMemoryMut};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 8, KvDtype::Bf16))?;
/// let mut pages = PageBuf::new(layout, 16)?;
/// pages.page_mut(PageId(0))?[0] = 1;
/// assert_eq!(pages.bytes().len(), 16 * layout.page_bytes());
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct PageBuf {
    layout: KvLayout,
    num_pages: u32,
    bytes: Vec<u8>,
}

impl PageBuf {
    /// Allocates `num_pages` zeroed pages. An empty buffer (0 pages) is
    /// legal; every page id is then out of range, which engines report.
    ///
    /// ```
    /// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageBuf, PageId, PageMemory};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 4, 4, KvDtype::F16))?;
    /// let empty = PageBuf::new(layout, 0)?;
    /// assert!(empty.page(PageId(0)).is_err());
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn new(layout: KvLayout, num_pages: u32) -> Result<Self> {
        let len = layout
            .page_bytes()
            .checked_mul(num_pages as usize)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or(Error::Overflow("page memory bytes"))?;
        Ok(Self {
            layout,
            num_pages,
            bytes: vec![0; len],
        })
    }

    /// All pages' bytes, page 0 first.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn span(&self, id: PageId) -> Result<core::ops::Range<usize>> {
        check_index("page", id.0 as usize, self.num_pages as usize)?;
        let n = self.layout.page_bytes();
        let start = id.0 as usize * n;
        Ok(start..start + n)
    }
}

impl PageGeometry for PageBuf {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn num_pages(&self) -> u32 {
        self.num_pages
    }
}

impl PageMemory for PageBuf {
    fn page(&self, id: PageId) -> Result<&[u8]> {
        let span = self.span(id)?;
        Ok(&self.bytes[span])
    }
}

impl PageMemoryMut for PageBuf {
    fn page_mut(&mut self, id: PageId) -> Result<&mut [u8]> {
        let span = self.span(id)?;
        Ok(&mut self.bytes[span])
    }
}
