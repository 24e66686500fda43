//! CPU paged attention: decode bandwidth against a STREAM-like read loop
//! and (with `--features candle`) candle's CPU flash attention, and prefill
//! GFLOP/s (with query tiles, and without) against the machine's measured
//! FMA peak, all in one run.
//!
//! Decode workload (the issue's): 32 query heads, 8 kv heads, head_dim 128,
//! f16 K/V in 16-token pages, batch 8, contexts 1k, 8k and 32k; and one
//! sequence at 256 and 1k tokens, on every core and on one thread.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench cpu_attention                    # kvslice + read loop + FMA peak
//! cargo bench -p kvslice-benches --bench cpu_attention --features candle  # + candle (builds candle)
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvslice_benches::decode_workload::{
    BATCH, BLOCK, CPU_KEY_ORDER, HEAD_DIM, KV_HEADS, Q_HEADS, cached_tables, decode_seqs, fill,
    kv_bytes, layout,
};
use kvslice_benches::read_loop::{in_parts, stream_read};
use kvslice_core::testkit::{Rng, dim_major_blocks, max_rel_err};
use kvslice_core::{
    AttentionBatch, AttentionEngine, KeyOrder, KvDtype, PageBuf, PageId, SeqAttention,
};
use kvslice_cpu::{CpuEngine, Kernels, SoftmaxState};

/// An engine for every SIMD set this CPU runs other than `engine`'s (AVX2
/// on an AVX-512 machine), by name, so that the sets are compared on the
/// same work in one run.
fn other_simd_sets(engine: &CpuEngine) -> Vec<(String, CpuEngine)> {
    Kernels::supported()
        .into_iter()
        .filter(|k| k.name != engine.kernels().name && k.name != Kernels::scalar().name)
        .map(|k| (k.name.to_string(), CpuEngine::new().with_kernels(k)))
        .collect()
}

