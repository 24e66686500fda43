//! One call's work shared between the calling thread and helper threads,
//! where a helper that has not started by the time the caller runs out of
//! work is called off instead of awaited.
//!
//! Why not a scope: the engine's callers are not pool workers, and a scope
//! entered from outside a pool cannot return before every job it spawned
//! has run. Waking an idle pool worker took 179–241 µs on a 2-vCPU VM, more
//! than a whole one-sequence decode step at 256 tokens (about 140 µs); the
//! caller then waited for a helper that found nothing left to do. Here the
//! caller takes tasks from the same queue as the helpers, and when it finds
//! it empty, it cancels every helper that has not begun (one CAS) and waits
//! only for those that have, each of which is finishing its last task.
//!
//! Public (hidden) only for the loom model in `loom-tests/`.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
//! use kvslice_cpu::work_sharing::share;
//!
//! // Ten tasks, taken from one counter by the caller and by any of three
//! // helpers that start in time; each task runs exactly once either way.
//! let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
//! let work = || while next.fetch_add(1, Relaxed) < 10 {
//!     done.fetch_add(1, Relaxed);
//! };
//! share(&work, 3, |helper| { std::thread::spawn(move || helper.run()); });
//! assert_eq!(done.load(Relaxed), 10);
//! ```

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

#[cfg(kvslice_loom)]
use loom::sync::atomic::{AtomicU8, Ordering};
#[cfg(kvslice_loom)]
use loom::sync::{Arc, Mutex};
#[cfg(kvslice_loom)]
use loom::thread::{self, Thread};

#[cfg(not(kvslice_loom))]
use std::sync::atomic::{AtomicU8, Ordering};
#[cfg(not(kvslice_loom))]
use std::sync::{Arc, Mutex};
#[cfg(not(kvslice_loom))]
use std::thread::{self, Thread};

/// A helper's states. PENDING moves to RUNNING (the helper starts) or to
/// CALLED_OFF (the caller got there first), never both; RUNNING moves to
/// DONE.
const PENDING: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const CALLED_OFF: u8 = 3;

