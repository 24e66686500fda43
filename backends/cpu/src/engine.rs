//! The CPU engine: blockwise online softmax over paged K/V, GQA-grouped,
//! split across threads by context chunks and merged by log-sum-exp.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use kvslice_core::{
    AttentionBatch, AttentionEngine, BatchShape, Error, KeyOrder, KvPart, KvWrite, PageMemory,
    PageMemoryMut, Result, SeqAttention, write_kv,
};

use crate::kernels::{
    FourRowKernels, Int8Queries, Kernels, SoftmaxState, StoredKernels, raw_scale,
};

/// Paged attention on the CPU with SIMD kernels and threads.
///
/// Per sequence and kv head it reads each page's K and V rows once for
/// every query head of the GQA group and every query token, with an online
/// (streaming) softmax: decode (up to four query rows per kv head) converts
/// the stored rows in registers ([`crate::StoredKernels`]), longer row sets
/// widen them to f32 once per span of blocks (below), and so do dim-major
/// keys ([`kvslice_core::KeyOrder`]) except where the four-row kernels
/// take them. A kv head's few query rows (up to 64: decode, and short
/// runs of query tokens) go through those kernels four at a time, the
/// last group padded ([`CpuEngine::with_row_groups`]). Four rows that all
/// see a whole block take its scores and softmax in one call where the
/// kernels have it ([`crate::FourRowKernels`]), and take small blocks in
/// spans of about 64 keys (four 16-token blocks) per call, so that the
/// weighted sum keeps its accumulators in registers across them and the
/// per-call costs are paid once per span; more rows that all see a span's
/// keys (prefill off the diagonal) widen its blocks together for the same
/// reason. A decode task
/// takes every kv head of its pages and reads each page in address order,
/// every head's K and then every head's V, one rising stream rather than
/// one head's 4 KiB of each. While a head's K (or V) is computed, the next
/// region of the stream is prefetched: by the four-row kernels line for
/// line alongside the lines they load (each page's next head), by the
/// others spread over their loops, so that the line-fill buffers never
/// all wait at once. Long queries (prefill) are cut into tiles of about
/// 256 query rows, each a task over the keys it sees, so that a tile's
/// rows and accumulators stay in cache while K and V pass (flash
/// attention's loop order). Long contexts are cut into chunks of
/// pages that threads compute independently; the partial `(max, sum,
/// output)` triples are merged by log-sum-exp, as in vLLM's paged attention
/// v2 and flash-decoding.
///
/// ```
/// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
/// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec};
/// use kvslice_cpu::CpuEngine;
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, 16, KvDtype::F16))?;
/// let mut rng = Rng::new(1);
/// let sc = Scenario::random(layout, &[(100, 1), (40, 1)], &mut rng)?;
/// let q = sc.random_queries(0, &mut rng)?;
/// let seqs = sc.seq_attention(0, 0)?;
/// let mut out = vec![0.0; q.len()];
/// CpuEngine::new().attend(&sc.pages, &AttentionBatch::new(0, 0, &seqs, &q, 0.125), &mut out)?;
/// assert!(max_rel_err(&out, &sc.naive_f64(0, 0, &q, 0.125)?) < 1e-3);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct CpuEngine {
    kernels: Kernels,
    threads: usize,
    /// Pages per split-K chunk.
    chunk_pages: usize,
    /// Keys per span of small blocks for four-row decode.
    span_keys: usize,
    /// Query rows per tile of a long query (0 = one tile).
    tile_rows: usize,
    /// Int8 keys scored against queries rounded to int8, where the
    /// kernels can.
    int8_queries: bool,
    /// A kv head's few query rows in groups of four for the four-row
    /// kernels ([`Self::with_row_groups`]).
    row_groups: bool,
}

