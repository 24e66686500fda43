//! The reference engine against dense, unpaged f64 attention, and its
//! input checks.

use kvslice_core::testkit::{Rng, Scenario, max_rel_err, window_suite_on};
use kvslice_core::{
    AttentionBatch, AttentionEngine, Error, KeyOrder, KvDtype, KvLayout, KvPart, KvWrite,
    LayerGrouping, LayoutSpec, PageBuf, PageId, PageMemory, PagePool, PageView, ReferenceEngine,
    SeqAttention, read_head_rows,
};

/// (layers, q heads, kv heads, head_dim, grouping, shards)
const SHAPES: [(u32, u32, u32, u32, LayerGrouping, u32); 5] = [
    (1, 1, 1, 8, LayerGrouping::AllLayers, 1),
    (2, 4, 4, 16, LayerGrouping::PerLayer, 1),
    (3, 8, 2, 32, LayerGrouping::Groups(2), 1),
    (2, 12, 4, 64, LayerGrouping::AllLayers, 3),
    (1, 16, 2, 128, LayerGrouping::AllLayers, 2),
];

fn check(dtype: KvDtype, bt: u32, seqs: &[(usize, usize)], seed: u64) {
    let mut rng = Rng::new(seed);
    let orders = [KeyOrder::TokenMajor, KeyOrder::DimMajor];
    for (&(layers, qh, kvh, hd, grouping, shards), order) in SHAPES
        .iter()
        .flat_map(|s| orders.iter().map(move |o| (s, *o)))
    {
        let layout = KvLayout::new(
            LayoutSpec::new(layers, qh, kvh, hd, bt, dtype)
                .with_grouping(grouping)
                .with_head_shards(shards)
                .with_key_order(order),
        )
        .unwrap();
        let sc = Scenario::random(layout, seqs, &mut rng).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        for layer in 0..layers {
            for shard in 0..shards {
                let q = sc.random_queries(shard, &mut rng).unwrap();
                let table = sc.seq_attention(layer, shard).unwrap();
                let mut out = vec![f32::NAN; q.len()];
                ReferenceEngine
                    .attend(
                        &sc.pages,
                        &AttentionBatch::new(layer, shard, &table, &q, scale),
                        &mut out,
                    )
                    .unwrap();
                let want = sc.naive_f64(layer, shard, &q, scale).unwrap();
                let err = max_rel_err(&out, &want);
                assert!(
                    err <= 1e-5,
                    "{dtype:?} {order:?} bt={bt} shape={:?} layer={layer} shard={shard}: rel err {err:e}",
                    (layers, qh, kvh, hd, grouping, shards)
                );
            }
        }
    }
}

/// Sliding windows: the shared window suite (placeholders before every
/// window, so a read of one fails), then the bad input a window brings.
#[test]
#[cfg_attr(
    miri,
    ignore = "numeric suite over safe code (engine, PageBuf); too slow under Miri"
)]
fn windows_match_naive_f64() {
    let n = window_suite_on(
        &ReferenceEngine,
        &[KeyOrder::TokenMajor, KeyOrder::DimMajor],
        &KvDtype::ALL,
        |p| p.clone(),
    );
    assert!(n > 100, "{n} checks");
}