/// What one helper shares with the caller.
struct Slot {
    state: AtomicU8,
    /// `work` with its type erased: calls the caller's closure.
    call: unsafe fn(*const ()),
    /// The caller's closure. Only dereferenced between the helper's
    /// PENDING → RUNNING and its DONE store, which `share` does not return
    /// or unwind before.
    work: *const (),
    caller: Thread,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `work` points at an `F: Sync` (the bound of `share`), so calling
// it from the helper's thread is sound; the pointer is only followed under
// the protocol above, and every other field is `Send + Sync`.
unsafe impl Send for Slot {}
// SAFETY: as for `Send`: shared access only reads `work` and `call`, and
// the rest is atomics, a mutex and a thread handle.
unsafe impl Sync for Slot {}

/// Calls the closure of type `F` at `work`.
///
/// # Safety
/// `work` points at a live `F`.
unsafe fn call<F: Fn()>(work: *const ()) {
    // SAFETY: the contract.
    unsafe { (*work.cast::<F>())() }
}

/// One helper's part: run it on another thread (or drop it, which is the
/// same as starting too late).
pub struct Helper(Arc<Slot>);

impl Helper {
    /// Runs the caller's work here, unless the caller has already called
    /// this helper off. A panic in the work is carried to the caller.
    pub fn run(self) {
        let slot = &*self.0;
        // Relaxed: the caller's writes before it spawned this helper reach
        // it through the spawn (rayon's queue, or a thread's start).
        if slot
            .state
            .compare_exchange(PENDING, RUNNING, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // SAFETY: this thread moved the state to RUNNING, so `share` waits
        // for DONE before it returns or unwinds, and its `work` borrow, the
        // `F` behind the pointer, lives until then.
        let ran = catch_unwind(AssertUnwindSafe(|| unsafe { (slot.call)(slot.work) }));
        if let Err(p) = ran {
            *slot.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
        // After DONE the caller may return; the slot itself lives on in
        // this `Arc`, and the pointer is never followed again.
        slot.state.store(DONE, Ordering::Release);
        // A point where loom may switch threads: its `unpark` also orders
        // the caller after this thread, which would hide a missing
        // `Release` above from the model.
        #[cfg(kvslice_loom)]
        slot.state.load(Ordering::Relaxed);
        slot.caller.unpark();
    }
}

/// Runs `work` on this thread and offers it to `helpers` more, each handed
/// to `spawn` (which runs [`Helper::run`] on some thread, now or later).
/// Returns once `work` has returned here and in every helper that started
/// before this thread finished; the others never run it. `work` should
/// take tasks from a shared queue until it is empty, so that it ends, on
/// every thread, when the call's work is done.
///
/// # Panics
/// With the first panic of `spawn`, of `work` on this thread, or of `work`
/// on a helper, in that order, once every started helper has finished.
pub fn share<F: Fn() + Sync>(work: &F, helpers: usize, mut spawn: impl FnMut(Helper)) {
    let slots: Vec<Arc<Slot>> = (0..helpers)
        .map(|_| {
            Arc::new(Slot {
                state: AtomicU8::new(PENDING),
                call: call::<F>,
                work: (work as *const F).cast(),
                caller: thread::current(),
                panic: Mutex::new(None),
            })
        })
        .collect();
    // From here on nothing may leave this function, by return or unwind,
    // before `settle` has run: a started helper follows the pointer. The
    // panics are caught; should anything else unwind, the guard aborts.
    let guard = AbortOnUnwind;
    let spawned = catch_unwind(AssertUnwindSafe(|| {
        for s in &slots {
            spawn(Helper(Arc::clone(s)));
        }
    }));
    let mine = catch_unwind(AssertUnwindSafe(work));
    let theirs = settle(&slots);
    std::mem::forget(guard);
    // Only now may a payload be dropped: its `Drop` may panic.
    let mut panics = spawned.err().into_iter().chain(mine.err()).chain(theirs);
    if let Some(first) = panics.next() {
        drop(panics);
        resume_unwind(first);
    }
}

/// [`share`] with its helpers from rayon's global pool: each is a
/// `rayon_core::spawn` job, which an idle worker takes when it wakes.
pub fn share_in_pool<F: Fn() + Sync>(work: &F, helpers: usize) {
    share(work, helpers, |h| rayon_core::spawn(move || h.run()));
}

/// Calls off every helper that has not started, then waits for those that
/// have (calling off first, so that no helper starts while the caller
/// waits on another); returns the helpers' panics, unopened.
fn settle(slots: &[Arc<Slot>]) -> Vec<Box<dyn Any + Send>> {
    for s in slots {
        let _ = s
            .state
            .compare_exchange(PENDING, CALLED_OFF, Ordering::Relaxed, Ordering::Relaxed);
    }
    let mut panics = Vec::new();
    // CALLED_OFF is final and only this thread stores it, so the slots
    // not in it are exactly those whose helper started.
    for s in slots
        .iter()
        .filter(|s| s.state.load(Ordering::Relaxed) != CALLED_OFF)
    {
        let mut spin = Spin::new();
        // Acquire: the helper's writes (its tasks' results) before DONE.
        while s.state.load(Ordering::Acquire) != DONE {
            if !spin.again() {
                thread::park();
            }
        }
        panics.extend(s.panic.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
    panics
}

/// Aborts the process if dropped while unwinding: for the stretch of
/// `share` where an unwind would end the caller's borrow under a running
/// helper (nothing there is expected to panic; this is the backstop).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

/// How long `settle` spins before it parks: a started helper is finishing
/// one task. Spinning for about what a park and wake-up costs (about
/// 200 µs on a VM whose idle vCPU halts) wastes at most that much more than
/// the best choice made in hindsight, and no longer: a spinning caller also
/// takes a core from the pool's idle workers, which rayon wakes to search.
struct Spin {
    #[cfg(not(kvslice_loom))]
    start: std::time::Instant,
    #[cfg(not(kvslice_loom))]
    spins: u32,
}

impl Spin {
    /// Spin for up to this long.
    #[cfg(not(kvslice_loom))]
    const LIMIT: std::time::Duration = std::time::Duration::from_micros(200);

    fn new() -> Self {
        Self {
            #[cfg(not(kvslice_loom))]
            start: std::time::Instant::now(),
            #[cfg(not(kvslice_loom))]
            spins: 0,
        }
    }

    /// Whether to spin once more (reads the clock every 64 spins); under
    /// loom never, as parking is the part of the protocol to check.
    fn again(&mut self) -> bool {
        #[cfg(not(kvslice_loom))]
        {
            self.spins = self.spins.wrapping_add(1);
            if !self.spins.is_multiple_of(64) || self.start.elapsed() < Self::LIMIT {
                std::hint::spin_loop();
                return true;
            }
        }
        false
    }
}

#[cfg(all(test, not(kvslice_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// Tasks from a counter: the work `share` expects.
    fn tasks(n: usize, next: &AtomicUsize, ran: &[AtomicUsize]) {
        loop {
            let i = next.fetch_add(1, Relaxed);
            if i >= n {
                return;
            }
            ran[i].fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn every_task_runs_once_with_helpers_that_start_or_not() {
        let ran: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        let next = AtomicUsize::new(0);
        let work = || tasks(100, &next, &ran);
        // One helper on a thread, one held back until after the call, one
        // dropped (never run).
        let mut late = Vec::new();
        let mut n = 0;
        share(&work, 3, |h| {
            n += 1;
            match n {
                1 => drop(std::thread::spawn(move || h.run())),
                2 => late.push(h),
                _ => drop(h),
            }
        });
        assert!(ran.iter().all(|r| r.load(Relaxed) == 1));
        // A helper that starts after the call finds itself called off: it
        // does not touch the (now gone) closure.
        for h in late {
            h.run();
        }
    }

    /// A helper's task in the waiting tests: marks it started, then holds
    /// long enough that a caller that did not wait would return first.
    fn slow_task(started: &AtomicUsize, finished: &AtomicUsize) {
        started.store(1, Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(100));
        finished.store(1, Relaxed);
    }

    /// Runs `h` on a new thread and returns once it has entered the work
    /// (`started`), so that the caller's part finds it RUNNING.
    fn start(h: Helper, started: &AtomicUsize) {
        std::thread::spawn(move || h.run());
        while started.load(Relaxed) == 0 {
            std::thread::yield_now();
        }
    }

    #[test]
    fn waits_for_a_started_helper() {
        let (started, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let caller = std::thread::current().id();
        let work = || {
            if std::thread::current().id() != caller {
                slow_task(&started, &finished);
            }
        };
        share(&work, 1, |h| start(h, &started));
        assert_eq!(finished.load(Relaxed), 1, "returned before the helper");
    }

    #[test]
    fn a_helper_panic_reaches_the_caller() {
        let caller = std::thread::current().id();
        let work = || {
            if std::thread::current().id() != caller {
                resume_unwind(Box::new("helper failed"));
            }
        };
        let got = catch_unwind(AssertUnwindSafe(|| {
            share(&work, 1, |h| {
                // Run the helper to completion before the caller's part.
                std::thread::spawn(move || h.run()).join().unwrap();
            })
        }));
        let p = got.expect_err("the helper's panic propagates");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"helper failed"));
    }

    #[test]
    fn a_caller_panic_still_waits_for_started_helpers() {
        let (started, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let caller = std::thread::current().id();
        let work = || {
            if std::thread::current().id() == caller {
                // Unwinds without the panic hook, whose backtrace could
                // take as long as the helper's sleep.
                resume_unwind(Box::new("caller failed"));
            }
            slow_task(&started, &finished);
        };
        let got = catch_unwind(AssertUnwindSafe(|| share(&work, 1, |h| start(h, &started))));
        let p = got.expect_err("the caller's panic propagates");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"caller failed"));
        assert_eq!(finished.load(Relaxed), 1, "unwound before the helper");
    }

    #[test]
    fn a_spawn_that_panics_part_way_still_waits_for_started_helpers() {
        let (started, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let caller = std::thread::current().id();
        let work = || {
            if std::thread::current().id() != caller {
                slow_task(&started, &finished);
            }
        };
        let mut n = 0;
        let got = catch_unwind(AssertUnwindSafe(|| {
            share(&work, 2, |h| {
                n += 1;
                if n == 2 {
                    resume_unwind(Box::new("spawn failed"));
                }
                start(h, &started);
            })
        }));
        let p = got.expect_err("the spawn's panic propagates");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"spawn failed"));
        assert_eq!(finished.load(Relaxed), 1, "unwound before the helper");
    }

    /// A panic payload whose `Drop` panics.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            // Without the panic hook, whose backtrace could outlast the
            // third helper's sleep.
            resume_unwind(Box::new("bomb"));
        }
    }

