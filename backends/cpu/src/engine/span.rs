//! One span of a head's keys: its scores and softmax, its weighted sum,
//! and the stored regions the kernels read.

use kvslice_core::SeqAttention;

use crate::kernels::{Int8Queries, Kernels, SoftmaxState, StoredKernels};

use super::task::{Partials, Scratch};
use super::{CpuEngine, SPAN_BLOCKS};

impl CpuEngine {
    /// Scores one span of a head's keys (one block, or several for four
    /// rows that see them all) against its query rows from `keys.first`
    /// on (those that see any of it), folds them into the rows' softmax
    /// state (rescaling their accumulators) and leaves the weights in the
    /// head's slot of [`Scratch::weights`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn score_block(
        &self,
        layout: &kvslice_core::KvLayout,
        seq: &SeqAttention<'_>,
        window: Option<u32>,
        q: &[f32],
        part: &mut Partials,
        keys: &Block<'_>,
        int8: Option<&Int8Queries>,
        scratch: &mut Scratch,
    ) {
        let hd = layout.head_dim() as usize;
        let dtype = layout.dtype();
        let ratio = layout.gqa_ratio() as usize;
        let (rows, n, pos, first) = (part.max.len(), keys.n, keys.pos, keys.first);
        let live = rows - first;
        let Scratch {
            weights,
            widened,
            block,
            key_major,
            rescale,
            slot_len,
            ..
        } = scratch;
        let scores = &mut weights[keys.weights(rows, *slot_len)];
        let q = &q[first * hd..];
        // Row `r` sees a range of the span: a prefix under the causal
        // mask, a suffix under a window. Rows are token-major, so those
        // that see all of it are consecutive (every row in decode).
        let rescale = &mut rescale[..live];
        let visible = |r: usize| {
            let seen = seq.keys_seen(keys.kv_row(r) / ratio, window);
            seen.start.clamp(pos, pos + n) - pos..seen.end.clamp(pos, pos + n) - pos
        };
        let whole = |r: usize| visible(r) == (0..n);
        let full_from = (first..rows).find(|&r| whole(r)).unwrap_or(rows);
        let full = full_from..(full_from..rows).find(|&r| !whole(r)).unwrap_or(rows);
        // Four rows that all see the whole block (GQA decode with four
        // query heads per kv head, or four token-major rows off the causal
        // diagonal): scores and softmax in one call. Dim-major keys go
        // there in whole blocks of a multiple of 16 keys.
        let four = self
            .four_row_kernels(hd)
            .filter(|_| live == 4 && full == (first..rows));
        let four = match keys.dim_major {
            None => four.map(|fk| fk.scores_softmax),
            Some(bt) => four
                .filter(|_| bt % 16 == 0 && pos % bt == 0 && n == keys.segs.len() * bt)
                .map(|fk| fk.scores_softmax_dim_major),
        };
        let bytes = four.and(int8).and_then(|q| {
            let iq = self.four_row_kernels(hd)?.int8_queries?;
            Some((iq.scores_softmax_dim_major, q))
        });
        key_major[keys.slot] = four.is_some();
        if let Some((scores_softmax, q)) = bytes {
            let state = SoftmaxState {
                max: &mut part.max[first..],
                sum: &mut part.sum[first..],
                rescale,
            };
            scores_softmax(q, keys.segs, keys.scales, scores, state, keys.ahead);
        } else if let Some(scores_softmax) = four {
            let state = SoftmaxState {
                max: &mut part.max[first..],
                sum: &mut part.sum[first..],
                rescale,
            };
            scores_softmax(dtype, q, keys.segs, keys.scales, scores, state, keys.ahead);
        } else {
            let widened = &mut widened[..n * hd];
            self.scores_then_softmax(
                dtype, keys, q, scores, widened, block, part, rescale, &visible, full,
            );
        }
        for (r, &c) in (first..rows).zip(rescale.iter()) {
            if c != 1.0 {
                part.acc[r * hd..(r + 1) * hd]
                    .iter_mut()
                    .for_each(|x| *x *= c);
            }
        }
    }

    /// [`Self::score_block`]'s general case: the scores of rows
    /// `keys.first..` into `scores`, then their softmax, one call for the
    /// rows in `full` (which see every key), one per other row (row `r`
    /// sees keys `visible(r)` of the span).
    #[allow(clippy::too_many_arguments)]
    fn scores_then_softmax(
        &self,
        dtype: kvslice_core::KvDtype,
        keys: &Block<'_>,
        q: &[f32],
        scores: &mut [f32],
        widened: &mut [f32],
        block: &mut [f32],
        part: &mut Partials,
        rescale: &mut [f32],
        visible: &dyn Fn(usize) -> std::ops::Range<usize>,
        full: std::ops::Range<usize>,
    ) {
        let k = &self.kernels;
        let (rows, n, first) = (part.max.len(), keys.n, keys.first);
        let live = rows - first;
        // Up to one register group of rows (GQA decode) reads token-major
        // K as stored; more rows, and dim-major K, widen it once for all
        // row groups.
        let stored = k
            .stored
            .filter(|_| live <= StoredKernels::MAX_ROWS && keys.dim_major.is_none());
        if let Some(sk) = stored {
            let (bytes, ahead) = keys.single();
            (sk.scores)(dtype, q, live, bytes, n, scores, ahead);
        } else {
            let ahead = keys.widen(k, dtype, widened, block);
            (k.scores)(q, live, widened, n, scores, ahead);
        }
        // A scaled dtype's keys were read raw: each key's scores times its
        // scale.
        if !keys.scales.is_empty() {
            for row in scores[..live * n].chunks_exact_mut(n) {
                row.iter_mut().zip(keys.scales).for_each(|(x, s)| *x *= s);
            }
        }
        // One softmax call for the rows that see the whole block, one per
        // row on the causal diagonal or a window's edge, where the hidden
        // scores get weight 0.
        for r in (first..rows).filter(|r| !full.contains(r)) {
            let (i, seen) = (r - first, visible(r));
            let s = &mut scores[i * n..(i + 1) * n];
            rescale[i] = 1.0;
            if !seen.is_empty() {
                (k.softmax_rows)(
                    &mut s[seen.clone()],
                    seen.len(),
                    &mut part.max[r..=r],
                    &mut part.sum[r..=r],
                    &mut rescale[i..=i],
                );
            }
            s[..seen.start].fill(0.0);
            s[seen.end..].fill(0.0);
        }
        if !full.is_empty() {
            (k.softmax_rows)(
                &mut scores[(full.start - first) * n..(full.end - first) * n],
                n,
                &mut part.max[full.clone()],
                &mut part.sum[full.clone()],
                &mut rescale[full.start - first..full.end - first],
            );
        }
    }

    /// Adds one span of a head's values, weighted by what
    /// [`Self::score_block`] left in its slot, to the accumulators of rows
    /// `values.first..`.
    pub(super) fn value_block(
        &self,
        layout: &kvslice_core::KvLayout,
        part: &mut Partials,
        values: &Block<'_>,
        scratch: &mut Scratch,
    ) {
        let k = &self.kernels;
        let hd = layout.head_dim() as usize;
        let dtype = layout.dtype();
        let (rows, n, first) = (part.max.len(), values.n, values.first);
        let live = rows - first;
        let weights = &mut scratch.weights[values.weights(rows, scratch.slot_len)];
        let acc = &mut part.acc[first * hd..];
        let four = self.four_row_kernels(hd);
        let key_major = scratch.key_major[values.slot];
        // A scaled dtype's values are read raw: each value's scale goes
        // into its weights, which nothing reads after this.
        if !values.scales.is_empty() {
            if key_major {
                k.scale_key_major(weights, values.scales);
            } else {
                for row in weights.chunks_exact_mut(n) {
                    row.iter_mut().zip(values.scales).for_each(|(x, s)| *x *= s);
                }
            }
        }
        let weights = &*weights;
        if let Some(fk) = four.filter(|_| key_major) {
            debug_assert_eq!(live, 4, "key-major weights hold four rows");
            (fk.weighted_sum)(dtype, weights, values.segs, acc, values.ahead);
            return;
        }
        // Spans of several blocks reach here only for dim-major keys the
        // four-row kernels did not take (a partial block): their values
        // widen too.
        let stored = k
            .stored
            .filter(|_| live <= StoredKernels::MAX_ROWS && values.segs.len() == 1);
        if let Some(sk) = stored {
            let (bytes, ahead) = values.single();
            (sk.weighted_sum)(dtype, weights, live, bytes, n, acc, ahead);
        } else {
            let widened = &mut scratch.widened[..n * hd];
            let ahead = values.widen(k, dtype, widened, &mut scratch.block);
            (k.weighted_sum)(weights, live, widened, n, acc, ahead);
        }
    }
}

