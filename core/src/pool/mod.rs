//! A fixed-capacity, lock-free page pool.
//!
//! Each page has one packed atomic state word (generation, reference count
//! or free-list link, lifecycle; see `state.rs`) and no other metadata.
//! Pages move
//!
//! ```text
//!            alloc               publish              try_begin_evict
//!   Free ──────────────▶ Filling ─────────▶ Cached ──────────────────▶ Evicting
//!    ▲   (1 ref, writer)    │      (refs ≥ 1 → 0)        (refs == 0)      │
//!    │                      │ writer dropped                              │ finish
//!    └──────────────────────┴──────────── generation + 1 ◀────────────────┘
//! ```
//!
//! Every return to Free bumps the generation, so a [`PageHandle`] kept past
//! its page's life is detected as stale instead of reaching someone else's
//! data, for the next 2^32 − 1 lives of its page: the generation has 32
//! bits, and a handle kept while its page is reused 2^32 times would name
//! a later life again. (At a million reuses a second of one page, that is
//! 72 minutes; a pool of a thousand pages serving a million blocks a
//! second reuses each page about every millisecond: 50 days.) Bytes are reachable only through guards: one [`PageMut`] writer
//! while Filling, any number of [`PageRef`] readers while Cached.
//! No allocation happens after construction.

mod free_list;
mod guard;
mod state;
mod storage;
mod view;

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::AtomicU64 as StdAtomicU64;

pub use guard::{AllocMany, Evicting, FillToken, PageMut, PageRef, RefToken};
pub use state::Life;
pub use view::PageView;

use self::free_list::FreeList;
use self::state::PageState;
use self::storage::Storage;
use crate::error::{Error, Result, check_index};
use crate::layout::KvLayout;
use crate::page::PageId;
use crate::sync::{AtomicU64, Ordering};

/// A page index with the generation it had when the handle was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageHandle {
    index: u32,
    generation: u32,
}

impl PageHandle {
    /// The page's index in its pool.
    pub fn id(self) -> PageId {
        PageId(self.index)
    }

    /// The generation the handle names.
    pub fn generation(self) -> u32 {
        self.generation
    }

    /// A handle from its index and generation (for handles stored outside
    /// the pool, e.g. packed into a word). A made-up handle is harmless: an
    /// operation on a generation that is not current fails as stale.
    pub fn from_parts(index: u32, generation: u32) -> Self {
        Self { index, generation }
    }

    /// The handle as one word (generation high, index low), for structures
    /// that store handles in atomics.
    #[inline]
    pub(crate) fn to_bits(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.index)
    }

    /// The handle [`to_bits`](Self::to_bits) encoded.
    #[inline]
    pub(crate) fn from_bits(w: u64) -> Self {
        Self::from_parts(w as u32, (w >> 32) as u32)
    }
}

/// A snapshot of one page's state, for diagnostics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageInfo {
    /// Generation (bumped each time the page is freed).
    pub generation: u32,
    /// References held.
    pub refs: u32,
    /// Lifecycle state.
    pub life: Life,
}

/// Distinguishes pools so a [`RefToken`] cannot be released into the wrong
/// one (and, through its pool, a store's request tickets): 64 bits, so no
/// process makes enough pools to wrap it. A plain core atomic even under
/// loom: it is not part of any model.
static NEXT_POOL_ID: StdAtomicU64 = StdAtomicU64::new(1);

/// Pages of one [`KvLayout`], capacity fixed at construction.
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 4, 4, KvDtype::F16))?;
/// let pool = PagePool::new(layout, 2)?;
///
/// let mut page = pool.alloc()?;
/// page.bytes_mut()[0] = 42;
/// let shared = page.publish(); // immutable from here on
/// let handle = shared.handle();
/// let again = pool.try_acquire(handle)?; // a second reference
/// assert_eq!(again.bytes()[0], 42);
/// assert!(pool.try_begin_evict(handle).is_err()); // still referenced
/// drop((shared, again));
/// pool.try_begin_evict(handle)?.finish();
/// assert!(pool.try_acquire(handle).is_err()); // stale now
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub struct PagePool<'m> {
    id: u64,
    layout: KvLayout,
    capacity: u32,
    states: Box<[AtomicU64]>,
    free: FreeList,
    storage: Storage<'m>,
}

