//! Arbitrary layouts, token sequences, salts and ranges through the
//! coordinator: invalid input gives errors, valid input gives canonical keys.

use alloc::vec::Vec;

use arbitrary::Unstructured;
use std::collections::HashSet;

use super::small;
use crate::{
    Coordinator, Error, HashSecret, KeyScope, KvDtype, KvLayout, LayerGrouping, LayoutSpec,
    Request, SliceKey,
};

/// Runs one coordinator case. Panics if a key is not canonical.
pub fn coordinator(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let dtype = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16][small(&mut u, 0, 2) as usize];
    let grouping = match small(&mut u, 0, 2) {
        0 => LayerGrouping::AllLayers,
        1 => LayerGrouping::PerLayer,
        _ => LayerGrouping::Groups(small(&mut u, 0, 5)),
    };
    let spec = LayoutSpec::new(
        small(&mut u, 0, 6),
        small(&mut u, 0, 12),
        small(&mut u, 0, 6),
        small(&mut u, 0, 32),
        small(&mut u, 0, 40),
        dtype,
    )
    .with_grouping(grouping)
    .with_head_shards(small(&mut u, 0, 4));
    let layout = match KvLayout::new(spec) {
        Ok(l) => l,
        Err(e) => {
            assert!(
                matches!(e, Error::InvalidLayout(_) | Error::Overflow(_)),
                "{e:?}"
            );
            return;
        }
    };
    let secret = HashSecret::from_bytes(u.arbitrary().unwrap_or([0; 16]));
    let coord = Coordinator::new(layout, secret);
    let n = small(&mut u, 0, 200) as usize;
    let tokens: Vec<u32> = (0..n)
        .map(|_| u.arbitrary::<u16>().unwrap_or(0) as u32 % 64)
        .collect();
    let salt: Vec<u8> = (0..small(&mut u, 0, 8))
        .map(|_| u.arbitrary().unwrap_or(0))
        .collect();
    let adapter: Option<u64> = u.arbitrary().unwrap_or(None);
    let scope = KeyScope {
        salt: &salt,
        adapter,
    };
    let start = small(&mut u, 0, n as u32 + 2) as usize;
    let end = small(&mut u, 0, n as u32 + 2) as usize;
    let bt = layout.block_tokens() as usize;
    let extras: Vec<Option<u128>> = (0..small(&mut u, 0, 6))
        .map(|_| u.arbitrary::<Option<u8>>().unwrap_or(None).map(u128::from))
        .collect();
    let req = Request::new(&tokens)
        .with_scope(scope)
        .with_range(start..end)
        .with_block_extras(&extras);

    let valid = start < end && end <= n && extras.len() <= n.div_ceil(bt);
    let plan = match coord.plan(&req) {
        Ok(p) => p,
        Err(e) => {
            assert!(!valid, "valid request rejected: {e:?}");
            region(&mut u, &coord);
            budget(&mut u, &coord);
            return;
        }
    };
    assert!(
        valid,
        "invalid request accepted: {start}..{end} of {n}, {} extras",
        extras.len()
    );

    // Canonical: the blocks touched, keyed exactly as in the whole-sequence
    // plan, whatever the range inside them.
    let whole = coord
        .plan(&req.clone().with_range(0..n))
        .expect("whole sequence plans");
    let first = start / bt;
    assert_eq!(plan.blocks(), &whole.blocks()[first..end.div_ceil(bt)]);
    let widened = coord
        .plan(
            &req.clone()
                .with_range(first * bt..(end.div_ceil(bt) * bt).min(n)),
        )
        .expect("widened range plans");
    assert_eq!(widened, plan);
    assert_eq!(
        Coordinator::new(layout, secret).plan(&req).ok(),
        Some(plan.clone()),
        "deterministic"
    );
    for b in plan.blocks() {
        let len = (n - b.index as usize * bt).min(bt);
        assert_eq!(b.valid_tokens as usize, len);
    }
    // Pages: distinct, and each (group, shard) worker's keys are its own.
    let all: Vec<SliceKey> = plan.slice_keys().collect();
    let distinct: HashSet<SliceKey> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len());
    let mut covered = 0;
    for g in 0..layout.num_layer_groups() {
        for s in 0..layout.num_head_shards() {
            covered += plan
                .keys_for(g, s)
                .expect("in range")
                .filter(|k| distinct.contains(k))
                .count();
        }
    }
    assert_eq!(covered, all.len());
    // A partial tail never shares a full block's key.
    if let Some(last) = whole.blocks().last()
        && (last.valid_tokens as usize) < bt
    {
        let mut padded = tokens.clone();
        padded.resize(n.div_ceil(bt) * bt, 0);
        let full = coord
            .plan(
                &Request::new(&padded)
                    .with_scope(scope)
                    .with_block_extras(&extras),
            )
            .expect("plans");
        assert!(full.blocks().iter().all(|b| b.hash != last.hash));
    }
    region(&mut u, &coord);
    budget(&mut u, &coord);
}

