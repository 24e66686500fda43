//! The cost of the C ABI on the hit path: `lookup_prefix` of a cached
//! 16-block prefix and the release of its references, through
//! `kvs_lookup_prefix` + `kvs_request_truncate` against the same two steps
//! in Rust on the same store, in the same run. The ABI path adds a handle
//! lookup, the request's lock, key conversion and token bookkeeping.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench capi_overhead
//! ```

use std::hint::black_box;
use std::ptr;

use criterion::{Criterion, criterion_group, criterion_main};
use kvslice_capi::*;
use kvslice_core::{CacheStore, Coordinator, HashSecret, KvDtype, KvLayout, LayoutSpec, Request};

const BLOCKS: usize = 16;
const BT: u32 = 16;

fn bench(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..BLOCKS as u32 * BT).collect();
    let mut group = c.benchmark_group("lookup_prefix_16_blocks");

    // Rust: the default policy on a store with the prefix cached.
    let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, BT, KvDtype::F16)).unwrap();
    let store = CacheStore::new(layout, 64, kvslice_core::DensityPolicy::new(64)).unwrap();
    let coord = Coordinator::new(layout, HashSecret::from_bytes([5; 16]));
    let plan = coord.plan(&Request::new(&tokens)).unwrap();
    let keys: Vec<_> = plan.keys_for(0, 0).unwrap().collect();
    {
        let guard = store.pin();
        let req = store.begin_request();
        let mut held = Vec::new();
        for (k, page) in keys
            .iter()
            .zip(store.allocate(BLOCKS as u32, &guard).unwrap())
        {
            held.push(
                store
                    .publish(&req, page, *k, held.last(), BT, &guard)
                    .unwrap(),
            );
        }
        store.end_request(req).unwrap();
    }
    let req = store.begin_request();
    let mut held = Vec::with_capacity(BLOCKS);
    group.bench_function("rust", |b| {
        b.iter(|| {
            let guard = store.pin();
            let n = store
                .lookup_prefix(&req, &keys, tokens.len(), &guard, &mut held)
                .unwrap();
            assert_eq!(n, BLOCKS);
            held.clear();
        })
    });

    // C ABI: the same layout, policy and prefix.
    let spec = KvsLayoutSpec {
        num_layers: 1,
        num_q_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        block_tokens: BT,
        dtype: KVS_DTYPE_F16,
        ..Default::default()
    };
    let (mut l, mut co, mut st, mut rq) = (
        KvsLayout { id: 0 },
        KvsCoordinator { id: 0 },
        KvsStore { id: 0 },
        KvsRequest { id: 0 },
    );
    let mut ckeys = vec![KvsKey::default(); BLOCKS];
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(kvs_layout_new(&spec, &mut l), KvsStatus::Ok);
        assert_eq!(kvs_coordinator_new(l, &[5; 16], &mut co), KvsStatus::Ok);
        assert_eq!(
            kvs_store_new(l, 64, ptr::null(), KvsMemory { id: 0 }, &mut st),
            KvsStatus::Ok
        );
        let p = KvsPlanRequest {
            tokens: tokens.as_ptr(),
            n_tokens: tokens.len(),
            salt: ptr::null(),
            salt_len: 0,
            range_start: 0,
            range_end: 0,
            layer_group: 0,
            head_shard: 0,
        };
        let mut info = KvsPlanInfo::default();
        assert_eq!(
            kvs_plan(co, &p, ckeys.as_mut_ptr(), BLOCKS, &mut info),
            KvsStatus::Ok
        );
        assert_eq!(kvs_request_begin(st, &mut rq), KvsStatus::Ok);
        let mut first = 0;
        assert_eq!(
            kvs_allocate(rq, 0, 0, BLOCKS as u32, &mut first),
            KvsStatus::Ok
        );
        let mut page = 0;
        for (slot, key) in ckeys.iter().enumerate() {
            assert_eq!(kvs_publish(rq, slot, key, BT, &mut page), KvsStatus::Ok);
        }
        assert_eq!(kvs_request_truncate(rq, 0, 0, 0), KvsStatus::Ok);
    }
    group.bench_function("c_abi", |b| {
        b.iter(|| {
            let mut hits = 0usize;
            // SAFETY: live locals.
            let s =
                unsafe { kvs_lookup_prefix(rq, ckeys.as_ptr(), BLOCKS, tokens.len(), &mut hits) };
            assert_eq!((s, hits), (KvsStatus::Ok, BLOCKS));
            assert_eq!(kvs_request_truncate(rq, 0, 0, 0), KvsStatus::Ok);
            black_box(hits);
        })
    });
    group.finish();
    assert_eq!(kvs_request_end(rq), KvsStatus::Ok);
    store.end_request(req).unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
