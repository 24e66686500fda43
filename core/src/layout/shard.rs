//! Head shards: how kv heads, with their query heads, split across
//! tensor-parallel workers.

use core::ops::Range;

use super::KvLayout;
use crate::error::{Result, check_index};

/// The heads one tensor-parallel worker owns.
///
/// kv heads are split into contiguous, near-equal runs (the first
/// `num_kv_heads % shards` shards get one more); each kv head brings its
/// `gqa_ratio` query heads. Together the shards cover every head once.
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayoutSpec};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 16, 8, 64, 16, KvDtype::F16).with_head_shards(3))?;
/// let shard = layout.head_shard(2)?;
/// assert_eq!(shard.kv_heads(), 6..8);
/// assert_eq!(shard.q_heads(), 12..16);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HeadShard {
    index: u32,
    kv: Range<u32>,
    gqa_ratio: u32,
}

impl HeadShard {
    pub(super) fn new(layout: &KvLayout, index: u32) -> Result<Self> {
        let shards = layout.num_head_shards();
        check_index("head shard", index as usize, shards as usize)?;
        let kv_heads = layout.num_kv_heads();
        let (base, extra) = (kv_heads / shards, kv_heads % shards);
        let start = index * base + index.min(extra);
        let len = base + u32::from(index < extra);
        Ok(Self {
            index,
            kv: start..start + len,
            gqa_ratio: layout.gqa_ratio(),
        })
    }

    /// This shard's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Global kv head indices owned by this shard.
    pub fn kv_heads(&self) -> Range<u32> {
        self.kv.clone()
    }

    /// Global query head indices owned by this shard.
    pub fn q_heads(&self) -> Range<u32> {
        self.kv.start * self.gqa_ratio..self.kv.end * self.gqa_ratio
    }

    /// Number of kv heads in this shard.
    pub fn num_kv_heads(&self) -> u32 {
        self.kv.end - self.kv.start
    }

    /// Number of query heads in this shard.
    pub fn num_q_heads(&self) -> u32 {
        self.num_kv_heads() * self.gqa_ratio
    }

    /// The shard-local kv head serving shard-local query head `q_in_shard`.
    pub fn kv_head_for_q(&self, q_in_shard: u32) -> u32 {
        q_in_shard / self.gqa_ratio
    }
}

#[cfg(test)]
mod tests {
    use crate::{KvDtype, KvLayout, LayoutSpec};

    #[test]
    fn shards_are_disjoint_and_complete() {
        for kv in 1..=9u32 {
            for ratio in [1u32, 2, 4] {
                for shards in 1..=kv {
                    let layout = KvLayout::new(
                        LayoutSpec::new(1, kv * ratio, kv, 8, 4, KvDtype::F32)
                            .with_head_shards(shards),
                    )
                    .unwrap();
                    let mut kv_seen = alloc::vec![0u32; kv as usize];
                    let mut q_seen = alloc::vec![0u32; (kv * ratio) as usize];
                    for s in 0..shards {
                        let sh = layout.head_shard(s).unwrap();
                        assert!(sh.num_kv_heads() >= 1);
                        assert!(sh.num_kv_heads() <= kv.div_ceil(shards));
                        sh.kv_heads().for_each(|h| kv_seen[h as usize] += 1);
                        sh.q_heads().for_each(|h| q_seen[h as usize] += 1);
                        for q in 0..sh.num_q_heads() {
                            let global_q = sh.q_heads().start + q;
                            let global_kv = sh.kv_heads().start + sh.kv_head_for_q(q);
                            assert_eq!(global_q / ratio, global_kv);
                        }
                    }
                    assert!(kv_seen.iter().all(|&c| c == 1));
                    assert!(q_seen.iter().all(|&c| c == 1));
                    assert!(layout.head_shard(shards).is_err());
                }
            }
        }
    }
}
