//! The wgpu engine against the reference engine: the shared accuracy suite
//! (f32/f16/bf16 and the scaled int8/fp8, decode, prefill and mixed, page sizes 1/16/64/7; keys
//! token-major, as dim-major keys are a typed error here) through both
//! first-pass kernels, pages
//! split across many bindings, in-place K/V writes, and bad input and
//! device failures as typed errors.
//!
//! Without an adapter each test prints why and returns, unless
//! `KVSLICE_REQUIRE_GPU=1` (CI sets it), which turns that into a failure.

use kvslice_core::testkit::{Rng, Scenario, accuracy_suite_on, max_rel_err, window_suite_on};

use kvslice_core::{
    AttentionBatch, AttentionEngine, DeviceFailure, Error, KeyOrder, KvDtype, KvLayout, KvWrite,
    LayoutSpec, PageBuf, PageGeometry, PageId, ReferenceEngine, SeqAttention,
};
use kvslice_wgpu::WgpuEngine;

fn engine(test: &str) -> Option<WgpuEngine> {
    kvslice_wgpu::testing::engine_or_skip(test)
}

/// Whether `e` runs the kernel asked of it: an adapter without usable
/// subgroups quietly runs the one-key-per-thread kernel instead, which
/// the pass for the lane-group kernel reports as SKIPPED.
fn runs_asked_kernel(e: &WgpuEngine, subgroups: bool, test: &str) -> bool {
    let runs = e.subgroups() == subgroups;
    if !runs {
        println!("SKIPPED: {test}: the adapter has no usable subgroups for the lane-group kernel");
    }
    runs
}

/// Both first-pass kernels: lane groups with subgroup shuffles (where the
/// adapter has subgroups and the layout's rows are 16-byte aligned) and
/// one key per thread (every adapter; native f16 where available).
#[test]
fn suite_passes() {
    for subgroups in [true, false] {
        let Some(e) = engine("suite_passes") else {
            return;
        };
        let e = e.with_subgroups(subgroups);
        if !runs_asked_kernel(&e, subgroups, "suite_passes") {
            continue;
        }
        println!(
            "subgroups: {}, native f16: {}",
            e.subgroups(),
            e.native_f16()
        );
        let n = accuracy_suite_on(&e, &[KeyOrder::TokenMajor], &KvDtype::ALL, |host| {
            e.upload(host).expect("upload")
        });
        assert!(n > 100, "{n} checks");
    }
}

/// Sliding windows against the f64 oracle, the pages before every window
/// placeholders, with the default cut and with many small splits (a
/// window's edge inside and across splits), for both kernels.
#[test]
fn window_suite_passes() {
    let suite = |e: &WgpuEngine| {
        let n = window_suite_on(e, &[KeyOrder::TokenMajor], &KvDtype::ALL, |host| {
            e.upload(host).expect("upload")
        });
        assert!(n > 100, "{n} checks");
    };
    for subgroups in [true, false] {
        let Some(e) = engine("window_suite_passes") else {
            return;
        };
        let e = e.with_subgroups(subgroups);
        if !runs_asked_kernel(&e, subgroups, "window_suite_passes") {
            continue;
        }
        suite(&e);
        suite(&e.with_target_workgroups(100_000));
    }
}

/// The staging engine (host pages copied up per call) over the same
/// windows: the blocks before a window are placeholders, which it must not
/// try to copy.
#[test]
fn window_suite_passes_through_staging() {
    let Some(e) = engine("window_suite_passes_through_staging") else {
        return;
    };
    let staging = kvslice_wgpu::StagingEngine::new(e);
    let n = window_suite_on(&staging, &[KeyOrder::TokenMajor], &KvDtype::ALL, |host| {
        host.clone()
    });
    assert!(n > 100, "{n} checks");
}

/// Tiny splits (many workgroups per tile, so the merge runs) and about six
/// bindings per memory (chunk selection), for both kernels; the
/// one-key-per-thread kernel unpacks f16 from words here.
#[test]
fn suite_passes_with_unpacked_f16_and_pages_over_many_bindings() {
    for subgroups in [true, false] {
        let Some(e) = engine("suite_unpacked_many_bindings") else {
            return;
        };
        let e = e
            .with_subgroups(subgroups)
            .with_native_f16(false)
            .with_target_workgroups(100_000);
        if !runs_asked_kernel(&e, subgroups, "suite_unpacked_many_bindings") {
            continue;
        }
        let n = accuracy_suite_on(&e, &[KeyOrder::TokenMajor], &KvDtype::ALL, |host| {
            let per = host.num_pages().div_ceil(6).max(1);
            let mut pages = e
                .pages_in_bindings(*host.layout(), host.num_pages(), per)
                .expect("pages");
            assert!(pages.num_chunks() > 1 || host.num_pages() <= per);
            pages.upload_from(host).expect("upload");
            pages
        });
        assert!(n > 100, "{n} checks");
    }
}

