//! The prefix index's memory of departed blocks: who last held a block that
//! no worker holds any more, which routing uses to send a conversation
//! evicted everywhere back to the worker that served it.

use kvslice_core::{BlockHash, SliceKey};
use kvslice_events::index::PrefixIndex;
use kvslice_events::wire::WireEvent;

fn stored(blocks: &[u128]) -> WireEvent {
    WireEvent::Stored {
        hashes: blocks.iter().map(|&b| BlockHash(b)).collect(),
        parent: None,
        tokens: vec![16; blocks.len()],
        block_size: 16,
        medium: "GPU".into(),
        layer_group: 0,
        head_shard: 0,
        first_block_index: 0,
    }
}

fn removed(blocks: &[u128]) -> WireEvent {
    WireEvent::Removed {
        hashes: blocks.iter().map(|&b| BlockHash(b)).collect(),
        medium: "GPU".into(),
        layer_group: 0,
        head_shard: 0,
    }
}

fn request(blocks: &[u128]) -> Vec<SliceKey> {
    blocks
        .iter()
        .enumerate()
        .map(|(i, &b)| SliceKey {
            block: BlockHash(b),
            block_index: i as u32,
            layer_group: 0,
            head_shard: 0,
        })
        .collect()
}

#[test]
fn the_deepest_departed_block_names_its_last_holder() {
    let mut index = PrefixIndex::new(3);
    // A shared root on every worker; a conversation [0, 10, 11, 12] on
    // worker 2, another [0, 20, 21] on worker 1.
    for w in 0..3 {
        index.apply(w, &stored(&[0]));
    }
    index.apply(2, &stored(&[10, 11, 12]));
    index.apply(1, &stored(&[20, 21]));
    let next_turn = request(&[0, 10, 11, 12, 13]);
    assert_eq!(index.last_holder(&next_turn), None, "nothing departed yet");
    // Worker 2 evicts the conversation's tail: the deepest departed block
    // (12, depth 4) names it, while 10 is still cached there.
    index.apply(2, &removed(&[12, 11]));
    assert_eq!(index.overlaps(&next_turn), [1, 1, 2]);
    assert_eq!(index.last_holder(&next_turn), Some((4, 2)));
    // A request that shares only the root is not steered.
    assert_eq!(index.last_holder(&request(&[0, 30])), None);
    // The other conversation departs from worker 1.
    index.apply(1, &removed(&[21, 20]));
    assert_eq!(index.last_holder(&request(&[0, 20, 21, 22])), Some((3, 1)));
}

#[test]
fn a_block_departs_only_when_its_last_holder_drops_it() {
    let mut index = PrefixIndex::new(2);
    index.apply(0, &stored(&[5, 6]));
    index.apply(1, &stored(&[5, 6]));
    let keys = request(&[5, 6, 7]);
    index.apply(0, &removed(&[6]));
    assert_eq!(index.last_holder(&keys), None, "worker 1 still holds 6");
    index.apply(1, &removed(&[6]));
    assert_eq!(index.last_holder(&keys), Some((2, 1)));
    // Stored again: cached, so no longer a departed block.
    index.apply(0, &stored(&[6]));
    assert_eq!(index.last_holder(&keys), None);
    // A removal by a worker that no longer holds the block changes
    // nothing: worker 0 holds 6, so it has not departed.
    index.apply(1, &removed(&[6]));
    assert_eq!(index.overlaps(&keys), [2, 1]);
    assert_eq!(index.last_holder(&keys), None);
}

#[test]
fn a_clear_departs_a_workers_blocks_and_a_gone_worker_is_forgotten() {
    let mut index = PrefixIndex::new(2);
    index.apply(0, &stored(&[1, 2, 3]));
    index.apply(1, &stored(&[1]));
    index.apply(0, &removed(&[3]));
    let keys = request(&[1, 2, 3]);
    assert_eq!(index.last_holder(&keys), Some((3, 0)));
    // A clear (or a publisher's resync): worker 0's blocks depart from it,
    // but block 1, which worker 1 holds, does not.
    index.apply(0, &WireEvent::Cleared);
    assert_eq!(index.overlaps(&keys), [0, 1]);
    assert_eq!(index.last_holder(&keys), Some((3, 0)));
    assert_eq!(index.last_holder(&request(&[1, 2])), Some((2, 0)));
    // The resync's snapshot stores block 2 again: held, not departed.
    index.apply(0, &stored(&[1, 2]));
    assert_eq!(index.last_holder(&request(&[1, 2])), None);
    // Another worker takes block 3 and drops it in a clear: it held it last.
    index.apply(1, &stored(&[3]));
    index.apply(1, &WireEvent::Cleared);
    assert_eq!(index.last_holder(&keys), Some((3, 1)));
    // Worker 1 is gone: nothing names it, what it held is forgotten.
    index.forget_worker(1);
    assert_eq!(index.overlaps(&keys), [2, 0]);
    assert_eq!(index.last_holder(&keys), None);
    // Departures from a worker still here keep naming it.
    index.apply(0, &removed(&[2]));
    assert_eq!(index.last_holder(&keys), Some((2, 0)));
}