fn decode(c: &mut Criterion) {
    let engine = CpuEngine::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "kvslice-cpu kernels: {}, {threads} threads",
        engine.kernels().name
    );
    let others = other_simd_sets(&engine);
    let mut g = c.benchmark_group("decode_f16_32q8kv_d128_b8");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for ctx in [1024usize, 8192, 32768] {
        let (pages, tables) = fill(ctx, false, CPU_KEY_ORDER);
        // The same values with keys token-major: decode over them is the
        // row the key order is judged by, and candle copies them.
        let (tm_pages, _) = fill(ctx, false, KeyOrder::TokenMajor);
        let kv_bytes = kv_bytes(ctx);
        g.throughput(Throughput::Bytes(kv_bytes));
        let seqs = decode_seqs(&tables, ctx);
        let mut rng = Rng::new(9);
        let q = rng.vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
        let mut out = vec![0f32; q.len()];
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        g.bench_function(BenchmarkId::new("kvslice_cpu", ctx), |b| {
            b.iter(|| {
                engine
                    .attend(
                        &pages,
                        &AttentionBatch::new(0, 0, &seqs, &q, scale),
                        &mut out,
                    )
                    .unwrap()
            })
        });
        g.bench_function(BenchmarkId::new("kvslice_cpu_token_major", ctx), |b| {
            b.iter(|| {
                engine
                    .attend(
                        &tm_pages,
                        &AttentionBatch::new(0, 0, &seqs, &q, scale),
                        &mut out,
                    )
                    .unwrap()
            })
        });
        for (name, other) in &others {
            g.bench_function(BenchmarkId::new(format!("kvslice_cpu_{name}"), ctx), |b| {
                b.iter(|| {
                    other
                        .attend(
                            &pages,
                            &AttentionBatch::new(0, 0, &seqs, &q, scale),
                            &mut out,
                        )
                        .unwrap()
                })
            });
        }
        // The compute ceiling: the same work with every block table cycling
        // over its sequence's first two pages (1 MiB in all, cache-resident).
        let hot = cached_tables(&tables);
        let hot_seqs = decode_seqs(&hot, ctx);
        g.bench_function(BenchmarkId::new("kvslice_cpu_cached", ctx), |b| {
            b.iter(|| {
                engine
                    .attend(
                        &pages,
                        &AttentionBatch::new(0, 0, &hot_seqs, &q, scale),
                        &mut out,
                    )
                    .unwrap()
            })
        });
        // The same number of bytes, read as fast as the cores can.
        let all = pages.bytes();
        let span = &all[..(kv_bytes as usize).min(all.len())];
        g.bench_function(BenchmarkId::new("stream_read", ctx), |b| {
            b.iter(|| black_box(stream_read(span, threads)))
        });
        #[cfg(feature = "candle")]
        candle_peer::bench(&mut g, ctx, &tm_pages, &tables, &q, scale);
        if interleaved_wanted() {
            let batch = AttentionBatch::new(0, 0, &seqs, &q, scale);
            let hot_batch = AttentionBatch::new(0, 0, &hot_seqs, &q, scale);
            // Eight tokens fewer, so that each sequence's last block is
            // half full, as most decode steps' are (0.1% fewer bytes at
            // 8k than the read loop's, which the ratio ignores).
            let partial_seqs = decode_seqs(&tables, ctx - 8);
            let partial_batch = AttentionBatch::new(0, 0, &partial_seqs, &q, scale);
            let mut partial_out = vec![0f32; q.len()];
            let mut hot_out = vec![0f32; q.len()];
            let blockwise = CpuEngine::new().with_span_keys(0);
            let mut block_out = vec![0f32; q.len()];
            // The same pages in a random order across the batch, as a
            // serving pool's free list hands them out after evictions (the
            // read loop still reads them in address order).
            let mut ids = tables.concat();
            Rng::new(ctx as u64 + 1).shuffle(&mut ids);
            let scattered: Vec<Vec<PageId>> = ids
                .chunks(tables[0].len())
                .map(<[PageId]>::to_vec)
                .collect();
            let scattered_seqs = decode_seqs(&scattered, ctx);
            let scattered_batch = AttentionBatch::new(0, 0, &scattered_seqs, &q, scale);
            let mut scattered_out = vec![0f32; q.len()];
            // Both key orders hold the same values: their decodes agree.
            let (mut dm_out, mut tm_out) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            engine.attend(&pages, &batch, &mut dm_out).unwrap();
            engine.attend(&tm_pages, &batch, &mut tm_out).unwrap();
            let tm64: Vec<f64> = tm_out.iter().map(|&x| f64::from(x)).collect();
            let err = max_rel_err(&dm_out, &tm64);
            assert!(err < 1e-5, "decode over dim-major keys disagrees: {err:e}");
            let mut steps: Vec<Step<'_>> = vec![
                (
                    "decode".into(),
                    Box::new(|| {
                        engine.attend(&pages, &batch, &mut out).unwrap();
                        black_box(&out);
                    }),
                ),
                // What the key order is worth, in the same rounds.
                (
                    "decode, token-major keys".into(),
                    Box::new(|| {
                        engine.attend(&tm_pages, &batch, &mut tm_out).unwrap();
                        black_box(&tm_out);
                    }),
                ),
                // The compute ceiling row, in the same rounds: decode's
                // time with its memory traffic taken away (mostly).
                (
                    "decode, cache-resident pages".into(),
                    Box::new(|| {
                        engine.attend(&pages, &hot_batch, &mut hot_out).unwrap();
                        black_box(&hot_out);
                    }),
                ),
                // What spans of four blocks gain over one kernel call
                // per block, in the same rounds.
                (
                    "decode, one block per call".into(),
                    Box::new(|| {
                        blockwise.attend(&pages, &batch, &mut block_out).unwrap();
                        black_box(&block_out);
                    }),
                ),
                (
                    "decode, last block half full".into(),
                    Box::new(|| {
                        engine
                            .attend(&pages, &partial_batch, &mut partial_out)
                            .unwrap();
                        black_box(&partial_out);
                    }),
                ),
                (
                    "decode, pages in random order".into(),
                    Box::new(|| {
                        engine
                            .attend(&pages, &scattered_batch, &mut scattered_out)
                            .unwrap();
                        black_box(&scattered_out);
                    }),
                ),
            ];
            // What a kernel with only decode's unavoidable arithmetic
            // reaches (`ideal_kernel`), in the same rounds: fed by the
            // kernels' prefetches, and by the hardware prefetchers alone.
            #[cfg(target_arch = "x86_64")]
            if ideal_kernel::supported() {
                steps.push((
                    "ideal kernel, software prefetch".into(),
                    Box::new(|| ideal_kernel::run::<true>(span, threads)),
                ));
                steps.push((
                    "ideal kernel, hardware prefetch in address order".into(),
                    Box::new(|| ideal_kernel::run::<false>(span, threads)),
                ));
            }
            // Decode's own engine (its tasks, order, segments and paired
            // prefetches) with four-row kernels that do only the ideal
            // kernel's arithmetic: what the engine allows kernels of that
            // cost, and, against decode, what decode's kernels cost beyond
            // it (streaming and cache-resident).
            #[cfg(target_arch = "x86_64")]
            if ideal_kernel::supported() {
                for (what, batch) in [
                    ("decode's engine, ideal kernels", &batch),
                    (
                        "decode's engine, ideal kernels, cache-resident pages",
                        &hot_batch,
                    ),
                ] {
                    let ideal =
                        CpuEngine::new().with_kernels(ideal_kernel::in_engine(*engine.kernels()));
                    let (pages, mut out) = (&pages, vec![0f32; q.len()]);
                    steps.push((
                        what.into(),
                        Box::new(move || {
                            ideal.attend(pages, batch, &mut out).unwrap();
                            black_box(&out);
                        }),
                    ));
                }
            }
            // The other SIMD sets' decode, in the same rounds.
            for (name, other) in &others {
                let (pages, batch, mut out) = (&pages, &batch, vec![0f32; q.len()]);
                steps.push((
                    format!("decode, {name} kernels"),
                    Box::new(move || {
                        other.attend(pages, batch, &mut out).unwrap();
                        black_box(&out);
                    }),
                ));
            }
            let group = Q_HEADS / KV_HEADS;
            let fpb = decode_flops_per_byte(group, layout().dtype().size_bytes());
            interleaved(ctx, span, threads, fpb, &mut steps);
        }
    }
    g.finish();
}

