//! The slice map against concurrent hash maps, on conc-map-bench's
//! ReadHeavy mix (98% get, 1% insert, 1% remove), with `SliceKey` keys and
//! page-handle values, on 1 and 2 threads, at 10k and 1M entries. Also the
//! cost of `CacheStore::lookup_prefix` for a 32-block sequence.
//!
//! Peers in the same run: dashmap, papaya and scc, each given the same
//! cheap key hasher as kvslice's map (the block hash in a key is already a
//! keyed PRF output, so no map needs SipHash here). Epoch-based maps (ours,
//! papaya) pin once per 1024 operations; dashmap locks a shard and scc
//! pins internally per operation, which is how each is meant to be used.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench slice_map
//! ```

use std::hash::{BuildHasher, Hasher};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kvslice_core::CacheStore;
use kvslice_core::testkit::Rng;
use kvslice_core::{
    BlockHash, KvDtype, KvLayout, LayoutSpec, PageHandle, PagePool, SliceKey, SliceMap,
};

fn key(i: u64) -> SliceKey {
    let h = Rng::new(i).next_u64();
    SliceKey {
        block: BlockHash(u128::from(h) << 64 | u128::from(i)),
        block_index: (i % 64) as u32,
        layer_group: 0,
        head_shard: 0,
    }
}

/// The same mixing the slice map uses, for the peers.
#[derive(Clone, Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.write_u64(v as u64 ^ ((v >> 64) as u64).rotate_left(29));
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        let h = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

#[derive(Clone, Default)]
struct BuildKeyHasher;

impl BuildHasher for BuildKeyHasher {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

/// One map under test.
trait Map: Sync {
    /// Runs `ops` operations of the mix with keys drawn by `rng`; present
    /// keys are `0..n`, churned keys `n..2n`.
    fn run(&self, n: u64, ops: u64, rng: &mut Rng, value: PageHandle);
}

fn op(rng: &mut Rng, n: u64) -> (u8, u64) {
    let r = rng.below(100);
    match r {
        0 => (1, n + rng.below(n)),
        1 => (2, n + rng.below(n)),
        _ => (0, rng.below(n)),
    }
}

impl Map for SliceMap {
    fn run(&self, n: u64, ops: u64, rng: &mut Rng, value: PageHandle) {
        let mut guard = kvslice_core::epoch::pin();
        for i in 0..ops {
            if i.is_multiple_of(1024) {
                guard.repin();
            }
            match op(rng, n) {
                (0, k) => drop(black_box(self.get(&key(k), &guard).unwrap())),
                (1, k) => drop(black_box(self.insert(key(k), value, &guard).unwrap())),
                (_, k) => drop(black_box(self.remove(&key(k), &guard).unwrap())),
            }
        }
    }
}

impl Map for dashmap::DashMap<SliceKey, PageHandle, BuildKeyHasher> {
    fn run(&self, n: u64, ops: u64, rng: &mut Rng, value: PageHandle) {
        for _ in 0..ops {
            match op(rng, n) {
                (0, k) => drop(black_box(self.get(&key(k)).map(|r| *r))),
                (1, k) => drop(black_box(self.insert(key(k), value))),
                (_, k) => drop(black_box(self.remove(&key(k)))),
            }
        }
    }
}

impl Map for papaya::HashMap<SliceKey, PageHandle, BuildKeyHasher> {
    fn run(&self, n: u64, ops: u64, rng: &mut Rng, value: PageHandle) {
        let mut guard = self.guard();
        for i in 0..ops {
            if i.is_multiple_of(1024) {
                drop(guard);
                guard = self.guard();
            }
            match op(rng, n) {
                (0, k) => drop(black_box(self.get(&key(k), &guard).copied())),
                (1, k) => drop(black_box(self.insert(key(k), value, &guard).copied())),
                (_, k) => drop(black_box(self.remove(&key(k), &guard).copied())),
            }
        }
    }
}

impl Map for scc::HashMap<SliceKey, PageHandle, BuildKeyHasher> {
    fn run(&self, n: u64, ops: u64, rng: &mut Rng, value: PageHandle) {
        for _ in 0..ops {
            match op(rng, n) {
                (0, k) => drop(black_box(self.read_sync(&key(k), |_, v| *v))),
                (1, k) => drop(black_box(self.insert_sync(key(k), value))),
                (_, k) => drop(black_box(self.remove_sync(&key(k)))),
            }
        }
    }
}

/// Wall time for `iters` operations split across `threads` threads.
fn run(map: &dyn Map, n: u64, threads: u64, iters: u64, value: PageHandle) -> Duration {
    let barrier = Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut rng = Rng::new(t * 7919 + iters);
                    barrier.wait();
                    map.run(n, iters / threads, &mut rng, value);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        workers.into_iter().for_each(|w| w.join().unwrap());
        start.elapsed()
    })
}

