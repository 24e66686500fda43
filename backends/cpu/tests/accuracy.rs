//! The CPU engine against the reference engine: the shared accuracy suite,
//! with every kernel set the CPU runs, one thread and forced split-K; and
//! bad input rejected before any compute.

use kvslice_core::testkit::{Rng, Scenario, accuracy_suite, max_rel_err, window_suite_on};
use kvslice_core::{
    AttentionBatch, AttentionEngine, Error, KeyOrder, KvDtype, KvLayout, LayoutSpec, PageBuf,
    PageId, SeqAttention,
};
use kvslice_cpu::{CpuEngine, FourRowKernels, Kernels};

#[test]
fn every_kernel_set_passes_the_suite() {
    // A run that exists for one set (`KVSLICE_REQUIRE_KERNELS`, as under the
    // AVX-512 emulator, where every instruction is slow) tests only that
    // set; `required_kernels_are_detected` fails if it is missing.
    let required = std::env::var("KVSLICE_REQUIRE_KERNELS").ok();
    let wanted = |k: &Kernels| required.as_deref().is_none_or(|r| r == k.name);
    for k in Kernels::supported().into_iter().filter(wanted) {
        println!("kernels: {}", k.name);
        assert!(accuracy_suite(&CpuEngine::new().with_kernels(k)) > 100);
    }
}

/// Sliding windows against the f64 oracle (every kernel set, both key
/// orders, every dtype, windows of 1, 7, a page and either side of it,
/// and longer than the context), with the pages before every window
/// replaced by placeholders, so that reading one fails.
#[test]
fn every_kernel_set_passes_the_window_suite() {
    let required = std::env::var("KVSLICE_REQUIRE_KERNELS").ok();
    let wanted = |k: &Kernels| required.as_deref().is_none_or(|r| r == k.name);
    let orders = [KeyOrder::TokenMajor, KeyOrder::DimMajor];
    for k in Kernels::supported().into_iter().filter(wanted) {
        let n = window_suite_on(
            &CpuEngine::new().with_kernels(k),
            &orders,
            &KvDtype::ALL,
            |p| p.clone(),
        );
        println!("kernels: {} windows: {n} checks", k.name);
        assert!(n > 100);
    }
}

