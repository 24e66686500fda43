//! Fuzz harness (feature `fuzzing`): arbitrary small shapes, page sizes, key
//! orders, thread counts, split-K chunk sizes and contents through the CPU
//! engine, against the reference engine and dense f64 attention; non-finite
//! input is a typed error that leaves pages untouched; then one of the
//! engines-agree edge cases (extreme magnitudes, duplicate pages) with
//! arbitrary builder arguments; then the first case under a sliding window
//! with the pages before it released.

use arbitrary::Unstructured;
use kvslice_core::testkit::{Rng, Scenario, all_close, edge_cases, max_rel_err, tolerance};
use kvslice_core::{
    AttentionBatch, AttentionEngine, Error, KeyOrder, KvDtype, KvLayout, KvWrite, LayoutSpec,
    PageBuf, ReferenceEngine,
};

use crate::CpuEngine;

fn small(u: &mut Unstructured<'_>, lo: u32, hi: u32) -> u32 {
    u.int_in_range(lo..=hi).unwrap_or(lo)
}

/// Runs one attention case. Panics if an engine is wrong.
///
/// The case runs with keys token-major; a last input byte that asks for it
/// runs it again with keys dim-major, its pages of 16 or 32 tokens so that
/// the SIMD dim-major kernels can take whole blocks. Drawn last, that
/// choice leaves every earlier input (the committed corpus and its
/// regression seeds) the case it was.
pub fn attention(data: &[u8]) {
    if case(data, KeyOrder::TokenMajor) {
        case(data, KeyOrder::DimMajor);
    }
}

