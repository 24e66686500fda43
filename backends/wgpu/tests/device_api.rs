//! The device-resident API: queries, new K/V and output in the caller's
//! buffers, passes recorded into the caller's encoder. The shared accuracy
//! suite runs through it (buffers at non-zero offsets), a 30-layer step is
//! chained in one submission, warm calls create no buffer, and bad regions
//! and steps are typed errors before anything is recorded.
//!
//! Without an adapter each test prints why and returns, unless
//! `KVSLICE_REQUIRE_GPU=1` (CI sets it), which turns that into a failure.

use std::sync::Mutex;

use kvslice_core::testkit::{Rng, accuracy_suite_on};
use kvslice_core::{
    AttentionBatch, AttentionEngine, DeviceFailure, Error, KeyOrder, KvDtype, KvLayout, KvWrite,
    LayerGrouping, LayoutSpec, PageBuf, PageGeometry, PageId, PageMemory, ReferenceEngine, Result,
    SeqAttention,
};
use kvslice_wgpu::{DeviceAppend, DeviceAttend, DevicePages, DeviceRegion, DeviceStep, WgpuEngine};

const UNSCALED: [KvDtype; 3] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16];

fn engine(test: &str) -> Option<WgpuEngine> {
    kvslice_wgpu::testing::engine_or_skip(test)
}

