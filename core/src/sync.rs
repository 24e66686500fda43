//! Synchronisation shim: core's atomics normally, loom's when the crate is
//! built with `--cfg kvslice_loom`, so the loom models in `loom-tests/`
//! explore every interleaving of the same code. Also a small spin lock for
//! the few structures that are serial by nature (exact LRU).

use core::ops::{Deref, DerefMut};

// Under loom the lock's cell is loom's, so a guard access that is not
// ordered after the previous holder's is reported as a data race.
#[cfg(kvslice_loom)]
use loom::cell::UnsafeCell;

#[cfg(not(kvslice_loom))]
use core::cell::UnsafeCell;

#[cfg(kvslice_loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

#[cfg(not(kvslice_loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

// The slice map's table is shared with deferred reclamation closures; under
// loom its `Arc` is tracked, so one never dropped fails the model.
#[cfg(kvslice_loom)]
pub(crate) use loom::sync::Arc;

#[cfg(not(kvslice_loom))]
pub(crate) use alloc::sync::Arc;

/// Tells the CPU (or loom's scheduler) that this thread is waiting.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(kvslice_loom)]
    loom::thread::yield_now();
    #[cfg(not(kvslice_loom))]
    core::hint::spin_loop();
}

/// Asks the CPU to bring `value`'s cache line in, so that a batch of
/// independent random reads can overlap their misses before the loop that
/// uses them. A hint only: nothing on targets without one, or under Miri
/// and loom.
#[inline]
pub(crate) fn prefetch<T>(value: &T) {
    prefetch_address(core::ptr::from_ref(value).addr());
}

/// [`prefetch`] by address, for a line another thread may be writing
/// under a lock this one does not hold: nothing is read, so the address
/// need not be a live reference, or valid at all.
#[inline]
pub(crate) fn prefetch_address(address: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(kvslice_loom)))]
    // SAFETY: `prefetcht0` needs SSE, which every x86-64 CPU has; it is a
    // hint that neither faults (at any address) nor reads or writes memory
    // as far as the program can tell.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(core::ptr::without_provenance::<i8>(address));
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(kvslice_loom))))]
    let _ = address;
}

/// A test-and-test-and-set lock. Only for short critical sections.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time, so sharing
// the lock is as safe as sending the `T` between threads.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> core::fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SpinLock(..)")
    }
}

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        loop {
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return SpinGuard {
                    lock: self,
                    _not_sync: core::marker::PhantomData,
                };
            }
            while self.locked.load(Ordering::Relaxed) {
                spin_hint();
            }
        }
    }
}

pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Without it the guard would be `Sync` whenever `T: Send` (through
    /// `&SpinLock<T>`), and a shared guard would hand `&T` to several
    /// threads; `Sync` is granted below for `T: Sync` only, as std's
    /// `MutexGuard` does. (It also makes the guard `!Send`, as std's is.)
    _not_sync: core::marker::PhantomData<*const ()>,
}

// SAFETY: a shared guard gives out `&T` only, which several threads may
// hold at once exactly when `T: Sync`.
unsafe impl<T: Sync> Sync for SpinGuard<'_, T> {}

impl<T> SpinGuard<'_, T> {
    fn ptr(&self) -> *mut T {
        #[cfg(kvslice_loom)]
        return self.lock.value.with_mut(|p| p);
        #[cfg(not(kvslice_loom))]
        return self.lock.value.get();
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock, so no `&mut T` exists elsewhere.
        unsafe { &*self.ptr() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock exclusively.
        unsafe { &mut *self.ptr() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}