#[test]
fn windows_refuse_zero_and_placeholders_they_need() {
    // Pages of 4 tokens; 6 tokens of context, decode at position 5.
    let (pages, table) = small();
    let q = [0.5f32; 16];
    let mut out = [0f32; 16];
    let seqs = [SeqAttention {
        block_table: &table,
        kv_len: 6,
        q_len: 1,
    }];
    let zero = AttentionBatch::for_layer(1, &seqs, &q, 1.0).window(0);
    assert_eq!(
        ReferenceEngine.attend(&pages, &zero, &mut out),
        Err(Error::InvalidValue(
            "attention window must be at least one token"
        ))
    );
    // Block 0 released, but a window of 3 reads keys 3..=5.
    let released = [PageId::PLACEHOLDER, table[1]];
    let seqs = [SeqAttention {
        block_table: &released,
        kv_len: 6,
        q_len: 1,
    }];
    let wide = AttentionBatch::for_layer(1, &seqs, &q, 1.0).window(3);
    assert_eq!(
        ReferenceEngine.attend(&pages, &wide, &mut out),
        Err(Error::ReleasedBlockRead { block: 0, first: 0 })
    );
    // A window of 2 reads keys 4..=5, block 1 only.
    let narrow = AttentionBatch::for_layer(1, &seqs, &q, 1.0).window(2);
    ReferenceEngine.attend(&pages, &narrow, &mut out).unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
    // Writing token 3 reaches released block 0: refused, nothing written;
    // token 6 lands in block 1.
    let mut pages = pages;
    let before = pages.bytes().to_vec();
    let row = [0.25f32; 2 * 4];
    let write = |start| KvWrite {
        layer: 1,
        shard: 0,
        block_table: &released,
        start,
        k: &row,
        v: &row,
    };
    assert_eq!(
        ReferenceEngine.write_kv(&mut pages, &write(3)),
        Err(Error::ReleasedBlockWrite { block: 0 })
    );
    assert_eq!(pages.bytes(), &before[..]);
    ReferenceEngine.write_kv(&mut pages, &write(6)).unwrap();
}

#[test]
#[cfg_attr(
    miri,
    ignore = "numeric suite over safe code (engine, PageBuf); too slow under Miri"
)]
fn decode_matches_naive_f64() {
    for (i, bt) in [1u32, 16, 7].into_iter().enumerate() {
        for (j, dtype) in KvDtype::ALL.into_iter().enumerate() {
            check(
                dtype,
                bt,
                &[(1, 1), (33, 1), (16, 1), (70, 1)],
                (i * 5 + j) as u64,
            );
        }
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "numeric suite over safe code (engine, PageBuf); too slow under Miri"
)]
fn causal_prefill_matches_naive_f64() {
    for (i, bt) in [1u32, 16, 7].into_iter().enumerate() {
        for (j, dtype) in KvDtype::ALL.into_iter().enumerate() {
            // Full prefill, prefill after a cached prefix, and a mix with decode.
            check(
                dtype,
                bt,
                &[(20, 20), (45, 13), (9, 1), (17, 16)],
                100 + (i * 5 + j) as u64,
            );
        }
    }
}

#[test]
fn mask_is_bottom_right_aligned() {
    // One token of context per query step: query i of q_len must see keys
    // 0..=kv_len-q_len+i, so the first query of a (kv 3, q 2) batch sees
    // two keys, not one.
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, 4, KvDtype::F32)).unwrap();
    let mut pages = PageBuf::new(layout, 1).unwrap();
    let table = [PageId(0)];
    let w = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &table,
        start: 0,
        k: &[0.0, 0.0, 0.0],
        v: &[1.0, 2.0, 6.0],
    };
    ReferenceEngine.write_kv(&mut pages, &w).unwrap();
    let seqs = [SeqAttention {
        block_table: &table,
        kv_len: 3,
        q_len: 2,
    }];
    let mut out = [0.0f32; 2];
    ReferenceEngine
        .attend(
            &pages,
            &AttentionBatch::new(0, 0, &seqs, &[1.0, 1.0], 1.0),
            &mut out,
        )
        .unwrap();
    assert_eq!(out, [1.5, 3.0]);
}

