//! The wire decoder on arbitrary bytes, the encoder on arbitrary events,
//! and the router's index on arbitrary event streams. Checked: decoding
//! never panics; a batch the decoder accepts encodes to bytes that decode
//! to the same batch; per-block events folded, encoded and decoded name
//! the same blocks in the same order; the index agrees with a plain model
//! of who holds what and who held it last; a subscriber's batch numbers
//! account for every batch once, whatever arrives live and in replays.

use std::collections::HashMap;

use kvslice_core::events::{KvEvent, Medium};
use kvslice_core::{BlockHash, SliceKey};

use crate::index::PrefixIndex;
use crate::sequence::{Live, RESTART_RUN, Replayed, Sequence};
use crate::wire::{self, WireEvent};

/// Runs every check on `data`.
pub fn payload(data: &[u8]) {
    if let Ok(batch) = wire::decode(data) {
        let again = wire::decode(&wire::encode(batch.ts, &batch.events))
            .expect("an accepted batch re-encodes to a valid one");
        assert_eq!(again.events, batch.events);
        assert_eq!(again.ts.to_bits(), batch.ts.to_bits());
    }
    events(data);
    index(data);
    sequence(data);
}

/// A worker's batch numbers through arbitrary live batches, each gap's
/// replay bringing arbitrary batches, as the subscriber drives them. Two
/// bytes per live batch: its number (near the last one seen, so runs,
/// duplicates, gaps and restarts all happen; sometimes far) and how many
/// batches its gap's replay brings, then those batches' numbers, a byte
/// each. Checked against a plain model: since the stream (re)started,
/// every batch below the next is applied or counted lost, exactly once;
/// applied batches rise; a batch dropped as behind changes nothing; and a
/// restart comes exactly when [`RESTART_RUN`] behind batches in a row run
/// on one past another, or when a shorter such run from batch 0 runs on
/// past the newest batch.
fn sequence(data: &[u8]) {
    let mut seq = Sequence::default();
    // Since the (re)start: batches applied, batches counted lost, the
    // last applied, the newest seen live, and the run of behind batches.
    let (mut applied, mut lost, mut last_applied) = (0u64, 0u64, None::<u64>);
    let mut newest: Option<u64> = None;
    let mut run: Vec<u64> = Vec::new();
    let mut bytes = data.iter().copied();
    let apply = |seq: &mut Sequence, n: u64, applied: &mut u64, last: &mut Option<u64>| {
        assert!(
            last.is_none_or(|l| n > l),
            "batch {n} applied after {last:?}"
        );
        seq.applied(n);
        *applied += 1;
        *last = Some(n);
    };
    while let (Some(a), Some(b)) = (bytes.next(), bytes.next()) {
        let base = newest.unwrap_or(0);
        let n = match a >> 6 {
            0 => base.saturating_sub(u64::from(a & 0x3F)),
            1 | 2 => base + u64::from(a & 0x3F),
            _ => u64::from(a & 0x3F) << 20,
        };
        let before = seq;
        // Whether this batch makes a run of RESTART_RUN behind batches,
        // each one past the one before, or ends such a shorter run that
        // began at 0 by running past the newest: then, and only then, a
        // restart.
        let k = RESTART_RUN as usize - 1;
        let restarts = newest.is_some_and(|newest| n <= newest)
            && run.len() >= k
            && run[run.len() - k..].windows(2).all(|w| w[1] == w[0] + 1)
            && run.last().is_none_or(|l| n == l + 1);
        let from_zero = newest.is_some_and(|newest| n > newest)
            && n > 0
            && run.len() as u64 >= n
            && run[run.len() - n as usize..].iter().copied().eq(0..n);
        let restarts = restarts || from_zero;
        let mut live = seq.live(n);
        assert_eq!(live == Live::Restarted, restarts, "batch {n} after {run:?}");
        if live == Live::Restarted {
            seq.restart();
            (applied, lost, last_applied, newest) = (0, 0, None, None);
            run.clear();
            live = seq.live(n);
            assert!(!matches!(live, Live::Behind { .. } | Live::Restarted));
        }
        match live {
            Live::Behind { last } => {
                assert_eq!(Some(last), newest);
                assert!(n <= last);
                assert_eq!(seq.next(), before.next(), "a batch behind moved the next");
                run.push(n);
            }
            Live::Restarted => unreachable!("offered again after a restart"),
            Live::Gap { from } => {
                assert_eq!(from, seq.next());
                assert!(n > from);
                run.clear();
                newest = Some(n);
                for _ in 0..b % 8 {
                    let Some(r) = bytes.next() else { break };
                    let r = from.saturating_sub(2) + u64::from(r % 16);
                    match seq.replayed(r) {
                        Replayed::Stale => assert!(r < seq.next()),
                        Replayed::Apply { lost: gap } => {
                            assert_eq!((gap.start, gap.end), (seq.next(), r));
                            lost += gap.end - gap.start;
                            apply(&mut seq, r, &mut applied, &mut last_applied);
                        }
                    }
                }
                if let Some(gap) = seq.filled(n) {
                    assert_eq!(gap.end, n);
                    lost += gap.end - gap.start;
                }
                assert!(seq.next() >= n);
                if seq.next() == n {
                    apply(&mut seq, n, &mut applied, &mut last_applied);
                }
            }
            Live::Next => {
                run.clear();
                newest = Some(n);
                assert_eq!(n, seq.next());
                apply(&mut seq, n, &mut applied, &mut last_applied);
            }
            Live::Done => {
                run.clear();
                newest = Some(n);
                assert!(n < seq.next());
            }
        }
        assert_eq!(
            applied + lost,
            seq.next(),
            "every batch below the next once"
        );
    }
}

