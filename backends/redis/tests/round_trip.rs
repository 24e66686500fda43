//! Blocks spilled by one replica and fetched by another come back byte for
//! byte, for every dtype and key order, full blocks and a partial tail;
//! attention over the fetched pages equals attention over the originals.
//! Needs the loopback cluster (`.ci/redis-cluster.sh start`); prints
//! `SKIPPED` without it, unless `KVSLICE_REQUIRE_REDIS=1`.

mod common;

use std::time::Duration;

use kvslice_core::testkit::{Rng, Scenario};
use kvslice_core::{
    AttentionBatch, AttentionEngine, CacheStore, Coordinator, HashSecret, KeyOrder, KvDtype,
    KvLayout, LayoutSpec, LruPolicy, PageId, PageMemory, PageView, ReferenceEngine, Request,
    SeqAttention, SliceKey,
};
use kvslice_redis::TieredStore;

#[test]
fn every_dtype_and_key_order_round_trips() {
    let mut rng = Rng::new(38);
    let mut checked = 0;
    for dtype in KvDtype::ALL {
        for order in [KeyOrder::TokenMajor, KeyOrder::DimMajor] {
            let layout =
                KvLayout::new(LayoutSpec::new(2, 4, 2, 16, 8, dtype).with_key_order(order))
                    .unwrap();
            let Some(tier) = common::tier(layout, "round-trip", |c| c) else {
                return;
            };
            // 29 tokens: three full blocks of 8 and a tail of 5.
            let sc = Scenario::random(layout, &[(29, 1)], &mut rng).unwrap();
            let table = &sc.seqs[0].tables[0];
            let tokens: Vec<u32> = (0..29).map(|_| rng.below(50_000) as u32).collect();
            let coord = Coordinator::new(layout, HashSecret::from_bytes([38; 16]));
            let plan = coord.plan(&Request::new(&tokens)).unwrap();
            let keys: Vec<SliceKey> = plan.keys_for(0, 0).unwrap().collect();
            let valid: Vec<u32> = plan.blocks().iter().map(|b| b.valid_tokens).collect();
            assert_eq!(valid, [8, 8, 8, 5]);

            // Replica A publishes the blocks, then clears: each is spilled.
            let a = CacheStore::new(layout, 8, LruPolicy::new(8))
                .unwrap()
                .with_spill(Box::new(tier.sink()))
                .unwrap();
            {
                let (guard, req) = (a.pin(), a.begin_request());
                let mut refs = Vec::new();
                for (i, key) in keys.iter().enumerate() {
                    let mut page = a.allocate(1, &guard).unwrap().pop().unwrap();
                    page.bytes_mut()
                        .copy_from_slice(sc.pages.page(table[i]).unwrap());
                    let r = a
                        .publish(&req, page, *key, refs.last(), valid[i], &guard)
                        .unwrap();
                    refs.push(r);
                }
                drop(refs);
                a.end_request(req).unwrap();
                assert!(a.clear(&guard).unwrap());
            }
            assert!(tier.flush(Duration::from_secs(10)));
            assert_eq!(tier.stats().spilled_blocks, 4, "{:?}", tier.stats());

            // Replica B has none of them locally: all four come from the tier.
            let b = CacheStore::new(layout, 8, LruPolicy::new(8)).unwrap();
            let tiered = TieredStore::new(&b, &tier).unwrap();
            let (guard, req) = (b.pin(), b.begin_request());
            let mut got = Vec::new();
            let hit = tiered.lookup(&req, &keys, 29, &guard, &mut got).unwrap();
            assert_eq!(
                (hit.local, hit.remote, hit.remote_tokens),
                (0, 4, 29),
                "{dtype:?} {order:?}"
            );
            for (i, r) in got.iter().enumerate() {
                assert_eq!(r.bytes(), sc.pages.page(table[i]).unwrap(), "block {i}");
                assert_eq!(b.valid_tokens(r).unwrap(), valid[i]);
            }
            // Attention over B's fetched pages, against the originals.
            let q = sc.random_queries(0, &mut rng).unwrap();
            let fetched_table: Vec<_> = got.iter().map(|r| r.handle().id()).collect();
            let mut view = PageView::new(b.pool());
            for r in &got {
                view.add_ref(r);
            }
            for layer in 0..2 {
                let want = attend(&sc.pages, table, layer, &q);
                let have = attend(&view, &fetched_table, layer, &q);
                assert_eq!(have, want, "{dtype:?} {order:?} layer {layer}");
            }
            drop(view);
            drop(got);
            // Now they are local.
            let mut again = Vec::new();
            let hit = tiered.lookup(&req, &keys, 29, &guard, &mut again).unwrap();
            assert_eq!((hit.local, hit.remote), (4, 0));
            drop(again);
            b.end_request(req).unwrap();
            checked += 1;
        }
    }
    assert_eq!(checked, 10);
}

fn attend<P>(memory: &P, table: &[PageId], layer: u32, q: &[f32]) -> Vec<f32>
where
    ReferenceEngine: AttentionEngine<P>,
{
    let seqs = [SeqAttention {
        block_table: table,
        kv_len: 29,
        q_len: 1,
    }];
    let mut out = vec![0f32; q.len()];
    ReferenceEngine
        .attend(
            memory,
            &AttentionBatch::new(layer, 0, &seqs, q, 0.25),
            &mut out,
        )
        .unwrap();
    out
}
