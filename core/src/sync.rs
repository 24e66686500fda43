//! Atomics shim: core's atomics normally, loom's when the crate is built
//! with `--cfg kvslice_loom` so the loom models in `loom-tests/` explore
//! every interleaving of the same code.

#[cfg(kvslice_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(kvslice_loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Tells the CPU (or loom's scheduler) that this thread is retrying.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(kvslice_loom)]
    loom::thread::yield_now();
    #[cfg(not(kvslice_loom))]
    core::hint::spin_loop();
}
