//! Shared test support (feature `testkit`): a small deterministic RNG,
//! random paged scenarios, a dense f64 attention oracle, a request served
//! against a store ([`serve_blocks`]), and (with `std`) the committed fuzz
//! seeds ([`fuzz_seeds`]).
//!
//! Every backend's accuracy suite builds a [`Scenario`], runs its engine
//! over it and compares with [`Scenario::naive_f64`], so all backends are
//! held to the same oracle.
//!
//! ```
//! use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
//! use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec, ReferenceEngine};
//!
//! let layout = KvLayout::new(LayoutSpec::new(2, 4, 2, 8, 3, KvDtype::F32))?;
//! let mut rng = Rng::new(1);
//! let sc = Scenario::random(layout, &[(7, 1), (5, 5)], &mut rng)?;
//! let q = sc.random_queries(0, &mut rng)?;
//! let seqs = sc.seq_attention(1, 0)?;
//! let mut out = vec![0.0; q.len()];
//! ReferenceEngine.attend(&sc.pages, &AttentionBatch::new(1, 0, &seqs, &q, 0.5), &mut out)?;
//! assert!(max_rel_err(&out, &sc.naive_f64(1, 0, &q, 0.5)?) < 1e-5);
//! # Ok::<(), kvslice_core::Error>(())
//! ```

#[cfg(feature = "std")]
mod corpus;
mod edge_cases;
mod serve;

#[cfg(feature = "std")]
pub use corpus::{fuzz_corpus_dir, fuzz_seeds};
pub use edge_cases::{EdgeCase, Outcome, edge_cases};
pub use serve::serve_blocks;

use alloc::vec;
use alloc::vec::Vec;

use crate::engine::SeqAttention;
use crate::error::Result;
use crate::layout::KvLayout;
use crate::page::{KvWrite, PageBuf, PageId, write_kv};

/// SplitMix64: tiny, fast, good enough for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// One sequence of a scenario.
#[derive(Debug, Clone)]
pub struct ScenarioSeq {
    /// Context tokens.
    pub kv_len: usize,
    /// Query tokens (the last `q_len` of the context).
    pub q_len: usize,
    /// Block table per (layer group, head shard), indexed
    /// `group * shards + shard`.
    pub tables: Vec<Vec<PageId>>,
    /// K per layer and global kv head, `kv_len × head_dim`, already rounded
    /// to the storage dtype.
    pub k: Vec<Vec<Vec<f32>>>,
    /// V, shaped like `k`.
    pub v: Vec<Vec<Vec<f32>>>,
}

/// Random sequences written into shuffled pages of a [`PageBuf`], with a
/// dense copy of everything written.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The layout.
    pub layout: KvLayout,
    /// Page memory holding every sequence.
    pub pages: PageBuf,
    /// The sequences.
    pub seqs: Vec<ScenarioSeq>,
}

impl Scenario {
    /// Builds sequences of the given `(kv_len, q_len)`, every layer and shard
    /// filled with values uniform in `[-1, 1)`, written with [`write_kv`] in
    /// two appends (so writes that start mid-page are exercised).
    pub fn random(layout: KvLayout, seqs: &[(usize, usize)], rng: &mut Rng) -> Result<Self> {
        let bt = layout.block_tokens() as usize;
        let hd = layout.head_dim() as usize;
        let groups = layout.num_layer_groups() as usize;
        let shards = layout.num_head_shards();
        let tables_per_seq = groups * shards as usize;
        let total_pages: usize = seqs
            .iter()
            .map(|(kv, _)| kv.div_ceil(bt) * tables_per_seq)
            .sum();
        let mut ids: Vec<PageId> = (0..total_pages as u32).map(PageId).collect();
        rng.shuffle(&mut ids);
        let mut pages = PageBuf::new(layout, total_pages as u32)?;
        let mut free = ids.into_iter();

        let mut out = Vec::with_capacity(seqs.len());
        for &(kv_len, q_len) in seqs {
            let blocks = kv_len.div_ceil(bt);
            let tables: Vec<Vec<PageId>> = (0..tables_per_seq)
                .map(|_| free.by_ref().take(blocks).collect())
                .collect();
            let kv_heads = layout.num_kv_heads() as usize;
            let dense = |rng: &mut Rng| -> Vec<Vec<Vec<f32>>> {
                (0..layout.num_layers())
                    .map(|_| {
                        (0..kv_heads)
                            .map(|_| {
                                // As stored: scaled dtypes round whole rows.
                                let mut x = rng.vec(kv_len * hd);
                                x.chunks_mut(hd)
                                    .for_each(|row| layout.dtype().round_trip_row(row));
                                x
                            })
                            .collect()
                    })
                    .collect()
            };
            let k = dense(rng);
            let v = dense(rng);
            let split = if kv_len > 1 {
                rng.below(kv_len as u64) as usize
            } else {
                0
            };
            for layer in 0..layout.num_layers() {
                let (group, _) = layout.layer_group(layer)?;
                for s in 0..shards {
                    let shard = layout.head_shard(s)?;
                    let table = &tables[group as usize * shards as usize + s as usize];
                    for chunk in [0..split, split..kv_len] {
                        let gather = |src: &Vec<Vec<Vec<f32>>>| -> Vec<f32> {
                            chunk
                                .clone()
                                .flat_map(|t| {
                                    shard.kv_heads().flat_map(move |h| {
                                        src[layer as usize][h as usize][t * hd..(t + 1) * hd]
                                            .iter()
                                            .copied()
                                    })
                                })
                                .collect()
                        };
                        let (kc, vc) = (gather(&k), gather(&v));
                        let w = KvWrite {
                            layer,
                            shard: s,
                            block_table: table,
                            start: chunk.start,
                            k: &kc,
                            v: &vc,
                        };
                        write_kv(&mut pages, &w)?;
                    }
                }
            }
            out.push(ScenarioSeq {
                kv_len,
                q_len,
                tables,
                k,
                v,
            });
        }
        Ok(Self {
            layout,
            pages,
            seqs: out,
        })
    }

