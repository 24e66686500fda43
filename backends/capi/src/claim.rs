//! An exclusive claim on something the caller owns, taken by one holder at
//! a time, released when that holder is gone, and taken for good by
//! whoever ends the thing: page memory's hold by a store
//! (`kvs_store_new`) against its destruction (`kvs_memory_destroy`).
//!
//! Public (hidden) only for the loom model in `loom-tests/`.
//!
//! ```
//! use kvslice_capi::claim::ClaimFlag;
//!
//! let flag = ClaimFlag::new();
//! assert!(flag.try_claim()); // a store takes the memory
//! assert!(!flag.try_claim()); // a second store, or a destroy, is refused
//! flag.release(); // the store is gone
//! assert!(flag.try_claim()); // a destroy takes it and never releases
//! ```

#[cfg(kvslice_loom)]
use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(kvslice_loom))]
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether something is claimed. See the [module docs](self).
#[derive(Debug)]
pub struct ClaimFlag(AtomicBool);

impl Default for ClaimFlag {
    fn default() -> Self {
        Self::new()
    }
}

impl ClaimFlag {
    /// Unclaimed.
    pub fn new() -> Self {
        Self(AtomicBool::new(false))
    }

    /// Claims, unless someone holds the claim: `true` makes the caller
    /// the only holder until it calls [`release`](Self::release), or for
    /// good if it never does. Acquire: what the previous holder did
    /// before releasing happens before what this one does. A refused
    /// claim writes nothing.
    pub fn try_claim(&self) -> bool {
        self.0
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends the caller's claim (taken with [`try_claim`](Self::try_claim)).
    /// Release: what the holder did happens before the next claim,
    /// including the one that ends the thing for good.
    pub fn release(&self) {
        self.0.store(false, Ordering::Release);
    }
}
