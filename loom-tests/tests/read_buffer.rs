//! loom model of the read buffer between a store's hit path and a policy
//! that buffers its accesses: recorders racing each other and a drainer.
//! Every record is delivered exactly once and intact, or dropped and
//! counted; a drain never reads a slot a writer has claimed but not yet
//! finished.

use kvslice_core::evict::{Access, ReadBuffer};
use kvslice_core::{PageEvent, PageId};
use kvslice_loom_tests::{Arc, Mutex, model, model_unbounded, thread};

fn hit(page: u32) -> Access {
    Access::Hit(PageEvent {
        page: PageId(page),
        fingerprint: u64::from(page) * 0x9e37_79b9 + 1,
        block_index: page,
        request: 1,
        partial: false,
    })
}

/// Collected records, shared with the threads that drain them.
type Seen = Arc<Mutex<Vec<Access>>>;

/// A thread that drains `buf` once into `seen`, unless another drains.
fn spawn_try_drain(buf: &Arc<ReadBuffer>, seen: &Seen) -> thread::JoinHandle<()> {
    let (buf, seen) = (buf.clone(), seen.clone());
    thread::spawn(move || {
        buf.try_drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
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
        let drainer = spawn_try_drain(&buf, &seen);
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

/// A lookup's claim of two positions at once racing two single records
/// and a drainer, on a stripe of four slots with one taken (so not all
/// fit unless the drainer frees some): the pair arrives whole and in
/// order or is dropped whole, and the drainer never reads a claimed slot
/// before its record is complete.
#[test]
fn claims_of_many_race_single_records_and_drain() {
    model(|| {
        let buf = Arc::new(ReadBuffer::new(1, 4));
        let seen = Arc::new(Mutex::new(Vec::new()));
        assert!(buf.record(hit(0)));
        let pair = {
            let buf = buf.clone();
            thread::spawn(move || buf.record_all(&[hit(1), hit(2)]))
        };
        let single = {
            let buf = buf.clone();
            thread::spawn(move || {
                buf.record(hit(3));
                buf.record(hit(4));
            })
        };
        let drainer = spawn_try_drain(&buf, &seen);
        let pair_in = pair.join().unwrap();
        single.join().unwrap();
        drainer.join().unwrap();
        buf.drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len() as u64 + buf.dropped(), 5, "delivered + dropped");
        let at = |a: Access| seen.iter().position(|s| *s == a);
        assert_eq!(at(hit(0)), Some(0));
        match (at(hit(1)), at(hit(2))) {
            (Some(i), Some(j)) => assert!(pair_in && j == i + 1, "the pair split"),
            (None, None) => assert!(!pair_in),
            _ => panic!("half a pair: {seen:?}"),
        }
        let mut pages: Vec<u32> = seen
            .iter()
            .map(|a| match a {
                Access::Hit(e) => e.page.0,
                _ => u32::MAX,
            })
            .collect();
        assert!(pages.iter().all(|&p| p <= 4), "a torn record");
        pages.sort_unstable();
        pages.dedup();
        assert_eq!(pages.len(), seen.len(), "a record delivered twice");
    });
}

/// `settled` racing a drainer: a recorder that finds its request settled
/// must find its record applied, even though the drainer moves `head`
/// past a batch before it applies the batch. Unbounded: the race (record,
/// the drainer up to its `head` store, then `settled`) takes more
/// preemptions than CI's bound, and the whole model is a few dozen
/// executions.
#[test]
fn settled_means_applied() {
    model_unbounded(|| {
        let buf = Arc::new(ReadBuffer::new(1, 2));
        let applied = Arc::new(Mutex::new(Vec::new()));
        let drainer = spawn_try_drain(&buf, &applied);
        assert!(buf.record(hit(5)));
        if buf.settled(1) {
            assert_eq!(*applied.lock().unwrap(), [hit(5)], "settled, not applied");
        }
        drainer.join().unwrap();
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
        let other = spawn_try_drain(&buf, &seen);
        buf.drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
        writer.join().unwrap();
        other.join().unwrap();
        buf.drain(&mut |b| seen.lock().unwrap().extend_from_slice(b));
        assert_eq!(*seen.lock().unwrap(), [hit(7)]);
    });
}
