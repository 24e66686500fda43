//! A task's work: its heads' query rows, softmax state and byte ranges,
//! the per-thread scratch, and the loop over a chunk's spans.

use kvslice_core::{
    AttentionBatch, BatchShape, KeyOrder, KvPart, PageMemory, Result, SeqAttention,
};

use crate::kernels::{FourRowKernels, Int8Queries, Kernels, StoredKernels, raw_scale};

use super::span::{Block, Regions};
use super::{CHUNKS_PER_THREAD, CpuEngine, MAX_GROUPED_ROWS, SPAN_BLOCKS};

/// One unit of work: a chunk of one query tile's pages for kv heads
/// `kv_head..kv_head + heads`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Task<'a> {
    /// The sequence (its index in the batch) and the tile's first query
    /// token in it, which together name the partials to merge.
    pub(super) seq: usize,
    pub(super) tile: usize,
    /// The tile as a sequence of its own: its query tokens, and the keys
    /// the last of them sees (causal, bottom-right aligned, so every
    /// token keeps its position).
    pub(super) view: SeqAttention<'a>,
    pub(super) kv_head: u32,
    /// One head, or (decode) every kv head, so that a page is read as one
    /// rising stream.
    pub(super) heads: u32,
    /// Token positions of the chunk.
    pub(super) start: usize,
    pub(super) end: usize,
    /// The tile's first query token in the batch.
    pub(super) q_base: usize,
}

/// Streaming-softmax state of a task's query rows over some keys.
#[derive(Debug, Clone)]
pub(super) struct Partials {
    pub(super) max: Vec<f32>,
    pub(super) sum: Vec<f32>,
    /// `rows × head_dim`.
    pub(super) acc: Vec<f32>,
}

impl Partials {
    pub(super) fn new(rows: usize, hd: usize) -> Self {
        Self {
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0.0; rows],
            acc: vec![0.0; rows * hd],
        }
    }

    /// A kv head's `rows` rows from its groups of four (see
    /// `CpuEngine::row_groups()`), the padding dropped.
    fn from_groups(groups: impl Iterator<Item = Partials>, rows: usize, hd: usize) -> Self {
        let mut whole = Partials::new(rows, hd);
        for (g, part) in groups.enumerate() {
            let (from, to) = (4 * g, (4 * g + 4).min(rows));
            whole.max[from..to].copy_from_slice(&part.max[..to - from]);
            whole.sum[from..to].copy_from_slice(&part.sum[..to - from]);
            whole.acc[from * hd..to * hd].copy_from_slice(&part.acc[..(to - from) * hd]);
        }
        whole
    }

    /// Folds `other` in, row by row (log-sum-exp merge).
    pub(super) fn merge(&mut self, other: &Partials, hd: usize, k: &Kernels) {
        for r in 0..self.max.len() {
            if other.sum[r] == 0.0 {
                continue;
            }
            let max = self.max[r].max(other.max[r]);
            let (a, b) = ((self.max[r] - max).exp(), (other.max[r] - max).exp());
            let acc = &mut self.acc[r * hd..(r + 1) * hd];
            acc.iter_mut().for_each(|x| *x *= a);
            (k.axpy)(acc, b, &other.acc[r * hd..(r + 1) * hd]);
            self.sum[r] = self.sum[r] * a + other.sum[r] * b;
            self.max[r] = max;
        }
    }
}

/// Per-thread buffers, reused across tasks.
#[derive(Default)]
pub(super) struct Scratch {
    /// Every head's query rows of a task, one after another.
    pub(super) q: Vec<f32>,
    /// One span of K or V widened to f32 (rows beyond one register
    /// group): the scores are done with K before the values widen V.
    pub(super) widened: Vec<f32>,
    /// Each head's softmax weights of the current span, between its
    /// scores and its values: one slot of `slot_len` per head, of which
    /// the visible rows × the span's keys are used.
    pub(super) weights: Vec<f32>,
    /// Per slot of `weights`: whether the four-row kernels left it
    /// key-major ([`crate::FourRowKernels`]) rather than row-major.
    pub(super) key_major: Vec<bool>,
    pub(super) rescale: Vec<f32>,
    /// Length of a head's slot of `weights`: rows × the keys of the
    /// longest span.
    pub(super) slot_len: usize,
    /// One block of dim-major keys widened as stored, to be transposed
    /// into `widened`.
    pub(super) block: Vec<f32>,
    /// A scaled dtype's scales of one head's K or V rows of the current
    /// span, times [`raw_scale`].
    pub(super) scales: Vec<f32>,
}