#[test]
fn dim_major_keys_are_stored_transposed() {
    // Two kv heads of 3 elements, 4-token pages; tokens 1..6 written, so
    // the write starts mid-page and crosses into the second page.
    let spec = LayoutSpec::new(1, 2, 2, 3, 4, KvDtype::F32).with_key_order(KeyOrder::DimMajor);
    let layout = KvLayout::new(spec).unwrap();
    let mut pages = PageBuf::new(layout, 2).unwrap();
    let table = [PageId(0), PageId(1)];
    // Token t, head h, element d holds 100t + 10h + d; values the negation.
    let k: Vec<f32> = (1..6)
        .flat_map(|t| (0..2).flat_map(move |h| (0..3).map(move |d| (100 * t + 10 * h + d) as f32)))
        .collect();
    let v: Vec<f32> = k.iter().map(|x| -x).collect();
    let w = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &table,
        start: 1,
        k: &k,
        v: &v,
    };
    ReferenceEngine.write_kv(&mut pages, &w).unwrap();
    let f32_at = |page: u32, elem: usize| {
        let b = &pages.page(PageId(page)).unwrap()[4 * elem..4 * elem + 4];
        f32::from_le_bytes(b.try_into().unwrap())
    };
    // Head 1's keys in page 0 start at element 12 (head 0's 4 × 3 before
    // them): element d of token t is at 12 + 4d + t.
    assert_eq!(f32_at(0, 12 + 4 * 2 + 3), 312.0);
    assert_eq!(f32_at(0, 12 + 1), 110.0);
    // Values stay token-major: page 1, head 0, token 5 (slot 1), d = 2.
    let v_start = layout.head_region(KvPart::V, 0, 0).unwrap().start;
    assert_eq!(f32_at(1, v_start + 3 + 2), -502.0);
    // Read back token-major, whatever the order.
    let mut rows = [0f32; 6];
    read_head_rows(&pages, PageId(1), KvPart::K, 0, 1, &mut rows).unwrap();
    assert_eq!(rows, [410.0, 411.0, 412.0, 510.0, 511.0, 512.0]);
}

fn small() -> (PageBuf, [PageId; 2]) {
    let layout = KvLayout::new(LayoutSpec::new(2, 4, 2, 4, 4, KvDtype::F16)).unwrap();
    let mut pages = PageBuf::new(layout, 2).unwrap();
    let table = [PageId(1), PageId(0)];
    let mut rng = Rng::new(5);
    let k = rng.vec(6 * 2 * 4);
    let v = rng.vec(6 * 2 * 4);
    let w = KvWrite {
        layer: 1,
        shard: 0,
        block_table: &table,
        start: 0,
        k: &k,
        v: &v,
    };
    ReferenceEngine.write_kv(&mut pages, &w).unwrap();
    (pages, table)
}