/// Byte regions, one per block of a span, in order: the span's pages, or
/// one head's rows in each (no allocation per span).
#[derive(Default)]
pub(super) struct Regions<'a> {
    regions: [&'a [u8]; SPAN_BLOCKS],
    len: usize,
}

impl<'a> Regions<'a> {
    pub(super) fn push(&mut self, region: &'a [u8]) {
        self.regions[self.len] = region;
        self.len += 1;
    }

    pub(super) fn as_slice(&self) -> &[&'a [u8]] {
        &self.regions[..self.len]
    }
}

/// One span of K or V rows of one of a task's kv heads, as stored, one
/// segment per block, with what to prefetch while they are computed.
pub(super) struct Block<'a> {
    pub(super) segs: &'a [&'a [u8]],
    pub(super) ahead: &'a [&'a [u8]],
    /// A scaled dtype's `n` row scales times [`raw_scale`](crate::kernels::raw_scale) (else empty):
    /// the kernels read its codes raw.
    pub(super) scales: &'a [f32],
    /// The head's index in the task (its slot of [`Scratch::weights`]).
    pub(super) slot: usize,
    /// Position of the first key.
    pub(super) pos: usize,
    /// Keys in the span.
    pub(super) n: usize,
    /// The first of the head's rows (token-major) at or after the causal
    /// diagonal: rows before it see none of the span (a window may still
    /// hide it from later ones).
    pub(super) first: usize,
    /// Where the head's rows start among its kv head's rows.
    pub(super) row0: usize,
    /// The kv head's rows (query tokens × query heads per kv head).
    pub(super) kv_rows: usize,
    /// For dim-major keys, the block length: each segment is then a whole
    /// block, of which the span takes keys `pos..pos + n`.
    pub(super) dim_major: Option<usize>,
}

