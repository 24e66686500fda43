//! loom model of the C ABI's page-memory claim (`kvslice_capi::claim`):
//! stores made on caller-owned memory (`kvs_store_new`) and the memory's
//! destruction (`kvs_memory_destroy`) race on one flag. At most one store
//! uses the bytes at a time, and once a destroy succeeds no store uses
//! them again and every earlier store's writes happened before it (the
//! caller frees the bytes then).
//!
//! The bytes are a [`RaceCell`] reached only through the claim: two
//! holders at once, or a destroy not ordered after the last holder's
//! writes, is a data race loom reports. Checked to fail with a `Relaxed`
//! release, a `Relaxed` claim, and a claim made of a load and a store.
//!
//! loom 0.7 lets a plain store fall between the read and the write of a
//! concurrent swap (tokio-rs/loom#254), so a claim made with `swap`, whose
//! refusals write `true`, fails this model where real hardware would not:
//! the claim is a compare-exchange, which writes nothing when refused.

use kvslice_capi::claim::ClaimFlag;
use kvslice_loom_tests::{Arc, AtomicU32, Ordering, RaceCell, model, thread};

/// The caller's page memory: its claim and its bytes.
#[derive(Default)]
struct Memory {
    flag: ClaimFlag,
    bytes: RaceCell,
    /// Set by a destroy that succeeded.
    destroyed: AtomicU32,
}

impl Memory {
    /// A store made on the memory writes its pages, then is destroyed.
    fn store_lifetime(&self) -> bool {
        if !self.flag.try_claim() {
            return false;
        }
        assert_eq!(
            self.destroyed.load(Ordering::Relaxed),
            0,
            "a store claimed memory that was destroyed"
        );
        // SAFETY: the claim makes this store the only user of the bytes;
        // loom checks that it does.
        unsafe { self.bytes.bump() };
        self.flag.release();
        true
    }

    /// `kvs_memory_destroy`: refused while a store holds the memory; on
    /// success the caller reads (frees) the bytes.
    fn destroy(&self) -> Option<u32> {
        if !self.flag.try_claim() {
            return None;
        }
        self.destroyed.store(1, Ordering::Relaxed);
        // SAFETY: claimed for good; loom checks that every store's write
        // happened before.
        Some(unsafe { self.bytes.get() })
    }
}

/// Two stores on one memory against a destroy: the stores never overlap,
/// a destroy that succeeds sees every write of the stores that ran, and
/// no store runs after it.
#[test]
fn stores_and_a_destroy_race_on_one_memory() {
    model(|| {
        let memory = Arc::new(Memory::default());
        let stores: Vec<_> = (0..2)
            .map(|_| {
                let m = Arc::clone(&memory);
                thread::spawn(move || m.store_lifetime())
            })
            .collect();
        let destroyed = memory.destroy();
        let ran = stores
            .into_iter()
            .map(|s| u32::from(s.join().unwrap()))
            .sum::<u32>();
        match destroyed {
            // Every store that ran did so before the destroy.
            Some(seen) => assert_eq!(seen, ran),
            // Refused while a store held the memory; once they are gone, it
            // succeeds and sees them all.
            None => assert_eq!(memory.destroy(), Some(ran)),
        }
        assert!(!memory.flag.try_claim(), "destroyed memory claimed again");
    });
}