    /// Random queries for every sequence on `shard`.
    pub fn random_queries(&self, shard: u32, rng: &mut Rng) -> Result<Vec<f32>> {
        let heads = self.layout.head_shard(shard)?.num_q_heads() as usize;
        let tokens: usize = self.seqs.iter().map(|s| s.q_len).sum();
        Ok(rng.vec(tokens * heads * self.layout.head_dim() as usize))
    }

    /// Per-sequence block tables for `layer` on `shard`.
    pub fn seq_attention(&self, layer: u32, shard: u32) -> Result<Vec<SeqAttention<'_>>> {
        let (group, _) = self.layout.layer_group(layer)?;
        let shards = self.layout.num_head_shards();
        crate::error::check_index("head shard", shard as usize, shards as usize)?;
        Ok(self
            .seqs
            .iter()
            .map(|s| SeqAttention {
                block_table: &s.tables[(group * shards + shard) as usize],
                kv_len: s.kv_len,
                q_len: s.q_len,
            })
            .collect())
    }

    /// [`seq_attention`](Self::seq_attention) with every block that lies
    /// wholly before all of a sequence's windows replaced by
    /// [`PageId::PLACEHOLDER`], as a runtime that released them holds
    /// them: `(tables, window)` give the tables to borrow from.
    pub fn placeholder_tables(
        &self,
        layer: u32,
        shard: u32,
        window: Option<u32>,
    ) -> Result<Vec<Vec<PageId>>> {
        let bt = self.layout.block_tokens();
        Ok(self
            .seq_attention(layer, shard)?
            .iter()
            .map(|s| {
                let first = s.first_block(window, bt);
                let mut table = s.block_table.to_vec();
                table[..first].fill(PageId::PLACEHOLDER);
                table
            })
            .collect())
    }

    /// The sequences over `tables` (from
    /// [`placeholder_tables`](Self::placeholder_tables)).
    pub fn seq_attention_over<'a>(&self, tables: &'a [Vec<PageId>]) -> Vec<SeqAttention<'a>> {
        self.seqs
            .iter()
            .zip(tables)
            .map(|(s, t)| SeqAttention {
                block_table: t,
                kv_len: s.kv_len,
                q_len: s.q_len,
            })
            .collect()
    }

    /// Dense, unpaged attention in f64 on the stored (rounded) K/V: the
    /// oracle. Same shape as an engine's output.
    pub fn naive_f64(
        &self,
        layer: u32,
        shard: u32,
        queries: &[f32],
        scale: f32,
    ) -> Result<Vec<f64>> {
        self.naive_f64_window(layer, shard, queries, scale, None)
    }

    /// [`naive_f64`](Self::naive_f64) under a sliding window of `window`
    /// tokens: query token `t` sees keys
    /// `max(0, p - window + 1)..=p`, where `p = kv_len - q_len + t`.
    pub fn naive_f64_window(
        &self,
        layer: u32,
        shard: u32,
        queries: &[f32],
        scale: f32,
        window: Option<u32>,
    ) -> Result<Vec<f64>> {
        let sh = self.layout.head_shard(shard)?;
        let hd = self.layout.head_dim() as usize;
        let ratio = self.layout.gqa_ratio() as usize;
        let row = sh.num_q_heads() as usize * hd;
        let mut out = vec![0f64; queries.len()];
        let mut q_base = 0;
        for s in &self.seqs {
            for qh in 0..sh.num_q_heads() as usize {
                let kv = sh.kv_heads().start as usize + qh / ratio;
                let (k, v) = (&s.k[layer as usize][kv], &s.v[layer as usize][kv]);
                for t in 0..s.q_len {
                    let at = (q_base + t) * row + qh * hd;
                    let q = &queries[at..at + hd];
                    let end = s.kv_len - s.q_len + t + 1;
                    let start = window.map_or(0, |w| end.saturating_sub(w as usize));
                    let scores: Vec<f64> = (start..end)
                        .map(|j| {
                            scale as f64
                                * q.iter()
                                    .zip(&k[j * hd..(j + 1) * hd])
                                    .map(|(a, b)| *a as f64 * *b as f64)
                                    .sum::<f64>()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| libm::exp(s - max)).collect();
                    let denom: f64 = w.iter().sum();
                    for d in 0..hd {
                        out[at + d] = (start..end)
                            .zip(&w)
                            .map(|(j, w)| w * v[j * hd + d] as f64)
                            .sum::<f64>()
                            / denom;
                    }
                }
            }
            q_base += s.q_len;
        }
        Ok(out)
    }
}

