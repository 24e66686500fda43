//! The scalar reference engine: the oracle every backend is tested against.

use alloc::vec;
use alloc::vec::Vec;

use super::{AttentionBatch, AttentionEngine};
use crate::error::Result;
use crate::layout::KvPart;
use crate::page::{KvWrite, PageMemoryMut, read_head_rows, write_kv};

/// Plain, obviously-correct paged attention in f32.
///
/// Per sequence and kv head it decodes the context's K and V once (from the
/// first block a window reads), then for each query head of the group and
/// each query token computes scores over the keys it sees, a
/// max-subtracted softmax, and the weighted sum of values. See
/// [`AttentionEngine`] for an example.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceEngine;

impl<P: PageMemoryMut + ?Sized> AttentionEngine<P> for ReferenceEngine {
    fn attend(&self, pages: &P, batch: &AttentionBatch<'_>, out: &mut [f32]) -> Result<()> {
        let shape = batch.validate(pages, out.len())?;
        let hd = shape.layout.head_dim() as usize;
        let bt = shape.layout.block_tokens() as usize;
        let q_heads = shape.shard.num_q_heads() as usize;
        let ratio = shape.layout.gqa_ratio() as usize;
        let row = q_heads * hd;

        let mut k = Vec::new();
        let mut v = Vec::new();
        let mut scores = Vec::new();
        let mut acc = vec![0f32; hd];
        let mut q_base = 0usize;
        for seq in batch.seqs {
            // Keys from the first block a window reads; `k` and `v` hold
            // them from position `base` on.
            let first_block = seq.first_block(batch.window, bt as u32);
            let base = first_block * bt;
            k.resize((seq.kv_len - base) * hd, 0.0);
            v.resize((seq.kv_len - base) * hd, 0.0);
            for kv_head in 0..shape.shard.num_kv_heads() {
                for b in first_block..seq.kv_len.div_ceil(bt) {
                    let rows = (seq.kv_len - b * bt).min(bt) * hd;
                    let at = (b * bt - base) * hd;
                    for (part, dst) in [(KvPart::K, &mut k), (KvPart::V, &mut v)] {
                        read_head_rows(
                            pages,
                            seq.block_table[b],
                            part,
                            shape.layer_in_group,
                            kv_head,
                            &mut dst[at..at + rows],
                        )?;
                    }
                }
                let first_q = kv_head as usize * ratio;
                for qh in first_q..first_q + ratio {
                    for t in 0..seq.q_len {
                        let at = (q_base + t) * row + qh * hd;
                        let q = &batch.queries[at..at + hd];
                        let seen = seq.keys_seen(t, batch.window);
                        let seen = seen.start - base..seen.end - base;
                        let (keys, values) = (
                            &k[seen.start * hd..seen.end * hd],
                            &v[seen.start * hd..seen.end * hd],
                        );
                        scores.clear();
                        scores.extend(keys.chunks_exact(hd).map(|key| {
                            batch.scale * q.iter().zip(key).map(|(a, b)| a * b).sum::<f32>()
                        }));
                        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let mut denom = 0f32;
                        acc.fill(0.0);
                        for (s, value) in scores.iter().zip(values.chunks_exact(hd)) {
                            let p = libm::expf(s - max);
                            denom += p;
                            acc.iter_mut().zip(value).for_each(|(a, x)| *a += p * x);
                        }
                        out[at..at + hd]
                            .iter_mut()
                            .zip(&acc)
                            .for_each(|(o, a)| *o = a / denom);
                    }
                }
            }
            q_base += seq.q_len;
        }
        Ok(())
    }

    fn write_kv(&self, pages: &mut P, write: &KvWrite<'_>) -> Result<()> {
        write_kv(pages, write)
    }
}