    #[test]
    fn a_payload_that_panics_on_drop_is_dropped_after_every_helper_is_done() {
        let (entered, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let work = || {
            let name = std::thread::current().name().map(str::to_owned);
            let Some(name) = name.filter(|n| n.starts_with('h')) else {
                return; // the caller
            };
            entered.fetch_add(1, Relaxed);
            match name.as_str() {
                "h0" => resume_unwind(Box::new("plain")),
                "h1" => resume_unwind(Box::new(Bomb)),
                _ => {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    finished.store(1, Relaxed);
                }
            }
        };
        let mut n = 0;
        let got = catch_unwind(AssertUnwindSafe(|| {
            share(&work, 3, |h| {
                std::thread::Builder::new()
                    .name(format!("h{n}"))
                    .spawn(move || h.run())
                    .unwrap();
                n += 1;
                if n == 3 {
                    while entered.load(Relaxed) < 3 {
                        std::thread::yield_now();
                    }
                }
            })
        }));
        // The first payload ("plain") was being raised when the second one's
        // drop panicked; that panic is what arrives, after the third helper.
        let p = got.expect_err("a panic propagates");
        assert_eq!(p.downcast_ref::<&str>(), Some(&"bomb"));
        assert_eq!(finished.load(Relaxed), 1, "unwound before the helper");
    }
}
