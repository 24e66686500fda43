//! The CPU engine: blockwise online softmax over paged K/V, GQA-grouped,
//! split across threads by context chunks and merged by log-sum-exp.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use kvslice_core::{
    AttentionBatch, AttentionEngine, Error, KvWrite, PageMemoryMut, Result, SeqAttention, write_kv,
};

use crate::kernels::{Kernels, StoredKernels};

mod span;
mod task;

use task::{Partials, Scratch, Task};

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
    /// E4M3 pages on bf16 dot products, where the kernels can.
    fp8_bf16: bool,
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
            fp8_bf16: false,
            row_groups: true,
        }
    }

    /// With a fixed number of threads (1 = the calling thread alone;
    /// more than [`BUILDER_LIMIT`] is taken as that, as the other
    /// builders take their sizes, so no task count can overflow).
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
        self.threads = threads.clamp(1, BUILDER_LIMIT);
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

    /// With E4M3 (fp8) pages decoded on bf16 dot products, where the
    /// kernel set has them ([`crate::FourRowKernels::fp8_bf16`]: AVX-512
    /// BF16 beside VNNI and VBMI, as on Sapphire Rapids and Zen 4) and the
    /// rows go through the four-row kernels: the scores where keys are
    /// stored dim-major, the weighted sum where the head width is a
    /// multiple of 64. Each code converts exactly; the query rows and the
    /// softmax weights are rounded to bf16 (8 significant bits), which
    /// adds error of its own, small beside E4M3's (docs/QUANTIZATION.md
    /// has the figures). Elsewhere it changes nothing ([`Self::fp8_bf16`]
    /// says which).
    ///
    /// ```
    /// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
    /// use kvslice_core::{AttentionBatch, AttentionEngine, KeyOrder, KvDtype, KvLayout, LayoutSpec};
    /// use kvslice_cpu::CpuEngine;
    ///
    /// // GQA decode (8 query heads, 2 kv heads) over fp8 pages, dim-major keys.
    /// let spec = LayoutSpec::new(1, 8, 2, 128, 16, KvDtype::F8E4M3).with_key_order(KeyOrder::DimMajor);
    /// let mut rng = Rng::new(9);
    /// let sc = Scenario::random(KvLayout::new(spec)?, &[(512, 1)], &mut rng)?;
    /// let q = sc.random_queries(0, &mut rng)?;
    /// let seqs = sc.seq_attention(0, 0)?;
    /// let mut out = vec![0.0; q.len()];
    /// let engine = CpuEngine::new().with_fp8_bf16(true);
    /// engine.attend(&sc.pages, &AttentionBatch::new(0, 0, &seqs, &q, 0.09), &mut out)?;
    /// println!("fp8 on bf16 in use: {}", engine.fp8_bf16());
    /// assert!(max_rel_err(&out, &sc.naive_f64(0, 0, &q, 0.09)?) < 1e-2);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn with_fp8_bf16(mut self, on: bool) -> Self {
        self.fp8_bf16 = on;
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

    /// Whether fp8 pages are decoded on bf16 dot products: asked for
    /// ([`Self::with_fp8_bf16`]) and in the kernel set.
    pub fn fp8_bf16(&self) -> bool {
        self.fp8_bf16
            && self
                .kernels
                .stored
                .and_then(|s| s.four_rows)
                .is_some_and(|f| f.fp8_bf16.is_some())
    }

    /// The kernels in use (for reports).
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
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