/// `vals`, whole blocks of `block_tokens` keys of `head_dim` elements each
/// stored token-major, with every block's keys reordered dim-major
/// ([`KeyOrder::DimMajor`](crate::KeyOrder)): what a dim-major page region
/// holds for the same keys.
///
/// ```
/// // Two blocks of two keys of three elements.
/// let keys = [0., 1., 2., 10., 11., 12., 20., 21., 22., 30., 31., 32.];
/// let dm = kvslice_core::testkit::dim_major_blocks(&keys, 2, 3);
/// assert_eq!(dm, [0., 10., 1., 11., 2., 12., 20., 30., 21., 31., 22., 32.]);
/// ```
///
/// # Panics
/// If `vals` is not whole blocks.
pub fn dim_major_blocks(vals: &[f32], block_tokens: usize, head_dim: usize) -> Vec<f32> {
    let block = block_tokens * head_dim;
    assert!(
        block > 0 && vals.len().is_multiple_of(block),
        "dim_major_blocks: {} values are not whole blocks of {block_tokens} × {head_dim}",
        vals.len()
    );
    let mut out = vec![0f32; vals.len()];
    for (src, dst) in vals.chunks_exact(block).zip(out.chunks_exact_mut(block)) {
        for (t, key) in src.chunks_exact(head_dim).enumerate() {
            for (c, &x) in key.iter().enumerate() {
                dst[c * block_tokens + t] = x;
            }
        }
    }
    out
}

/// Largest absolute difference over the largest magnitude of the oracle:
/// relative error in the max norm. NaN anywhere in `got` gives infinity.
pub fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "output lengths differ");
    if got.iter().any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let scale = want
        .iter()
        .fold(0f64, |m, x| m.max(x.abs()))
        .max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .fold(0f64, |m, (g, w)| m.max((*g as f64 - w).abs()))
        / scale
}

/// Whether every element satisfies `|got - want| <= atol + rtol·|want|`
/// (numpy's `allclose`); NaN never passes.
pub fn all_close(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (*g as f64 - w).abs() <= atol + rtol * w.abs())
}

/// Tolerances of the shared accuracy suite, per storage dtype, as
/// `(atol, rtol)`; f32 is held to a relative error in the max norm instead.
pub fn tolerance(dtype: crate::KvDtype) -> (f64, f64) {
    match dtype {
        crate::KvDtype::F32 => (0.0, 1e-5),
        crate::KvDtype::F16 => (1e-3, 1e-3),
        crate::KvDtype::Bf16 => (1e-3, 1.6e-2),
        // Engines read the same codes and scales as the reference; only
        // where the scale is applied (to a score or to each element) and
        // the order of the sums differ.
        crate::KvDtype::I8 | crate::KvDtype::F8E4M3 => (1e-3, 1e-3),
    }
}