/// Three bytes per step: event kind, worker and layer group; the blocks
/// it names; and a request to query. Eight blocks (with high hash bits
/// set) in two layer groups. Two indexes: one of eight departed slots,
/// so that departures collide, checked for soundness (what it names is
/// right); one of 2^16, where these sixteen blocks have slots of their
/// own, checked exactly against a plain model.
fn index(data: &[u8]) {
    const WORKERS: usize = 3;
    type Id = (u128, u32);
    let mut small = PrefixIndex::new(WORKERS).with_departed_slots(8);
    let mut exact = PrefixIndex::new(WORKERS).with_departed_slots(1 << 16);
    let block = |b: u8| u128::from(b) << 64 | u128::from(b).wrapping_mul(0x9e37_79b9);
    let key = |b: u8, g: u32, i: usize| SliceKey {
        block: BlockHash(block(b)),
        block_index: i as u32,
        layer_group: g,
        head_shard: 0,
    };
    let all: Vec<SliceKey> = (0..16).map(|n| key(n % 8, u32::from(n / 8), 0)).collect();
    let mut slots: Vec<usize> = all.iter().filter_map(|k| exact.departed_slot(k)).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(
        slots.len(),
        all.len(),
        "the exact index's blocks share slots"
    );
    let mut holders: HashMap<Id, u64> = HashMap::new();
    let mut departed: HashMap<Id, (usize, u32)> = HashMap::new();
    let mut forgets = [0u32; WORKERS];
    for c in data.chunks_exact(3) {
        let (w, g) = (usize::from(c[0] / 4) % WORKERS, u32::from(c[0] / 12 % 2));
        let bit = 1u64 << w;
        let blocks = [c[1] % 8, c[1] / 8 % 8];
        let hashes = blocks.iter().map(|&b| BlockHash(block(b))).collect();
        let mut depart = |id: Id, holders: &mut HashMap<Id, u64>| {
            let set = holders.entry(id).or_default();
            if *set & bit != 0 {
                *set &= !bit;
                if *set == 0 {
                    departed.insert(id, (w, forgets[w]));
                }
            }
        };
        let event = match c[0] % 4 {
            0 => {
                // Held again: no longer departed, from anyone.
                blocks.iter().for_each(|&b| {
                    *holders.entry((block(b), g)).or_default() |= bit;
                    departed.remove(&(block(b), g));
                });
                Some(WireEvent::Stored {
                    hashes,
                    parent: None,
                    tokens: vec![16; 2],
                    block_size: 16,
                    medium: "GPU".into(),
                    layer_group: g,
                    head_shard: 0,
                    first_block_index: 0,
                })
            }
            1 => {
                blocks
                    .iter()
                    .for_each(|&b| depart((block(b), g), &mut holders));
                Some(WireEvent::Removed {
                    hashes,
                    medium: "GPU".into(),
                    layer_group: g,
                    head_shard: 0,
                })
            }
            2 => {
                let ids: Vec<Id> = holders.keys().copied().collect();
                ids.into_iter().for_each(|id| depart(id, &mut holders));
                Some(WireEvent::Cleared)
            }
            _ => {
                holders.values_mut().for_each(|set| *set &= !bit);
                forgets[w] += 1;
                None
            }
        };
        for index in [&mut small, &mut exact] {
            match &event {
                Some(e) => index.apply(w, e),
                None => index.forget_worker(w),
            }
        }
        let request: Vec<SliceKey> = [c[2] % 8, c[2] / 8 % 8, c[2] / 64]
            .iter()
            .enumerate()
            .map(|(i, &b)| key(b, g, i))
            .collect();
        let id = |k: &SliceKey| (k.block.0, k.layer_group);
        let held = |k: &SliceKey| holders.get(&id(k)).copied().unwrap_or(0);
        let expected: Vec<usize> = (0..WORKERS)
            .map(|w| request.iter().take_while(|k| held(k) >> w & 1 == 1).count())
            .collect();
        // Departed from a worker not forgotten since, and held by none.
        let named = |k: &SliceKey| {
            departed
                .get(&id(k))
                .filter(|&&(w, f)| f == forgets[w] && held(k) == 0)
                .map(|&(w, _)| w)
        };
        for index in [&small, &exact] {
            assert_eq!(index.overlaps(&request), expected);
        }
        if let Some((depth, w)) = small.last_holder(&request) {
            assert_eq!(
                named(&request[depth - 1]),
                Some(w),
                "{:?}",
                request[depth - 1]
            );
        }
        let deepest = (0..request.len())
            .rev()
            .find_map(|d| named(&request[d]).map(|w| (d + 1, w)));
        assert_eq!(exact.last_holder(&request), deepest);
    }
}

