//! How a batch is cut into workgroups: query-row tiles × key splits.
//!
//! A (sequence, kv head) pair has `q_len × gqa` query rows (row
//! `i·gqa + g` is token `i`, query head `g` of the group), so GQA reads each
//! kv head's pages once per tile of rows, not once per query head. Each tile
//! is split along the context (flash-decoding) when there are too few tiles
//! to fill the device; splits past a tile's causal horizon, or before its
//! first row's sliding window, are never made.
//! Every (tile, split) is one workgroup of the attention pass and writes one
//! partial (max, sum, unnormalised output) per row; the merge pass combines a
//! tile's splits by log-sum-exp.

use kvslice_core::SeqAttention;

/// Keys one workgroup scores per step; splits are multiples of it.
pub(crate) const KEY_TILE: u32 = 64;

/// One workgroup of the attention pass, as the shader reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkItem {
    /// Offset of the sequence's block table in the batch's table array.
    pub table_off: u32,
    pub kv_len: u32,
    pub q_len: u32,
    /// The sequence's first query token in the batch (row of `queries`).
    pub q_tok0: u32,
    /// kv head in the shard.
    pub head: u32,
    /// First query row of the tile.
    pub row0: u32,
    /// Keys `k0..k1` of this split.
    pub k0: u32,
    pub k1: u32,
}

/// One tile of the merge pass: its splits are work items
/// `first_work..first_work + splits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MergeItem {
    pub first_work: u32,
    pub splits: u32,
    /// Copied from the tile's work item so the merge needs no other input.
    pub q_len: u32,
    pub q_tok0: u32,
    pub head: u32,
    pub row0: u32,
}

impl WorkItem {
    /// The shader's `Work` struct.
    pub(crate) fn words(&self) -> [u32; 8] {
        [
            self.table_off,
            self.kv_len,
            self.q_len,
            self.q_tok0,
            self.head,
            self.row0,
            self.k0,
            self.k1,
        ]
    }
}

impl MergeItem {
    /// The shader's `Merge` struct.
    pub(crate) fn words(&self) -> [u32; 8] {
        [
            self.first_work,
            self.splits,
            self.q_len,
            self.q_tok0,
            self.head,
            self.row0,
            0,
            0,
        ]
    }
}

/// The cut of one batch.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub work: Vec<WorkItem>,
    pub merge: Vec<MergeItem>,
    /// Block tables of all sequences, concatenated.
    pub tables: Vec<u32>,
    /// Keys per split.
    pub split: u32,
}

/// Rows per tile for a batch whose largest (sequence, head) has `rows`
/// query rows, capped at `max_rows` (a power of two).
pub(crate) fn tile_rows(rows: u32, max_rows: u32) -> u32 {
    rows.next_power_of_two().clamp(1, max_rows)
}

