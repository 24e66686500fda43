//! Page allocation: an alloc + release pair, kvslice's `PagePool` against
//! two free lists a runtime might use instead, on 1 and 2 threads.
//!
//! Peers, measured in the same run:
//! - `mutex_vec`: `Mutex<Vec<u32>>` of free page indices;
//! - `array_queue`: crossbeam-queue's lock-free bounded `ArrayQueue<u32>`.
//!
//! The peers only hand out indices; the pool also maintains each page's
//! generation, reference count and lifecycle. At 2 threads each iteration is
//! one pair on each of the two threads split evenly, so the reported time
//! is wall time per pair across both threads.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench page_pool
//! ```

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use crossbeam_queue::ArrayQueue;
use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PagePool};

const PAGES: u32 = 1024;

/// A free list under test: take one page index, give it back.
trait FreeList: Sync {
    fn pair(&self);
}

impl FreeList for PagePool<'_> {
    fn pair(&self) {
        drop(black_box(self.alloc().expect("pool has free pages")));
    }
}

impl FreeList for Mutex<Vec<u32>> {
    fn pair(&self) {
        let page = self.lock().unwrap().pop().expect("free pages");
        self.lock().unwrap().push(black_box(page));
    }
}

impl FreeList for ArrayQueue<u32> {
    fn pair(&self) {
        let page = self.pop().expect("free pages");
        self.push(black_box(page)).expect("room for the page");
    }
}

/// Wall time for `iters` pairs split across `threads` threads.
fn run(list: &dyn FreeList, threads: u64, iters: u64) -> Duration {
    let barrier = Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let mine = iters / threads + u64::from(t < iters % threads);
                s.spawn(move || {
                    barrier.wait();
                    for _ in 0..mine {
                        list.pair();
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        workers.into_iter().for_each(|w| w.join().unwrap());
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 1, KvDtype::F32)).unwrap();
    let pool = PagePool::new(layout, PAGES).unwrap();
    let mutex = Mutex::new((0..PAGES).collect::<Vec<u32>>());
    let queue = ArrayQueue::new(PAGES as usize);
    (0..PAGES).for_each(|p| queue.push(p).unwrap());
    let lists: [(&str, &dyn FreeList); 3] = [
        ("kvslice_pool", &pool),
        ("mutex_vec", &mutex),
        ("array_queue", &queue),
    ];

    let mut single = c.benchmark_group("alloc_release/1_thread");
    for (name, list) in lists {
        single.bench_function(name, |b| b.iter(|| list.pair()));
    }
    single.finish();

    let mut double = c.benchmark_group("alloc_release/2_threads");
    for (name, list) in lists {
        double.bench_function(name, |b| b.iter_custom(|iters| run(list, 2, iters)));
    }
    double.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