#[test]
fn writes_in_place_match_the_host() {
    let Some(e) = engine("writes_in_place") else {
        return;
    };
    let mut rng = Rng::new(11);
    // Odd head_dim puts 16-bit rows across word boundaries; page size 3
    // makes writes straddle pages; two layers and shards pick regions.
    for dtype in KvDtype::ALL {
        for (hd, bt) in [(5u32, 3u32), (8, 16), (1, 1)] {
            let layout = KvLayout::new(
                LayoutSpec::new(2, 4, 4, hd, bt, dtype)
                    .with_grouping(kvslice_core::LayerGrouping::AllLayers)
                    .with_head_shards(2),
            )
            .unwrap();
            let mut host = PageBuf::new(layout, 12).unwrap();
            let mut dev = e.pages_in_bindings(layout, 12, 5).unwrap();
            let table: Vec<PageId> = [7u32, 2, 11, 0, 5, 9, 1, 3, 10, 4, 8, 6]
                .map(PageId)
                .to_vec();
            for (layer, shard, start, n) in [
                (0u32, 0u32, 0usize, 7usize),
                (1, 1, 2, 9),
                (0, 1, 5, 1),
                (1, 0, 0, 8),
            ] {
                let row = 2 * hd as usize; // two kv heads per shard
                let k = rng.vec(n * row);
                let mut v = rng.vec(n * row);
                // Scaled rows of large values, up to the 2^90 writes take
                // (`VALUE_LIMIT`): the scale's division far from 1.
                if dtype.is_scaled() && (layer, shard) == (1, 1) {
                    v.iter_mut().for_each(|x| *x *= 2f32.powi(89));
                }
                let w = KvWrite {
                    layer,
                    shard,
                    block_table: &table,
                    start,
                    k: &k,
                    v: &v,
                };
                ReferenceEngine.write_kv(&mut host, &w).unwrap();
                e.write_kv(&mut dev, &w).unwrap();
            }
            let back = dev.download().unwrap();
            // WGSL allows division 2.5 ulps off; IEEE division (lavapipe)
            // quantises exactly as the host. Elsewhere a scaled row may
            // differ by a code, and its scale by a few ulps.
            let exact = !dtype.is_scaled() || e.adapter().device_type == "Cpu";
            for p in 0..12 {
                use kvslice_core::PageMemory;
                if exact {
                    assert_eq!(
                        back.page(PageId(p)).unwrap(),
                        host.page(PageId(p)).unwrap(),
                        "{dtype:?} hd {hd} bt {bt} page {p}"
                    );
                } else {
                    assert_rows_within_a_code(&back, &host, PageId(p));
                }
            }
        }
    }
}

/// Every row of `page` reads back from `a` within one code step (the
/// row's scale times the largest gap between neighbouring codes) of `b`.
fn assert_rows_within_a_code(a: &PageBuf, b: &PageBuf, page: PageId) {
    use kvslice_core::{KvPart, read_head_rows};
    let l = *a.layout();
    let (bt, hd) = (l.block_tokens() as usize, l.head_dim() as usize);
    let (mut x, mut y) = (vec![0f32; bt * hd], vec![0f32; bt * hd]);
    for part in [KvPart::K, KvPart::V] {
        for layer in 0..l.layers_per_group() {
            for head in 0..l.num_kv_heads() / l.spec().head_shards {
                read_head_rows(a, page, part, layer, head, &mut x).unwrap();
                read_head_rows(b, page, part, layer, head, &mut y).unwrap();
                for (rx, ry) in x.chunks(hd).zip(y.chunks(hd)) {
                    let amax = ry.iter().fold(0f32, |m, v| m.max(v.abs()));
                    // int8 steps are amax/127; E4M3's widest is 32 of 448.
                    let step = amax
                        * if l.dtype() == KvDtype::I8 {
                            1.01 / 127.0
                        } else {
                            33.0 / 448.0
                        };
                    for (u, v) in rx.iter().zip(ry) {
                        assert!((u - v).abs() <= step, "{page:?} {part:?}: {u} vs {v}");
                    }
                }
            }
        }
    }
}

