//! Guards that own a page's references: the only way to its bytes.
//!
//! - [`PageMut`]: the single writer of a page being filled.
//! - [`PageRef`]: one counted reference to a published, immutable page.
//! - [`Evicting`]: a page taken out of the cache, not yet freed.
//! - [`AllocMany`]: the pages of an all-or-nothing reservation.

use core::mem::ManuallyDrop;

use super::free_list::Chain;
use super::state::Life;
use super::{PageHandle, PagePool};
use crate::error::Result;
use crate::layout::KvPart;
use crate::page::{KvRows, KvRowsMut};

/// Exclusive access to a page being filled. Dropping it frees the page;
/// [`PageMut::publish`] turns it into a shared [`PageRef`].
#[must_use = "dropping a PageMut frees the page"]
#[derive(Debug)]
pub struct PageMut<'p, 'm> {
    pub(super) pool: &'p PagePool<'m>,
    pub(super) handle: PageHandle,
}

impl<'p, 'm> PageMut<'p, 'm> {
    /// Index and generation of the page.
    pub fn handle(&self) -> PageHandle {
        self.handle
    }

    /// The pool the page belongs to.
    pub(crate) fn pool(&self) -> &'p PagePool<'m> {
        self.pool
    }

    /// The page's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: this guard is the page's only accessor: the page is
        // Filling, which no other guard or acquire can reach, and `&self`
        // excludes our own `bytes_mut` for the slice's lifetime.
        unsafe { self.pool.storage.page(self.handle.index) }
    }

    /// The page's bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only slice.
        unsafe { self.pool.storage.page_mut(self.handle.index) }
    }

    /// One head's K or V rows, typed, writable.
    ///
    /// ```
    /// use kvslice_core::{KvDtype, KvLayout, KvPart, KvRows, KvRowsMut, LayoutSpec, PagePool};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 2, KvDtype::F32))?;
    /// let pool = PagePool::new(layout, 1)?;
    /// let mut page = pool.alloc()?;
    /// if let KvRowsMut::F32(v) = page.rows_mut(KvPart::V, 0, 0)? {
    ///     v.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    /// }
    /// let page = page.publish();
    /// assert_eq!(page.rows(KvPart::V, 0, 0)?, KvRows::F32(&[1.0, 2.0, 3.0, 4.0]));
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn rows_mut(
        &mut self,
        part: KvPart,
        layer_in_group: u32,
        head_in_shard: u32,
    ) -> Result<KvRowsMut<'_>> {
        let layout = *self.pool.layout();
        crate::page::rows_mut(
            &layout,
            self.bytes_mut(),
            part,
            layer_in_group,
            head_in_shard,
        )
    }

    /// Keeps the page being filled but drops the borrow of the pool: for
    /// holding it across calls where a lifetime does not fit (a C caller's
    /// request). Turn it back into a guard with [`PagePool::redeem_fill`];
    /// a token that is never redeemed keeps its page out of the pool.
    ///
    /// ```
    /// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};
    ///
    /// let pool = PagePool::new(KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 2, KvDtype::F32))?, 1)?;
    /// let token = pool.alloc()?.into_token();
    /// assert_eq!(pool.free_pages(), 0);
    /// drop(pool.redeem_fill(token)?); // dropping the guard frees the page
    /// assert_eq!(pool.free_pages(), 1);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn into_token(self) -> FillToken {
        let this = ManuallyDrop::new(self);
        FillToken {
            pool_id: this.pool.id,
            handle: this.handle,
        }
    }

    /// Makes the page immutable and shareable, keeping this reference.
    pub fn publish(self) -> PageRef<'p, 'm> {
        let this = ManuallyDrop::new(self);
        // The writer's last moment with the bytes.
        this.pool.storage.track(this.handle.index, true);
        this.pool
            .transition(this.handle, |s| {
                (s.life == Life::Filling).then_some((Life::Cached, s.refs))
            })
            .expect("a PageMut's page is Filling until the guard goes");
        PageRef {
            pool: this.pool,
            handle: this.handle,
        }
    }
}

impl Drop for PageMut<'_, '_> {
    #[inline]
    fn drop(&mut self) {
        self.pool.storage.track(self.handle.index, true);
        self.pool.free_filling(self.handle);
    }
}

/// One counted reference to a published page. Cloning takes another
/// reference; dropping releases this one.
#[must_use = "dropping a PageRef releases the reference"]
#[derive(Debug)]
pub struct PageRef<'p, 'm> {
    pub(super) pool: &'p PagePool<'m>,
    pub(super) handle: PageHandle,
}

impl<'p, 'm> PageRef<'p, 'm> {
    /// Index and generation of the page.
    pub fn handle(&self) -> PageHandle {
        self.handle
    }

