//! loom models of kvslice's lock-free protocols (kvslice-core's, the CPU
//! backend's work sharing and the C ABI's page-memory claim). For using
//! kvslice rather than checking it, start with the embedding guide,
//! `docs/GUIDE.md` in the repository.
//!
//! Run them exhaustively (within loom's preemption bound) with
//!
//! ```sh
//! RUSTFLAGS="--cfg kvslice_loom --cfg crossbeam_loom" LOOM_MAX_PREEMPTIONS=3 \
//!     cargo test --release -p kvslice-loom-tests --target-dir target/loom
//! ```
//!
//! Without the cfg, the same models run as ordinary tests: each is executed
//! [`PLAIN_RUNS`] times on real threads, so `cargo test --workspace` keeps
//! them compiling and catches gross breakage, though only loom proves them.
//!
//! Page bytes are checked too: under the cfg the pool gives each page a
//! loom cell that every slice of its bytes goes through (`bytes`,
//! `bytes_mut`), and every guard's end (the last moment its slices were
//! usable). So a model fails when the page lifecycle's atomics do not order
//! a reader's accesses before a later writer's: a compare-exchange of the
//! page state without `Release` fails `release_races_eviction` and
//! `a_publish_races_an_eviction_that_is_undone`, and passed every model
//! when only the bytes' values were asserted.

#[cfg(kvslice_loom)]
pub use loom::sync::atomic::{AtomicU32, Ordering};
#[cfg(kvslice_loom)]
pub use loom::sync::{Arc, Mutex};
#[cfg(kvslice_loom)]
pub use loom::thread;

#[cfg(not(kvslice_loom))]
pub use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(kvslice_loom))]
pub use std::sync::{Arc, Mutex};
#[cfg(not(kvslice_loom))]
pub use std::thread;

/// How often a model runs on real threads when loom is off.
pub const PLAIN_RUNS: usize = 2000;

/// Runs `f` under loom's model checker, or [`PLAIN_RUNS`] times plainly,
/// and prints how many executions that was.
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    model_with_preemptions(None, f)
}

/// [`model`] with no preemption bound, whatever `LOOM_MAX_PREEMPTIONS`
/// says: for small models whose race needs more preemptions than CI's
/// bound of 3 (loom counts a switch at every operation of the racing
/// sequence) and which stay cheap exhaustively.
pub fn model_unbounded<F: Fn() + Sync + Send + 'static>(f: F) {
    model_with_preemptions(Some(usize::MAX), f)
}

/// [`model`], exploring at most `cap` preemptions per execution (or fewer,
/// if `LOOM_MAX_PREEMPTIONS` says so). For models whose core race is proven
/// at the full bound by a smaller model, and which would otherwise take
/// most of CI's time.
pub fn model_with_preemptions<F: Fn() + Sync + Send + 'static>(cap: Option<usize>, f: F) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let started = std::time::Instant::now();
    let counted = move || {
        counter.fetch_add(1, Relaxed);
        f();
    };
    #[cfg(kvslice_loom)]
    {
        let mut builder = loom::model::Builder::new();
        match cap {
            Some(usize::MAX) => builder.preemption_bound = None,
            Some(cap) => {
                builder.preemption_bound =
                    Some(builder.preemption_bound.map_or(cap, |b| b.min(cap)));
            }
            None => {}
        }
        builder.check(counted);
    }
    #[cfg(not(kvslice_loom))]
    let _ = cap;
    #[cfg(not(kvslice_loom))]
    for _ in 0..PLAIN_RUNS {
        counted();
    }
    let how = if cfg!(kvslice_loom) {
        "loom interleavings"
    } else {
        "plain runs"
    };
    println!(
        "{}: {} {how} in {:.2?}",
        std::thread::current().name().unwrap_or("model"),
        runs.load(Relaxed),
        started.elapsed()
    );
}

/// Per-page ownership marks: a model calls [`Owners::claim`] when it gets
/// a page for writing and [`Owners::unclaim`] before giving it up, so a
/// page handed to two owners at once fails the model. The marks are loom
/// atomics, so loom checks their orderings too.
pub struct Owners(Vec<AtomicU32>);

impl Owners {
    /// Marks for `n` pages.
    pub fn new(n: usize) -> Self {
        Self((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    /// Records that the caller owns `page`; panics if someone else does.
    pub fn claim(&self, page: u32) {
        let before = self.0[page as usize].fetch_add(1, Ordering::AcqRel);
        assert_eq!(before, 0, "page {page} handed out twice");
    }

    /// Records that the caller gave `page` up.
    pub fn unclaim(&self, page: u32) {
        self.0[page as usize].fetch_sub(1, Ordering::AcqRel);
    }
}

/// A counter without atomics, whose accesses loom checks for data races
/// under `kvslice_loom` (two accesses, one a write, not ordered by
/// happens-before fail the model); a plain cell otherwise. For results a
/// protocol hands from one thread to another.
#[derive(Default)]
pub struct RaceCell {
    #[cfg(kvslice_loom)]
    cell: loom::cell::UnsafeCell<u32>,
    #[cfg(not(kvslice_loom))]
    cell: std::cell::UnsafeCell<u32>,
}

// SAFETY: `bump` and `get` are unsafe and require the caller to exclude
// concurrent access, which is what the models check.
unsafe impl Sync for RaceCell {}

impl RaceCell {
    /// Adds one.
    ///
    /// # Safety
    /// No other thread accesses the cell at the same time.
    pub unsafe fn bump(&self) {
        #[cfg(kvslice_loom)]
        // SAFETY: exclusive by the contract; loom checks it.
        self.cell.with_mut(|p| unsafe { *p += 1 });
        #[cfg(not(kvslice_loom))]
        // SAFETY: exclusive by the contract.
        unsafe {
            *self.cell.get() += 1
        };
    }

    /// The count.
    ///
    /// # Safety
    /// No other thread writes the cell at the same time.
    pub unsafe fn get(&self) -> u32 {
        #[cfg(kvslice_loom)]
        // SAFETY: no concurrent write by the contract; loom checks it.
        return self.cell.with(|p| unsafe { *p });
        #[cfg(not(kvslice_loom))]
        // SAFETY: no concurrent write by the contract.
        unsafe {
            *self.cell.get()
        }
    }
}

/// The models' block `i`: distinct blocks and indices, layer group and
/// head shard 0.
pub fn key(i: u32) -> kvslice_core::SliceKey {
    kvslice_core::SliceKey {
        block: kvslice_core::BlockHash(u128::from(i) + 1),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}
