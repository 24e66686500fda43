//! loom model of the read buffer between a store's hit path and a policy
//! that buffers its accesses: recorders racing each other and a drainer.
//! Every record is delivered exactly once and intact, or dropped and
//! counted; a drain never reads a slot a writer has claimed but not yet
//! finished.

use kvslice_core::evict::{Access, ReadBuffer};
use kvslice_core::{PageEvent, PageId};
use kvslice_loom_tests::{Arc, Mutex, model, thread};

fn hit(page: u32) -> Access {
    Access::Hit(PageEvent {
        page: PageId(page),
        fingerprint: u64::from(page) * 0x9e37_79b9 + 1,
        block_index: page,
        request: 1,
    })
}

/// Two recorders (two records each, one stripe of two slots, so the stripe
/// fills and writers race for positions) against a drainer, then a final
/// drain: delivered + dropped = recorded, no record delivered twice or torn.
#[test]
fn records_race_drain() {
    model(|| {
        let buf = Arc::new(ReadBuffer::new(1, 2));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let writers: Vec<_> = (0..2u32)
            .map(|w| {
                let buf = buf.clone();
                thread::spawn(move || (0..2u32).filter(|i| buf.record(hit(w * 10 + i))).count())
            })
            .collect();
        let drainer = {
            let (buf, seen) = (buf.clone(), seen.clone());
            thread::spawn(move || {
                buf.try_drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
            })
        };
        let recorded: usize = writers.into_iter().map(|w| w.join().unwrap()).sum();
        drainer.join().unwrap();
        buf.drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
        let mut seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), recorded, "every accepted record arrives once");
        assert_eq!(recorded as u64 + buf.dropped(), 4);
        let valid = [0u32, 1, 10, 11].map(hit);
        assert!(seen.iter().all(|a| valid.contains(a)), "a torn record");
        seen.sort_by_key(|a| match a {
            Access::Hit(e) => e.page.0,
            _ => u32::MAX,
        });
        seen.dedup();
        assert_eq!(seen.len(), recorded, "a record delivered twice");
    });
}

/// A recorder racing two drainers (one waiting, one trying): the drain
/// flag keeps them apart, so the record arrives exactly once.
#[test]
fn drainers_exclude_each_other() {
    model(|| {
        let buf = Arc::new(ReadBuffer::new(1, 2));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buf = buf.clone();
            thread::spawn(move || assert!(buf.record(hit(7))))
        };
        let other = {
            let (buf, seen) = (buf.clone(), seen.clone());
            thread::spawn(move || {
                buf.try_drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
            })
        };
        buf.drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
        writer.join().unwrap();
        other.join().unwrap();
        buf.drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
        assert_eq!(*seen.lock().unwrap(), [hit(7)]);
    });
}
