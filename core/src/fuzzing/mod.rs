//! Fuzz harnesses (feature `fuzzing`): each takes raw bytes, turns them into
//! operations with `arbitrary`, runs them against kvslice and a simple
//! model, and panics on any disagreement or broken invariant.
//!
//! The cargo-fuzz targets in `fuzz/` call these, and a stable test replays
//! every committed corpus file through them, so a finding stays a
//! regression test without nightly. (The attention harness lives in
//! `kvslice_cpu::fuzzing`, since it compares the CPU engine with the
//! reference one.)

mod cache_store;
mod coordinator;
mod page_pool;
mod sequence_table;
mod slice_map;

pub use cache_store::cache_store;
pub use coordinator::coordinator;
pub use page_pool::page_pool;
pub use sequence_table::sequence_table;
pub use slice_map::slice_map;

use arbitrary::Unstructured;

/// A small integer in `lo..=hi` from `u` (`lo` when the input runs out).
pub(crate) fn small(u: &mut Unstructured<'_>, lo: u32, hi: u32) -> u32 {
    u.int_in_range(lo..=hi).unwrap_or(lo)
}