/// Windows inside and across query tiles, split-K chunks and spans of
/// several blocks, with one thread and several: the window's edge falls
/// mid-block, mid-span and mid-tile.
#[test]
fn windows_across_tiles_chunks_and_spans_agree() {
    let mut rng = Rng::new(37);
    type Case = (u32, u32, u32, &'static [(usize, usize)]);
    let cases: [Case; 3] = [
        (8, 2, 16, &[(300, 300), (120, 37), (1000, 1), (64, 4)]),
        (4, 4, 5, &[(90, 61), (7, 7), (333, 2)]),
        (4, 1, 16, &[(150, 100), (300, 3)]),
    ];
    for (qh, kvh, bt, seqs) in cases {
        let layout = KvLayout::new(LayoutSpec::new(1, qh, kvh, 32, bt, KvDtype::F16)).unwrap();
        let engines = [
            CpuEngine::new(),
            CpuEngine::new().with_query_tile_rows(0).with_threads(1),
            CpuEngine::new().with_query_tile_rows(1).with_threads(1),
            CpuEngine::new().with_query_tile_rows(7).with_span_keys(0),
            CpuEngine::new()
                .with_query_tile_rows(40)
                .with_span_keys(1000)
                .with_threads(3)
                .with_chunk_pages(2),
        ];
        for window in [1, 3, bt, 2 * bt + 3, 100, 5000] {
            agree_with_oracle_windowed(layout, seqs, &mut rng, &engines, Some(window));
        }
    }
}

/// `KVSLICE_REQUIRE_KERNELS=<name>` (set where a run exists to test one
/// instruction set, as the AVX-512 emulator run does) fails unless that
/// set is the one detected, so it cannot pass on a fallback.
#[test]
fn required_kernels_are_detected() {
    let detected = Kernels::detect().name;
    match std::env::var("KVSLICE_REQUIRE_KERNELS") {
        Ok(want) => assert_eq!(detected, want, "KVSLICE_REQUIRE_KERNELS"),
        Err(_) => println!(
            "KVSLICE_REQUIRE_KERNELS unset: detected {detected}, \
             supported {:?}",
            Kernels::supported()
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
        ),
    }
}

/// Row groups of up to four (decode, and short speculative runs of 2–4
/// query tokens) go through tasks that take every kv head of a page, with
/// the causal diagonal inside them; the suite's workloads have no such
/// multi-token runs, so this covers them, chunked and not.
#[test]
fn short_query_runs_over_every_head_agree() {
    let mut rng = Rng::new(11);
    // (q heads, kv heads, tokens per page, sequences as (kv_len, q_len))
    type Case = (u32, u32, u32, &'static [(usize, usize)]);
    let cases: [Case; 3] = [
        (8, 4, 16, &[(300, 2), (33, 1), (2, 2)]),
        (4, 4, 7, &[(100, 4), (5, 3), (64, 4)]),
        (8, 2, 16, &[(129, 1), (16, 1)]),
    ];
    for (qh, kvh, bt, seqs) in cases {
        let layout = KvLayout::new(LayoutSpec::new(1, qh, kvh, 32, bt, KvDtype::F16)).unwrap();
        let engines = [
            CpuEngine::new(),
            CpuEngine::new().with_threads(1),
            CpuEngine::new().with_threads(3).with_chunk_pages(1),
        ];
        agree_with_oracle(layout, seqs, &mut rng, &engines);
    }
}

/// Decode, and short runs of query tokens (as speculative decoding
/// verifies), with any number of query heads per kv head go through the
/// four-row kernels in groups of four rows, the last group padded: every
/// group size from 1 to 9, runs of 1 to 30 tokens (exactly the grouping
/// limit of 64 rows, and past it), every kernel set, dtype and key order,
/// with and without a window, split into one-page chunks and into tiles
/// (of 5 rows, all grouped; of 80, whose last tile alone is grouped) and
/// not, with 4-token pages where a group's rows see none of a block, agree
/// with the f64 oracle.
#[test]
fn short_runs_of_every_group_size_agree() {
    use kvslice_core::testkit::{all_close, tolerance};
    let required = std::env::var("KVSLICE_REQUIRE_KERNELS").ok();
    let wanted = |k: &Kernels| required.as_deref().is_none_or(|r| r == k.name);
    let mut rng = Rng::new(23);
    let mut checks = 0;
    for k in Kernels::supported().into_iter().filter(wanted) {
        // Int8 queries in row groups: in their own test, against their
        // rounding.
        let engines = [
            CpuEngine::new().with_kernels(k),
            CpuEngine::new()
                .with_kernels(k)
                .with_threads(3)
                .with_chunk_pages(1),
            CpuEngine::new().with_kernels(k).with_query_tile_rows(5),
            // Only the run of 30 tokens at 4 per kv head has tiles of
            // more than 64 rows (of 80, the last of 40).
            CpuEngine::new().with_kernels(k).with_query_tile_rows(80),
        ];
        for ratio in 1..=9u32 {
            let engines = &engines[..if ratio == 4 { 4 } else { 3 }];
            for dtype in KvDtype::ALL {
                for order in [KeyOrder::TokenMajor, KeyOrder::DimMajor] {
                    let bt = if ratio % 3 == 0 { 4 } else { 16 };
                    let spec =
                        LayoutSpec::new(1, 2 * ratio, 2, 32, bt, dtype).with_key_order(order);
                    let layout = KvLayout::new(spec).unwrap();
                    let seqs: &[(usize, usize)] = match ratio {
                        4 => &[(300, 2), (200, 16), (100, 30), (90, 1)],
                        r if r % 2 == 1 => &[(300, 1), (37, 1), (5, 1), (140, 9)],
                        _ => &[(300, 2), (37, 3), (3, 3), (90, 1)],
                    };
                    let sc = Scenario::random(layout, seqs, &mut rng).unwrap();
                    let q = sc.random_queries(0, &mut rng).unwrap();
                    for window in [None, Some(40)] {
                        let tables = sc.placeholder_tables(0, 0, window).unwrap();
                        let table = sc.seq_attention_over(&tables);
                        let mut batch = AttentionBatch::new(0, 0, &table, &q, 0.17);
                        batch.window = window;
                        let want = sc.naive_f64_window(0, 0, &q, 0.17, window).unwrap();
                        let (atol, rtol) = tolerance(dtype);
                        for engine in engines {
                            let mut out = vec![f32::NAN; q.len()];
                            engine.attend(&sc.pages, &batch, &mut out).unwrap();
                            let case = format!(
                                "{} GQA {ratio} {dtype:?} {order:?} window {window:?}: {engine:?}",
                                k.name
                            );
                            if dtype == KvDtype::F32 {
                                let err = max_rel_err(&out, &want);
                                assert!(err <= 1e-5, "{case}: {err:e}");
                            } else {
                                assert!(all_close(&out, &want, atol, rtol), "{case}");
                            }
                            checks += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checks > 100, "{checks} checks");
}

/// Four rows that see whole blocks (GQA 4 decode; four query tokens of
/// one head, two of GQA 2) take small blocks in spans: spans of every
/// length the block sizes allow (up to the eight-block cap, and single
/// blocks with spans off), cut by chunk ends and by the causal diagonal,
/// all agree with the oracle.
#[test]
fn spans_of_small_blocks_agree() {
    let mut rng = Rng::new(5);
    // (q heads, kv heads, sequences as (kv_len, q_len))
    type Case = (u32, u32, &'static [(usize, usize)]);
    let cases: [Case; 3] = [
        (8, 2, &[(517, 1), (64, 1), (3, 1)]),
        (2, 2, &[(300, 4), (9, 4)]),
        (4, 2, &[(250, 2), (40, 2)]),
    ];
    for (qh, kvh, seqs) in cases {
        for bt in [1u32, 3, 16, 20, 64] {
            let layout = KvLayout::new(LayoutSpec::new(1, qh, kvh, 32, bt, KvDtype::F16)).unwrap();
            let engines = [
                CpuEngine::new(),
                CpuEngine::new().with_span_keys(0),
                CpuEngine::new().with_span_keys(40).with_threads(1),
                CpuEngine::new()
                    .with_span_keys(1000)
                    .with_threads(3)
                    .with_chunk_pages(5),
            ];
            agree_with_oracle(layout, seqs, &mut rng, &engines);
        }
    }
}

/// Long queries (prefill) are cut into tiles of query rows, each a task
/// over the keys it sees: tiles of one token, of a few tokens (also fewer
/// rows than the GQA group, and a row count the group does not divide),
/// the default and none, with the causal diagonal inside and across
/// tiles and split-K chunks, and spans of blocks widened together (off,
/// default, the eight-block cap), all agree with the oracle.
#[test]
fn query_tiles_agree() {
    let mut rng = Rng::new(17);
    // (q heads, kv heads, tokens per page, sequences as (kv_len, q_len))
    type Case = (u32, u32, u32, &'static [(usize, usize)]);
    let cases: [Case; 4] = [
        (8, 2, 16, &[(300, 300), (120, 37), (64, 1)]),
        (4, 4, 5, &[(90, 61), (7, 7)]),
        (6, 2, 16, &[(200, 130)]),
        // One kv head: a sequence's tiles follow each other in one head.
        (4, 1, 16, &[(150, 100), (30, 30)]),
    ];
    for (qh, kvh, bt, seqs) in cases {
        let layout = KvLayout::new(LayoutSpec::new(1, qh, kvh, 32, bt, KvDtype::F16)).unwrap();
        let engines = [
            CpuEngine::new(),
            CpuEngine::new().with_query_tile_rows(0),
            CpuEngine::new().with_query_tile_rows(1).with_threads(1),
            CpuEngine::new().with_query_tile_rows(7).with_span_keys(0),
            CpuEngine::new()
                .with_query_tile_rows(40)
                .with_span_keys(1000)
                .with_threads(3)
                .with_chunk_pages(2),
        ];
        agree_with_oracle(layout, seqs, &mut rng, &engines);
    }
}

/// Runs `engines` on one random scenario of `layout` with `seqs` (as
/// `(kv_len, q_len)`), keys token-major and dim-major, and asserts each
/// within 1e-5 of the f64 oracle.
fn agree_with_oracle(
    layout: KvLayout,
    seqs: &[(usize, usize)],
    rng: &mut Rng,
    engines: &[CpuEngine],
) {
    agree_with_oracle_windowed(layout, seqs, rng, engines, None);
}

/// [`agree_with_oracle`] under an attention window, the blocks before
/// every window placeholders.
fn agree_with_oracle_windowed(
    layout: KvLayout,
    seqs: &[(usize, usize)],
    rng: &mut Rng,
    engines: &[CpuEngine],
    window: Option<u32>,
) {
    for order in [KeyOrder::TokenMajor, KeyOrder::DimMajor] {
        let layout = KvLayout::new(layout.spec().with_key_order(order)).unwrap();
        let sc = Scenario::random(layout, seqs, rng).unwrap();
        let q = sc.random_queries(0, rng).unwrap();
        let tables = sc.placeholder_tables(0, 0, window).unwrap();
        let table = sc.seq_attention_over(&tables);
        let mut batch = AttentionBatch::new(0, 0, &table, &q, 0.17);
        batch.window = window;
        let want = sc.naive_f64_window(0, 0, &q, 0.17, window).unwrap();
        for engine in engines {
            let mut out = vec![f32::NAN; q.len()];
            engine.attend(&sc.pages, &batch, &mut out).unwrap();
            let err = max_rel_err(&out, &want);
            assert!(
                err < 1e-5,
                "{layout:?}, {seqs:?}, window {window:?}, {engine:?}: {err:e}"
            );
        }
    }
}

/// Heads of 72 elements (a multiple of 8, not of 16: every kernel's
/// tail) with groups of 7 and 16 query heads per kv head, over a
/// thousand tokens cut into one-page chunks, agree with the f64 oracle.
#[test]
fn wide_groups_and_odd_head_widths_agree() {
    use kvslice_core::testkit::{all_close, tolerance};
    let required = std::env::var("KVSLICE_REQUIRE_KERNELS").ok();
    let wanted = |k: &Kernels| required.as_deref().is_none_or(|r| r == k.name);
    let mut rng = Rng::new(41);
    for k in Kernels::supported().into_iter().filter(wanted) {
        let engines = [
            CpuEngine::new().with_kernels(k),
            CpuEngine::new().with_kernels(k).with_chunk_pages(1),
        ];
        for ratio in [7u32, 16] {
            for (dtype, order) in [
                (KvDtype::F16, KeyOrder::DimMajor),
                (KvDtype::F32, KeyOrder::TokenMajor),
                (KvDtype::I8, KeyOrder::DimMajor),
            ] {
                let spec = LayoutSpec::new(1, 2 * ratio, 2, 72, 16, dtype).with_key_order(order);
                let layout = KvLayout::new(spec).unwrap();
                let sc = Scenario::random(layout, &[(1000, 1), (333, 3)], &mut rng).unwrap();
                let q = sc.random_queries(0, &mut rng).unwrap();
                let table = sc.seq_attention(0, 0).unwrap();
                let batch = AttentionBatch::new(0, 0, &table, &q, 0.11);
                let want = sc.naive_f64(0, 0, &q, 0.11).unwrap();
                let (atol, rtol) = tolerance(dtype);
                for engine in &engines {
                    let mut out = vec![f32::NAN; q.len()];
                    engine.attend(&sc.pages, &batch, &mut out).unwrap();
                    let case = format!("{} GQA {ratio} {dtype:?} {order:?}: {engine:?}", k.name);
                    // f32 pages: to the scale of the output, as elsewhere
                    // (an element near zero has no relative precision).
                    if dtype == KvDtype::F32 {
                        let err = max_rel_err(&out, &want);
                        assert!(err <= 1e-5, "{case}: {err:e}");
                    } else {
                        assert!(all_close(&out, &want, atol, rtol), "{case}");
                    }
                }
            }
        }
    }
}

#[test]
fn split_k_and_thread_counts_agree() {
    // One page per chunk forces many partials to be merged; one thread and
    // many threads must give the same answer up to rounding.
    // Under Miri, which interprets every step, narrower heads and shorter
    // contexts: still many chunks per sequence, merged across threads.
    let (head_dim, seqs): (u32, &[(usize, usize)]) = if cfg!(miri) {
        (8, &[(48, 1), (30, 3)])
    } else {
        (64, &[(1000, 1), (777, 5), (50, 50)])
    };
    let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, head_dim, 16, KvDtype::F16)).unwrap();
    let mut rng = Rng::new(3);
    let sc = Scenario::random(layout, seqs, &mut rng).unwrap();
    let q = sc.random_queries(0, &mut rng).unwrap();
    let table = sc.seq_attention(0, 0).unwrap();
    let batch = AttentionBatch::new(0, 0, &table, &q, 0.125);
    let want = sc.naive_f64(0, 0, &q, 0.125).unwrap();
    for engine in [
        CpuEngine::new().with_threads(1),
        CpuEngine::new().with_threads(4).with_chunk_pages(1),
        CpuEngine::new().with_threads(2).with_chunk_pages(3),
    ] {
        let mut out = vec![f32::NAN; q.len()];
        engine.attend(&sc.pages, &batch, &mut out).unwrap();
        let err = max_rel_err(&out, &want);
        assert!(err < 1e-5, "{engine:?}: {err:e}");
    }
}

#[test]
fn bad_batches_fail_before_compute() {
    let layout = KvLayout::new(LayoutSpec::new(1, 4, 2, 8, 4, KvDtype::Bf16)).unwrap();
    let pages = PageBuf::new(layout, 2).unwrap();
    let table = [PageId(0), PageId(1)];
    let q = vec![0.1f32; 4 * 8];
    let mut out = vec![7.0f32; 4 * 8];
    let e = CpuEngine::new();
    let cases: [(Vec<SeqAttention<'_>>, u32); 4] = [
        (
            vec![SeqAttention {
                block_table: &[PageId(0), PageId(2)],
                kv_len: 8,
                q_len: 1,
            }],
            0,
        ),
        (
            vec![SeqAttention {
                block_table: &table,
                kv_len: 9,
                q_len: 1,
            }],
            0,
        ),
        (
            vec![SeqAttention {
                block_table: &table,
                kv_len: 8,
                q_len: 1,
            }],
            1,
        ),
        (
            vec![SeqAttention {
                block_table: &table,
                kv_len: 0,
                q_len: 1,
            }],
            0,
        ),
    ];
    for (seqs, shard) in cases {
        let r = e.attend(
            &pages,
            &AttentionBatch::new(0, shard, &seqs, &q, 0.5),
            &mut out,
        );
        assert!(
            matches!(
                r,
                Err(Error::OutOfRange { .. } | Error::ContextPastTable { .. })
            ),
            "{r:?}"
        );
        assert!(
            out.iter().all(|&x| x == 7.0),
            "output touched before the error"
        );
    }
    let ok = [SeqAttention {
        block_table: &table,
        kv_len: 8,
        q_len: 1,
    }];
    let r = e.attend(
        &pages,
        &AttentionBatch::new(0, 0, &ok, &q[..16], 0.5),
        &mut out,
    );
    assert!(
        matches!(r, Err(Error::ShapeMismatch { .. })),
        "head-count mismatch: {r:?}"
    );
}

/// Dim-major keys in whole blocks of 16 reach the four-row dim-major
/// kernel (GQA 4 decode), and a partial last block goes through the
/// general path alone, with both results right.
#[test]
fn dim_major_decode_takes_the_dim_major_kernel() {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kvslice_cpu::SoftmaxState;

    static INNER: OnceLock<FourRowKernels> = OnceLock::new();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    fn counted(
        dtype: KvDtype,
        q: &[f32],
        keys: &[&[u8]],
        scales: &[f32],
        w: &mut [f32],
        state: SoftmaxState<'_>,
        ahead: &[&[u8]],
    ) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        (INNER.get().unwrap().scores_softmax_dim_major)(dtype, q, keys, scales, w, state, ahead);
    }
    let Some(mut set) = Kernels::supported()
        .into_iter()
        .find(|k| k.stored.is_some_and(|s| s.four_rows.is_some()))
    else {
        println!("no four-row kernels on this CPU: nothing to count");
        return;
    };
    let stored = set.stored.as_mut().unwrap();
    let four = stored.four_rows.as_mut().unwrap();
    INNER.set(*four).ok();
    four.scores_softmax_dim_major = counted;
    let engine = CpuEngine::new().with_kernels(set).with_threads(1);
    let spec = LayoutSpec::new(1, 8, 2, 32, 16, KvDtype::F16).with_key_order(KeyOrder::DimMajor);
    let layout = KvLayout::new(spec).unwrap();
    let mut rng = Rng::new(23);
    // 128 keys: two spans of four whole blocks per kv head; 120 keys: a
    // span of four whole blocks, one of three, and the partial block alone
    // on the general path.
    for (kv_len, calls) in [(128usize, 4usize), (120, 4)] {
        CALLS.store(0, Ordering::Relaxed);
        agree_with_oracle(
            layout,
            &[(kv_len, 1)],
            &mut rng,
            std::slice::from_ref(&engine),
        );
        // `agree_with_oracle` runs token-major keys too, which never count.
        assert_eq!(CALLS.load(Ordering::Relaxed), calls, "kv_len {kv_len}");
    }
}

/// Each query row (`d` elements, already times the softmax scale) as the
/// int8-query kernels round it: to int8 against its largest magnitude, in
/// f32 with ties to even, then back to f32.
fn rounded_queries(q: &[f32], d: usize, scale: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(q.len());
    for row in q.chunks_exact(d) {
        let row: Vec<f32> = row.iter().map(|x| x * scale).collect();
        let top = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        let (inv, unit) = if top > 0.0 {
            (127.0 / top, top / 127.0)
        } else {
            (0.0, 0.0)
        };
        out.extend(row.iter().map(|x| (x * inv).round_ties_even() * unit));
    }
    out
}

/// The kernel sets this CPU runs (only `required`, if named) whose
/// four-row kernels have what `has` asks for.
fn sets_with(required: Option<&str>, has: impl Fn(&FourRowKernels) -> bool) -> Vec<Kernels> {
    Kernels::supported()
        .into_iter()
        .filter(|k| required.is_none_or(|r| r == k.name))
        .filter(|k| k.stored.and_then(|s| s.four_rows).is_some_and(|f| has(&f)))
        .collect()
}

/// (head width, block, query heads for 2 kv heads) of the opt-in
/// kernels' tests: GQA 4, and 3, 1 and 6 through the row groups; widths
/// of 128 and 64 (the byte and bf16 weighted sums) and 32 (the f32 one),
/// blocks of 16 (one load per four dims) and 32.
const GQA_SHAPES: [(u32, usize, u32); 6] = [
    (128, 16, 8),
    (64, 32, 8),
    (32, 16, 8),
    (128, 16, 6),
    (64, 16, 2),
    (32, 32, 12),
];

/// Int8 keys scored against int8 queries ([`CpuEngine::with_int8_queries`])
/// give the oracle's attention for the rounded queries (whole blocks, so
/// every score takes the int8 kernel), and stay near the unrounded
/// queries' with a partial last block on f32 queries; [`GQA_SHAPES`].
#[test]
fn int8_queries_give_the_attention_of_their_rounding() {
    let required = std::env::var("KVSLICE_REQUIRE_KERNELS").ok();
    let sets = sets_with(required.as_deref(), |f| f.int8_queries.is_some());
    if sets.is_empty() {
        // A run that exists for a VNNI set must not skip what it is for.
        assert!(
            !required
                .as_deref()
                .is_some_and(|r| r.ends_with("+vnni+vbmi")),
            "KVSLICE_REQUIRE_KERNELS={required:?} has no int8-query kernels"
        );
        println!("SKIPPED: no kernel set here scores int8 queries (needs AVX-512 VNNI and VBMI)");
        return;
    }
    let mut rng = Rng::new(41);
    let scale = 0.09;
    for k in sets {
        for (hd, bt, qh) in GQA_SHAPES {
            let spec = LayoutSpec::new(1, qh, 2, hd, bt as u32, KvDtype::I8)
                .with_key_order(KeyOrder::DimMajor);
            let layout = KvLayout::new(spec).unwrap();
            for (seqs, whole) in [
                (vec![(20 * bt, 1), (3 * bt, 1), (bt, 1)], true),
                (vec![(7 * bt + 5, 1), (bt + 1, 1)], false),
            ] {
                let sc = Scenario::random(layout, &seqs, &mut rng).unwrap();
                let q = sc.random_queries(0, &mut rng).unwrap();
                let table = sc.seq_attention(0, 0).unwrap();
                let batch = AttentionBatch::new(0, 0, &table, &q, scale);
                let exact = sc.naive_f64(0, 0, &q, scale).unwrap();
                let rounded = rounded_queries(&q, hd as usize, scale);
                let of_rounded = sc.naive_f64(0, 0, &rounded, 1.0).unwrap();
                for engine in [
                    CpuEngine::new().with_kernels(k).with_int8_queries(true),
                    CpuEngine::new()
                        .with_kernels(k)
                        .with_int8_queries(true)
                        .with_threads(1)
                        .with_span_keys(bt),
                ] {
                    assert!(engine.int8_queries());
                    let mut out = vec![f32::NAN; q.len()];
                    engine.attend(&sc.pages, &batch, &mut out).unwrap();
                    let (to_exact, to_rounded) =
                        (max_rel_err(&out, &exact), max_rel_err(&out, &of_rounded));
                    let case = format!("{} d={hd} bt={bt} qh={qh} {seqs:?} {engine:?}", k.name);
                    println!("{case}: {to_exact:.2e} from f32 queries, {to_rounded:.2e} from int8");
                    assert!(to_exact < 5e-2, "{case}: {to_exact:e} from f32 queries");
                    if whole {
                        // The rounding shows, and nothing else does.
                        assert!(
                            to_rounded < 2e-5,
                            "{case}: {to_rounded:e} from int8 queries"
                        );
                        assert!(to_exact > 1e-4, "{case}: queries not rounded?");
                    }
                }
            }
        }
    }
}

/// Fp8 pages on bf16 dot products ([`CpuEngine::with_fp8_bf16`]) against
/// the f64 oracle over the same codes: within the rounding of the query
/// rows and the softmax weights to bf16 (2^-8 of each), and not the
/// engine's f32 kernels' results (the path was taken); [`GQA_SHAPES`],
/// whole blocks and a partial last one.
#[test]
fn fp8_on_bf16_stays_within_its_rounding() {
    let required = std::env::var("KVSLICE_REQUIRE_KERNELS").ok();
    let sets = sets_with(required.as_deref(), |f| f.fp8_bf16.is_some());
    if sets.is_empty() {
        println!(
            "SKIPPED: no kernel set here has fp8 on bf16 dot products (needs AVX-512 BF16, VNNI and VBMI)"
        );
        return;
    }
    let mut rng = Rng::new(43);
    let scale = 0.09;
    for k in sets {
        for (hd, bt, qh) in GQA_SHAPES {
            let spec = LayoutSpec::new(1, qh, 2, hd, bt as u32, KvDtype::F8E4M3)
                .with_key_order(KeyOrder::DimMajor);
            let layout = KvLayout::new(spec).unwrap();
            for seqs in [
                vec![(20 * bt, 1), (3 * bt, 1), (bt, 1)],
                vec![(7 * bt + 5, 1), (bt + 1, 1)],
            ] {
                let sc = Scenario::random(layout, &seqs, &mut rng).unwrap();
                let q = sc.random_queries(0, &mut rng).unwrap();
                let table = sc.seq_attention(0, 0).unwrap();
                let batch = AttentionBatch::new(0, 0, &table, &q, scale);
                let exact = sc.naive_f64(0, 0, &q, scale).unwrap();
                let mut f32_out = vec![f32::NAN; q.len()];
                let f32_engine = CpuEngine::new().with_kernels(k);
                f32_engine.attend(&sc.pages, &batch, &mut f32_out).unwrap();
                let f32_err = max_rel_err(&f32_out, &exact);
                for engine in [
                    f32_engine.clone().with_fp8_bf16(true),
                    f32_engine
                        .clone()
                        .with_fp8_bf16(true)
                        .with_threads(1)
                        .with_span_keys(bt),
                ] {
                    assert!(engine.fp8_bf16());
                    let mut out = vec![f32::NAN; q.len()];
                    engine.attend(&sc.pages, &batch, &mut out).unwrap();
                    let err = max_rel_err(&out, &exact);
                    let case = format!("{} d={hd} bt={bt} qh={qh} {seqs:?} {engine:?}", k.name);
                    println!("{case}: {err:.2e} from the oracle (f32 kernels {f32_err:.2e})");
                    assert!(err < 5e-3, "{case}: {err:e}");
                    assert_ne!(out, f32_out, "{case}: the bf16 kernels did not run");
                }
            }
        }
    }
}