/// Six bytes per event: kind, block, index, layer group, head shard,
/// tokens; small ranges so that runs and parents line up often.
fn events(data: &[u8]) {
    let mut made = Vec::new();
    let mut prev: Option<SliceKey> = None;
    for c in data.chunks_exact(6) {
        let key = SliceKey {
            block: BlockHash(u128::from(c[1] % 8) << 64 | u128::from(c[1])),
            block_index: u32::from(c[2] % 4) | if c[2] & 0x80 != 0 { u32::MAX - 3 } else { 0 },
            layer_group: u32::from(c[3] % 2),
            head_shard: u32::from(c[4] % 2),
        };
        let event = match c[0] % 4 {
            0 | 1 => KvEvent::Stored {
                key,
                parent: match c[0] % 4 {
                    0 => prev.map(|p| p.block),
                    _ => (c[5] & 1 == 1).then_some(BlockHash(u128::from(c[5]))),
                },
                tokens: u32::from(c[5]),
            },
            2 => KvEvent::Removed { key },
            _ => KvEvent::Cleared,
        };
        prev = Some(key);
        made.push(event);
    }
    let folded = wire::fold(&made, 16, Medium::Gpu);
    let batch = wire::decode(&wire::encode(0.25, &folded)).expect("encoded batches decode");
    assert_eq!(batch.events, folded);
    // Unfold: the wire events name the blocks the store reported, in order.
    let mut named = Vec::new();
    for e in &batch.events {
        match e {
            WireEvent::Stored {
                tokens,
                parent,
                hashes,
                ..
            } => {
                // The first block's parent is the event's; each later
                // block's is the block before it.
                let parents = core::iter::once(*parent).chain(hashes.iter().map(|&h| Some(h)));
                named.extend(
                    wire::keys(e)
                        .into_iter()
                        .zip(tokens)
                        .zip(parents)
                        .map(|((k, &t), p)| Named::Stored(k, t, p)),
                )
            }
            WireEvent::Removed {
                hashes,
                layer_group,
                head_shard,
                ..
            } => named.extend(
                hashes
                    .iter()
                    .map(|&h| Named::Removed(h, *layer_group, *head_shard)),
            ),
            WireEvent::Cleared => named.push(Named::Cleared),
        }
    }
    let expected: Vec<_> = made
        .iter()
        .map(|e| match *e {
            KvEvent::Stored {
                key,
                tokens,
                parent,
            } => Named::Stored(key, tokens, parent),
            KvEvent::Removed { key } => Named::Removed(key.block, key.layer_group, key.head_shard),
            KvEvent::Cleared => Named::Cleared,
        })
        .collect();
    assert_eq!(named, expected);
}

/// A block as a consumer's index sees it: removals carry no index.
#[derive(Debug, PartialEq)]
enum Named {
    /// The key, its tokens and its parent.
    Stored(SliceKey, u32, Option<BlockHash>),
    Removed(BlockHash, u32, u32),
    Cleared,
}