impl core::fmt::Debug for PagePool<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PagePool")
            .field("capacity", &self.capacity)
            .field("free", &self.free_pages())
            .field("page_bytes", &self.layout.page_bytes())
            .finish()
    }
}

impl PagePool<'static> {
    /// A pool of `capacity` zeroed pages, allocated once.
    pub fn new(layout: KvLayout, capacity: u32) -> Result<Self> {
        let len = Self::bytes_for(&layout, capacity)?;
        Ok(Self::build(
            layout,
            capacity,
            Storage::allocate(len, layout.page_bytes()),
        ))
    }
}

impl<'m> PagePool<'m> {
    /// A pool over the caller's `memory`, as many pages as fit after its
    /// start is rounded up to a 64-byte boundary (at most
    /// [`PagePool::MAX_PAGES`]). Only the per-page
    /// metadata (see [`PagePool::METADATA_BYTES_PER_PAGE`]) is allocated,
    /// once, here.
    ///
    /// ```
    /// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 8, 4, KvDtype::F32))?;
    /// let mut arena = vec![0u8; 3 * layout.page_bytes() + 64];
    /// let pool = PagePool::with_memory(layout, &mut arena)?;
    /// assert_eq!(pool.capacity(), 3);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_memory(layout: KvLayout, memory: &'m mut [u8]) -> Result<Self> {
        let skip = memory
            .as_ptr()
            .align_offset(storage::ALIGN)
            .min(memory.len());
        let memory = &mut memory[skip..];
        let capacity = u32::try_from(memory.len() / layout.page_bytes())
            .unwrap_or(u32::MAX)
            .min(Self::MAX_PAGES);
        let used = capacity as usize * layout.page_bytes();
        Ok(Self::build(
            layout,
            capacity,
            Storage::borrow(&mut memory[..used], layout.page_bytes()),
        ))
    }

    fn bytes_for(layout: &KvLayout, capacity: u32) -> Result<usize> {
        if capacity > Self::MAX_PAGES {
            return Err(Error::CapacityExhausted(
                "pages per pool (PagePool::MAX_PAGES)",
            ));
        }
        layout
            .page_bytes()
            .checked_mul(capacity as usize)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or(Error::Overflow("pool bytes"))
    }

    fn build(layout: KvLayout, capacity: u32, storage: Storage<'m>) -> Self {
        let (free, words) = FreeList::full(capacity);
        let states: Vec<AtomicU64> = words.map(AtomicU64::new).collect();
        Self {
            id: NEXT_POOL_ID.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
            layout,
            capacity,
            states: states.into_boxed_slice(),
            free,
            storage,
        }
    }

    /// Bytes of metadata the pool keeps per page: one state word.
    pub const METADATA_BYTES_PER_PAGE: usize = core::mem::size_of::<u64>();

    /// The most pages one pool can hold (free-list links share the
    /// reference-count bits).
    pub const MAX_PAGES: u32 = PageState::MAX_PAGES;

    /// The layout of every page.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// This pool's id, distinct from every other pool's in the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Number of pages.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Pages free right now: a scan of every page's state, so O(capacity),
    /// and only a snapshot while other threads allocate or free. Pages an
    /// [`alloc_many`](Self::alloc_many) batch holds and has not handed out
    /// yet still count (their state says free until taken).
    pub fn free_pages(&self) -> u32 {
        self.states
            .iter()
            .filter(|w| PageState::unpack(w.load(Ordering::Relaxed)).life == Life::Free)
            .count() as u32
    }

    /// One free page, for filling. Errors with
    /// [`Error::CapacityExhausted`] when none is free.
    #[inline]
    pub fn alloc(&self) -> Result<PageMut<'_, 'm>> {
        match self.free.pop(&self.states) {
            Some((index, generation)) => Ok(self.start_filling(index, generation)),
            None => Err(Error::CapacityExhausted("page pool")),
        }
    }

    /// `n` free pages, or none: on error the pool is exactly as it was.
    ///
    /// ```
    /// # use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};
    /// # let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 8, 4, KvDtype::F32))?;
    /// let pool = PagePool::new(layout, 4)?;
    /// assert!(pool.alloc_many(5).is_err());
    /// assert_eq!(pool.free_pages(), 4);
    /// let pages: Vec<_> = pool.alloc_many(3)?.collect();
    /// assert_eq!((pages.len(), pool.free_pages()), (3, 1));
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn alloc_many(&self, n: u32) -> Result<AllocMany<'_, 'm>> {
        let chain = match n {
            0 => None,
            n => Some(
                self.free
                    .pop_chain(&self.states, n)
                    .ok_or(Error::CapacityExhausted("page pool"))?,
            ),
        };
        Ok(AllocMany { pool: self, chain })
    }

    /// Makes a page just popped off the free list Filling, with the
    /// writer's reference.
    #[inline]
    fn start_filling(&self, index: u32, generation: u32) -> PageMut<'_, 'm> {
        self.hand_to_writer(
            index,
            PageState {
                generation,
                refs: 0,
                life: Life::Free,
            },
            generation,
        )
    }

    /// Makes a page the caller owns exclusively (just popped, or Evicting)
    /// Filling at `generation`, with the writer's reference. Nobody else
    /// writes an owned page's word, so a store is enough; Release pairs
    /// with later acquirers of the state.
    fn hand_to_writer(&self, index: u32, expected: PageState, generation: u32) -> PageMut<'_, 'm> {
        let word = &self.states[index as usize];
        debug_assert_eq!(PageState::unpack(word.load(Ordering::Relaxed)), expected);
        word.store(
            PageState {
                generation,
                refs: 1,
                life: Life::Filling,
            }
            .pack(),
            Ordering::Release,
        );
        PageMut {
            pool: self,
            handle: PageHandle { index, generation },
        }
    }

    /// Atomically moves page `h` to the state `f` picks, if `h` is current.
    ///
    /// `f` returns the new `(life, refs)` or `None` to refuse. Returns the
    /// state seen, so callers can tell why a refusal happened.
    #[inline]
    fn transition(
        &self,
        h: PageHandle,
        mut f: impl FnMut(PageState) -> Option<(Life, u32)>,
    ) -> core::result::Result<PageState, PageState> {
        let word = &self.states[h.index as usize];
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let s = PageState::unpack(cur);
            if s.generation != h.generation {
                return Err(s);
            }
            let Some((life, refs)) = f(s) else {
                return Err(s);
            };
            let next = PageState {
                generation: s.generation,
                refs,
                life,
            }
            .pack();
            match word.compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(s),
                Err(seen) => cur = seen,
            }
        }
    }

    /// The error for an operation on `h` refused in state `s`.
    fn refusal(h: PageHandle, s: PageState) -> Error {
        if s.generation != h.generation || s.life == Life::Free {
            Error::StaleHandle { page: h.index }
        } else {
            Error::PageBusy { page: h.index }
        }
    }

    fn check_handle(&self, h: PageHandle) -> Result<()> {
        check_index("page", h.index as usize, self.capacity as usize)
    }

    /// A new reference to the published page `h`.
    ///
    /// Errors with [`Error::StaleHandle`] if the page was freed since `h`
    /// was made, and [`Error::PageBusy`] if it is being filled or evicted:
    /// an acquire that races an eviction either wins (and the eviction
    /// fails) or loses cleanly.
    #[inline]
    pub fn try_acquire(&self, h: PageHandle) -> Result<PageRef<'_, 'm>> {
        self.check_handle(h)?;
        let acquired = self.transition(h, |s| {
            (s.life == Life::Cached && s.refs < PageState::MAX_REFS)
                .then(|| (Life::Cached, s.refs + 1))
        });
        match acquired {
            Ok(_) => Ok(PageRef {
                pool: self,
                handle: h,
            }),
            Err(s) if s.generation == h.generation && s.life == Life::Cached => {
                Err(Error::CapacityExhausted("page references"))
            }
            Err(s) => Err(Self::refusal(h, s)),
        }
    }

    /// Releases a reference held as a token.
    pub fn release(&self, token: RefToken) -> Result<()> {
        self.redeem(token).map(drop)
    }

    /// Turns a token back into a guard.
    pub fn redeem(&self, token: RefToken) -> Result<PageRef<'_, 'm>> {
        if token.pool_id != self.id {
            return Err(Error::InvalidValue("reference token from another pool"));
        }
        Ok(PageRef {
            pool: self,
            handle: token.handle,
        })
    }

    /// Turns a [`FillToken`] back into the page's writer.
    pub fn redeem_fill(&self, token: FillToken) -> Result<PageMut<'_, 'm>> {
        if token.pool_id != self.id {
            return Err(Error::InvalidValue("fill token from another pool"));
        }
        Ok(PageMut {
            pool: self,
            handle: token.handle,
        })
    }

    /// Drops one reference that the caller's guard or token holds.
    #[inline]
    fn release_held(&self, h: PageHandle) {
        let released = self.transition(h, |s| {
            (s.life == Life::Cached && s.refs > 0).then(|| (Life::Cached, s.refs - 1))
        });
        debug_assert!(
            released.is_ok(),
            "released a reference nobody held: {released:?}"
        );
    }

    /// Takes the unreferenced, published page `h` out of the cache. No
    /// reference can be taken from here on; dropping the returned guard
    /// frees the page.
    ///
    /// Errors with [`Error::PageBusy`] if the page has references (or is
    /// being filled or evicted), and [`Error::StaleHandle`] if it is gone.
    pub fn try_begin_evict(&self, h: PageHandle) -> Result<Evicting<'_, 'm>> {
        self.check_handle(h)?;
        match self.transition(h, |s| {
            (s.life == Life::Cached && s.refs == 0).then_some((Life::Evicting, 0))
        }) {
            Ok(_) => Ok(Evicting {
                pool: self,
                handle: h,
            }),
            Err(s) => Err(Self::refusal(h, s)),
        }
    }

    /// Evicts and frees `h` in one step. See [`PagePool::try_begin_evict`].
    pub fn try_evict(&self, h: PageHandle) -> Result<()> {
        self.try_begin_evict(h).map(Evicting::finish)
    }

    /// A private, writable copy of `src`: copy-on-write for a shared
    /// partial block that is about to diverge.
    ///
    /// ```
    /// # use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};
    /// # let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 8, 4, KvDtype::F32))?;
    /// let pool = PagePool::new(layout, 2)?;
    /// let mut p = pool.alloc()?;
    /// p.bytes_mut()[..3].copy_from_slice(b"abc");
    /// let shared = p.publish();
    /// let mut mine = pool.copy_page(&shared)?;
    /// mine.bytes_mut()[2] = b'x';
    /// assert_eq!((&shared.bytes()[..3], &mine.bytes()[..3]), (&b"abc"[..], &b"abx"[..]));
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn copy_page(&self, src: &PageRef<'_, '_>) -> Result<PageMut<'_, 'm>> {
        if src.pool.id != self.id {
            return Err(Error::InvalidValue("source page from another pool"));
        }
        let mut dst = self.alloc()?;
        dst.bytes_mut().copy_from_slice(src.bytes());
        Ok(dst)
    }

    /// A snapshot of page `id`'s state.
    pub fn page_info(&self, id: PageId) -> Result<PageInfo> {
        check_index("page", id.0 as usize, self.capacity as usize)?;
        let s = PageState::unpack(self.states[id.0 as usize].load(Ordering::Acquire));
        Ok(PageInfo {
            generation: s.generation,
            refs: s.refs,
            life: s.life,
        })
    }

    /// Frees a Filling page whose writer went away.
    #[inline]
    fn free_filling(&self, h: PageHandle) {
        self.free_from(h, Life::Filling);
    }

    /// Frees an Evicting page.
    fn free_evicting(&self, h: PageHandle) {
        self.free_from(h, Life::Evicting);
    }

    /// Turns an Evicting page straight into a Filling one of the next
    /// generation. The caller's `Evicting` guard owns the page exclusively.
    fn refill_evicting(&self, h: PageHandle) -> PageMut<'_, 'm> {
        let evicting = PageState {
            generation: h.generation,
            refs: 0,
            life: Life::Evicting,
        };
        self.hand_to_writer(h.index, evicting, h.generation.wrapping_add(1))
    }

    /// Frees a page the caller's guard owns exclusively. A Filling or
    /// Evicting page's word is written only by its guard (every other
    /// transition needs Cached), so the free list's push may overwrite it
    /// with a plain store.
    #[inline]
    fn free_from(&self, h: PageHandle, from: Life) {
        debug_assert_eq!(
            PageState::unpack(self.states[h.index as usize].load(Ordering::Relaxed)),
            PageState {
                generation: h.generation,
                refs: u32::from(from == Life::Filling),
                life: from
            },
            "freeing a page in an unexpected state"
        );
        self.free
            .push(&self.states, h.index, h.generation.wrapping_add(1));
    }
}
