//! Values that are not the block asked for — corrupted, truncated, written
//! under another layout or format version, of the wrong size, of the wrong
//! Redis type — are misses: counted, deleted where they are garbage, never
//! data; the prefix
//! stops there and the local cache keeps working. Needs the loopback
//! cluster; prints `SKIPPED` without it, unless `KVSLICE_REQUIRE_REDIS=1`.

mod common;

use std::time::Duration;

use kvslice_core::{
    BlockHash, CacheStore, KeyOrder, KvDtype, KvLayout, LayoutSpec, LruPolicy, SliceKey,
};
use kvslice_redis::{TieredStore, value};
use redis::Commands;

fn key(i: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(0xbad0_0000 + u128::from(i)),
        block_index: i,
        layer_group: 0,
        head_shard: 0,
    }
}

#[test]
fn bad_values_are_counted_misses_and_garbage_is_deleted() {
    let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 8, 4, KvDtype::F16)).unwrap();
    let Some(tier) = common::tier(layout, "bad-values", |c| c) else {
        return;
    };
    let page: Vec<u8> = (0..layout.page_bytes()).map(|i| i as u8).collect();
    // Block 0 is good, spilled by the tier itself.
    assert!(tier.spill(&key(0), 4, &page));
    assert!(tier.flush(Duration::from_secs(5)));

    // The others are written by hand, each wrong in its own way.
    let client =
        redis::cluster::ClusterClient::new(common::urls().split(',').collect::<Vec<_>>()).unwrap();
    let mut con = client.get_connection().unwrap();
    let mut good = Vec::new();
    value::encode(&layout, &key(1), 4, &page, &mut good);
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let truncated = good[..good.len() / 2].to_vec();
    let other = KvLayout::new(layout.spec().with_key_order(KeyOrder::DimMajor)).unwrap();
    let mut foreign = Vec::new();
    value::encode(&other, &key(3), 4, &page, &mut foreign);
    let mut short = Vec::new();
    value::encode(&layout, &key(4), 4, &page[1..], &mut short);
    let mut newer = Vec::new();
    value::encode(&layout, &key(6), 4, &page, &mut newer);
    newer[4] = value::VERSION + 1;
    // (block, value, what, deleted): garbage is deleted; another layout's
    // or another format version's value is some writer's data, kept.
    let cases: [(u32, Vec<u8>, &str, bool); 5] = [
        (1, flipped, "checksum", true),
        (2, truncated, "truncated", true),
        (3, foreign, "another layout", false),
        (4, short, "wrong size", true),
        (6, newer, "another format version", false),
    ];
    for (i, bytes, _, _) in &cases {
        let _: () = con.set(tier.redis_key(&key(*i)), bytes).unwrap();
    }
    // Block 5: a list, not a string: GET answers with an error reply.
    let _: () = con.rpush(tier.redis_key(&key(5)), "x").unwrap();

    let store = CacheStore::new(layout, 16, LruPolicy::new(16)).unwrap();
    let tiered = TieredStore::new(&store, &tier).unwrap();
    let guard = store.pin();
    for (n, (i, _, what, deleted)) in cases.iter().enumerate() {
        let req = store.begin_request();
        let mut held = Vec::new();
        // Block 0 then the bad one: the prefix stops after block 0.
        let hit = tiered
            .lookup(&req, &[key(0), key(*i)], 8, &guard, &mut held)
            .unwrap();
        assert_eq!(
            (hit.local, hit.remote),
            (usize::from(n > 0), usize::from(n == 0)),
            "{what}"
        );
        assert_eq!(held[0].bytes(), &page[..]);
        drop(held);
        store.end_request(req).unwrap();
        assert_eq!(tier.stats().bad_values, n as u64 + 1, "{what}");
        let exists: bool = con.exists(tier.redis_key(&key(*i))).unwrap();
        assert_eq!(exists, !deleted, "the {what} value: deleted {deleted}");
    }
    for i in [3, 6] {
        let _: () = con.del(tier.redis_key(&key(i))).unwrap();
    }
    let req = store.begin_request();
    let mut held = Vec::new();
    let hit = tiered
        .lookup(&req, &[key(5)], 4, &guard, &mut held)
        .unwrap();
    assert_eq!(hit.blocks(), 0);
    assert_eq!(tier.stats().fetch_errors, 1, "{:?}", tier.stats());
    // The local cache keeps working: publish block 5 and find it locally.
    let mut page5 = store.allocate(1, &guard).unwrap().pop().unwrap();
    page5.bytes_mut().copy_from_slice(&page);
    held.push(store.publish(&req, page5, key(5), None, 4, &guard).unwrap());
    drop(held);
    store.end_request(req).unwrap();
    let req = store.begin_request();
    let mut held = Vec::new();
    let hit = tiered
        .lookup(&req, &[key(5)], 4, &guard, &mut held)
        .unwrap();
    assert_eq!((hit.local, hit.remote), (1, 0));
    drop(held);
    store.end_request(req).unwrap();
    let _: () = con.del(tier.redis_key(&key(5))).unwrap();
    let _: () = con.del(tier.redis_key(&key(0))).unwrap();
}