impl Block<'_> {
    /// Row `r` of the head as a row of its kv head (a padding row repeats
    /// the last one).
    fn kv_row(&self, r: usize) -> usize {
        (self.row0 + r).min(self.kv_rows - 1)
    }

    /// This head's weights in [`Scratch::weights`] (of `rows` rows, slots
    /// of `slot_len`): the visible rows × the span's keys, at the start of
    /// the head's slot. The score and value phases both index through it,
    /// so they agree on the slots.
    pub(super) fn weights(&self, rows: usize, slot_len: usize) -> std::ops::Range<usize> {
        let start = self.slot * slot_len;
        start..start + (rows - self.first) * self.n
    }

    /// The span's only block (the general kernels read stored rows one
    /// block at a time), and its prefetch target.
    fn single(&self) -> (&[u8], &[u8]) {
        // Spans of several blocks go to the four-row kernels or, for more
        // than four rows, through `widen`.
        assert_eq!(self.segs.len(), 1, "stored-row kernels take one block");
        (self.segs[0], self.ahead.first().copied().unwrap_or(&[]))
    }

    /// The span's rows widened to f32 into `out` (`n·d`, token-major,
    /// block after block; dim-major blocks through `block`, one block's
    /// elements), and the prefetch target of the kernel that reads them:
    /// the first region ahead (the general kernels walk one).
    pub(super) fn widen(
        &self,
        k: &Kernels,
        dtype: kvslice_core::KvDtype,
        out: &mut [f32],
        block: &mut [f32],
    ) -> &[u8] {
        let ahead = self.ahead.first().copied().unwrap_or(&[]);
        let Some(bt) = self.dim_major else {
            let mut at = 0;
            for seg in self.segs {
                let len = seg.len() / dtype.size_bytes();
                k.widen(dtype, seg, &mut out[at..at + len]);
                at += len;
            }
            return ahead;
        };
        let d = out.len() / self.n;
        let (mut done, mut from) = (0, self.pos % bt);
        for seg in self.segs {
            let block = &mut block[..bt * d];
            k.widen(dtype, seg, block);
            let take = (bt - from).min(self.n - done);
            for (t, row) in out[done * d..(done + take) * d]
                .chunks_exact_mut(d)
                .enumerate()
            {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = block[c * bt + from + t];
                }
            }
            (done, from) = (done + take, 0);
        }
        ahead
    }
}
