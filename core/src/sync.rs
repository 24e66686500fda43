//! Atomics shim: core's atomics normally, loom's when the crate is built
//! with `--cfg kvslice_loom` so the loom models in `loom-tests/` explore
//! every interleaving of the same code.

#[cfg(kvslice_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(kvslice_loom))]
pub(crate) use core::sync::atomic::{AtomicU64, Ordering};