/// The accuracy suite every backend runs: random inputs (never zeros) over
/// many shapes, page sizes 1, 16, 64 and 7, every dtype, decode and
/// causal prefill, with keys token-major and (page sizes 16, 64 and 7)
/// dim-major, compared with the [`ReferenceEngine`](crate::ReferenceEngine)
/// on the same pages (so both read the same rounded K/V). f32 must match to
/// 1e-5 relative error; f16, int8 and fp8 to atol 1e-3, rtol 1e-3; bf16
/// to atol 1e-3, rtol 1.6e-2 (vLLM's tolerances). NaN never passes. Returns the number of
/// comparisons made; panics with the case on a mismatch.
pub fn accuracy_suite<E: crate::AttentionEngine<PageBuf>>(engine: &E) -> usize {
    use crate::KeyOrder::{DimMajor, TokenMajor};
    accuracy_suite_on(
        engine,
        &[TokenMajor, DimMajor],
        &crate::KvDtype::ALL,
        |pages| pages.clone(),
    )
}

/// [`accuracy_suite`] over the key orders in `orders` and the dtypes in
/// `dtypes` for an engine whose pages live elsewhere (a device): `mirror`
/// copies each scenario's host pages into the engine's memory once, and
/// the engine then answers every batch of that scenario from its copy.
pub fn accuracy_suite_on<P, E: crate::AttentionEngine<P>>(
    engine: &E,
    orders: &[crate::KeyOrder],
    dtypes: &[crate::KvDtype],
    mut mirror: impl FnMut(&PageBuf) -> P,
) -> usize {
    use crate::{
        AttentionBatch, AttentionEngine, KeyOrder, LayerGrouping, LayoutSpec, ReferenceEngine,
    };
    // (layers, q heads, kv heads, head_dim, grouping, shards)
    let shapes: [(u32, u32, u32, u32, LayerGrouping, u32); 5] = [
        (1, 1, 1, 8, LayerGrouping::AllLayers, 1),
        (2, 4, 4, 16, LayerGrouping::PerLayer, 1),
        (2, 8, 2, 64, LayerGrouping::AllLayers, 1),
        (1, 12, 4, 32, LayerGrouping::AllLayers, 3),
        (1, 32, 8, 128, LayerGrouping::AllLayers, 1),
    ];
    let workloads: [&[(usize, usize)]; 3] = [
        &[(1, 1), (37, 1), (130, 1), (300, 1)], // decode
        &[(20, 20), (45, 13), (70, 64)],        // prefill, some after a cached prefix
        &[(9, 1), (33, 17), (200, 1)],          // mixed
    ];
    let mut rng = Rng::new(0x5eed);
    let mut checks = 0;
    let cases = orders.iter().flat_map(|&order| {
        // One-token pages store keys the same either way.
        let bts: &[u32] = match order {
            KeyOrder::TokenMajor => &[1, 16, 64, 7],
            KeyOrder::DimMajor => &[16, 64, 7],
        };
        bts.iter().map(move |&bt| (order, bt))
    });
    for (order, bt) in cases {
        for (si, &(layers, qh, kvh, hd, grouping, shards)) in shapes.iter().enumerate() {
            for &dtype in dtypes {
                let layout = KvLayout::new(
                    LayoutSpec::new(layers, qh, kvh, hd, bt, dtype)
                        .with_grouping(grouping)
                        .with_head_shards(shards)
                        .with_key_order(order),
                )
                .expect("valid suite layout");
                let seqs = workloads[(si + bt as usize) % workloads.len()];
                let sc = Scenario::random(layout, seqs, &mut rng).expect("scenario");
                let scale = 1.0 / libm::sqrtf(hd as f32);
                let memory = mirror(&sc.pages);
                for layer in 0..layers {
                    for shard in 0..shards {
                        let q = sc.random_queries(shard, &mut rng).expect("queries");
                        let table = sc.seq_attention(layer, shard).expect("tables");
                        let batch = AttentionBatch::new(layer, shard, &table, &q, scale);
                        let mut want = vec![0f32; q.len()];
                        ReferenceEngine
                            .attend(&sc.pages, &batch, &mut want)
                            .expect("reference");
                        let mut got = vec![f32::NAN; q.len()];
                        engine
                            .attend(&memory, &batch, &mut got)
                            .expect("engine accepts a valid batch");
                        let want64: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
                        let case = alloc::format!(
                            "shape {si} bt {bt} {dtype:?} {order:?} layer {layer} shard {shard}"
                        );
                        check_close(&case, dtype, &got, &want64);
                        checks += 1;
                    }
                }
            }
        }
    }
    checks
}