fn bytes_of(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A caller's buffer: storage, writable from the host, copyable out.
fn caller_buffer(e: &WgpuEngine, bytes: u64) -> wgpu::Buffer {
    e.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("caller"),
        size: bytes.max(4).next_multiple_of(4),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

/// Submits `enc` after copying `bytes` of `src` from `offset` into a
/// mappable buffer, and returns them as f32.
fn submit_and_read(
    e: &WgpuEngine,
    mut enc: wgpu::CommandEncoder,
    src: &wgpu::Buffer,
    offset: u64,
    floats: usize,
) -> Vec<f32> {
    let bytes = (floats * 4) as u64;
    let rb = e.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("test readback"),
        size: bytes.max(4),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    enc.copy_buffer_to_buffer(src, offset, &rb, 0, bytes);
    e.queue().submit([enc.finish()]);
    rb.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    e.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let view = rb.get_mapped_range(..).expect("mapped");
    view.chunks_exact(4)
        .take(floats)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// An [`AttentionEngine`] that goes through the device-resident calls
/// only, with its queries and output at non-zero aligned offsets of one
/// buffer, so the suite checks regions as a runtime would pass them.
struct ThroughBuffers {
    e: WgpuEngine,
    step: Mutex<DeviceStep>,
}

impl ThroughBuffers {
    fn new(e: WgpuEngine) -> Self {
        let step = Mutex::new(e.step());
        Self { e, step }
    }
}

impl AttentionEngine<DevicePages> for ThroughBuffers {
    fn attend(
        &self,
        pages: &DevicePages,
        batch: &AttentionBatch<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        batch.validate(pages, out.len())?;
        let e = &self.e;
        let mut step = self.step.lock().unwrap();
        let (group, _) = pages.layout().layer_group(batch.layer)?;
        e.plan_group(
            &mut step,
            pages,
            group,
            batch.shard,
            batch.seqs,
            batch.window,
        )?;
        let a = e.offset_alignment();
        let bytes = out.len() as u64 * 4;
        let (q_at, out_at) = (a, (a + bytes).next_multiple_of(a));
        let buf = caller_buffer(e, out_at + bytes);
        e.queue().write_buffer(&buf, q_at, &bytes_of(batch.queries));
        let mut enc = e.device().create_command_encoder(&Default::default());
        e.record_attend(
            &mut enc,
            pages,
            &mut step,
            &DeviceAttend {
                layer: batch.layer,
                scale: batch.scale,
                queries: DeviceRegion::at(&buf, q_at),
                out: DeviceRegion::at(&buf, out_at),
            },
        )?;
        out.copy_from_slice(&submit_and_read(e, enc, &buf, out_at, out.len()));
        Ok(())
    }

    fn write_kv(&self, pages: &mut DevicePages, w: &KvWrite<'_>) -> Result<()> {
        w.validate(&*pages)?;
        self.append(pages, w)
    }
}

impl ThroughBuffers {
    /// `w` appended by [`WgpuEngine::record_append`] without the host's
    /// checks of the values (the device path trusts its producer).
    fn append(&self, pages: &mut DevicePages, w: &KvWrite<'_>) -> Result<()> {
        let e = &self.e;
        let row = (pages.layout().num_kv_heads() * pages.layout().head_dim()) as usize;
        let tokens = w.k.len() / row;
        let mut step = self.step.lock().unwrap();
        let seqs = [SeqAttention {
            block_table: w.block_table,
            kv_len: w.start + tokens,
            q_len: tokens,
        }];
        let (group, _) = pages.layout().layer_group(w.layer)?;
        e.plan_group(&mut step, pages, group, w.shard, &seqs, None)?;
        let a = e.offset_alignment();
        let bytes = w.k.len() as u64 * 4;
        let v_at = bytes.next_multiple_of(a);
        let buf = caller_buffer(e, v_at + bytes);
        e.queue().write_buffer(&buf, 0, &bytes_of(w.k));
        e.queue().write_buffer(&buf, v_at, &bytes_of(w.v));
        let mut enc = e.device().create_command_encoder(&Default::default());
        e.record_append(
            &mut enc,
            pages,
            &mut step,
            &DeviceAppend {
                layer: w.layer,
                k: DeviceRegion::new(&buf),
                v: DeviceRegion::at(&buf, v_at),
            },
        )?;
        e.queue().submit([enc.finish()]);
        e.device()
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("poll");
        Ok(())
    }
}

/// The suite through the device-resident calls, with both first-pass
/// kernels.
#[test]
fn suite_passes_through_device_buffers() {
    for subgroups in [true, false] {
        let Some(e) = engine("suite_through_device_buffers") else {
            return;
        };
        let t = ThroughBuffers::new(e.with_subgroups(subgroups));
        let n = accuracy_suite_on(&t, &[KeyOrder::TokenMajor], &KvDtype::ALL, |host| {
            t.e.upload(host).expect("upload")
        });
        assert!(n > 100, "{n} checks");
    }
}

/// Appends through device buffers land bit for bit where the host writes
/// them: subnormals of both formats and halfway cases of the rounding; and
/// NaN, infinities and overflow past f16's range, which only the device
/// path accepts, as the host's converter encodes them.
#[test]
fn appends_match_host_writes_bit_for_bit_with_special_values() {
    let Some(e) = engine("appends_special_values") else {
        return;
    };
    let t = ThroughBuffers::new(e);
    let specials = [
        65504.0,
        -0.0,
        6.0e-8,                      // f16 subnormal
        2.9e-8,                      // under half of f16's smallest subnormal
        f32::from_bits(0x3380_0000), // exactly half of it: ties to even, 0
        f32::from_bits(0x3840_0000), // f16 subnormal halfway case
        1.0 + f32::EPSILON * 1024.0, // f16 halfway above 1
        f32::from_bits(0x3f80_8000), // bf16 halfway, ties to even
        f32::from_bits(0x3f81_8000), // bf16 halfway, rounds up
        1e-40,                       // f32 subnormal
    ];
    let mut rng = Rng::new(5);
    for dtype in UNSCALED {
        for (hd, bt) in [(5u32, 3u32), (8, 16)] {
            let layout = KvLayout::new(LayoutSpec::new(2, 2, 2, hd, bt, dtype)).unwrap();
            let mut host = PageBuf::new(layout, 10).unwrap();
            let mut dev = t.e.pages(layout, 10).unwrap();
            let table: Vec<PageId> = [4u32, 9, 0, 7, 2, 5, 8, 1, 6, 3].map(PageId).to_vec();
            for (layer, start, n) in [(0u32, 0usize, 7usize), (1, 2, 9), (0, 7, 1), (1, 11, 4)] {
                let row = 2 * hd as usize;
                let mut k = rng.vec(n * row);
                let v = rng.vec(n * row);
                for (i, x) in k.iter_mut().enumerate().step_by(3) {
                    *x = specials[i / 3 % specials.len()];
                }
                let w = KvWrite {
                    layer,
                    shard: 0,
                    block_table: &table,
                    start,
                    k: &k,
                    v: &v,
                };
                ReferenceEngine.write_kv(&mut host, &w).unwrap();
                t.write_kv(&mut dev, &w).unwrap();
            }
            let back = dev.download().unwrap();
            for p in 0..10 {
                assert_eq!(
                    back.page(PageId(p)).unwrap(),
                    host.page(PageId(p)).unwrap(),
                    "{dtype:?} hd {hd} bt {bt} page {p}"
                );
            }
        }
        // The host refuses non-finite and huge K/V; the device path stores
        // them as the host's converter would (f16 overflow is infinity).
        let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 4, 1, dtype)).unwrap();
        let mut dev = t.e.pages(layout, 1).unwrap();
        let k = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::INFINITY,
        ];
        let v = [f32::NEG_INFINITY, 65519.99, 65520.0, f32::MAX];
        let table = [PageId(0)];
        let w = KvWrite {
            layer: 0,
            shard: 0,
            block_table: &table,
            start: 0,
            k: &k,
            v: &v,
        };
        assert!(
            ReferenceEngine
                .write_kv(&mut PageBuf::new(layout, 1).unwrap(), &w)
                .is_err()
        );
        t.append(&mut dev, &w).unwrap();
        let es = dtype.size_bytes();
        let mut want = vec![0u8; 8 * es];
        dtype.encode_row(&k, &mut want[..4 * es]).unwrap();
        dtype.encode_row(&v, &mut want[4 * es..]).unwrap();
        assert_eq!(
            &dev.download().unwrap().page(PageId(0)).unwrap()[..8 * es],
            &want[..],
            "{dtype:?}"
        );
    }
}