/// Cuts `seqs` (already validated, pages of `block_tokens`, attention
/// `window` if any) for `kv_heads` heads of GQA ratio `gqa` into tiles of
/// `tile` rows, splitting contexts so that about `target` workgroups run.
pub(crate) fn plan(
    seqs: &[SeqAttention<'_>],
    window: Option<u32>,
    block_tokens: u32,
    kv_heads: u32,
    gqa: u32,
    tile: u32,
    target: u32,
) -> Plan {
    let mut tiles = 0u64;
    let mut max_kv = 0u32;
    for s in seqs {
        tiles += u64::from(kv_heads) * u64::from((s.q_len as u32 * gqa).div_ceil(tile));
        let read = s.kv_len - s.keys_seen(0, window).start;
        max_kv = max_kv.max(read as u32);
    }
    let split = if tiles >= u64::from(target) || tiles == 0 {
        max_kv.max(1).next_multiple_of(KEY_TILE)
    } else {
        let per_tile = (u64::from(target)).div_ceil(tiles) as u32;
        max_kv
            .div_ceil(per_tile)
            .next_multiple_of(KEY_TILE)
            .max(KEY_TILE)
    };

    let mut p = Plan {
        split,
        ..Plan::default()
    };
    let mut q_tok0 = 0u32;
    for s in seqs {
        let (kv_len, q_len) = (s.kv_len as u32, s.q_len as u32);
        let table_off = p.tables.len() as u32;
        // Validation guarantees the table covers the context; pages past it
        // are never read, so they are not sent.
        let blocks = kv_len.div_ceil(block_tokens) as usize;
        p.tables
            .extend(s.block_table[..blocks].iter().map(|id| id.0));
        let rows = q_len * gqa;
        for head in 0..kv_heads {
            for row0 in (0..rows).step_by(tile as usize) {
                let last_tok = ((row0 + tile).min(rows) - 1) / gqa;
                // Keys the tile's rows may see: from the first row's window
                // start to the last row's causal limit.
                let from = s.keys_seen((row0 / gqa) as usize, window).start as u32;
                let horizon = s.keys_seen(last_tok as usize, window).end as u32;
                let first_work = p.work.len() as u32;
                for k0 in (from..horizon).step_by(split as usize) {
                    p.work.push(WorkItem {
                        table_off,
                        kv_len,
                        q_len,
                        q_tok0,
                        head,
                        row0,
                        k0,
                        k1: (k0 + split).min(horizon),
                    });
                }
                p.merge.push(MergeItem {
                    first_work,
                    splits: p.work.len() as u32 - first_work,
                    q_len,
                    q_tok0,
                    head,
                    row0,
                });
            }
        }
        q_tok0 += q_len;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslice_core::PageId;

    fn seq(table: &[PageId], kv_len: usize, q_len: usize) -> SeqAttention<'_> {
        SeqAttention {
            block_table: table,
            kv_len,
            q_len,
        }
    }

    #[test]
    fn tiles_cover_every_row_once_and_splits_cover_each_horizon() {
        let table: Vec<PageId> = (0..40).map(PageId).collect();
        let seqs = [
            seq(&table, 300, 1),
            seq(&table, 130, 45),
            seq(&table, 64, 64),
        ];
        for (gqa, tile, target) in [(4, 4, 1), (4, 16, 64), (1, 8, 10_000), (3, 16, 500)] {
            let p = plan(&seqs, None, 16, 2, gqa, tile, target);
            assert_eq!(p.split % KEY_TILE, 0);
            let mut rows_seen = std::collections::HashSet::new();
            for m in &p.merge {
                let works = &p.work[m.first_work as usize..(m.first_work + m.splits) as usize];
                // Splits are contiguous, start at key 0, and end at the
                // horizon of the tile's last row.
                assert_eq!(works[0].k0, 0);
                for w in works.windows(2) {
                    assert_eq!(w[0].k1, w[1].k0);
                }
                let rows = m.q_len * gqa;
                let last_row = (m.row0 + tile).min(rows) - 1;
                let horizon = works[0].kv_len - m.q_len + last_row / gqa + 1;
                assert_eq!(works.last().unwrap().k1, horizon);
                for w in works {
                    assert!(w.k1 - w.k0 <= p.split && w.k1 > w.k0);
                    assert_eq!((w.head, w.row0, w.q_tok0), (m.head, m.row0, m.q_tok0));
                }
                for r in m.row0..=last_row {
                    assert!(rows_seen.insert((m.q_tok0, m.head, r)), "row twice");
                }
            }
            let want: u32 = seqs.iter().map(|s| 2 * s.q_len as u32 * gqa).sum();
            assert_eq!(rows_seen.len() as u32, want);
        }
    }

    #[test]
    fn few_tiles_are_split_to_reach_the_target() {
        let table: Vec<PageId> = (0..2048).map(PageId).collect();
        let seqs = [seq(&table, 32 * 1024, 1)];
        let p = plan(&seqs, None, 16, 8, 4, 4, 1024);
        // 8 tiles, 128 splits each of 256 keys.
        assert_eq!((p.merge.len(), p.split, p.work.len()), (8, 256, 1024));
        // Plenty of tiles: no split at all.
        let p = plan(&seqs, None, 16, 8, 4, 4, 8);
        assert_eq!(p.work.len(), 8);
        assert_eq!(tile_rows(4, 16), 4);
        assert_eq!(tile_rows(5 * 4, 16), 16);
        assert_eq!(tile_rows(3, 16), 4);
    }

    #[test]
    fn windowed_splits_start_at_the_first_rows_window() {
        let table: Vec<PageId> = (0..2048).map(PageId).collect();
        let seqs = [seq(&table, 32 * 1024, 1), seq(&table, 300, 40)];
        let p = plan(&seqs, Some(4096), 16, 8, 4, 4, 1024);
        // Decode reads the last 4096 keys only.
        for m in p.merge.iter().filter(|m| m.q_len == 1) {
            let works = &p.work[m.first_work as usize..(m.first_work + m.splits) as usize];
            assert_eq!(works[0].k0, 32 * 1024 - 4096);
            assert_eq!(works.last().unwrap().k1, 32 * 1024);
        }
        // A prefill tile of rows 0..4 (one token each, gqa 4) sees keys
        // from 260 - 4096 (clamped to 0) on: a window longer than the
        // context is no window.
        let first = p.merge.iter().find(|m| m.q_len == 40).unwrap();
        assert_eq!(p.work[first.first_work as usize].k0, 0);
        let p = plan(&seqs[1..], Some(8), 16, 8, 4, 4, 8);
        let m = &p.merge[1];
        // Tile of token 1 (rows 4..8): position 261, window 254..=261.
        assert_eq!(p.work[m.first_work as usize].k0, 254);
        assert_eq!(p.work[(m.first_work + m.splits - 1) as usize].k1, 262);
    }
}