/// One sequence's decode step at short contexts, on every core and on one
/// thread: calls this small are where starting the second thread's work
/// costs as much as the work (docs/notes/cpu-decode.md).
fn decode_small(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_small_f16_32q8kv_d128_b1");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let engines = [
        ("kvslice_cpu", CpuEngine::new()),
        ("kvslice_cpu_1thread", CpuEngine::new().with_threads(1)),
    ];
    for ctx in [256usize, 1024] {
        let (pages, tables) = fill(ctx, false, CPU_KEY_ORDER);
        let seqs = decode_seqs(&tables[..1], ctx);
        g.throughput(Throughput::Bytes(kv_bytes(ctx) / BATCH as u64));
        let q = Rng::new(9).vec((Q_HEADS * HEAD_DIM) as usize);
        let mut out = vec![0f32; q.len()];
        let batch = AttentionBatch::new(0, 0, &seqs, &q, 1.0 / (HEAD_DIM as f32).sqrt());
        for (name, engine) in &engines {
            g.bench_function(BenchmarkId::new(*name, ctx), |b| {
                b.iter(|| engine.attend(&pages, &batch, &mut out).unwrap())
            });
        }
    }
    g.finish();
}

/// One step of [`interleaved`]: its name and its work.
type Step<'a> = (String, Box<dyn FnMut() + 'a>);

/// Rounds of the interleaved decode-against-read-loop measurement.
const INTERLEAVED_ROUNDS: usize = 21;

/// Whether to run [`interleaved`]: with no bench filter, or one naming it
/// (`cargo bench ... -- interleaved` runs only it, quickly).
fn interleaved_wanted() -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // `decode` or the group's name, not `decode_small` (another group).
    filters.is_empty()
        || filters.iter().any(|f| {
            f.contains("interleaved")
                || "decode_f16_32q8kv_d128_b8".starts_with(f.as_str())
                || f.starts_with("decode_f16")
        })
}