#[test]
fn bad_batches_are_typed_errors() {
    let (pages, table) = small();
    let q = vec![0.5f32; 4 * 4];
    let mut out = vec![0f32; 16];
    let run = |seqs: &[SeqAttention<'_>],
               layer: u32,
               shard: u32,
               q: &[f32],
               scale: f32,
               out: &mut [f32]| {
        ReferenceEngine.attend(
            &pages,
            &AttentionBatch::new(layer, shard, seqs, q, scale),
            out,
        )
    };
    let ok = [SeqAttention {
        block_table: &table,
        kv_len: 6,
        q_len: 1,
    }];
    run(&ok, 1, 0, &q, 0.5, &mut out).unwrap();

    let past_pool = [PageId(1), PageId(2)];
    let cases: Vec<(Vec<SeqAttention<'_>>, u32, u32, f32)> = vec![
        (
            vec![SeqAttention {
                block_table: &past_pool,
                kv_len: 6,
                q_len: 1,
            }],
            1,
            0,
            0.5,
        ),
        (
            vec![SeqAttention {
                block_table: &table,
                kv_len: 9,
                q_len: 1,
            }],
            1,
            0,
            0.5,
        ),
        (
            vec![SeqAttention {
                block_table: &table,
                kv_len: 6,
                q_len: 0,
            }],
            1,
            0,
            0.5,
        ),
        (
            vec![SeqAttention {
                block_table: &table,
                kv_len: 3,
                q_len: 4,
            }],
            1,
            0,
            0.5,
        ),
        (ok.to_vec(), 2, 0, 0.5),
        (ok.to_vec(), 1, 1, 0.5),
        (ok.to_vec(), 1, 0, f32::NAN),
        (ok.to_vec(), 1, 0, -1.0),
    ];
    for (seqs, layer, shard, scale) in cases {
        let err = run(&seqs, layer, shard, &q, scale, &mut out).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfRange { .. } | Error::InvalidValue(_) | Error::ContextPastTable { .. }
            ),
            "{seqs:?} layer {layer} shard {shard}: {err:?}"
        );
    }
    // Head-count mismatch: queries or output sized for the wrong heads.
    assert!(matches!(
        run(&ok, 1, 0, &q[..8], 0.5, &mut out),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        run(&ok, 1, 0, &q, 0.5, &mut out[..12]),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut nan_q = q.clone();
    nan_q[3] = f32::NAN;
    assert!(matches!(
        run(&ok, 1, 0, &nan_q, 0.5, &mut out),
        Err(Error::InvalidValue(_))
    ));
}

/// A write whose later page the memory refuses (a view's cached page)
/// fails before it writes the earlier, writable page.
#[test]
fn a_write_refused_past_its_first_page_writes_nothing() {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 2, KvDtype::F32)).unwrap();
    let pool = PagePool::new(layout, 2).unwrap();
    let cached = pool.alloc().unwrap().publish();
    let mut fresh = pool.alloc().unwrap();
    let table = [fresh.handle().id(), cached.handle().id()];
    let kv = [9.0f32; 8];
    let w = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &table,
        start: 0,
        k: &kv,
        v: &kv,
    };
    {
        let mut view = PageView::new(&pool);
        view.add_mut(&mut fresh);
        view.add_ref(&cached);
        assert!(matches!(
            ReferenceEngine.write_kv(&mut view, &w),
            Err(Error::InvalidValue(_))
        ));
    }
    {
        // A page the view does not hold is refused the same way.
        let mut view = PageView::new(&pool);
        view.add_mut(&mut fresh);
        assert!(matches!(
            ReferenceEngine.write_kv(&mut view, &w),
            Err(Error::OutOfRange { .. })
        ));
    }
    assert!(
        fresh.bytes().iter().all(|&b| b == 0),
        "the fresh page was written"
    );
}

#[test]
fn failed_write_changes_nothing() {
    let (mut pages, table) = small();
    let before = pages.bytes().to_vec();
    let k = vec![1.0f32; 3 * 2 * 4];
    let bad = [
        // Past the table: positions 6..9 need a third page.
        KvWrite {
            layer: 1,
            shard: 0,
            block_table: &table,
            start: 6,
            k: &k,
            v: &k,
        },
        KvWrite {
            layer: 2,
            shard: 0,
            block_table: &table,
            start: 0,
            k: &k,
            v: &k,
        },
        KvWrite {
            layer: 0,
            shard: 1,
            block_table: &table,
            start: 0,
            k: &k,
            v: &k,
        },
        KvWrite {
            layer: 0,
            shard: 0,
            block_table: &table,
            start: 0,
            k: &k[..7],
            v: &k[..7],
        },
        KvWrite {
            layer: 0,
            shard: 0,
            block_table: &table,
            start: 0,
            k: &k,
            v: &k[..8],
        },
        KvWrite {
            layer: 0,
            shard: 0,
            block_table: &[PageId(0), PageId(7)],
            start: 2,
            k: &k,
            v: &k,
        },
    ];
    for w in bad {
        assert!(ReferenceEngine.write_kv(&mut pages, &w).is_err(), "{w:?}");
        assert_eq!(pages.bytes(), &before[..], "{w:?} left a trace");
    }
    let inf = vec![f32::INFINITY; 8];
    let w = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &table,
        start: 0,
        k: &inf,
        v: &inf,
    };
    assert!(matches!(
        ReferenceEngine.write_kv(&mut pages, &w),
        Err(Error::InvalidValue(_))
    ));
    assert_eq!(pages.bytes(), &before[..]);
}