/// A random pool for a 30-layer model and a decode batch over it.
fn thirty_layer_setup(e: &WgpuEngine) -> (KvLayout, DevicePages, Vec<Vec<PageId>>, Vec<usize>) {
    let layout = KvLayout::new(LayoutSpec::new(30, 8, 2, 16, 8, KvDtype::F16)).unwrap();
    let mut host = PageBuf::new(layout, 48).unwrap();
    let mut rng = Rng::new(30);
    let lens = vec![37usize, 100, 5];
    let mut next = 0u32;
    let mut tables = Vec::new();
    for &len in &lens {
        let blocks = len.div_ceil(8) as u32;
        let table: Vec<PageId> = (next..next + blocks).map(PageId).collect();
        next += blocks;
        for layer in 0..30 {
            let n = len * 2 * 16;
            let (k, v) = (rng.vec(n), rng.vec(n));
            let w = KvWrite {
                layer,
                shard: 0,
                block_table: &table,
                start: 0,
                k: &k,
                v: &v,
            };
            ReferenceEngine.write_kv(&mut host, &w).unwrap();
        }
        tables.push(table);
    }
    (layout, e.upload(&host).unwrap(), tables, lens)
}

/// One decode token for each sequence of `thirty_layer_setup`.
fn decode_seqs<'a>(tables: &'a [Vec<PageId>], lens: &[usize]) -> Vec<SeqAttention<'a>> {
    tables
        .iter()
        .zip(lens)
        .map(|(t, &len)| SeqAttention {
            block_table: t,
            kv_len: len,
            q_len: 1,
        })
        .collect()
}

/// Thirty layers recorded into one encoder, one submission, each layer's
/// output at its own offset: every layer equals the host-slice call.
#[test]
fn thirty_layers_chain_in_one_submission() {
    let Some(e) = engine("thirty_layers") else {
        return;
    };
    let (layout, pages, tables, lens) = thirty_layer_setup(&e);
    let seqs = decode_seqs(&tables, &lens);
    let per_layer = seqs.len() * (layout.num_q_heads() * layout.head_dim()) as usize;
    let stride = (per_layer as u64 * 4).next_multiple_of(e.offset_alignment());
    let queries = Rng::new(3).vec(per_layer * 30);
    let q_buf = caller_buffer(&e, stride * 30);
    let out_buf = caller_buffer(&e, stride * 30);
    for layer in 0..30 {
        let q = &queries[layer * per_layer..(layer + 1) * per_layer];
        e.queue()
            .write_buffer(&q_buf, layer as u64 * stride, &bytes_of(q));
    }
    let mut step = e.step();
    e.plan(&mut step, &pages, 0, &seqs, None).unwrap();
    let mut enc = e.device().create_command_encoder(&Default::default());
    for layer in 0..30u32 {
        let at = u64::from(layer) * stride;
        e.record_attend(
            &mut enc,
            &pages,
            &mut step,
            &DeviceAttend {
                layer,
                scale: 0.25,
                queries: DeviceRegion::at(&q_buf, at),
                out: DeviceRegion::at(&out_buf, at),
            },
        )
        .unwrap();
    }
    let all = submit_and_read(&e, enc, &out_buf, 0, (stride / 4 * 30) as usize);
    for layer in 0..30usize {
        let q = &queries[layer * per_layer..(layer + 1) * per_layer];
        let batch = AttentionBatch::new(layer as u32, 0, &seqs, q, 0.25);
        let mut want = vec![0f32; per_layer];
        e.attend(&pages, &batch, &mut want).unwrap();
        let at = layer * (stride / 4) as usize;
        let got = &all[at..at + per_layer];
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "layer {layer}"
        );
    }
}