/// One case of [`attention`] with keys in `order`; returns whether the
/// input asks for the dim-major run.
fn case(data: &[u8], order: KeyOrder) -> bool {
    let mut u = Unstructured::new(data);
    let kv = small(&mut u, 1, 3);
    // Up to four query heads per kv head: GQA decode with four reaches the
    // four-row kernels.
    let ratio = small(&mut u, 1, 4);
    let dtype = KvDtype::ALL[small(&mut u, 0, 4) as usize];
    let (layers, hd, bt) = (
        small(&mut u, 1, 2),
        small(&mut u, 1, 16),
        small(&mut u, 1, 9),
    );
    let bt = match order {
        KeyOrder::TokenMajor => bt,
        KeyOrder::DimMajor => 16 * (1 + bt % 2),
    };
    let spec = LayoutSpec::new(layers, kv * ratio, kv, hd, bt, dtype)
        .with_head_shards(small(&mut u, 1, kv))
        .with_key_order(order);
    let layout = KvLayout::new(spec).expect("valid by construction");
    let seqs: Vec<(usize, usize)> = (0..small(&mut u, 1, 3))
        .map(|_| {
            let kv_len = small(&mut u, 1, 24) as usize;
            (kv_len, small(&mut u, 1, kv_len as u32) as usize)
        })
        .collect();
    let mut rng = Rng::new(u.arbitrary().unwrap_or(0));
    let mut sc = Scenario::random(layout, &seqs, &mut rng).expect("scenario fits");
    let layer = small(&mut u, 0, layout.num_layers() - 1);
    let shard = small(&mut u, 0, layout.num_head_shards() - 1);
    let mut q = sc.random_queries(shard, &mut rng).expect("shard in range");
    // Input-chosen query values, bounded so no intermediate can overflow.
    for x in q.iter_mut() {
        if let Ok(v) = u.arbitrary::<i16>() {
            *x = f32::from(v) / 4096.0;
        }
    }
    let table = sc.seq_attention(layer, shard).expect("in range");
    let scale = 1.0 / (layout.head_dim() as f32).sqrt();
    let batch = AttentionBatch::new(layer, shard, &table, &q, scale);

    let mut reference = vec![0f32; q.len()];
    ReferenceEngine
        .attend(&sc.pages, &batch, &mut reference)
        .expect("valid batch");
    assert!(
        reference.iter().all(|x| x.is_finite()),
        "NaN or inf from finite input"
    );
    // Outputs are averages of values in [-1, 1] and can cancel to nearly
    // zero (found by this fuzzer with head_dim 1), so errors are bounded in
    // absolute terms as well as relative ones.
    let want = sc.naive_f64(layer, shard, &q, scale).expect("in range");
    assert!(
        all_close(&reference, &want, 1e-6, 1e-5),
        "reference vs f64: max relative error {:e}",
        max_rel_err(&reference, &want)
    );

    let engine = CpuEngine::new()
        .with_threads(small(&mut u, 1, 3) as usize)
        .with_chunk_pages(small(&mut u, 0, 3) as usize)
        // Spans of small blocks from none (0) to past the eight-block cap.
        .with_span_keys(small(&mut u, 0, 80) as usize)
        // Query tiles from none (0) through one row to several tokens.
        .with_query_tile_rows(small(&mut u, 0, 40) as usize);
    // Any kernel set this CPU runs (the scalar one last), so that the
    // AVX2 set is fuzzed on machines that detect AVX-512 first.
    let sets = crate::Kernels::supported();
    let engine = engine.with_kernels(sets[small(&mut u, 0, sets.len() as u32 - 1) as usize]);
    let mut out = vec![f32::NAN; q.len()];
    engine
        .attend(&sc.pages, &batch, &mut out)
        .expect("valid batch");
    let reference: Vec<f64> = reference.iter().map(|&x| f64::from(x)).collect();
    if dtype == KvDtype::F32 {
        assert!(
            all_close(&out, &reference, 1e-6, 1e-5),
            "cpu vs reference: max relative error {:e}",
            max_rel_err(&out, &reference)
        );
    } else {
        let (atol, rtol) = tolerance(dtype);
        assert!(
            all_close(&out, &reference, atol, rtol),
            "cpu vs reference beyond atol {atol}, rtol {rtol}"
        );
    }

    // Non-finite queries and K/V are typed errors; pages stay as they were.
    let finite_q = q.clone();
    if let Some(x) = q.first_mut() {
        *x = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][small(&mut u, 0, 2) as usize];
        let bad = AttentionBatch::new(layer, shard, &table, &q, scale);
        for r in [
            ReferenceEngine.attend(&sc.pages, &bad, &mut out),
            engine.attend(&sc.pages, &bad, &mut out),
        ] {
            assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
        }
    }
    let before = sc.pages.bytes().to_vec();
    let heads = layout.head_shard(shard).expect("in range").num_kv_heads() as usize;
    let mut k = vec![0.5f32; heads * layout.head_dim() as usize];
    k[0] = f32::NAN;
    let block_table = sc.seqs[0].tables[0].clone();
    let w = KvWrite {
        layer: 0,
        shard,
        block_table: &block_table,
        start: 0,
        k: &k,
        v: &k,
    };
    assert!(matches!(
        ReferenceEngine.write_kv(&mut sc.pages, &w),
        Err(Error::InvalidValue(_))
    ));
    assert!(matches!(
        engine.write_kv(&mut sc.pages, &w),
        Err(Error::InvalidValue(_))
    ));
    assert_eq!(sc.pages.bytes(), &before[..]);
    let rerun = small(&mut u, 0, 1) == 1;
    // Drawn after everything above, so committed seeds keep their cases:
    // one engines-agree case (a named one, or extreme magnitudes from the
    // input) through a CPU engine with arbitrary builder arguments (any
    // usize, clamped), against the reference's outcome.
    let seed = u.arbitrary::<u64>().unwrap_or(0);
    let cases = edge_cases(seed, 1);
    let case = &cases[small(&mut u, 0, cases.len() as u32 - 1) as usize];
    let engine = CpuEngine::new()
        .with_kernels(sets[small(&mut u, 0, sets.len() as u32 - 1) as usize])
        .with_threads(small(&mut u, 1, 3) as usize)
        .with_chunk_pages(u.arbitrary().unwrap_or(0))
        .with_span_keys(u.arbitrary().unwrap_or(0))
        .with_query_tile_rows(u.arbitrary().unwrap_or(0));
    let mut pages = PageBuf::new(case.layout, case.pages).expect("small");
    let want = case.run(&ReferenceEngine, &mut pages);
    let mut pages = PageBuf::new(case.layout, case.pages).expect("small");
    let got = case.run(&engine, &mut pages);
    assert!(
        case.agrees(&got, &want, 1e-3),
        "{}: {got:?} vs {want:?}",
        case.name
    );
    // Drawn last as well: the first case again under a sliding window
    // (zero is a typed error), the blocks before every window placeholders,
    // both engines against the windowed f64 oracle.
    let window = small(&mut u, 0, 30);
    let tables = sc
        .placeholder_tables(layer, shard, Some(window.max(1)))
        .expect("in range");
    let seqs = sc.seq_attention_over(&tables);
    let batch = AttentionBatch::new(layer, shard, &seqs, &finite_q, scale).window(window);
    let want = sc
        .naive_f64_window(layer, shard, &finite_q, scale, Some(window))
        .expect("in range");
    for engine in [&engine as &dyn AttentionEngine<_>, &ReferenceEngine] {
        let r = engine.attend(&sc.pages, &batch, &mut out);
        if window == 0 {
            assert!(matches!(r, Err(Error::InvalidValue(_))), "{r:?}");
            continue;
        }
        r.expect("a windowed batch with placeholders before its windows");
        assert_near_oracle(dtype, &out, &want, &format!("window {window}"));
    }
    // Drawn last too, in this order: the first case's batch with int8
    // queries, which only int8 keys in dim-major blocks of four-row groups
    // take (where the CPU has them): within their rounding's error of the
    // oracle there, and the same output to the bit everywhere else; and
    // with decode's query rows as one group (`with_row_groups(false)`),
    // the path the groups replaced, against the oracle.
    let int8 = u.arbitrary::<bool>().unwrap_or(false);
    let together = u.arbitrary::<bool>().unwrap_or(false);
    // And after those, fp8 on bf16 dot products, which only E4M3 pages
    // take (where the CPU has them): within their rounding's error of the
    // oracle there, the same output to the bit everywhere else.
    let bf16 = u.arbitrary::<bool>().unwrap_or(false);
    if int8 || together || bf16 {
        let table = sc.seq_attention(layer, shard).expect("in range");
        let batch = AttentionBatch::new(layer, shard, &table, &finite_q, scale);
        let want = sc
            .naive_f64(layer, shard, &finite_q, scale)
            .expect("in range");
        // Each opt-in within 5% of the oracle where it takes the batch.
        let check = |on: &CpuEngine, takes: bool, what| {
            let opt_in = OptIn {
                engine: on,
                takes,
                bound: 5e-2,
                what,
            };
            opt_in.check(&engine, &sc.pages, &batch, &want);
        };
        if int8 {
            let rounded = engine.clone().with_int8_queries(true);
            let takes =
                rounded.int8_queries() && dtype == KvDtype::I8 && order == KeyOrder::DimMajor;
            check(&rounded, takes, "int8 queries");
        }
        if bf16 {
            let pairs = engine.clone().with_fp8_bf16(true);
            let takes = pairs.fp8_bf16() && dtype == KvDtype::F8E4M3;
            check(&pairs, takes, "fp8 on bf16");
            // The case's heads are at most 16 wide, and the bf16 weighted
            // sum takes multiples of 64: one GQA decode over fp8 pages of
            // width 64 too, its contents and lengths from the input.
            let mut rng = Rng::new(u.arbitrary::<u64>().unwrap_or(0));
            let spec = LayoutSpec::new(1, 8, 2, 64, 16, KvDtype::F8E4M3)
                .with_key_order(KeyOrder::DimMajor);
            let lens = [small(&mut u, 1, 70) as usize, small(&mut u, 1, 40) as usize];
            let sc = Scenario::random(
                KvLayout::new(spec).expect("valid"),
                &[(lens[0], 1), (lens[1], 1)],
                &mut rng,
            )
            .expect("small");
            let q = sc.random_queries(0, &mut rng).expect("in range");
            let table = sc.seq_attention(0, 0).expect("in range");
            let batch = AttentionBatch::new(0, 0, &table, &q, 0.125);
            let want = sc.naive_f64(0, 0, &q, 0.125).expect("in range");
            let opt_in = OptIn {
                engine: &pairs,
                takes: pairs.fp8_bf16(),
                bound: 1e-2,
                what: "fp8 on bf16, width 64",
            };
            opt_in.check(&engine, &sc.pages, &batch, &want);
        }
        if together {
            engine
                .clone()
                .with_row_groups(false)
                .attend(&sc.pages, &batch, &mut out)
                .expect("valid batch");
            assert_near_oracle(dtype, &out, &want, "rows together");
        }
    }
    rerun
}

