//! Properties of canonical keys, over many random requests.

use std::collections::HashSet;

use kvslice_core::testkit::Rng;
use kvslice_core::{
    Coordinator, Error, HashSecret, KeyScope, KvDtype, KvLayout, LayerGrouping, LayoutSpec,
    Request, SliceKey,
};

/// Random cases per property; Miri interprets every hash, so it takes a few.
const CASES: u64 = if cfg!(miri) { 6 } else { 300 };

fn layout(bt: u32, grouping: LayerGrouping, shards: u32) -> KvLayout {
    KvLayout::new(
        LayoutSpec::new(6, 8, 4, 16, bt, KvDtype::F16)
            .with_grouping(grouping)
            .with_head_shards(shards),
    )
    .unwrap()
}

fn coord(bt: u32) -> Coordinator {
    Coordinator::new(
        layout(bt, LayerGrouping::Groups(2), 2),
        HashSecret::from_bytes([3; 16]),
    )
}

fn tokens(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(50_000) as u32).collect()
}

#[test]
fn same_logical_slice_gives_same_key() {
    let mut rng = Rng::new(11);
    for _ in 0..CASES {
        let bt = 1 + rng.below(20) as u32;
        let c = coord(bt);
        let n = 1 + rng.below(200) as usize;
        let toks = tokens(&mut rng, n);
        let full = c.plan(&Request::new(&toks)).unwrap();
        // Any sub-range gives the blocks it touches, with the same keys as
        // the whole-sequence plan.
        let a = rng.below(n as u64) as usize;
        let b = a + 1 + rng.below((n - a) as u64) as usize;
        let sub = c.plan(&Request::new(&toks).with_range(a..b)).unwrap();
        let first = a / bt as usize;
        assert_eq!(sub.blocks(), &full.blocks()[first..b.div_ceil(bt as usize)]);
        // Widening the range inside the same blocks changes nothing.
        let bt_us = bt as usize;
        let (lo, hi) = (first * bt_us, (b.div_ceil(bt_us) * bt_us).min(n));
        assert_eq!(
            c.plan(&Request::new(&toks).with_range(lo..hi)).unwrap(),
            sub
        );
        assert_eq!(sub.token_range(), lo..hi);
        // A longer sequence with the same prefix shares every full block.
        let mut longer = toks.clone();
        let extra = 1 + rng.below(50) as usize;
        longer.extend(tokens(&mut rng, extra));
        let lp = c.plan(&Request::new(&longer)).unwrap();
        let shared = full.full_blocks();
        assert_eq!(&lp.blocks()[..shared], &full.blocks()[..shared]);
        // A fresh coordinator with the same secret and layout agrees.
        assert_eq!(coord(bt).plan(&Request::new(&toks)).unwrap(), full);
    }
}

#[test]
fn range_127_and_128_address_the_same_block() {
    let c = coord(128);
    let toks: Vec<u32> = (0..300).collect();
    let a = c.plan(&Request::new(&toks).with_range(0..127)).unwrap();
    let b = c.plan(&Request::new(&toks).with_range(0..128)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.blocks().len(), 1);
    assert_eq!(a.blocks()[0].valid_tokens, 128);
}