/// After the first call of each kind, neither API creates a buffer.
#[test]
fn warm_calls_create_no_buffers() {
    let Some(e) = engine("warm_calls_create_no_buffers") else {
        return;
    };
    let (layout, mut pages, tables, lens) = thirty_layer_setup(&e);
    let seqs = decode_seqs(&tables, &lens);
    let q_floats = seqs.len() * (layout.num_q_heads() * layout.head_dim()) as usize;
    let kv_floats = seqs.len() * (layout.num_kv_heads() * layout.head_dim()) as usize;
    let queries = Rng::new(4).vec(q_floats);
    let new_kv = Rng::new(6).vec(kv_floats);
    let q_buf = caller_buffer(&e, q_floats as u64 * 4);
    let out_buf = caller_buffer(&e, q_floats as u64 * 4);
    let kv_buf = caller_buffer(&e, kv_floats as u64 * 4);
    e.queue().write_buffer(&q_buf, 0, &bytes_of(&queries));
    e.queue().write_buffer(&kv_buf, 0, &bytes_of(&new_kv));
    let mut step = e.step();
    let mut out = vec![0f32; q_floats];
    let mut one_round = |pages: &mut DevicePages| {
        let batch = AttentionBatch::new(3, 0, &seqs, &queries, 0.25);
        e.attend(pages, &batch, &mut out).unwrap();
        let w = KvWrite {
            layer: 2,
            shard: 0,
            block_table: &tables[1],
            start: 99,
            k: &new_kv[..32],
            v: &new_kv[..32],
        };
        e.write_kv(pages, &w).unwrap();
        e.plan(&mut step, pages, 0, &seqs, None).unwrap();
        let mut enc = e.device().create_command_encoder(&Default::default());
        for layer in 0..30 {
            let kv = DeviceRegion::new(&kv_buf);
            let call = DeviceAppend {
                layer,
                k: kv,
                v: kv,
            };
            e.record_append(&mut enc, pages, &mut step, &call).unwrap();
            let call = DeviceAttend {
                layer,
                scale: 0.25,
                queries: DeviceRegion::new(&q_buf),
                out: DeviceRegion::new(&out_buf),
            };
            e.record_attend(&mut enc, pages, &mut step, &call).unwrap();
        }
        e.queue().submit([enc.finish()]);
        e.device()
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap();
    };
    one_round(&mut pages);
    let warm = e.buffers_created();
    assert!(warm > 0);
    for _ in 0..4 {
        one_round(&mut pages);
    }
    assert_eq!(e.buffers_created(), warm, "buffers created after warm-up");
    // One plan recorded into many submissions: each submission's calls
    // take the slots the last one freed (`submitted`), so nothing grows;
    // without it the parameter slots run out and a buffer is made.
    let attend_all = |step: &mut DeviceStep, pages: &DevicePages| {
        let mut enc = e.device().create_command_encoder(&Default::default());
        for layer in 0..30 {
            let call = DeviceAttend {
                layer,
                scale: 0.25,
                queries: DeviceRegion::new(&q_buf),
                out: DeviceRegion::new(&out_buf),
            };
            e.record_attend(&mut enc, pages, step, &call).unwrap();
        }
        e.queue().submit([enc.finish()]);
    };
    step.submitted();
    for _ in 0..8 {
        attend_all(&mut step, &pages);
        step.submitted();
    }
    assert_eq!(
        e.buffers_created(),
        warm,
        "buffers created on a reused plan"
    );
    for _ in 0..8 {
        attend_all(&mut step, &pages);
    }
    assert!(
        e.buffers_created() > warm,
        "slots were never freed, yet none ran out"
    );
    e.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
}