/// An engine option that rounds something (int8 queries, fp8 on bf16
/// products), as [`OptIn::check`] holds it.
struct OptIn<'e> {
    /// The engine with the option asked for.
    engine: &'e CpuEngine,
    /// Whether the option takes the batch.
    takes: bool,
    /// The largest relative error (max norm) from the oracle it may make.
    bound: f64,
    what: &'static str,
}

impl OptIn<'_> {
    /// Panics unless the option's output is within `bound` of `want` where
    /// it takes the batch, and `base`'s to the bit everywhere else.
    fn check(&self, base: &CpuEngine, pages: &PageBuf, batch: &AttentionBatch<'_>, want: &[f64]) {
        let n = batch.queries.len();
        let (mut plain, mut out) = (vec![f32::NAN; n], vec![f32::NAN; n]);
        base.attend(pages, batch, &mut plain).expect("valid batch");
        self.engine
            .attend(pages, batch, &mut out)
            .expect("valid batch");
        if self.takes {
            let err = max_rel_err(&out, want);
            assert!(
                err < self.bound,
                "{}: max relative error {err:e}",
                self.what
            );
        } else {
            assert_eq!(out, plain, "{} where nothing takes it", self.what);
        }
    }
}

/// Panics with `what` unless `got` is within the suite's tolerance for
/// `dtype` of the f64 oracle's `want` (f32: 1e-6 absolute, 1e-5 relative).
fn assert_near_oracle(dtype: KvDtype, got: &[f32], want: &[f64], what: &str) {
    let (atol, rtol) = match dtype {
        KvDtype::F32 => (1e-6, 1e-5),
        _ => tolerance(dtype),
    };
    assert!(
        all_close(got, want, atol, rtol),
        "{what}: max relative error {:e}",
        max_rel_err(got, want)
    );
}