/// Each step against the read loop, all alternating, one step or pass
/// each per round (the steps' order rotating from round to round), so
/// that all see the same machine: on a shared VM whose
/// bandwidth drifts by ±20% over a minute, separate runs a minute apart
/// make the ratio meaningless. Prints each step's median, the read loop's
/// and their ratio, and each later step against the first (when the
/// first is decode and a later one the same work on cache-resident
/// pages, that says how much of decode's time memory still adds).
///
/// Each round also times a short FMA trial, for the rate no f32 kernel
/// can pass: `flops_per_byte` (of K/V read) at the best trial's GFLOP/s.
/// Where 80% of the read loop is most of that ceiling, the target is out
/// of reach on this host at this time whatever the memory access does.
fn interleaved(
    ctx: usize,
    span: &[u8],
    threads: usize,
    flops_per_byte: f64,
    steps: &mut [Step<'_>],
) {
    let mut times = vec![Vec::new(); steps.len()];
    let mut read = Vec::new();
    let mut peak = None::<f64>;
    for round in 0..INTERLEAVED_ROUNDS {
        // About 3 ms: short enough to sit in every round.
        if let Some(p) = fma_peak::trial(threads, 2_000_000) {
            peak = Some(peak.map_or(p, |q| q.max(p)));
        }
        // Each round starts one step later, so that no step always runs
        // right after the trial: at 1k, decode in that place ran at
        // 0.70–0.87× the same work elsewhere in the round.
        let n = steps.len();
        for i in (0..n).map(|i| (i + round) % n) {
            let start = std::time::Instant::now();
            (steps[i].1)();
            times[i].push(start.elapsed().as_secs_f64());
            let start = std::time::Instant::now();
            black_box(stream_read(span, threads));
            read.push(start.elapsed().as_secs_f64());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let gib = |secs: f64| span.len() as f64 / secs / (1u64 << 30) as f64;
    let r = gib(median(&mut read));
    let rates: Vec<f64> = times.iter_mut().map(|t| gib(median(t))).collect();
    for ((what, _), d) in steps.iter().zip(&rates) {
        eprintln!(
            "interleaved ctx {ctx}: {what} {d:.2} GiB/s, read loop {r:.2} GiB/s, \
             ratio {:.0}% (medians of {INTERLEAVED_ROUNDS} alternating rounds)",
            100.0 * d / r
        );
    }
    for ((what, _), d) in steps.iter().zip(&rates).skip(1) {
        eprintln!(
            "interleaved ctx {ctx}: {} / {what}: {:.0}%",
            steps[0].0,
            100.0 * rates[0] / d
        );
    }
    if let Some(p) = peak {
        let ceiling = p * 1e9 / flops_per_byte / (1u64 << 30) as f64;
        eprintln!(
            "interleaved ctx {ctx}: FMA ceiling for {}: {ceiling:.2} GiB/s ({flops_per_byte} \
             flops per K/V byte at {p:.1} GFLOP/s, the best of the rounds' trials); 80% of \
             the read loop is {:.0}% of it",
            steps[0].0,
            80.0 * r / ceiling
        );
    }
}

/// Flops per byte of K/V that decode spends at `group` query heads per kv
/// head with `elem_bytes`-byte elements: an FMA (2 flops) per element, row
/// and kernel (scores, weighted sum).
fn decode_flops_per_byte(group: u32, elem_bytes: usize) -> f64 {
    2.0 * group as f64 / elem_bytes as f64
}

#[cfg(feature = "candle")]
mod candle_peer;

#[cfg(target_arch = "x86_64")]
mod ideal_kernel;

mod fma_peak;

fn prefill(c: &mut Criterion) {
    let engine = CpuEngine::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peak = fma_peak::gflops(threads);
    let n = 2048usize;
    let per_seq = n.div_ceil(BLOCK as usize);
    let l = layout();
    let mut pages = PageBuf::new(l, per_seq as u32).unwrap();
    let table: Vec<PageId> = (0..per_seq as u32).map(PageId).collect();
    let mut rng = Rng::new(5);
    let kv = rng.vec(n * (KV_HEADS * HEAD_DIM) as usize);
    engine
        .write_kv(
            &mut pages,
            &kvslice_core::KvWrite {
                layer: 0,
                shard: 0,
                block_table: &table,
                start: 0,
                k: &kv,
                v: &kv,
            },
        )
        .unwrap();
    let q = rng.vec(n * (Q_HEADS * HEAD_DIM) as usize);
    let mut out = vec![0f32; q.len()];
    let seqs = [SeqAttention {
        block_table: &table,
        kv_len: n,
        q_len: n,
    }];
    // Causal: each query head does QK and PV over on average n/2 keys.
    let flops =
        2.0 * 2.0 * (n as f64) * (n as f64 + 1.0) / 2.0 * f64::from(HEAD_DIM) * f64::from(Q_HEADS);
    let mut g = c.benchmark_group("prefill_f16_32q8kv_d128_2048");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(flops as u64));
    // The same prefill with every query row of a kv head in one task
    // (no query tiles), so that what tiles gain is measured in this run.
    let untiled = CpuEngine::new().with_query_tile_rows(0);
    let mut rows = vec![
        ("kvslice_cpu".to_string(), engine.clone()),
        ("kvslice_cpu_untiled".to_string(), untiled),
    ];
    rows.extend(
        other_simd_sets(&engine)
            .into_iter()
            .map(|(name, e)| (format!("kvslice_cpu_{name}"), e)),
    );
    for (name, engine) in &rows {
        g.bench_function(name, |b| {
            b.iter(|| {
                engine
                    .attend(
                        &pages,
                        &AttentionBatch::new(0, 0, &seqs, &q, 0.088),
                        &mut out,
                    )
                    .unwrap()
            })
        });
    }
    g.finish();
    // Trials before and after the prefill rows, seconds apart: one window
    // of five read 102 GFLOP/s (half the machine) on a shared VM.
    let peak = peak
        .into_iter()
        .chain(fma_peak::gflops(threads))
        .reduce(f64::max);
    match peak {
        Some(p) => eprintln!(
            "measured FMA peak: {p:.1} GFLOP/s on {threads} threads (prefill 'elements' above are flops)"
        ),
        None => eprintln!("no AVX2+FMA: FMA peak not measured"),
    }
}

/// The four-row decode kernels alone, per SIMD set, on one thread: 64 f16
/// keys of 128 elements (one span, 16 KiB of K and of V, L1-resident)
/// against four query rows, handed over as decode does: four 16-key pages,
/// each paired with a page of another buffer (the next head's, in decode)
/// whose lines the kernels prefetch. Per key each takes 64 eight-lane
/// FMAs, so the FMA floor (printed from the one-thread peak) is the same
/// for both and for every set; a set far above it, or above another set,
/// shows here before it hides in decode's memory time (a closure that
/// could not be inlined once made AVX-512's scores 6.5x slower than
/// AVX2's).
fn four_row_kernels(c: &mut Criterion) {
    const KEYS: usize = 64;
    let d = HEAD_DIM as usize;
    let mut rng = Rng::new(11);
    let mut k = vec![0u8; KEYS * d * 2];
    let mut v = vec![0u8; KEYS * d * 2];
    let mut next = vec![0u8; KEYS * d * 2];
    let kf = rng.vec(KEYS * d);
    KvDtype::F16.encode_row(&kf, &mut k).unwrap();
    KvDtype::F16.encode_row(&rng.vec(KEYS * d), &mut v).unwrap();
    KvDtype::F16
        .encode_row(&rng.vec(KEYS * d), &mut next)
        .unwrap();
    let page = BLOCK as usize * d * 2;
    // The same keys dim-major, block by block.
    let mut kt = vec![0u8; KEYS * d * 2];
    KvDtype::F16
        .encode_row(&dim_major_blocks(&kf, BLOCK as usize, d), &mut kt)
        .unwrap();
    let (k, kt, v, next): (Vec<_>, Vec<_>, Vec<_>, Vec<_>) = (
        k.chunks(page).collect(),
        kt.chunks(page).collect(),
        v.chunks(page).collect(),
        next.chunks(page).collect(),
    );
    let q: Vec<f32> = rng.vec(4 * d).iter().map(|x| x * 0.1).collect();
    if let Some(peak) = fma_peak::gflops(1) {
        // 64 FMAs of 8 lanes, 2 flops each, per key and kernel.
        eprintln!(
            "four-row kernels: FMA floor {:.2} ns per key (one-thread peak {peak:.1} GFLOP/s)",
            64.0 * 8.0 * 2.0 / peak
        );
    }
    let mut g = c.benchmark_group("four_row_kernels_f16_d128_64keys");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(KEYS as u64));
    for set in Kernels::supported() {
        let Some(fk) = set.stored.and_then(|s| s.four_rows) else {
            continue;
        };
        let mut w = vec![0f32; 4 * KEYS];
        let (mut max, mut sum, mut rescale) = ([0f32; 4], [0f32; 4], [0f32; 4]);
        // The same keys token-major and dim-major.
        for (what, scores_softmax, keys) in [
            ("scores_softmax", fk.scores_softmax, &k),
            ("scores_softmax_dim_major", fk.scores_softmax_dim_major, &kt),
        ] {
            g.bench_function(BenchmarkId::new(what, set.name), |b| {
                b.iter(|| {
                    // A fresh state each call, so that the sums stay finite.
                    (max, sum) = ([f32::NEG_INFINITY; 4], [0.0; 4]);
                    let state = SoftmaxState {
                        max: &mut max,
                        sum: &mut sum,
                        rescale: &mut rescale,
                    };
                    scores_softmax(KvDtype::F16, &q, keys, &[], &mut w, state, &next);
                    black_box(&w);
                })
            });
        }
        let mut acc = vec![0f32; 4 * d];
        g.bench_function(BenchmarkId::new("weighted_sum", set.name), |b| {
            b.iter(|| {
                (fk.weighted_sum)(KvDtype::F16, &w, &v, &mut acc, &next);
                black_box(&acc);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, decode, decode_small, prefill, four_row_kernels);
criterion_main!(benches);