impl Default for CpuEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuEngine {
    /// The best kernels for this CPU, on every available core.
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            kernels: Kernels::detect(),
            threads,
            chunk_pages: 0,
            span_keys: SPAN_KEYS,
            tile_rows: TILE_ROWS,
            int8_queries: false,
            row_groups: true,
        }
    }

    /// With a fixed number of threads (1 = the calling thread alone).
    ///
    /// The calling thread computes tasks too; up to `threads − 1` workers
    /// of rayon's global pool (`RAYON_NUM_THREADS` sizes it) help. They
    /// outlive the call, as a serving loop calls `attend` once per layer
    /// and step. A worker that has not started when the calling thread
    /// takes the last task is called off, not waited for, so a call too
    /// small to wait for an idle core's wake-up runs about as fast as on
    /// one thread. The first call on more than one thread starts rayon's
    /// pool if nothing has, so a program that configures it
    /// (`rayon::ThreadPoolBuilder::build_global`) does so before. With the
    /// chunking fixed, the result does not depend on the thread count:
    /// chunks merge in context order.
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, 16, KvDtype::F16))?;
    /// let mut rng = Rng::new(3);
    /// let sc = Scenario::random(layout, &[(300, 1), (77, 1)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let batch = AttentionBatch::new(0, 0, &seqs, &q, 0.125);
    /// let (mut one, mut four) = (vec![0.0; q.len()], vec![0.0; q.len()]);
    /// let engine = CpuEngine::new().with_chunk_pages(4);
    /// engine.clone().with_threads(1).attend(&sc.pages, &batch, &mut one)?;
    /// engine.with_threads(4).attend(&sc.pages, &batch, &mut four)?;
    /// assert_eq!(one, four);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// With the portable kernels instead of the detected ones.
    pub fn with_scalar_kernels(mut self) -> Self {
        self.kernels = Kernels::scalar();
        self
    }

    /// With a given kernel set, one of [`Kernels::supported`] (to compare
    /// instruction sets on one machine).
    ///
    /// ```
    /// use kvslice_cpu::{CpuEngine, Kernels};
    ///
    /// for k in Kernels::supported() {
    ///     assert_eq!(CpuEngine::new().with_kernels(k).kernels().name, k.name);
    /// }
    /// ```
    pub fn with_kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// With split-K chunks of `pages` pages (0 = choose automatically;
    /// more than [`BUILDER_LIMIT`] is taken as that, which is one chunk for
    /// any context).
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// let layout = KvLayout::new(LayoutSpec::new(1, 4, 2, 16, 16, KvDtype::F16))?;
    /// let mut rng = Rng::new(1);
    /// let sc = Scenario::random(layout, &[(100, 1)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let mut out = vec![0.0; q.len()];
    /// // Extreme builder values are clamped, never an overflow.
    /// let engine = CpuEngine::new().with_chunk_pages(usize::MAX).with_span_keys(usize::MAX);
    /// engine.attend(&sc.pages, &AttentionBatch::new(0, 0, &seqs, &q, 0.25), &mut out)?;
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_chunk_pages(mut self, pages: usize) -> Self {
        self.chunk_pages = pages.min(BUILDER_LIMIT);
        self
    }

    /// With spans of up to `keys` keys (default 64) where four query rows
    /// (or more, which widen K and V to f32) see every key of blocks
    /// smaller than that: the blocks are taken together, one kernel call
    /// per head for the span's scores and one for its values (at most
    /// eight blocks). 0 takes one block at a time
    /// (to measure what spans gain). Results agree either way up to
    /// rounding.
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// // GQA 4 decode over 8-token blocks.
    /// let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, 8, KvDtype::F16))?;
    /// let mut rng = Rng::new(3);
    /// let sc = Scenario::random(layout, &[(200, 1)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let batch = AttentionBatch::new(0, 0, &seqs, &q, 0.125);
    /// let (mut spans, mut blocks) = (vec![0.0; q.len()], vec![0.0; q.len()]);
    /// CpuEngine::new().attend(&sc.pages, &batch, &mut spans)?;
    /// CpuEngine::new().with_span_keys(0).attend(&sc.pages, &batch, &mut blocks)?;
    /// let blocks: Vec<f64> = blocks.iter().map(|&x| f64::from(x)).collect();
    /// assert!(max_rel_err(&spans, &blocks) < 1e-5);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_span_keys(mut self, keys: usize) -> Self {
        self.span_keys = keys.min(BUILDER_LIMIT);
        self
    }

    /// With long queries (prefill) cut into tiles of about `rows` query
    /// rows (query tokens × query heads per kv head; default 256), each
    /// computed over the keys it sees as a task of its own, so that its
    /// rows and accumulators stay in cache while every block of K and V
    /// passes them (flash attention's loop order). 0 computes every row of
    /// a sequence and kv head together, each block once (to measure what
    /// tiles gain). Results agree either way up to rounding.
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// // A causal prefill of 100 tokens, GQA 4, in tiles of 8 tokens.
    /// let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, 16, KvDtype::F16))?;
    /// let mut rng = Rng::new(5);
    /// let sc = Scenario::random(layout, &[(100, 100)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let batch = AttentionBatch::new(0, 0, &seqs, &q, 0.125);
    /// let (mut tiles, mut whole) = (vec![0.0; q.len()], vec![0.0; q.len()]);
    /// CpuEngine::new().with_query_tile_rows(32).attend(&sc.pages, &batch, &mut tiles)?;
    /// CpuEngine::new().with_query_tile_rows(0).attend(&sc.pages, &batch, &mut whole)?;
    /// let whole: Vec<f64> = whole.iter().map(|&x| f64::from(x)).collect();
    /// assert!(max_rel_err(&tiles, &whole) < 1e-5);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_query_tile_rows(mut self, rows: usize) -> Self {
        self.tile_rows = rows.min(BUILDER_LIMIT);
        self
    }

    /// With int8 keys scored against query rows rounded to int8 (each
    /// row against its largest magnitude, per kv head and call) on
    /// integer dot products, where the kernel set has them
    /// ([`crate::FourRowKernels::int8_queries`]:
    /// AVX-512 VNNI and VBMI) and the pages suit them: int8 keys stored
    /// dim-major, a kv head's rows in groups of four (decode and short
    /// runs, see [`Self::with_row_groups`]) or exactly four, whole blocks
    /// of a multiple of 16 keys (a partial last block keeps f32 queries).
    /// Elsewhere it changes nothing ([`Self::int8_queries`] says which).
    /// Scoring is the larger part of int8 decode's arithmetic, so this
    /// makes it faster, and the rounding adds error: on Gaussian keys, a
    /// fifth more than int8 K/V's own (docs/QUANTIZATION.md has the
    /// figures, and the model's).
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KeyOrder, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// // GQA decode (8 query heads, 2 kv heads) over int8 keys, dim-major.
    /// let spec = LayoutSpec::new(1, 8, 2, 128, 16, KvDtype::I8).with_key_order(KeyOrder::DimMajor);
    /// let mut rng = Rng::new(9);
    /// let sc = Scenario::random(KvLayout::new(spec)?, &[(512, 1)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let mut out = vec![0.0; q.len()];
    /// let engine = CpuEngine::new().with_int8_queries(true);
    /// engine.attend(&sc.pages, &AttentionBatch::new(0, 0, &seqs, &q, 0.09), &mut out)?;
    /// println!("int8 queries in use: {}", engine.int8_queries());
    /// assert!(max_rel_err(&out, &sc.naive_f64(0, 0, &q, 0.09)?) < 5e-2);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_int8_queries(mut self, on: bool) -> Self {
        self.int8_queries = on;
        self
    }

    /// Whether a kv head's few query rows (decode, and runs of query
    /// tokens up to 64 rows, as speculative decoding verifies) go four at
    /// a time through the four-row kernels whatever their number (the
    /// default), the last group padded with copies of its last row, or
    /// (`false`) as one group of rows: the four-row kernels for exactly
    /// four, one widening of each span for more, the kernels of one to
    /// three rows for fewer. The groups make decode with 1, 2, 3, 6 or 8
    /// query heads per kv head 2.0-2.5x faster than together, and a step
    /// of 2 to 8 tokens at 4 per kv head 1.4-2.4x (docs/BENCHMARKS.md);
    /// `false` is there to measure that. Sets without four-row kernels
    /// (scalar, NEON) keep the rows together either way; the results agree
    /// to rounding.
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// // GQA 3 decode (SmolLM2's shape: 9 query heads, 3 kv heads).
    /// let layout = KvLayout::new(LayoutSpec::new(1, 9, 3, 64, 16, KvDtype::F16))?;
    /// let mut rng = Rng::new(4);
    /// let sc = Scenario::random(layout, &[(400, 1), (33, 1)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let batch = AttentionBatch::new(0, 0, &seqs, &q, 0.125);
    /// let (mut grouped, mut together) = (vec![0.0; q.len()], vec![0.0; q.len()]);
    /// CpuEngine::new().attend(&sc.pages, &batch, &mut grouped)?;
    /// CpuEngine::new().with_row_groups(false).attend(&sc.pages, &batch, &mut together)?;
    /// assert!(max_rel_err(&grouped, &sc.naive_f64(0, 0, &q, 0.125)?) < 1e-3);
    /// let together: Vec<f64> = together.iter().map(|&x| f64::from(x)).collect();
    /// assert!(max_rel_err(&grouped, &together) < 1e-3);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_row_groups(mut self, on: bool) -> Self {
        self.row_groups = on;
        self
    }

    /// Whether int8 keys are scored against int8 queries: asked for
    /// ([`Self::with_int8_queries`]) and in the kernel set.
    pub fn int8_queries(&self) -> bool {
        self.int8_queries
            && self
                .kernels
                .stored
                .and_then(|s| s.four_rows)
                .is_some_and(|f| f.int8_queries.is_some())
    }

    /// The kernels in use (for reports).
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }
}