#[test]
fn different_salt_position_token_or_extra_gives_different_keys() {
    let mut rng = Rng::new(12);
    for _ in 0..CASES {
        let bt = 1 + rng.below(16) as u32;
        let c = coord(bt);
        let n = bt as usize * (1 + rng.below(6) as usize);
        let toks = tokens(&mut rng, n);
        let base = c.plan(&Request::new(&toks)).unwrap();
        let hashes =
            |p: &kvslice_core::SlicePlan| p.blocks().iter().map(|b| b.hash).collect::<Vec<_>>();

        // Salt and adapter.
        let salted = c
            .plan(&Request::new(&toks).with_scope(KeyScope {
                salt: b"t2",
                adapter: None,
            }))
            .unwrap();
        let adapted = c
            .plan(&Request::new(&toks).with_scope(KeyScope {
                salt: b"",
                adapter: Some(1),
            }))
            .unwrap();
        for other in [&salted, &adapted] {
            assert!(
                hashes(&base)
                    .iter()
                    .zip(hashes(other))
                    .all(|(a, b)| *a != b)
            );
        }
        // A changed token changes its block and every later block, and no
        // earlier one.
        let at = rng.below(n as u64) as usize;
        let mut changed = toks.clone();
        changed[at] ^= 1 + rng.below(1000) as u32;
        let cp = c.plan(&Request::new(&changed)).unwrap();
        let blk = at / bt as usize;
        for (i, (a, b)) in hashes(&base).iter().zip(hashes(&cp)).enumerate() {
            assert_eq!(i < blk, *a == b, "block {i}, changed token in block {blk}");
        }
        // An extra key on one block does the same.
        let mut extras = vec![None; blk + 1];
        extras[blk] = Some(rng.next_u64() as u128);
        let ep = c
            .plan(&Request::new(&toks).with_block_extras(&extras))
            .unwrap();
        for (i, (a, b)) in hashes(&base).iter().zip(hashes(&ep)).enumerate() {
            assert_eq!(i < blk, *a == b);
        }
        // Every block hash in a sequence is distinct (position is in the
        // chain), even when all blocks hold the same tokens.
        let same: Vec<u32> = (0..n).map(|i| (i % bt as usize) as u32).collect();
        let sp = hashes(&c.plan(&Request::new(&same)).unwrap());
        assert_eq!(sp.iter().collect::<HashSet<_>>().len(), sp.len());
    }
}

#[test]
fn secret_and_layout_are_part_of_the_key() {
    let toks: Vec<u32> = (0..64).collect();
    let l = layout(16, LayerGrouping::AllLayers, 1);
    let a = Coordinator::new(l, HashSecret::from_bytes([1; 16]))
        .plan(&Request::new(&toks))
        .unwrap();
    let b = Coordinator::new(l, HashSecret::from_bytes([2; 16]))
        .plan(&Request::new(&toks))
        .unwrap();
    let l2 = layout(16, LayerGrouping::PerLayer, 1);
    let c = Coordinator::new(l2, HashSecret::from_bytes([1; 16]))
        .plan(&Request::new(&toks))
        .unwrap();
    assert_ne!(a.blocks()[0].hash, b.blocks()[0].hash);
    assert_ne!(a.blocks()[0].hash, c.blocks()[0].hash);
}

#[test]
fn partial_tail_never_shares_a_full_blocks_key() {
    let mut rng = Rng::new(13);
    for _ in 0..CASES {
        let bt = 2 + rng.below(16) as u32;
        let c = coord(bt);
        let full_len = bt as usize * (1 + rng.below(4) as usize);
        let toks = tokens(&mut rng, full_len);
        let full = c.plan(&Request::new(&toks)).unwrap();
        let cut = full_len - 1 - rng.below(bt as u64 - 1) as usize;
        let partial = c.plan(&Request::new(&toks[..cut])).unwrap();
        let last = partial.blocks().last().unwrap();
        assert!(last.valid_tokens < bt);
        assert_eq!(partial.full_blocks(), partial.blocks().len() - 1);
        assert!(full.blocks().iter().all(|b| b.hash != last.hash));
        // A partial block with the same tokens as a full block's prefix,
        // padded out with the same values, is still a different key.
        let mut padded = toks[..cut].to_vec();
        padded.resize(full_len, 0);
        let pp = c.plan(&Request::new(&padded)).unwrap();
        assert_ne!(pp.blocks().last().unwrap().hash, last.hash);
    }
}

#[test]
fn shards_and_groups_are_disjoint_and_complete() {
    for (grouping, shards) in [
        (LayerGrouping::AllLayers, 1),
        (LayerGrouping::PerLayer, 4),
        (LayerGrouping::Groups(4), 3),
    ] {
        let l = layout(8, grouping, shards);
        let c = Coordinator::new(l, HashSecret::from_bytes([9; 16]));
        let toks: Vec<u32> = (0..100).collect();
        let plan = c.plan(&Request::new(&toks)).unwrap();
        let all: Vec<SliceKey> = plan.slice_keys().collect();
        let set: HashSet<SliceKey> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len(), "keys are distinct");
        assert_eq!(
            all.len(),
            plan.blocks().len() * (l.num_layer_groups() * shards) as usize
        );
        let mut union = HashSet::new();
        for g in 0..l.num_layer_groups() {
            for s in 0..shards {
                for k in plan.keys_for(g, s).unwrap() {
                    assert_eq!((k.layer_group, k.head_shard), (g, s));
                    assert!(union.insert(k), "each worker's keys are its own");
                }
            }
        }
        assert_eq!(union, set, "workers together cover every page once");
        assert!(plan.keys_for(l.num_layer_groups(), 0).is_err());
        assert!(plan.keys_for(0, shards).is_err());
    }
}