/// Region keys of arbitrary ranges: an error exactly when a dimension is
/// missing, one too many, or empty; otherwise the same key every time, and
/// another key when one bound moves.
fn region(u: &mut Unstructured<'_>, coord: &Coordinator) {
    let dims = small(u, 0, 10) as usize;
    let ranges: Vec<core::ops::Range<u64>> = (0..dims)
        .map(|_| u64::from(small(u, 0, 9))..u64::from(small(u, 0, 9)))
        .collect();
    let tensor = u64::from(small(u, 0, 3));
    let scope = KeyScope::default();
    let valid =
        (1..=crate::MAX_REGION_DIMS).contains(&dims) && ranges.iter().all(|r| r.start < r.end);
    match coord.region_key(&scope, tensor, &ranges, 0) {
        Ok(key) => {
            assert!(valid, "{ranges:?} accepted");
            assert_eq!(coord.region_key(&scope, tensor, &ranges, 0), Ok(key));
            let mut moved = ranges.clone();
            moved[0].end += 1;
            assert_ne!(
                coord.region_key(&scope, tensor, &moved, 0).map(|k| k.block),
                Ok(key.block)
            );
        }
        Err(e) => {
            assert!(!valid, "{ranges:?} refused: {e:?}");
            let want = if dims == 0 {
                matches!(e, Error::InvalidValue(_))
            } else {
                matches!(e, Error::OutOfRange { .. } | Error::InvalidRange { .. })
            };
            assert!(want, "{e:?}");
        }
    }
}

/// Token budgets, against the rule as the docs state it: a budget of zero,
/// or sinks that are none or leave no room for a tail, are errors; a
/// sequence that fits is planned whole; one over a refusing budget is an
/// error; otherwise the plan covers the tokens kept (the last
/// `max_tokens`, or the first `first` and the last `max_tokens - first`)
/// in the blocks a plan of those alone has, says which positions went,
/// shares no key with that plan (a cut request shares none with one that
/// was not cut) and ignores what the dropped tokens were (requests cut
/// the same way share keys).
fn budget(u: &mut Unstructured<'_>, coord: &Coordinator) {
    use crate::coordinator::{TokenBudget, Truncation};
    let n = small(u, 1, 60) as usize;
    let tokens: Vec<u32> = (0..n).map(|_| small(u, 0, 5)).collect();
    let max = small(u, 0, 64) as usize;
    let truncation = match small(u, 0, 2) {
        0 => Truncation::Refuse,
        1 => Truncation::KeepLast,
        _ => Truncation::KeepFirstAndLast {
            first: small(u, 0, 64) as usize,
        },
    };
    let b = TokenBudget {
        max_tokens: max,
        truncation,
    };
    let got = coord.plan(&Request::new(&tokens).with_budget(b));
    let kept: Option<(Vec<u32>, Option<core::ops::Range<usize>>)> = match truncation {
        _ if max == 0 => None,
        Truncation::KeepFirstAndLast { first } if first == 0 || first >= max => None,
        _ if n <= max => Some((tokens.clone(), None)),
        Truncation::Refuse => None,
        Truncation::KeepLast => Some((tokens[n - max..].to_vec(), Some(0..n - max))),
        Truncation::KeepFirstAndLast { first } => {
            let tail = max - first;
            let mut kept = tokens[..first].to_vec();
            kept.extend_from_slice(&tokens[n - tail..]);
            Some((kept, Some(first..n - tail)))
        }
    };
    match (kept, got) {
        (Some((kept, dropped)), Ok(plan)) => {
            assert_eq!(plan.dropped(), dropped);
            assert_eq!(plan.token_range(), 0..kept.len());
            let plain = coord.plan(&Request::new(&kept)).expect("plans");
            let shape = |p: &crate::SlicePlan| -> Vec<(u32, u32)> {
                p.blocks()
                    .iter()
                    .map(|b| (b.index, b.valid_tokens))
                    .collect()
            };
            assert_eq!(shape(&plan), shape(&plain), "budget {b:?} on {n} tokens");
            if let Some(d) = dropped {
                for (a, b) in plan.blocks().iter().zip(plain.blocks()) {
                    assert_ne!(
                        a.hash, b.hash,
                        "a cut request shares a key with an uncut one"
                    );
                }
                let mut other = tokens.clone();
                other[d].iter_mut().for_each(|t| *t += 1);
                let again = coord.plan(&Request::new(&other).with_budget(b));
                assert_eq!(
                    again.as_ref(),
                    Ok(&plan),
                    "the dropped tokens changed the keys"
                );
            }
        }
        (None, Err(_)) => {}
        (want, got) => panic!("budget {b:?} on {n} tokens: want {want:?}, got {got:?}"),
    }
}