fn is_device(err: &Error, want: DeviceFailure) -> bool {
    matches!(err, Error::Device { kind, .. } if *kind == want)
}

#[test]
fn bad_regions_and_steps_are_typed_errors_before_recording() {
    let Some(e) = engine("bad_regions") else {
        return;
    };
    let layout = KvLayout::new(LayoutSpec::new(2, 4, 2, 8, 4, KvDtype::F16)).unwrap();
    let mut pages = e.pages(layout, 8).unwrap();
    let table = [PageId(0), PageId(1)];
    let seqs = [SeqAttention {
        block_table: &table,
        kv_len: 6,
        q_len: 1,
    }];
    let need = 4 * 8 * 4; // one token × 4 q heads × 8 dims of f32
    let q = caller_buffer(&e, 4096);
    let small = caller_buffer(&e, need - 4);
    let mut enc = e.device().create_command_encoder(&Default::default());
    let call = |queries, out| DeviceAttend {
        layer: 0,
        scale: 0.5,
        queries,
        out,
    };
    let whole = DeviceRegion::new(&q);

    // Not planned yet.
    let mut step = e.step();
    let err = e
        .record_attend(&mut enc, &pages, &mut step, &call(whole, whole))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidValue(_)), "{err}");
    // A bad plan is refused as a bad batch is.
    let long = [SeqAttention {
        kv_len: 9,
        ..seqs[0]
    }];
    let err = e.plan(&mut step, &pages, 0, &long, None).unwrap_err();
    assert!(matches!(err, Error::ContextPastTable { .. }), "{err}");
    e.plan(&mut step, &pages, 0, &seqs, None).unwrap();

    // Too small.
    let err = e
        .record_attend(
            &mut enc,
            &pages,
            &mut step,
            &call(whole, DeviceRegion::new(&small)),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::ShapeMismatch { expected, actual, .. } if expected == need && actual == need - 4),
        "{err}"
    );
    // Past the end from an offset.
    let err = e
        .record_attend(
            &mut enc,
            &pages,
            &mut step,
            &call(DeviceRegion::at(&q, 4096), whole),
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    // Misaligned.
    let odd = e.offset_alignment() / 2;
    if odd > 0 {
        let err = e
            .record_attend(
                &mut enc,
                &pages,
                &mut step,
                &call(DeviceRegion::at(&q, odd), whole),
            )
            .unwrap_err();
        assert!(is_device(&err, DeviceFailure::Validation), "{err}");
    }
    // Not a storage buffer.
    let uniform = e.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4096,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    let err = e
        .record_attend(
            &mut enc,
            &pages,
            &mut step,
            &call(DeviceRegion::new(&uniform), whole),
        )
        .unwrap_err();
    assert!(is_device(&err, DeviceFailure::Validation), "{err}");
    // A layer past the layout, a bad scale.
    let err = e
        .record_attend(
            &mut enc,
            &pages,
            &mut step,
            &DeviceAttend {
                layer: 2,
                ..call(whole, whole)
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    let err = e
        .record_attend(
            &mut enc,
            &pages,
            &mut step,
            &DeviceAttend {
                scale: f32::NAN,
                ..call(whole, whole)
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidValue(_)), "{err}");
    // Pages of another geometry than the plan's.
    let other = e.pages(layout, 9).unwrap();
    let err = e
        .record_attend(&mut enc, &other, &mut step, &call(whole, whole))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidValue(_)), "{err}");
    // Two appended tokens in one slot would race.
    let clash = [seqs[0], seqs[0]];
    e.plan(&mut step, &pages, 0, &clash, None).unwrap();
    let kv = DeviceAppend {
        layer: 0,
        k: whole,
        v: whole,
    };
    let err = e
        .record_append(&mut enc, &mut pages, &mut step, &kv)
        .unwrap_err();
    assert!(matches!(err, Error::DuplicatePage { page: 1 }), "{err}");
    // A token appended to a page that its table holds at another block
    // too would overwrite that block (the host's write refuses it).
    let twice = [PageId(1), PageId(1)];
    let held_twice = [SeqAttention {
        block_table: &twice,
        kv_len: 6,
        q_len: 1,
    }];
    e.plan(&mut step, &pages, 0, &held_twice, None).unwrap();
    let err = e
        .record_append(&mut enc, &mut pages, &mut step, &kv)
        .unwrap_err();
    assert!(matches!(err, Error::DuplicatePage { page: 1 }), "{err}");

    // A buffer and a step of another device.
    let Some(e2) = engine("bad_regions (second device)") else {
        return;
    };
    let foreign = caller_buffer(&e2, 4096);
    e.plan(&mut step, &pages, 0, &seqs, None).unwrap();
    let err = e
        .record_attend(
            &mut enc,
            &pages,
            &mut step,
            &call(DeviceRegion::new(&foreign), whole),
        )
        .unwrap_err();
    assert!(is_device(&err, DeviceFailure::Validation), "{err}");
    let mut foreign_step = e2.step();
    let err = e
        .plan(&mut foreign_step, &pages, 0, &seqs, None)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidValue(_)), "{err}");

    // The encoder is still good: the refused calls recorded nothing.
    e.record_attend(&mut enc, &pages, &mut step, &call(whole, whole))
        .unwrap();
    e.queue().submit([enc.finish()]);
    e.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
    // Nor did finishing it lose the engine.
    e.plan(&mut step, &pages, 0, &seqs, None)
        .expect("the engine is still usable");
}