/// One kv head's part of a task (or one group of four of its rows, see
/// `CpuEngine::row_groups()`): where its query rows (token-major, then head
/// in group, pre-scaled) sit in [`Scratch::q`], its softmax state, and
/// where its K and V sit in a page (bytes).
struct HeadWork {
    /// Where its rows start among its kv head's rows (a row group's).
    row0: usize,
    q: std::ops::Range<usize>,
    part: Partials,
    k: std::ops::Range<usize>,
    v: std::ops::Range<usize>,
    /// Where the scales of its K and V rows sit (scaled dtypes).
    k_scales: Option<std::ops::Range<usize>>,
    v_scales: Option<std::ops::Range<usize>>,
    /// Its query rows rounded to int8, once for every span, where the
    /// engine scores int8 keys against them (boxed: 2 KiB that every
    /// other task would carry empty).
    int8: Option<Box<Int8Queries>>,
}

impl CpuEngine {
    /// Tokens per split-K chunk of a task over `heads` kv heads, where
    /// the call's sequences hold `total_tokens` tokens × kv heads in
    /// pages of `bt` tokens: [`Self::with_chunk_pages`]' pages where set,
    /// else [`CHUNKS_PER_THREAD`] chunks per thread (one in all on one
    /// thread), but whole pages, at least 256 tokens × heads per task, so
    /// per-chunk overhead stays small, and at least one span of keys, so
    /// that the kernels see whole spans. One sequence's 256 tokens as
    /// eight two-page chunks (all kv heads each) made two threads no
    /// faster than one (86–102 µs against 87–103 on a Zen 4 VM); as four
    /// whole-span chunks they took 53–69 µs.
    pub(super) fn chunk_tokens(&self, total_tokens: usize, heads: u32, bt: usize) -> usize {
        if self.chunk_pages > 0 {
            return self.chunk_pages.saturating_mul(bt);
        }
        // One thread needs no split: each chunk costs a merge, and the
        // first head's keys of its first span go unprefetched (nothing
        // before them pairs with them).
        let chunks = if self.threads == 1 {
            1
        } else {
            self.threads * CHUNKS_PER_THREAD
        };
        let per_chunk = total_tokens.div_ceil(chunks).max(256);
        (per_chunk / heads as usize)
            .max(self.span_keys)
            .max(1)
            .div_ceil(bt)
            .saturating_mul(bt)
    }