#[test]
fn bad_requests_are_errors() {
    let c = coord(4);
    let toks = [1u32, 2, 3, 4, 5];
    assert!(matches!(
        c.plan(&Request::new(&[])),
        Err(Error::InvalidRange { .. })
    ));
    assert!(matches!(
        c.plan(&Request::new(&toks).with_range(2..2)),
        Err(Error::InvalidRange { .. })
    ));
    assert!(matches!(
        c.plan(&Request::new(&toks).with_range(0..6)),
        Err(Error::OutOfRange { .. })
    ));
    let extras = [None, None, None];
    assert!(matches!(
        c.plan(&Request::new(&toks).with_block_extras(&extras)),
        Err(Error::ShapeMismatch { .. })
    ));
    let root = c.root(&KeyScope::default());
    assert!(c.next_block(root, 0, &[], None).is_err());
    assert!(c.next_block(root, 0, &[1, 2, 3, 4, 5], None).is_err());
}

#[test]
fn incremental_chain_matches_the_plan() {
    let mut rng = Rng::new(14);
    let c = coord(5);
    let toks = tokens(&mut rng, 23);
    let scope = KeyScope {
        salt: b"abc",
        adapter: Some(7),
    };
    let plan = c.plan(&Request::new(&toks).with_scope(scope)).unwrap();
    let mut prev = c.root(&scope);
    for (i, chunk) in toks.chunks(5).enumerate() {
        let b = c.next_block(prev, i as u32, chunk, None).unwrap();
        assert_eq!(b, plan.blocks()[i]);
        prev = b.hash;
    }
}

#[test]
fn region_keys_follow_coordinates_tensor_and_scope() {
    use kvslice_core::{Coordinator, Error};
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 100, 100, KvDtype::F32)).unwrap();
    let coord = Coordinator::new(layout, HashSecret::from_bytes([4; 16]));
    let scope = KeyScope::default();
    let chunk = |t: u64, s: &KeyScope<'_>, i: u64, j: u64| {
        coord
            .region_key(s, t, &[i * 100..i * 100 + 100, j * 100..j * 100 + 100], 0)
            .unwrap()
            .block
    };
    let mut seen = std::collections::HashSet::new();
    for i in 0..10 {
        for j in 0..10 {
            assert_eq!(chunk(1, &scope, i, j), chunk(1, &scope, i, j));
            assert!(seen.insert(chunk(1, &scope, i, j)), "({i}, {j}) collides");
        }
    }
    // Another tensor or another tenant: other keys for the same region.
    let tenant = KeyScope {
        salt: b"b",
        adapter: None,
    };
    assert!(!seen.contains(&chunk(2, &scope, 0, 0)));
    assert!(!seen.contains(&chunk(1, &tenant, 0, 0)));
    // A 1-D region is not its 2-D extension, nor a token block.
    let one = coord
        .region_key(&scope, 1, std::slice::from_ref(&(0..100)), 0)
        .unwrap()
        .block;
    assert!(!seen.contains(&one));
    let tokens: Vec<u32> = (0..100).collect();
    let plan = coord.plan(&kvslice_core::Request::new(&tokens)).unwrap();
    assert!(!seen.contains(&plan.blocks()[0].hash));
    let (hi, lo) = (3u64, 2u64);
    assert!(matches!(
        coord.region_key(&scope, 1, &[], 0),
        Err(Error::InvalidValue(_))
    ));
    assert!(matches!(
        coord.region_key(&scope, 1, std::slice::from_ref(&(hi..lo)), 0),
        Err(Error::InvalidRange { .. })
    ));
    let nine: Vec<_> = (0..9).map(|_| 0..1u64).collect();
    assert!(coord.region_key(&scope, 1, &nine, 0).is_err());
}