/// One unit of work: a chunk of one query tile's pages for kv heads
/// `kv_head..kv_head + heads`.
#[derive(Debug, Clone, Copy)]
struct Task<'a> {
    /// The sequence (its index in the batch) and the tile's first query
    /// token in it, which together name the partials to merge.
    seq: usize,
    tile: usize,
    /// The tile as a sequence of its own: its query tokens, and the keys
    /// the last of them sees (causal, bottom-right aligned, so every
    /// token keeps its position).
    view: SeqAttention<'a>,
    kv_head: u32,
    /// One head, or (decode) every kv head, so that a page is read as one
    /// rising stream.
    heads: u32,
    /// Token positions of the chunk.
    start: usize,
    end: usize,
    /// The tile's first query token in the batch.
    q_base: usize,
}

/// Streaming-softmax state of a task's query rows over some keys.
#[derive(Debug, Clone)]
struct Partials {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `rows × head_dim`.
    acc: Vec<f32>,
}

impl Partials {
    fn new(rows: usize, hd: usize) -> Self {
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
    fn merge(&mut self, other: &Partials, hd: usize, k: &Kernels) {
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

impl<P: PageMemoryMut + ?Sized + Sync> AttentionEngine<P> for CpuEngine {
    fn attend(&self, pages: &P, batch: &AttentionBatch<'_>, out: &mut [f32]) -> Result<()> {
        let shape = batch.validate(pages, out.len())?;
        let bt = shape.layout.block_tokens() as usize;
        let kv_heads = shape.shard.num_kv_heads();
        let ratio = shape.layout.gqa_ratio() as usize;
        // Keys the call reads: from each sequence's first window on.
        let total_tokens: usize = batch
            .seqs
            .iter()
            .map(|s| s.kv_len - s.keys_seen(0, batch.window).start)
            .sum::<usize>()
            * kv_heads as usize;
        let chunk = |heads: u32| self.chunk_tokens(total_tokens, heads, bt);
        let mut tasks = Vec::new();
        let mut q_base = 0;
        for (seq, s) in batch.seqs.iter().enumerate() {
            // Tiles of up to four rows, or of rows in groups of four (at
            // most `MAX_GROUPED_ROWS` per kv head), take every kv head of a
            // page in one task: every head's K, then every head's V, the
            // page read in address order, which the hardware streams
            // better than one head's 4 KiB of each per page
            // (docs/notes/cpu-decode.md). Longer tiles keep one head per
            // task, as their rows and accumulators for every head at once
            // would not stay in cache (64 rows of 8 kv heads at d = 128
            // are 256 KiB of queries and as much of accumulators: still
            // faster grouped, measured at 16 tokens of GQA 4).
            let tile_tokens = match self.tile_rows {
                0 => s.q_len,
                rows => (rows / ratio).max(1),
            };
            let hd = shape.layout.head_dim() as usize;
            let tile_q = tile_tokens.min(s.q_len);
            let heads = if tile_q * ratio <= StoredKernels::MAX_ROWS
                || self.row_groups(hd, ratio * tile_q).is_some()
            {
                kv_heads
            } else {
                1
            };
            for tile in (0..s.q_len).step_by(tile_tokens) {
                let upto = (tile + tile_tokens).min(s.q_len);
                let view = SeqAttention {
                    block_table: s.block_table,
                    kv_len: s.kv_len - (s.q_len - upto),
                    q_len: upto - tile,
                };
                // Keys before the tile's first window are never read; chunks
                // after the first start on page boundaries.
                let from = view.keys_seen(0, batch.window).start;
                for kv_head in (0..kv_heads).step_by(heads as usize) {
                    let mut start = from;
                    while start < view.kv_len {
                        let end = (start / bt * bt + chunk(heads)).min(view.kv_len);
                        tasks.push(Task {
                            seq,
                            tile,
                            view,
                            kv_head,
                            heads,
                            start,
                            end,
                            q_base: q_base + tile,
                        });
                        start = end;
                    }
                }
            }
            q_base += s.q_len;
        }
        let results: Vec<Mutex<Vec<Partials>>> =
            tasks.iter().map(|_| Mutex::new(Vec::new())).collect();
        let next = AtomicUsize::new(0);
        let failure: Mutex<Option<Error>> = Mutex::new(None);
        let work = || {
            let mut scratch = Scratch::default();
            loop {
                let i = next.fetch_add(1, Relaxed);
                let Some(task) = tasks.get(i) else { break };
                match self.run_task(pages, batch, &shape, task, &mut scratch) {
                    Ok(p) => *results[i].lock().unwrap() = p,
                    Err(e) => {
                        *failure.lock().unwrap() = Some(e);
                        next.store(tasks.len(), Relaxed);
                    }
                }
            }
        };
        let threads = self.threads.min(tasks.len());
        if threads <= 1 {
            work();
        } else {
            // The calling thread works too; the others come from rayon's
            // global pool, whose workers outlive the call (see
            // `with_threads`), and only if they start before the caller
            // has taken the last task.
            crate::work_sharing::share_in_pool(&work, threads - 1);
        }
        if let Some(e) = failure.into_inner().unwrap() {
            return Err(e);
        }
        // Every (sequence, kv head)'s chunks, in order, merged into the
        // output.
        // (kv head, its task, its partials), by sequence, head, position.
        let mut parts: Vec<(u32, &Task, Partials)> = tasks
            .iter()
            .zip(results)
            .flat_map(|(t, r)| {
                let p = r.into_inner().unwrap();
                assert_eq!(p.len(), t.heads as usize, "every task ran");
                (t.kv_head..).zip(p).map(move |(h, p)| (h, t, p))
            })
            .collect();
        parts.sort_by_key(|&(h, t, _)| (t.seq, t.tile, h, t.start));
        let hd = shape.layout.head_dim() as usize;
        let row = shape.shard.num_q_heads() as usize * hd;
        let mut parts = parts.into_iter().peekable();
        while let Some((kv_head, t, mut merged)) = parts.next() {
            while let Some((_, _, more)) =
                parts.next_if(|&(h, u, _)| (u.seq, u.tile, h) == (t.seq, t.tile, kv_head))
            {
                merged.merge(&more, hd, &self.kernels);
            }
            for r in 0..merged.max.len() {
                // Rows are (query token) × (query head in group).
                let (tok, g) = (r / ratio, r % ratio);
                let qh = kv_head as usize * ratio + g;
                let at = (t.q_base + tok) * row + qh * hd;
                let inv = 1.0 / merged.sum[r];
                for (o, a) in out[at..at + hd]
                    .iter_mut()
                    .zip(&merged.acc[r * hd..(r + 1) * hd])
                {
                    *o = a * inv;
                }
            }
        }
        Ok(())
    }

    fn write_kv(&self, pages: &mut P, write: &KvWrite<'_>) -> Result<()> {
        write_kv(pages, write)
    }
}

/// Per-thread buffers, reused across tasks.
#[derive(Default)]
struct Scratch {
    /// Every head's query rows of a task, one after another.
    q: Vec<f32>,
    /// One span of K or V widened to f32 (rows beyond one register
    /// group): the scores are done with K before the values widen V.
    widened: Vec<f32>,
    /// Each head's softmax weights of the current span, between its
    /// scores and its values: one slot of `slot_len` per head, of which
    /// the visible rows × the span's keys are used.
    weights: Vec<f32>,
    /// Per slot of `weights`: whether the four-row kernels left it
    /// key-major ([`crate::FourRowKernels`]) rather than row-major.
    key_major: Vec<bool>,
    rescale: Vec<f32>,
    /// Length of a head's slot of `weights`: rows × the keys of the
    /// longest span.
    slot_len: usize,
    /// One block of dim-major keys widened as stored, to be transposed
    /// into `widened`.
    block: Vec<f32>,
    /// A scaled dtype's scales of one head's K or V rows of the current
    /// span, times [`raw_scale`].
    scales: Vec<f32>,
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
    fn chunk_tokens(&self, total_tokens: usize, heads: u32, bt: usize) -> usize {
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
    fn run_task<'a, P: PageMemory + ?Sized>(
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
    fn row_groups(&self, hd: usize, kv_rows: usize) -> Option<usize> {
        (self.row_groups && kv_rows <= MAX_GROUPED_ROWS && self.four_row_kernels(hd).is_some())
            .then(|| kv_rows.div_ceil(4))
    }

    /// The four-row kernels, where this set has them and a head of `hd`
    /// elements suits them: what both the span length and the kernel
    /// choice rest on, so that they agree (only four-row calls take
    /// spans of several blocks).
    fn four_row_kernels(&self, hd: usize) -> Option<FourRowKernels> {
        self.kernels
            .stored
            .and_then(|sk| sk.four_rows)
            .filter(|_| hd.is_multiple_of(8))
    }

    /// Scores one span of a head's keys (one block, or several for four
    /// rows that see them all) against its query rows from `keys.first`
    /// on (those that see any of it), folds them into the rows' softmax
    /// state (rescaling their accumulators) and leaves the weights in the
    /// head's slot of [`Scratch::weights`].
    #[allow(clippy::too_many_arguments)]
    fn score_block(
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
    fn value_block(
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

/// Split-K chunks per thread where the work is long enough, so that a
/// thread slowed or started late leaves the other little to wait for:
/// batch-8 decode on two threads read 71% and 78% of the read loop at 8k
/// and 32k with sixteen (means of eight interleaved runs on a Zen 4 VM),
/// against 69% and 74% with four, which cut each sequence into one chunk.
const CHUNKS_PER_THREAD: usize = 16;

/// The largest chunk, span or tile size the builders keep (2^24): larger
/// values are taken as this, which already covers any context a pool can
/// hold, so no size computed from them can overflow.
pub const BUILDER_LIMIT: usize = 1 << 24;

/// Longest span, in blocks: a kernel call takes up to this many blocks'
/// keys.
const SPAN_BLOCKS: usize = 8;
/// Keys a span takes by default: a weighted sum over 64 keys keeps its
/// accumulators in registers four times as long as over one 16-token
/// block, and the per-call costs are paid once; 128 measured no better
/// (docs/notes/cpu-decode.md).
const SPAN_KEYS: usize = 64;

/// Most query rows of a kv head that go through the four-row kernels in
/// groups of four (`CpuEngine::row_groups`); more widen each span once for
/// all rows. At 64 (16 tokens × 4 query heads per kv head, 8k context) the
/// groups were still 1.23x faster, and the gain falls with the rows
/// (docs/notes/cpu-decode.md).
const MAX_GROUPED_ROWS: usize = 64;

/// Query rows per tile of a long query: 256 rows of d = 128 are 128 KiB
/// of queries and 128 KiB of accumulators, which stay in a 512 KiB L2
/// while K and V pass.
const TILE_ROWS: usize = 256;

/// Byte regions, one per block of a span, in order: the span's pages, or
/// one head's rows in each (no allocation per span).
#[derive(Default)]
struct Regions<'a> {
    regions: [&'a [u8]; SPAN_BLOCKS],
    len: usize,
}

impl<'a> Regions<'a> {
    fn push(&mut self, region: &'a [u8]) {
        self.regions[self.len] = region;
        self.len += 1;
    }

    fn as_slice(&self) -> &[&'a [u8]] {
        &self.regions[..self.len]
    }
}

/// One span of K or V rows of one of a task's kv heads, as stored, one
/// segment per block, with what to prefetch while they are computed.
struct Block<'a> {
    segs: &'a [&'a [u8]],
    ahead: &'a [&'a [u8]],
    /// A scaled dtype's `n` row scales times [`raw_scale`] (else empty):
    /// the kernels read its codes raw.
    scales: &'a [f32],
    /// The head's index in the task (its slot of [`Scratch::weights`]).
    slot: usize,
    /// Position of the first key.
    pos: usize,
    /// Keys in the span.
    n: usize,
    /// The first of the head's rows (token-major) at or after the causal
    /// diagonal: rows before it see none of the span (a window may still
    /// hide it from later ones).
    first: usize,
    /// Where the head's rows start among its kv head's rows.
    row0: usize,
    /// The kv head's rows (query tokens × query heads per kv head).
    kv_rows: usize,
    /// For dim-major keys, the block length: each segment is then a whole
    /// block, of which the span takes keys `pos..pos + n`.
    dim_major: Option<usize>,
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
    fn weights(&self, rows: usize, slot_len: usize) -> std::ops::Range<usize> {
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
    fn widen(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_chunks_are_whole_spans() {
        // One sequence of 256 tokens, 8 kv heads per task, 16-token
        // pages: four chunks of one span each on two threads, not eight
        // of half a span.
        let two = CpuEngine::new().with_threads(2);
        assert_eq!(two.chunk_tokens(256 * 8, 8, 16), SPAN_KEYS);
        // Spans of 32 keys allow two-page chunks again.
        assert_eq!(
            two.clone().with_span_keys(32).chunk_tokens(256 * 8, 8, 16),
            32
        );
        // Long contexts are cut into sixteen chunks per thread, in whole
        // pages, and not at all on one thread.
        assert_eq!(two.chunk_tokens(32768 * 8, 8, 16), 32768 / 32);
        let one = CpuEngine::new().with_threads(1);
        assert_eq!(one.chunk_tokens(32768 * 8, 8, 16), 32768);
        assert_eq!(two.chunk_tokens(1000 * 8, 8, 16) % 16, 0);
        // One-head tasks keep their 256-token floor.
        assert_eq!(two.chunk_tokens(256, 1, 16), 256);
        // A fixed chunk wins.
        assert_eq!(two.with_chunk_pages(1).chunk_tokens(256 * 8, 8, 16), 16);
    }
}