/// A device lost between two layers of a chained step: the next record is
/// `Lost`.
#[test]
fn a_device_lost_mid_step_is_reported() {
    let Some(e) = engine("lost_mid_step") else {
        return;
    };
    let (_, pages, tables, lens) = thirty_layer_setup(&e);
    let seqs = [SeqAttention {
        block_table: &tables[0],
        kv_len: lens[0],
        q_len: 1,
    }];
    let buf = caller_buffer(&e, 4096);
    let r = DeviceRegion::new(&buf);
    let mut step = e.step();
    e.plan(&mut step, &pages, 0, &seqs, None).unwrap();
    let mut enc = e.device().create_command_encoder(&Default::default());
    let call = |layer| DeviceAttend {
        layer,
        scale: 0.25,
        queries: r,
        out: r,
    };
    e.record_attend(&mut enc, &pages, &mut step, &call(0))
        .unwrap();
    e.destroy();
    let err = e
        .record_attend(&mut enc, &pages, &mut step, &call(1))
        .unwrap_err();
    assert!(is_device(&err, DeviceFailure::Lost), "{err}");
    let err = e.plan(&mut step, &pages, 0, &seqs, None).unwrap_err();
    assert!(is_device(&err, DeviceFailure::Lost), "{err}");
}

/// Positions past u32 (the shaders' integers) are refused on the device
/// rather than cut: a write the host stores at slot 1 of its block would
/// land at slot 0, and a plan would name page `u32::MAX`. Plans stop at
/// contexts of 2^31 - 1, where a split's end could wrap.
#[test]
fn positions_past_u32_are_refused() {
    let Some(e) = engine("positions_past_u32_are_refused") else {
        return;
    };
    let bt = 65_535u32;
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 1, bt, KvDtype::F32)).unwrap();
    let mut pages = e.pages(layout, 1).unwrap();
    let start = 1usize << 32;
    let mut table = vec![PageId::PLACEHOLDER; start / bt as usize + 1];
    *table.last_mut().unwrap() = PageId(0);
    let w = KvWrite {
        layer: 0,
        shard: 0,
        block_table: &table,
        start,
        k: &[1.0],
        v: &[2.0],
    };
    let err = e.write_kv(&mut pages, &w).unwrap_err();
    assert!(matches!(err, Error::Overflow(_)), "{err}");
    let seqs = [SeqAttention {
        block_table: &table,
        kv_len: start + 1,
        q_len: 1,
    }];
    let mut step = e.step();
    let err = e.plan(&mut step, &pages, 0, &seqs, Some(1)).unwrap_err();
    assert!(matches!(err, Error::Overflow(_)), "{err}");
    // A split's end must not wrap either: the last key plus a split,
    // rounded up to a tile, fits u32 only below 2^31.
    for (kv_len, fits) in [
        (u32::MAX as usize, false),
        (1 << 31, false),
        ((1 << 31) - 1, true),
    ] {
        let mut table = vec![PageId::PLACEHOLDER; kv_len.div_ceil(bt as usize)];
        *table.last_mut().unwrap() = PageId(0);
        let seqs = [SeqAttention {
            block_table: &table,
            kv_len,
            q_len: 1,
        }];
        // A window of one token reads only the last page, the real one.
        let got = e.plan(&mut step, &pages, 0, &seqs, Some(1));
        if fits {
            got.unwrap();
        } else {
            assert!(matches!(got, Err(Error::Overflow(_))), "{kv_len}: {got:?}");
        }
    }
}

