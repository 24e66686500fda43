//! A [`PageMemory`] over pool pages the caller holds, so attention engines
//! can read and write pool pages directly.

use hashbrown::HashMap;

use super::{PageMut, PagePool, PageRef};
use crate::error::{Error, Result};
use crate::layout::KvLayout;
use crate::page::{PageGeometry, PageId, PageMemory, PageMemoryMut};

/// Page memory made of borrowed guards: readable pages from [`PageRef`]s
/// (cached, immutable) and writable ones from [`PageMut`]s (being filled).
/// Any other page id is an error, so an engine can only touch pages the
/// caller holds; the borrows make aliasing impossible. A page of another
/// pool (whose layout may differ) is never read or written: once one is
/// added, every access through the view is an error.
///
/// ```
/// use kvslice_core::{
///     AttentionBatch, AttentionEngine, KvDtype, KvLayout, KvWrite, LayoutSpec, PagePool, PageView,
///     ReferenceEngine, SeqAttention,
/// };
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 2, KvDtype::F32))?;
/// let pool = PagePool::new(layout, 4)?;
/// let mut fresh = pool.alloc()?;
/// let id = fresh.handle().id();
/// let table = [id];
/// {
///     let mut view = PageView::new(&pool);
///     view.add_mut(&mut fresh);
///     let kv = [1.0, 0.0, 0.0, 1.0];
///     ReferenceEngine.write_kv(&mut view, &KvWrite { layer: 0, shard: 0, block_table: &table, start: 0, k: &kv, v: &kv })?;
/// }
/// let cached = fresh.publish();
/// let mut view = PageView::new(&pool);
/// view.add_ref(&cached);
/// let seqs = [SeqAttention { block_table: &table, kv_len: 2, q_len: 1 }];
/// let mut out = [0.0f32; 2];
/// ReferenceEngine.attend(&mut view, &AttentionBatch::new(0, 0, &seqs, &[0.0, 0.0], 1.0), &mut out)?;
/// assert_eq!(out, [0.5, 0.5]);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug)]
pub struct PageView<'a> {
    layout: KvLayout,
    capacity: u32,
    /// The pool the view is of.
    pool: u64,
    /// A page of another pool was added.
    foreign: bool,
    reads: HashMap<u32, &'a [u8]>,
    writes: HashMap<u32, &'a mut [u8]>,
}

impl<'a> PageView<'a> {
    /// An empty view of `pool`'s pages.
    pub fn new(pool: &PagePool<'_>) -> Self {
        Self {
            layout: *pool.layout(),
            capacity: pool.capacity(),
            pool: pool.id(),
            foreign: false,
            reads: HashMap::new(),
            writes: HashMap::new(),
        }
    }

    /// Makes a cached page readable through the view (a page of another
    /// pool makes every access an error).
    pub fn add_ref(&mut self, page: &'a PageRef<'_, '_>) {
        if page.pool().id() != self.pool {
            self.foreign = true;
            return;
        }
        self.reads.insert(page.handle().id().0, page.bytes());
    }

    /// Makes a page being filled readable and writable through the view
    /// (a page of another pool makes every access an error).
    pub fn add_mut(&mut self, page: &'a mut PageMut<'_, '_>) {
        if page.pool().id() != self.pool {
            self.foreign = true;
            return;
        }
        let id = page.handle().id().0;
        self.writes.insert(id, page.bytes_mut());
    }

    fn check(&self) -> Result<()> {
        match self.foreign {
            true => Err(Error::InvalidValue(
                "a page of another pool was added to this view",
            )),
            false => Ok(()),
        }
    }

    fn missing(id: PageId) -> Error {
        Error::OutOfRange {
            what: "page (not held by this view)",
            index: u64::from(id.0),
            bound: 0,
        }
    }
}

impl PageGeometry for PageView<'_> {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn num_pages(&self) -> u32 {
        self.capacity
    }
}

impl PageMemory for PageView<'_> {
    fn page(&self, id: PageId) -> Result<&[u8]> {
        self.check()?;
        match (self.reads.get(&id.0), self.writes.get(&id.0)) {
            (Some(r), _) => Ok(r),
            (None, Some(w)) => Ok(w),
            (None, None) => Err(Self::missing(id)),
        }
    }
}

impl PageMemoryMut for PageView<'_> {
    fn page_mut(&mut self, id: PageId) -> Result<&mut [u8]> {
        self.check()?;
        match self.writes.get_mut(&id.0) {
            Some(w) => Ok(w),
            None if self.reads.contains_key(&id.0) => {
                Err(Error::InvalidValue("page is cached and immutable"))
            }
            None => Err(Self::missing(id)),
        }
    }
}