/// Windows [`window_suite_on`] tries for pages of `bt` tokens: one token,
/// seven, a page less one, a page, a page and one, and one longer than any
/// context (no window in effect).
pub fn suite_windows(bt: u32) -> Vec<u32> {
    let mut ws = vec![1, 7, bt.saturating_sub(1).max(1), bt, bt + 1, 10_000];
    ws.sort_unstable();
    ws.dedup();
    ws
}

/// The sliding-window suite every backend runs: page sizes 1, 7, 16 and
/// 64, windows from [`suite_windows`], every dtype, keys token-major and
/// dim-major (where `orders` has them), GQA 1 and 4, decode and causal
/// prefill (some after a cached prefix), with every block before the
/// windows a [`PageId::PLACEHOLDER`] (so a read of one fails). Compared
/// with [`Scenario::naive_f64_window`] at the [`accuracy_suite`]'s
/// tolerances. Returns the number of comparisons; panics with the case on
/// a mismatch. `dtypes` are the dtypes to try.
pub fn window_suite_on<P, E: crate::AttentionEngine<P>>(
    engine: &E,
    orders: &[crate::KeyOrder],
    dtypes: &[crate::KvDtype],
    mut mirror: impl FnMut(&PageBuf) -> P,
) -> usize {
    use crate::{AttentionBatch, KeyOrder, LayoutSpec};
    // (layers, q heads, kv heads, head_dim)
    let shapes: [(u32, u32, u32, u32); 2] = [(1, 2, 2, 8), (2, 8, 2, 64)];
    let workloads: [&[(usize, usize)]; 2] = [
        &[(1, 1), (37, 1), (300, 1), (130, 1)], // decode
        &[(150, 40), (70, 70), (9, 3)],         // prefill, some after a cached prefix
    ];
    let mut rng = Rng::new(0x3717);
    let mut checks = 0;
    for &order in orders {
        let bts: &[u32] = match order {
            KeyOrder::TokenMajor => &[1, 7, 16, 64],
            KeyOrder::DimMajor => &[7, 16, 64],
        };
        for &bt in bts {
            for (si, &(layers, qh, kvh, hd)) in shapes.iter().enumerate() {
                for &dtype in dtypes {
                    let layout = KvLayout::new(
                        LayoutSpec::new(layers, qh, kvh, hd, bt, dtype).with_key_order(order),
                    )
                    .expect("valid suite layout");
                    for (wi, window) in suite_windows(bt).into_iter().enumerate() {
                        let seqs = workloads[(wi + si) % workloads.len()];
                        let sc = Scenario::random(layout, seqs, &mut rng).expect("scenario");
                        let memory = mirror(&sc.pages);
                        let scale = 1.0 / libm::sqrtf(hd as f32);
                        for layer in 0..layers {
                            let q = sc.random_queries(0, &mut rng).expect("queries");
                            let tables = sc
                                .placeholder_tables(layer, 0, Some(window))
                                .expect("tables");
                            let seqs = sc.seq_attention_over(&tables);
                            let batch =
                                AttentionBatch::for_layer(layer, &seqs, &q, scale).window(window);
                            let mut got = vec![f32::NAN; q.len()];
                            engine
                                .attend(&memory, &batch, &mut got)
                                .expect("engine accepts a windowed batch");
                            let want = sc
                                .naive_f64_window(layer, 0, &q, scale, Some(window))
                                .expect("oracle");
                            let case = alloc::format!(
                                "shape {si} bt {bt} window {window} {dtype:?} {order:?} layer {layer}"
                            );
                            check_close(&case, dtype, &got, &want);
                            checks += 1;
                        }
                    }
                }
            }
        }
    }
    checks
}

/// Panics with `case` unless `got` matches `want` at the suite's
/// tolerance for `dtype`.
fn check_close(case: &str, dtype: crate::KvDtype, got: &[f32], want: &[f64]) {
    match dtype {
        crate::KvDtype::F32 => {
            let err = max_rel_err(got, want);
            assert!(err <= 1e-5, "{case}: relative error {err:e}");
        }
        _ => {
            let (atol, rtol) = tolerance(dtype);
            assert!(
                all_close(got, want, atol, rtol),
                "{case}: not within atol {atol}, rtol {rtol}"
            );
        }
    }
}