#[test]
fn budgets_cut_before_keys_and_report_what_went() {
    use kvslice_core::coordinator::{TokenBudget, Truncation};
    use kvslice_core::{Coordinator, Error, Request};
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 8, 4, KvDtype::F16)).unwrap();
    let coord = Coordinator::new(layout, HashSecret::from_bytes([6; 16]));
    let long: Vec<u32> = (0..30).collect();
    let last = TokenBudget {
        max_tokens: 16,
        truncation: Truncation::KeepLast,
    };
    let sinks = TokenBudget {
        max_tokens: 16,
        truncation: Truncation::KeepFirstAndLast { first: 4 },
    };
    let plan = |tokens: &[u32], b: Option<TokenBudget>| {
        let r = Request::new(tokens);
        coord.plan(&match b {
            Some(b) => r.with_budget(b),
            None => r,
        })
    };

    let a = plan(&long, Some(last)).unwrap();
    assert_eq!((a.dropped(), a.blocks().len()), (Some(0..14), 4));
    let s = plan(&long, Some(sinks)).unwrap();
    assert_eq!((s.dropped(), s.blocks().len()), (Some(4..18), 4));
    // Cut the same way, same keys, whatever the dropped tokens were.
    let other_head: Vec<u32> = (100..114).chain(14..30).collect();
    assert_eq!(plan(&other_head, Some(last)).unwrap(), a);
    assert_eq!(plan(&long, Some(last)).unwrap(), a);
    // Cut differently, or not cut: no key in common, even for the same
    // kept tokens at the same positions.
    let kept_alone: Vec<u32> = (14..30).collect();
    let untruncated = plan(&kept_alone, None).unwrap();
    assert!(
        a.blocks()
            .iter()
            .all(|b| untruncated.blocks().iter().all(|u| u.hash != b.hash))
    );
    assert!(
        a.blocks()
            .iter()
            .all(|b| s.blocks().iter().all(|o| o.hash != b.hash))
    );
    // Within the budget: nothing dropped, the same keys as with no budget.
    let short: Vec<u32> = (0..16).collect();
    assert_eq!(
        plan(&short, Some(last)).unwrap(),
        plan(&short, None).unwrap()
    );

    // Bad budgets and over-budget refusals are typed errors.
    let refuse = TokenBudget {
        max_tokens: 16,
        truncation: Truncation::Refuse,
    };
    assert!(matches!(
        plan(&long, Some(refuse)),
        Err(Error::OutOfRange { .. })
    ));
    let zero = TokenBudget {
        max_tokens: 0,
        truncation: Truncation::KeepLast,
    };
    assert!(matches!(
        plan(&long, Some(zero)),
        Err(Error::InvalidValue(_))
    ));
    for first in [0, 16, 99] {
        let b = TokenBudget {
            max_tokens: 16,
            truncation: Truncation::KeepFirstAndLast { first },
        };
        assert!(
            matches!(plan(&short, Some(b)), Err(Error::OutOfRange { .. })),
            "{first}"
        );
    }
    // A range in request positions: shifted past the cut, refused inside it.
    let r = coord
        .plan(&Request::new(&long).with_budget(last).with_range(20..30))
        .unwrap();
    assert_eq!(r.token_range(), 4..16);
    assert!(
        coord
            .plan(&Request::new(&long).with_budget(last).with_range(5..30))
            .is_err()
    );
    // Errors name the caller's positions, not the shifted ones: an end
    // past the 30 tokens is 31, not 17.
    let err = coord
        .plan(&Request::new(&long).with_budget(last).with_range(20..31))
        .unwrap_err();
    assert_eq!(
        err,
        Error::OutOfRange {
            what: "range end",
            index: 31,
            bound: 31
        }
    );
    // A range of dropped tokens only, even one on the cut's edges, has
    // nothing to plan, and says so.
    for range in [4..18, 6..10] {
        let err = coord
            .plan(
                &Request::new(&long)
                    .with_budget(sinks)
                    .with_range(range.clone()),
            )
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidValue(m) if m.contains("drops")),
            "{range:?}: {err}"
        );
    }
}
