//! What the store remembers about each page besides its bytes: its key,
//! its parent block's page, how many cached children depend on it, its
//! valid tokens and its priority.
//!
//! Fields are atomics, but the protocol, not the atomics, makes them
//! consistent: they are written while the writer owns the page (Filling),
//! published with the page, and read by holders of a reference or of an
//! Evicting guard. `children` and `priority` change while the page is
//! cached, always by a thread that holds a reference to it, so an evictor
//! (which needs zero references) sees their final values.

use crate::key::SliceKey;
use crate::pool::PageHandle;
use crate::sync::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};

/// How hard the store tries to keep a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Evicted in the policy's order.
    Normal = 0,
    /// Evicted only when no normal page can be (system prompts).
    High = 1,
    /// Never evicted while pinned.
    Pinned = 2,
}

impl Priority {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Priority::Normal,
            1 => Priority::High,
            _ => Priority::Pinned,
        }
    }
}

const NO_PARENT: u64 = u64::MAX;

pub(super) struct PageMeta {
    key: [AtomicU64; 4],
    parent: AtomicU64,
    pub(super) children: AtomicU32,
    valid_tokens: AtomicU32,
    priority: AtomicU8,
}

impl PageMeta {
    pub(super) fn new() -> Self {
        Self {
            key: [
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ],
            parent: AtomicU64::new(NO_PARENT),
            children: AtomicU32::new(0),
            valid_tokens: AtomicU32::new(0),
            priority: AtomicU8::new(0),
        }
    }

    /// Records a freshly filled page's identity (the caller owns it).
    pub(super) fn set(&self, key: &SliceKey, parent: Option<PageHandle>, valid_tokens: u32) {
        for (slot, word) in self.key.iter().zip(key.to_words()) {
            slot.store(word, Relaxed);
        }
        self.parent
            .store(parent.map_or(NO_PARENT, PageHandle::to_bits), Relaxed);
        self.children.store(0, Relaxed);
        self.valid_tokens.store(valid_tokens, Relaxed);
        self.priority.store(Priority::Normal as u8, Relaxed);
    }

    pub(super) fn key(&self) -> SliceKey {
        SliceKey::from_words(core::array::from_fn(|i| self.key[i].load(Relaxed)))
    }

    pub(super) fn parent(&self) -> Option<PageHandle> {
        match self.parent.load(Relaxed) {
            NO_PARENT => None,
            w => Some(PageHandle::from_bits(w)),
        }
    }

    pub(super) fn valid_tokens(&self) -> u32 {
        self.valid_tokens.load(Relaxed)
    }

    pub(super) fn priority(&self) -> Priority {
        Priority::from_u8(self.priority.load(Relaxed))
    }

    pub(super) fn set_priority(&self, p: Priority) {
        self.priority.store(p as u8, Relaxed);
    }
}