#[test]
fn long_context_decode_and_prefill_after_device_writes() {
    let Some(e) = engine("long_context") else {
        return;
    };
    // K/V written through the engine, then attention over a context split
    // across many workgroups, against dense f64 attention.
    let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, 16, KvDtype::F16)).unwrap();
    let mut rng = Rng::new(5);
    let sc = Scenario::random(layout, &[(2000, 1), (777, 5), (300, 300)], &mut rng).unwrap();
    let mut dev = e.pages(layout, sc.pages.num_pages()).unwrap();
    dev.upload_from(&sc.pages).unwrap();
    let q = sc.random_queries(0, &mut rng).unwrap();
    let table = sc.seq_attention(0, 0).unwrap();
    let batch = AttentionBatch::new(0, 0, &table, &q, 0.125);
    let want = sc.naive_f64(0, 0, &q, 0.125).unwrap();
    for target in [1, 64, 5000] {
        let e2 = WgpuEngine::new().unwrap().with_target_workgroups(target);
        let dev2 = e2.upload(&sc.pages).unwrap();
        let mut out = vec![f32::NAN; q.len()];
        e2.attend(&dev2, &batch, &mut out).unwrap();
        let err = max_rel_err(&out, &want);
        assert!(err < 1e-5, "target {target}: {err:e}");
    }
    let mut out = vec![f32::NAN; q.len()];
    e.attend(&dev, &batch, &mut out).unwrap();
    assert!(max_rel_err(&out, &want) < 1e-5);
}

#[test]
fn dim_major_keys_are_a_typed_error() {
    let Some(e) = engine("dim_major_keys") else {
        return;
    };
    let spec = LayoutSpec::new(1, 4, 1, 8, 16, KvDtype::F16).with_key_order(KeyOrder::DimMajor);
    let layout = KvLayout::new(spec).unwrap();
    assert!(matches!(e.pages(layout, 2), Err(Error::Unsupported(_))));
    let host = PageBuf::new(layout, 2).unwrap();
    assert!(matches!(e.upload(&host), Err(Error::Unsupported(_))));
}

#[test]
fn bad_batches_fail_before_compute() {
    let Some(e) = engine("bad_batches") else {
        return;
    };
    let layout = KvLayout::new(LayoutSpec::new(1, 4, 2, 8, 4, KvDtype::Bf16)).unwrap();
    let mut pages = e.pages(layout, 2).unwrap();
    let table = [PageId(0), PageId(1)];
    let q = vec![0.1f32; 4 * 8];
    let mut out = vec![7.0f32; 4 * 8];
    let seq = |block_table, kv_len| {
        [SeqAttention {
            block_table,
            kv_len,
            q_len: 1,
        }]
    };
    let past_pool = seq(&[PageId(0), PageId(2)][..], 8);
    let past_table = seq(&table[..], 9);
    let ok = seq(&table[..], 8);
    for (seqs, shard) in [(&past_pool, 0), (&past_table, 0), (&ok, 1)] {
        let b = AttentionBatch::new(0, shard, seqs, &q, 0.5);
        assert!(e.attend(&pages, &b, &mut out).is_err());
        assert!(out.iter().all(|&x| x == 7.0), "output touched");
    }
    // Head-count mismatch: queries for the wrong number of heads.
    let b = AttentionBatch::new(0, 0, &ok, &q[..16], 0.5);
    assert!(matches!(
        e.attend(&pages, &b, &mut out),
        Err(Error::ShapeMismatch { .. })
    ));
    // A write past the pool writes nothing.
    let kv = vec![1.0f32; 2 * 8];
    let w = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &[PageId(5)],
        start: 0,
        k: &kv,
        v: &kv,
    };
    assert!(e.write_kv(&mut pages, &w).is_err());
    assert!(pages.download().unwrap().page_bytes_all_zero());
    // Memory from another device is refused.
    let other = WgpuEngine::new().unwrap();
    let foreign = other.pages(layout, 2).unwrap();
    assert!(matches!(
        e.attend(&foreign, &AttentionBatch::new(0, 0, &ok, &q, 0.5), &mut out),
        Err(Error::InvalidValue(_))
    ));
}

#[test]
fn device_failures_are_typed() {
    let Some(e) = engine("device_failures") else {
        return;
    };
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 64, 16, KvDtype::F32)).unwrap();
    // More pages than the adapter's bindings can hold: out of memory,
    // reported before anything is allocated.
    let err = e.pages_in_bindings(layout, 1 << 20, 1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Device {
                kind: DeviceFailure::OutOfMemory,
                ..
            }
        ),
        "{err}"
    );
    // A lost device: every later call says so.
    let pages = e.pages(layout, 1).unwrap();
    e.destroy();
    let seqs = [SeqAttention {
        block_table: &[PageId(0)],
        kv_len: 1,
        q_len: 1,
    }];
    let q = [0.5f32; 64];
    let mut out = [0f32; 64];
    let err = e
        .attend(&pages, &AttentionBatch::new(0, 0, &seqs, &q, 1.0), &mut out)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Device {
                kind: DeviceFailure::Lost,
                ..
            }
        ),
        "{err}"
    );
}

trait AllZero {
    fn page_bytes_all_zero(&self) -> bool;
}

impl AllZero for PageBuf {
    fn page_bytes_all_zero(&self) -> bool {
        use kvslice_core::PageMemory;
        (0..self.num_pages()).all(|p| self.page(PageId(p)).unwrap().iter().all(|&b| b == 0))
    }
}
