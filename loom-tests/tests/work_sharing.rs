//! loom model of the CPU engine's work sharing (`kvslice_cpu::work_sharing`):
//! a helper that starts runs the caller's work entirely before `share`
//! returns, one that starts later never runs it, and every task runs once.
//!
//! Checked to fail when the caller does not wait for a started helper,
//! when a helper starts without claiming its slot, when it unparks the
//! caller before storing DONE (a lost wake-up), and when it stores DONE
//! without `Release`.

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
        // (`share` has returned, the work was entered after that.) A
        // mutex, so that the check on entering the work is ordered against
        // the set; not taken on leaving it, where it would also order a
        // helper's bumps before the caller's reads and hide a missing
        // `Release`. The work records a late entry rather than asserting,
        // as a helper's panic would only reach a caller that has returned.
        let returned = Arc::new(Mutex::new((false, false)));
        let work = || {
            let mut r = returned.lock().unwrap();
            if r.0 {
                r.1 = true;
            }
            drop(r);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(cell) = ran.get(i) else { break };
                // SAFETY: task `i` was claimed by this thread alone.
                unsafe { cell.bump() };
            }
        };
        // Helper threads that have returned; counted rather than joined,
        // because a helper may still unpark the caller after `share` has
        // returned (a spare token, harmless to `park`), and loom takes an
        // unpark during `join` for a broken join.
        let ended = Arc::new(AtomicU32::new(0));
        share(&work, helpers, |h| {
            let ended = ended.clone();
            thread::spawn(move || {
                h.run();
                ended.fetch_add(1, Ordering::Release);
            });
        });
        // A helper still bumping, or whose bumps are not ordered before
        // this point, races with these reads.
        for cell in &ran {
            // SAFETY: every thread that ran tasks is done (what loom checks).
            assert_eq!(unsafe { cell.get() }, 1, "a task ran twice or never");
        }
        returned.lock().unwrap().0 = true;
        // Every helper has ended (the work's borrows are still alive here).
        while ended.load(Ordering::Acquire) < helpers as u32 {
            thread::yield_now();
        }
        assert!(!returned.lock().unwrap().1, "work entered after return");
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
