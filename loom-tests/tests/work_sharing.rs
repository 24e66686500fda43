//! loom model of the CPU engine's work sharing (`kvslice_cpu::work_sharing`):
//! a helper that starts runs the caller's work entirely before `share`
//! returns, one that starts later never runs it, and every task runs once.
//!
//! Checked to fail when the caller does not wait for a started helper,
//! when a helper starts without claiming its slot, and when it unparks the
//! caller before storing DONE (a lost wake-up). Not checked: the DONE
//! store's `Release` on its own, since loom's `unpark` joins the caller's
//! view with the helper's at once (real `unpark` orders only a `park` that
//! returns because of it).

use kvslice_cpu::work_sharing::share;
use kvslice_loom_tests::{Arc, AtomicU32, Mutex, Ordering, RaceCell, model, thread};

/// Two tasks shared by the caller and `helpers` helpers on their own
/// threads, started in any order against the caller: each task runs
/// exactly once, and no helper is inside the work once `share` has
/// returned (which is what makes the caller's borrows safe to end).
fn tasks_run_once_and_never_after_return(helpers: usize) {
    model(move || {
        let next = AtomicU32::new(0);
        // Plain counters: a helper's bump that the caller's read after
        // `share` is not ordered after is a data race loom reports.
        let ran = [RaceCell::default(), RaceCell::default()];
        // Set once `share` has returned, checked on entering the work: a
        // mutex, so that the check is ordered against the set. (Not on
        // leaving it: that lock would also order a helper's bumps before
        // the caller's reads, and hide a missing release.)
        let returned = Arc::new(Mutex::new(false));
        let work = || {
            assert!(!*returned.lock().unwrap(), "work entered after return");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(r) = ran.get(i) else { break };
                // SAFETY: task `i` was claimed by this thread alone.
                unsafe { r.bump() };
            }
        };
        share(&work, helpers, |h| {
            thread::spawn(move || h.run());
        });
        // A helper still bumping, or whose bumps are not ordered before
        // this point, races with these reads.
        for r in &ran {
            // SAFETY: every thread that ran tasks is done (what loom checks).
            assert_eq!(unsafe { r.get() }, 1, "a task ran twice or never");
        }
        *returned.lock().unwrap() = true;
    });
}

#[test]
fn one_helper() {
    tasks_run_once_and_never_after_return(1);
}

#[test]
fn two_helpers() {
    tasks_run_once_and_never_after_return(2);
}