fn bench_maps(c: &mut Criterion) {
    let pool = PagePool::new(
        KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 1, KvDtype::F32)).unwrap(),
        1,
    )
    .unwrap();
    let value = pool.alloc().unwrap().handle();
    for n in [10_000u64, 1_000_000] {
        let ours = SliceMap::new(2 * n as u32);
        let dash = dashmap::DashMap::with_capacity_and_hasher(2 * n as usize, BuildKeyHasher);
        let papaya = papaya::HashMap::builder()
            .capacity(2 * n as usize)
            .hasher(BuildKeyHasher)
            .build();
        let scc = scc::HashMap::with_capacity_and_hasher(2 * n as usize, BuildKeyHasher);
        {
            let g = kvslice_core::epoch::pin();
            let pg = papaya.guard();
            for i in 0..n {
                ours.insert(key(i), value, &g).unwrap();
                dash.insert(key(i), value);
                papaya.insert(key(i), value, &pg);
                let _ = scc.insert_sync(key(i), value);
            }
        }
        let maps: [(&str, &dyn Map); 4] = [
            ("kvslice", &ours),
            ("dashmap", &dash),
            ("papaya", &papaya),
            ("scc", &scc),
        ];
        for threads in [1u64, 2] {
            let mut g = c.benchmark_group(format!("read_heavy/{n}_entries/{threads}_threads"));
            for (name, map) in maps {
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter_custom(|iters| run(map, n, threads, iters, value))
                });
            }
            g.finish();
        }
    }
}

/// `lookup_prefix` hitting a cached 32-block prefix, per policy, on 1 and
/// 2 threads looking up the same prefix at once (the time is per lookup
/// and thread). Each lookup is one request (a ticket from `begin_request`,
/// given back with `end_request`), and every 16th drains the read buffer
/// (`evict(0)`), as the inserts and evictions of real traffic would: the
/// hit path is measured with its maintenance, not with a buffer that
/// overflowed and drops every record.
fn bench_lookup_prefix(c: &mut Criterion) {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 16, KvDtype::F16)).unwrap();
    let keys: Vec<SliceKey> = (0..32)
        .map(|i| SliceKey {
            block_index: i,
            ..key(u64::from(i))
        })
        .collect();
    let mut g = c.benchmark_group("lookup_prefix/32_blocks_hit");
    for name in ["default", "clock", "lru", "tinylfu", "chain"] {
        let policy = kvslice_core::evict::by_name(name, 64).unwrap();
        let store = CacheStore::new(layout, 64, policy).unwrap();
        {
            let guard = store.pin();
            let req = store.begin_request();
            let mut held = Vec::new();
            for (k, page) in keys.iter().zip(store.allocate(32, &guard).unwrap()) {
                let r = store
                    .publish(&req, page, *k, held.last(), 16, &guard)
                    .unwrap();
                held.push(r);
            }
            store.end_request(req).unwrap();
        }
        for threads in [1usize, 2] {
            let id = BenchmarkId::new(name, format!("{threads}_threads"));
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let barrier = Barrier::new(threads);
                    std::thread::scope(|s| {
                        let workers: Vec<_> = (0..threads)
                            .map(|_| {
                                s.spawn(|| {
                                    let guard = store.pin();
                                    let mut out = Vec::with_capacity(32);
                                    barrier.wait();
                                    let t0 = Instant::now();
                                    for i in 0..iters {
                                        let req = store.begin_request();
                                        let hits = store
                                            .lookup_prefix(
                                                &req,
                                                black_box(&keys),
                                                32 * 16,
                                                &guard,
                                                &mut out,
                                            )
                                            .unwrap();
                                        assert_eq!(hits, 32);
                                        out.clear();
                                        store.end_request(req).unwrap();
                                        if i % 16 == 15 {
                                            store.evict(0, &guard).unwrap();
                                        }
                                    }
                                    t0.elapsed()
                                })
                            })
                            .collect();
                        workers
                            .into_iter()
                            .map(|w| w.join().unwrap())
                            .max()
                            .unwrap()
                    })
                })
            });
        }
        let stats = store.stats();
        println!(
            "{name}: {} of {} hit records dropped (stripe full or position lost to another thread)",
            stats.dropped_accesses, stats.hit_blocks
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench_maps, bench_lookup_prefix
}
criterion_main!(benches);
