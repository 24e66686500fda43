//! Operation sequences on a slice map against `hashbrown::HashMap`.

use alloc::vec::Vec;

use arbitrary::Unstructured;
use crossbeam_epoch::Collector;
use hashbrown::HashMap;

use super::small;
use crate::{BlockHash, KvDtype, KvLayout, LayoutSpec, PageHandle, PagePool, SliceKey, SliceMap};

/// Runs one slice-map case. Panics if the map disagrees with the model.
pub fn slice_map(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let capacity = small(&mut u, 1, 64);
    let map = SliceMap::with_collector(capacity, Collector::new());
    let local = map.collector().register();
    let pool = PagePool::new(
        KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 1, KvDtype::F32)).expect("valid"),
        4,
    )
    .expect("pool");
    let values: Vec<PageHandle> = pool
        .alloc_many(4)
        .expect("free")
        .map(|p| p.handle())
        .collect();
    let mut model: HashMap<SliceKey, PageHandle> = HashMap::new();
    while !u.is_empty() {
        let guard = local.pin();
        // Few distinct keys, so operations collide; some differ only in
        // group, shard or index.
        let k = SliceKey {
            block: BlockHash(u128::from(small(&mut u, 0, 15))),
            block_index: small(&mut u, 0, 1),
            layer_group: small(&mut u, 0, 1),
            head_shard: 0,
        };
        let v = values[small(&mut u, 0, 3) as usize];
        match small(&mut u, 0, 3) {
            0 => {
                let want = model.get(&k).copied();
                assert_eq!(map.insert(k, v, &guard).expect("own guard"), want);
                model.entry(k).or_insert(v);
            }
            1 => assert_eq!(map.remove(&k, &guard).expect("own guard"), model.remove(&k)),
            2 => {
                let want = model.get(&k) == Some(&v);
                assert_eq!(map.remove_if(&k, v, &guard).expect("own guard"), want);
                if want {
                    model.remove(&k);
                }
            }
            _ => assert_eq!(
                map.get(&k, &guard).expect("own guard"),
                model.get(&k).copied()
            ),
        }
    }
    let guard = local.pin();
    assert_eq!(map.census(&guard).expect("own guard").entries, model.len());
    for (k, v) in &model {
        assert_eq!(map.get(k, &guard).expect("own guard"), Some(*v));
    }
}