    /// The page's bytes, immutable while any reference exists.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the page is Cached and this guard holds a reference, so it
        // cannot be evicted (eviction needs zero references) and nobody can
        // get a writer to it (writers exist only for Filling pages).
        unsafe { self.pool.storage.page(self.handle.index) }
    }

    /// The pool the page belongs to.
    pub(crate) fn pool(&self) -> &'p PagePool<'m> {
        self.pool
    }

    /// One head's K or V rows, typed. See [`PageMut::rows_mut`].
    pub fn rows(
        &self,
        part: KvPart,
        layer_in_group: u32,
        head_in_shard: u32,
    ) -> Result<KvRows<'_>> {
        crate::page::rows(
            self.pool.layout(),
            self.bytes(),
            part,
            layer_in_group,
            head_in_shard,
        )
    }

    /// Takes one more reference to the same page.
    pub fn try_clone(&self) -> Result<Self> {
        self.pool.try_acquire(self.handle)
    }

    /// Keeps the reference but drops the borrow of the pool: for holding a
    /// reference across calls where a lifetime does not fit. Give the token
    /// back with [`PagePool::release`] or [`PagePool::redeem`].
    pub fn into_token(self) -> RefToken {
        let this = ManuallyDrop::new(self);
        RefToken {
            pool_id: this.pool.id,
            handle: this.handle,
        }
    }
}

impl Drop for PageRef<'_, '_> {
    #[inline]
    fn drop(&mut self) {
        self.pool.storage.track(self.handle.index, false);
        self.pool.release_held(self.handle);
    }
}

/// A reference held without a guard (see [`PageRef::into_token`]). It can
/// be neither copied nor cloned, so a reference cannot be released twice.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a RefToken holds a page reference until it is released"]
pub struct RefToken {
    pub(super) pool_id: u64,
    pub(super) handle: PageHandle,
}

impl RefToken {
    /// Index and generation of the referenced page.
    pub fn handle(&self) -> PageHandle {
        self.handle
    }
}

/// A page being filled, held without a guard (see [`PageMut::into_token`]).
/// It can be neither copied nor cloned, so a page has one writer.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a FillToken keeps its page until it is redeemed"]
pub struct FillToken {
    pub(super) pool_id: u64,
    pub(super) handle: PageHandle,
}

impl FillToken {
    /// Index and generation of the page.
    pub fn handle(&self) -> PageHandle {
        self.handle
    }
}

/// A page removed from the cache: no reference can be taken. Dropping it
/// (or [`Evicting::finish`]) frees the page; [`Evicting::cancel`] puts it
/// back.
#[must_use = "dropping an Evicting frees the page"]
#[derive(Debug)]
pub struct Evicting<'p, 'm> {
    pub(super) pool: &'p PagePool<'m>,
    pub(super) handle: PageHandle,
}

impl<'p, 'm> Evicting<'p, 'm> {
    /// Index and generation of the page.
    pub fn handle(&self) -> PageHandle {
        self.handle
    }

    /// Frees the page; its handle becomes stale.
    pub fn finish(self) {}

    /// Reuses the page at once for new contents, without a trip through
    /// the free list (so no other thread can take it in between). The old
    /// handle becomes stale.
    pub fn refill(self) -> PageMut<'p, 'm> {
        let this = ManuallyDrop::new(self);
        this.pool.refill_evicting(this.handle)
    }

    /// Returns the page to the cache unchanged.
    pub fn cancel(self) {
        let this = ManuallyDrop::new(self);
        this.pool
            .transition(this.handle, |s| {
                (s.life == Life::Evicting).then_some((Life::Cached, 0))
            })
            .expect("an Evicting's page stays Evicting until the guard goes");
    }
}

impl Drop for Evicting<'_, '_> {
    fn drop(&mut self) {
        self.pool.free_evicting(self.handle);
    }
}

/// The pages of a successful [`PagePool::alloc_many`], yielded one by one.
/// Pages not taken when it is dropped go back to the pool.
#[derive(Debug)]
pub struct AllocMany<'p, 'm> {
    pub(super) pool: &'p PagePool<'m>,
    pub(super) chain: Option<Chain>,
}

impl<'p, 'm> Iterator for AllocMany<'p, 'm> {
    type Item = PageMut<'p, 'm>;

    fn next(&mut self) -> Option<Self::Item> {
        let chain = self.chain.as_mut()?;
        let (index, generation) = self.pool.free.next_of(&self.pool.states, chain)?;
        Some(self.pool.start_filling(index, generation))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.chain.as_ref().map_or(0, |c| c.len() as usize);
        (n, Some(n))
    }
}

impl ExactSizeIterator for AllocMany<'_, '_> {}

impl Drop for AllocMany<'_, '_> {
    fn drop(&mut self) {
        if let Some(rest) = self.chain.take() {
            self.pool.free.push_chain(&self.pool.states, rest);
        }
    }
}