/// A layout of one page per layer: a step planned on one layer group's
/// block tables attends over that group's pages, and refuses the layers
/// of another group rather than reading their K/V from the wrong pages.
#[test]
fn each_layer_group_is_planned_apart() {
    let Some(e) = engine("each_layer_group_is_planned_apart") else {
        return;
    };
    let spec = LayoutSpec::new(2, 4, 1, 8, 4, KvDtype::F32).with_grouping(LayerGrouping::PerLayer);
    let layout = KvLayout::new(spec).unwrap();
    let mut pages = e.pages(layout, 4).unwrap();
    // Six tokens per layer, keys zero (attention is the values' mean),
    // values 1.0 in layer 0's pages and 2.0 in layer 1's.
    let tables = [[PageId(0), PageId(1)], [PageId(2), PageId(3)]];
    for (layer, table) in tables.iter().enumerate() {
        let w = KvWrite {
            layer: layer as u32,
            shard: 0,
            block_table: table,
            start: 0,
            k: &[0.0; 6 * 8],
            v: &[layer as f32 + 1.0; 6 * 8],
        };
        e.write_kv(&mut pages, &w).unwrap();
    }
    let q = caller_buffer(&e, 4 * 8 * 4);
    let out = caller_buffer(&e, 4 * 8 * 4);
    let attend = |layer| DeviceAttend {
        layer,
        scale: 0.5,
        queries: DeviceRegion::new(&q),
        out: DeviceRegion::new(&out),
    };
    let mut steps = [e.step(), e.step()];
    for (group, (step, table)) in steps.iter_mut().zip(&tables).enumerate() {
        let seqs = [SeqAttention {
            block_table: table,
            kv_len: 6,
            q_len: 1,
        }];
        e.plan_group(step, &pages, group as u32, 0, &seqs, None)
            .unwrap();
    }
    for (layer, step) in steps.iter_mut().enumerate() {
        let mut enc = e.device().create_command_encoder(&Default::default());
        e.record_attend(&mut enc, &pages, step, &attend(layer as u32))
            .unwrap();
        let got = submit_and_read(&e, enc, &out, 0, 4 * 8);
        assert!(
            got.iter().all(|&x| x == layer as f32 + 1.0),
            "layer {layer}: {got:?}"
        );
    }
    // Layer 1 on the step planned over layer 0's pages (plan, as
    // plan_group for group 0), and layer 0 on layer 1's: both refused.
    let seqs = [SeqAttention {
        block_table: &tables[0],
        kv_len: 6,
        q_len: 1,
    }];
    e.plan(&mut steps[0], &pages, 0, &seqs, None).unwrap();
    let mut enc = e.device().create_command_encoder(&Default::default());
    for (layer, step) in [(1, 0), (0, 1)] {
        let err = e
            .record_attend(&mut enc, &pages, &mut steps[step], &attend(layer))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidValue(_)), "{err}");
        let append = DeviceAppend {
            layer,
            k: DeviceRegion::new(&q),
            v: DeviceRegion::new(&q),
        };
        let err = e
            .record_append(&mut enc, &mut pages, &mut steps[step], &append)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidValue(_)), "{err}");
    }
    // A group the layout does not have.
    let err = e
        .plan_group(&mut steps[0], &pages, 2, 0, &seqs, None)
        .unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
}