#[test]
fn the_memory_is_bounded_and_can_be_switched_off() {
    let mut off = PrefixIndex::new(2).with_departed_slots(0);
    off.apply(1, &stored(&[1, 2]));
    off.apply(1, &removed(&[2]));
    assert_eq!(off.last_holder(&request(&[1, 2])), None);

    // One slot: each departure takes the place of the one before.
    let mut one = PrefixIndex::new(2).with_departed_slots(1);
    one.apply(0, &stored(&[1, 2]));
    one.apply(1, &stored(&[3, 4]));
    one.apply(0, &removed(&[2]));
    assert_eq!(one.last_holder(&request(&[1, 2])), Some((2, 0)));
    one.apply(1, &removed(&[4]));
    assert_eq!(one.last_holder(&request(&[1, 2])), None);
    assert_eq!(one.last_holder(&request(&[3, 4])), Some((2, 1)));

    // 1,000 departures in 4,096 slots: most are remembered, and every
    // answer names the worker that held the block.
    let mut some = PrefixIndex::new(4).with_departed_slots(4096);
    for b in 0..1000u128 {
        let block = b.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        let w = (b % 4) as usize;
        some.apply(w, &stored(&[block]));
        some.apply(w, &removed(&[block]));
    }
    let mut remembered = 0;
    for b in 0..1000u128 {
        let block = b.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        if let Some((depth, w)) = some.last_holder(&request(&[block])) {
            assert_eq!((depth, w), (1, (b % 4) as usize));
            remembered += 1;
        }
    }
    assert!(remembered > 850, "{remembered} of 1000 remembered");
}

/// A publisher's resync (a clear, then a snapshot that stores the
/// worker's blocks again) costs the departed memory nothing: a small
/// memory still names the holder of a block that departed before it, and
/// what the clear dropped for good departs as before.
#[test]
fn a_resync_does_not_push_out_earlier_departures() {
    let mut index = PrefixIndex::new(2).with_departed_slots(8);
    index.apply(0, &stored(&[1, 2]));
    index.apply(0, &removed(&[2]));
    let earlier = request(&[1, 2]);
    assert_eq!(index.last_holder(&earlier), Some((2, 0)));
    // Worker 1 holds 1,000 blocks, is cleared and stores all but one again.
    let blocks: Vec<u128> = (0..1000u128)
        .map(|b| (b + 100).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
        .collect();
    index.apply(1, &stored(&blocks));
    index.apply(1, &WireEvent::Cleared);
    index.apply(1, &stored(&blocks[1..]));
    assert_eq!(index.last_holder(&earlier), Some((2, 0)), "pushed out");
    let dropped = request(&[blocks[0]]);
    assert_eq!(index.last_holder(&dropped), Some((1, 1)));
    assert_eq!(index.last_holder(&request(&blocks[1..3])), None);
    // Its first removal ends the snapshot: what the clear dropped for good
    // moves into the memory, beside the removed block.
    index.apply(1, &removed(&blocks[1..2]));
    assert_eq!(index.last_holder(&dropped), Some((1, 1)));
    assert_eq!(index.last_holder(&request(&blocks[1..2])), Some((1, 1)));
    // A worker that is gone is named for none of it.
    index.apply(1, &WireEvent::Cleared);
    assert_eq!(index.last_holder(&request(&blocks[5..6])), Some((1, 1)));
    index.forget_worker(1);
    for b in [&blocks[0..1], &blocks[1..2], &blocks[5..6]] {
        assert_eq!(index.last_holder(&request(b)), None);
    }
}