    /// Computes one chunk: for every query head of each of the task's kv
    /// heads' groups and every query token, the partial softmax state over
    /// the chunk's keys (one [`Partials`] per kv head).
    pub(super) fn run_task<'a, P: PageMemory + ?Sized>(
        &self,
        pages: &'a P,
        batch: &AttentionBatch<'_>,
        shape: &BatchShape,
        t: &Task<'_>,
        scratch: &mut Scratch,
    ) -> Result<Vec<Partials>> {
        let k = &self.kernels;
        let layout = &shape.layout;
        let (hd, bt) = (layout.head_dim() as usize, layout.block_tokens() as usize);
        let es = layout.dtype().size_bytes();
        let ratio = layout.gqa_ratio() as usize;
        let row = shape.shard.num_q_heads() as usize * hd;
        let seq = &t.view;
        // A kv head's rows (token-major), and how many a HeadWork holds.
        let kv_rows = ratio * seq.q_len;
        let groups = self.row_groups(hd, kv_rows);
        let rows = if groups.is_some() { 4 } else { kv_rows };
        let mut heads = Vec::with_capacity(t.heads as usize);
        // Taken out of the scratch so that the blocks can borrow both.
        let mut q = std::mem::take(&mut scratch.q);
        let mut scales = std::mem::take(&mut scratch.scales);
        q.clear();
        // Four rows (GQA decode) of int8 keys in dim-major blocks are what
        // the int8-query kernels take.
        let int8_queries = self
            .four_row_kernels(hd)
            .and_then(|fk| fk.int8_queries)
            .filter(|_| {
                self.int8_queries
                    && rows == 4
                    && layout.dtype() == kvslice_core::KvDtype::I8
                    && layout.key_order() == KeyOrder::DimMajor
            });
        for kv_head in t.kv_head..t.kv_head + t.heads {
            for group in 0..groups.unwrap_or(1) {
                // Token-major puts the rows a causal block can see in one
                // suffix. A group holds the kv head's rows `4·group..`,
                // its last row repeated past the end.
                let first_row = q.len();
                for r in 0..rows {
                    let k = (4 * group + r).min(kv_rows - 1);
                    let (tok, g) = (k / ratio, k % ratio);
                    let at = (t.q_base + tok) * row + (kv_head as usize * ratio + g) * hd;
                    q.extend(batch.queries[at..at + hd].iter().map(|x| x * batch.scale));
                }
                let bytes = |r: std::ops::Range<usize>| r.start * es..r.end * es;
                heads.push(HeadWork {
                    row0: 4 * group,
                    q: first_row..q.len(),
                    part: Partials::new(rows, hd),
                    k: bytes(layout.head_region(KvPart::K, shape.layer_in_group, kv_head)?),
                    v: bytes(layout.head_region(KvPart::V, shape.layer_in_group, kv_head)?),
                    k_scales: layout.scale_region(KvPart::K, shape.layer_in_group, kv_head)?,
                    v_scales: layout.scale_region(KvPart::V, shape.layer_in_group, kv_head)?,
                    int8: int8_queries.and_then(|iq| (iq.round)(&q[first_row..]).map(Box::new)),
                });
            }
        }
        // Rows that see every key of several small blocks take them as one
        // span of up to `span_keys` keys (one kernel call per head for the
        // span's scores and one for its values): four rows through the
        // four-row kernels, more through one widening of the span. Up to
        // four rows otherwise read stored rows a block at a time.
        let spans =
            (rows == 4 && self.four_row_kernels(hd).is_some()) || rows > StoredKernels::MAX_ROWS;
        let max_blocks = if spans {
            (self.span_keys / bt).clamp(1, SPAN_BLOCKS)
        } else {
            1
        };
        // Keys in `from_all..seen_by_all` are seen by every row: after the
        // last query token's window start, before the first one's causal
        // limit.
        let seen_by_all = (seq.kv_len + 1).saturating_sub(seq.q_len);
        let from_all = seq.keys_seen(seq.q_len - 1, batch.window).start;
        // Dim-major keys reach the four-row kernels in whole blocks only,
        // so a partial last block (most decode steps have one) is a span
        // of its own rather than sending the whole span the slow way.
        let dim_major = layout.key_order() == KeyOrder::DimMajor;
        // Where the span that starts at `pos` ends: whole blocks while
        // every row sees them, at least one block.
        let span_end = |pos: usize| {
            let mut end = ((pos / bt + 1) * bt).min(t.end);
            let extend = if pos < from_all { 1 } else { max_blocks };
            for _ in 1..extend {
                let more = (end + bt).min(t.end);
                if end == t.end || more > seen_by_all || (dim_major && more - end < bt) {
                    break;
                }
                end = more;
            }
            end
        };
        // The pages of the span `pos..end`, each looked up once: as a
        // prefetch target, then used.
        let span_pages = |pos: usize, end: usize| -> Result<Regions<'a>> {
            let mut span = Regions::default();
            for block in pos / bt..end.div_ceil(bt) {
                span.push(pages.page(seq.block_table[block])?);
            }
            Ok(span)
        };
        scratch.widened.resize(bt * hd * max_blocks, 0.0);
        // Dim-major keys are read as whole blocks (the kernels index their
        // columns), and widened through one block's transpose where the
        // four-row kernels do not take them.
        if dim_major {
            scratch.block.resize(bt * hd, 0.0);
        }
        scratch.slot_len = rows * bt * max_blocks;
        scratch.weights.resize(heads.len() * scratch.slot_len, 0.0);
        scratch.key_major.resize(heads.len(), false);
        scratch.rescale.resize(rows, 1.0);
        let (first_k, first_v) = (heads[0].k.clone(), heads[0].v.clone());
        // A scaled dtype's scales of every head of the task, K's and then
        // V's, one run of bytes per page (the kernels' prefetches cover
        // the codes only).
        let all_scales = match (&heads[0].k_scales, &heads[heads.len() - 1].v_scales) {
            (Some(first), Some(last)) => first.start.min(last.start)..first.end.max(last.end),
            _ => 0..0,
        };
        // Each head's next region of K and of V that differs from its own
        // (a kv head's row groups share theirs): what it prefetches.
        let next_region = |part: fn(&HeadWork) -> &std::ops::Range<usize>| {
            (0..heads.len())
                .map(|i| {
                    heads[i + 1..]
                        .iter()
                        .map(part)
                        .find(|r| *r != part(&heads[i]))
                        .cloned()
                })
                .collect::<Vec<_>>()
        };
        let (next_k, next_v) = (next_region(|h| &h.k), next_region(|h| &h.v));
        let mut pos = t.start;
        let mut end = span_end(pos);
        let mut span = span_pages(pos, end)?;
        while pos < t.end {
            let n = end - pos;
            let (next, next_end) = if end < t.end {
                let next_end = span_end(end);
                // And the first line of the block after the next span,
                // which starts the L2 streamer there early (a small gain
                // at 8k with one-head tasks, none measured with decode's
                // all-head tasks; docs/notes/cpu-decode.md).
                if next_end < t.end {
                    let far = pages.page(seq.block_table[next_end / bt])?;
                    (k.prefetch)(&far[first_k.start..(first_k.start + 64).min(first_k.end)]);
                    (k.prefetch)(&far[first_v.start..(first_v.start + 64).min(first_v.end)]);
                }
                let next = span_pages(end, next_end)?;
                if !all_scales.is_empty() {
                    for page in next.as_slice() {
                        (k.prefetch)(&page[all_scales.clone()]);
                    }
                }
                (Some(next), next_end)
            } else {
                (None, end)
            };
            // Causal, bottom-right aligned: token `tok` sees keys
            // 0..=kv_len - q_len + tok, so rows (token-major) before
            // `first` see nothing in this span, for every head alike (the
            // last token sees every key, so some row always sees it).
            let first_tok = (pos + seq.q_len).saturating_sub(seq.kv_len);
            debug_assert!(first_tok < seq.q_len, "a span no row sees");
            // The first of a kv head's rows that sees the span; a head
            // whose rows come before it all sits the span out.
            let first_row = first_tok * ratio;
            let first_of = |h: &HeadWork| first_row.saturating_sub(h.row0);
            // Each block's keys of the span, within a head's region `r`.
            let cut = |r: &std::ops::Range<usize>| {
                let mut segs = Regions::default();
                for (i, page) in span.as_slice().iter().enumerate() {
                    let block_start = (pos / bt + i) * bt;
                    let from = pos.max(block_start) - block_start;
                    let upto = end.min(block_start + bt) - block_start;
                    segs.push(&page[r.start + from * hd * es..r.start + upto * hd * es]);
                }
                segs
            };
            // The scales of the span's rows in each block's scale region
            // `r` (none for an unscaled dtype), times the raw factor, unless
            // `out` holds them already (`held`: a kv head's row groups
            // share their region).
            let raw = raw_scale(layout.dtype());
            let fill_scales =
                |r: &Option<std::ops::Range<usize>>,
                 out: &mut Vec<f32>,
                 held: &mut Option<Option<std::ops::Range<usize>>>| {
                    if held.as_ref() == Some(r) {
                        return;
                    }
                    *held = Some(r.clone());
                    out.clear();
                    let Some(r) = r else { return };
                    for (i, page) in span.as_slice().iter().enumerate() {
                        let block_start = (pos / bt + i) * bt;
                        let from = pos.max(block_start) - block_start;
                        let upto = end.min(block_start + bt) - block_start;
                        let bytes = &page[r.start + 4 * from..r.start + 4 * upto];
                        // Sized first, then filled: a loop the compiler
                        // vectorizes, where `extend` went a scale at a time.
                        let at = out.len();
                        out.resize(at + upto - from, 0.0);
                        for (o, b) in out[at..].iter_mut().zip(bytes.chunks_exact(4)) {
                            *o = raw * f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        }
                    }
                };
            // Region `r` of every page of `span` (whole, for prefetching).
            let whole = |span: &Regions<'a>, r: &std::ops::Range<usize>| {
                let mut regions = Regions::default();
                for page in span.as_slice() {
                    regions.push(&page[r.clone()]);
                }
                regions
            };
            // The span is read in address order within each page, every
            // head's K and then every head's V (docs/notes/cpu-decode.md); each
            // head's next regions in that order are prefetched while it
            // computes: the next head's K, the first head's V, the next
            // head's V, the next span's first K, one region per page, so
            // that the four-row kernels pair each with the segment they
            // compute in the same page.
            let mut held = None;
            for i in 0..heads.len() {
                let first = first_of(&heads[i]);
                if first >= rows {
                    continue;
                }
                let ahead = next_k[i].as_ref().unwrap_or(&first_v);
                let segs = if dim_major {
                    whole(&span, &heads[i].k)
                } else {
                    cut(&heads[i].k)
                };
                let ahead = whole(&span, ahead);
                fill_scales(&heads[i].k_scales, &mut scales, &mut held);
                let h = &mut heads[i];
                let keys = Block {
                    segs: segs.as_slice(),
                    ahead: ahead.as_slice(),
                    scales: &scales,
                    slot: i,
                    pos,
                    n,
                    first,
                    row0: h.row0,
                    kv_rows,
                    dim_major: dim_major.then_some(bt),
                };
                self.score_block(
                    layout,
                    seq,
                    batch.window,
                    &q[h.q.clone()],
                    &mut h.part,
                    &keys,
                    h.int8.as_deref(),
                    scratch,
                );
            }
            let mut held = None;
            for i in 0..heads.len() {
                let first = first_of(&heads[i]);
                if first >= rows {
                    continue;
                }
                let ahead = match (&next_v[i], &next) {
                    (Some(v), _) => whole(&span, v),
                    (None, Some(ns)) => whole(ns, &first_k),
                    (None, None) => Regions::default(),
                };
                let segs = cut(&heads[i].v);
                fill_scales(&heads[i].v_scales, &mut scales, &mut held);
                let h = &mut heads[i];
                let values = Block {
                    segs: segs.as_slice(),
                    ahead: ahead.as_slice(),
                    scales: &scales,
                    slot: i,
                    pos,
                    n,
                    first,
                    row0: h.row0,
                    kv_rows,
                    dim_major: None,
                };
                self.value_block(layout, &mut h.part, &values, scratch);
            }
            if let Some(ns) = next {
                span = ns;
            }
            pos = end;
            end = next_end;
        }
        scratch.q = q;
        scratch.scales = scales;
        let parts = heads.into_iter().map(|h| h.part);
        Ok(match groups {
            // One group of exactly four rows is the kv head's rows as they are.
            Some(g) if kv_rows != 4 => {
                let mut parts = parts.peekable();
                let mut whole = Vec::with_capacity(t.heads as usize);
                while parts.peek().is_some() {
                    whole.push(Partials::from_groups(parts.by_ref().take(g), kv_rows, hd));
                }
                whole
            }
            _ => parts.collect(),
        })
    }

    /// A kv head's `kv_rows` query rows (token-major) in groups of four,
    /// the last one padded with copies of its last row, where the four-row
    /// kernels take heads of `hd` elements and the rows are few (decode,
    /// and short runs of query tokens as speculative decoding verifies):
    /// how many groups, or `None` to keep the rows together. Below four
    /// rows the copies cost arithmetic that streaming hides; above, passes
    /// over keys the first pass left in cache beat widening them for all
    /// rows, up to [`MAX_GROUPED_ROWS`] (docs/notes/cpu-decode.md, "Any
    /// group size").
    pub(super) fn row_groups(&self, hd: usize, kv_rows: usize) -> Option<usize> {
        (self.row_groups && kv_rows <= MAX_GROUPED_ROWS && self.four_row_kernels(hd).is_some())
            .then(|| kv_rows.div_ceil(4))
    }

    /// The four-row kernels, where this set has them and a head of `hd`
    /// elements suits them: what both the span length and the kernel
    /// choice rest on, so that they agree (only four-row calls take
    /// spans of several blocks).
    pub(super) fn four_row_kernels(&self, hd: usize) -> Option<FourRowKernels> {
        let mut four = self
            .kernels
            .stored?
            .four_rows
            .filter(|_| hd.is_multiple_of(8))?;
        if let Some(b) = four.fp8_bf16.filter(|_| self.fp8_bf16) {
            // Every dtype and shape but E4M3's suitable ones falls through
            // to the set's own kernels.
            four.scores_softmax_dim_major = b.scores_softmax_dim_major;
            four.weighted_sum = b.weighted_sum;
        }
        Some(four)
    }
}
