//! wgpu paged attention: decode K/V bytes read per second through the
//! device-resident API and through host slices, against the device's
//! buffer-to-buffer copy bandwidth measured in the same run; and a 30-layer
//! decode step chained on the device against 30 host-slice calls, at 128
//! and 1k tokens of context.
//!
//! Decode workload (as the CPU bench): 32 query heads, 8 kv heads,
//! head_dim 128, f16 K/V in 16-token pages (shuffled), batch 8, contexts
//! 1k, 8k, 32k (`KVSLICE_BENCH_CONTEXTS=1024,8192` picks others). Paths:
//!
//! - `device_resident`: queries already in a device buffer; one
//!   `record_attend` into an encoder, submit, wait; output stays on the
//!   device (what a runtime chaining layers pays);
//! - `host_slices`: `AttentionEngine::attend` (queries up, output back);
//! - `host_slices_one_key_per_thread`: the same with the subgroup kernel
//!   off, the kernel every adapter can run (contexts up to 8k).
//!
//! Then the device-resident path over f16, int8 and fp8 pages, and the
//! 30-layer step. `benches/gpu-bench.sh` runs this on a real GPU.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench wgpu_attention
//! ```

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvslice_benches::decode_workload::{
    BATCH, BLOCK, HEAD_DIM, KV_HEADS, Q_HEADS, decode_seqs, fill, fill_as, kv_bytes, kv_bytes_of,
    layout_of,
};
use kvslice_core::testkit::Rng;
use kvslice_core::{
    AttentionBatch, AttentionEngine, KeyOrder, KvDtype, KvLayout, LayoutSpec, PageBuf, PageId,
    PageMemoryMut, SeqAttention,
};
use kvslice_wgpu::{DeviceAttend, DevicePages, DeviceRegion, DeviceStep, WgpuEngine, wgpu};

const LAYERS: u32 = 30;
/// Contexts of the 30-layer step: short, where per-call costs show, and 1k.
const STEP_CONTEXTS: [usize; 2] = [128, 1024];

fn contexts() -> Vec<usize> {
    match std::env::var("KVSLICE_BENCH_CONTEXTS") {
        Ok(list) => list
            .split(',')
            .map(|c| {
                c.trim()
                    .parse()
                    .expect("KVSLICE_BENCH_CONTEXTS: comma-separated token counts")
            })
            .collect(),
        Err(_) => vec![1024, 8192, 32768],
    }
}

/// Seconds of the best of `n` runs of `f`.
fn best_of(n: usize, mut f: impl FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A caller's buffer holding `data`.
fn device_buffer(e: &WgpuEngine, data: &[f32]) -> wgpu::Buffer {
    let buf = e.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("bench caller"),
        size: (data.len() * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    e.queue().write_buffer(&buf, 0, &bytes);
    buf
}

/// Records `layers` attends (one per layer, queries and output at each
/// layer's offset), submits them at once and waits: no readback.
fn device_step(
    e: &WgpuEngine,
    pages: &DevicePages,
    step: &mut DeviceStep,
    layers: u32,
    (q, out): (&wgpu::Buffer, &wgpu::Buffer),
    stride: u64,
) {
    let mut enc = e.device().create_command_encoder(&Default::default());
    for layer in 0..layers {
        let at = u64::from(layer) * stride;
        let call = DeviceAttend {
            layer,
            scale: 1.0 / (HEAD_DIM as f32).sqrt(),
            queries: DeviceRegion::at(q, at),
            out: DeviceRegion::at(out, at),
        };
        e.record_attend(&mut enc, pages, step, &call).unwrap();
    }
    e.queue().submit([enc.finish()]);
    // One plan serves every iteration: free its parameter slots.
    step.submitted();
    e.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
}

fn decode(c: &mut Criterion) {
    let engine = match WgpuEngine::new() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("no wgpu adapter, nothing to measure: {e}");
            return;
        }
    };
    let a = engine.adapter();
    eprintln!(
        "adapter: {} ({}, {}), subgroups {} of {:?}, f16 read {}",
        a.name,
        a.backend,
        a.device_type,
        engine.subgroups(),
        a.subgroup_sizes,
        if engine.native_f16() {
            "natively (one-key-per-thread kernel)"
        } else {
            "by unpack2x16float"
        }
    );
    let copy = engine.copy_bandwidth(256 << 20, 5).expect("copy bandwidth");
    eprintln!(
        "device copy bandwidth: {:.1} GB/s (read + write)",
        copy / 1e9
    );
    let fallback = WgpuEngine::new().unwrap().with_subgroups(false);
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();

    let mut summary = Vec::new();
    let mut g = c.benchmark_group("wgpu_decode_f16_32q8kv_d128_b8");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for ctx in contexts() {
        let (host, tables) = fill(ctx, true, KeyOrder::TokenMajor);
        let pages = engine.upload(&host).expect("upload");
        let slow_pages = (ctx <= 8192).then(|| fallback.upload(&host).expect("upload"));
        drop(host);
        let kv_bytes = kv_bytes(ctx);
        g.throughput(Throughput::Bytes(kv_bytes));
        let seqs = decode_seqs(&tables, ctx);
        let q = Rng::new(9).vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
        let mut out = vec![0f32; q.len()];
        let batch = AttentionBatch::new(0, 0, &seqs, &q, scale);

        let q_buf = device_buffer(&engine, &q);
        let out_buf = device_buffer(&engine, &out);
        let mut step = engine.step();
        engine.plan(&mut step, &pages, 0, &seqs, None).unwrap();
        let bufs = (&q_buf, &out_buf);
        g.bench_function(BenchmarkId::new("device_resident", ctx), |b| {
            b.iter(|| device_step(&engine, &pages, &mut step, 1, bufs, 0))
        });
        g.bench_function(BenchmarkId::new("host_slices", ctx), |b| {
            b.iter(|| engine.attend(&pages, &batch, &mut out).unwrap())
        });
        if let Some(slow) = &slow_pages {
            g.bench_function(
                BenchmarkId::new("host_slices_one_key_per_thread", ctx),
                |b| b.iter(|| fallback.attend(slow, &batch, &mut out).unwrap()),
            );
        }
        // The same calls timed directly, for the table printed below.
        let dev = best_of(5, || device_step(&engine, &pages, &mut step, 1, bufs, 0));
        let host = best_of(5, || engine.attend(&pages, &batch, &mut out).unwrap());
        let slow = slow_pages
            .as_ref()
            .map(|p| best_of(3, || fallback.attend(p, &batch, &mut out).unwrap()));
        summary.push((ctx, kv_bytes as f64, dev, host, slow));
    }
    g.finish();

    eprintln!(
        "\nwgpu decode on {} (best of 5 calls; GB/s of K/V read, % of copy bandwidth {:.1} GB/s):",
        a.name,
        copy / 1e9
    );
    eprintln!(
        "  {:>6}  {:>22}  {:>22}  {:>26}  {:>8}",
        "ctx", "device-resident", "host slices", "host, one key per thread", "speedup"
    );
    let cell = |secs: f64, bytes: f64| {
        format!(
            "{:7.2} ms {:5.2} ({:4.1}%)",
            secs * 1e3,
            bytes / secs / 1e9,
            100.0 * bytes / secs / copy
        )
    };
    for (ctx, bytes, dev, host, slow) in summary {
        let (slow_cell, speedup) = match slow {
            Some(s) => (cell(s, bytes), format!("{:.1}x", s / dev)),
            None => ("-".to_owned(), "-".to_owned()),
        };
        eprintln!(
            "  {ctx:>6}  {:>22}  {:>22}  {slow_cell:>26}  {speedup:>8}",
            cell(dev, bytes),
            cell(host, bytes)
        );
    }
}

/// Device-resident decode over f16, int8 and fp8 pages in the same run:
/// time, and bytes actually read (codes and scales) per second.
fn eight_bit(c: &mut Criterion) {
    let Ok(engine) = WgpuEngine::new() else {
        return;
    };
    let mut g = c.benchmark_group("wgpu_decode_kv_dtype_32q8kv_d128_b8");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let mut summary = Vec::new();
    for ctx in contexts() {
        let q = Rng::new(9).vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
        let q_buf = device_buffer(&engine, &q);
        let out_buf = device_buffer(&engine, &q);
        let mut row = Vec::new();
        for dtype in [KvDtype::F16, KvDtype::I8, KvDtype::F8E4M3] {
            let (host, tables) = fill_as(ctx, dtype, KeyOrder::TokenMajor);
            let pages = engine.upload(&host).expect("upload");
            drop(host);
            let bytes = kv_bytes_of(&layout_of(dtype, KeyOrder::TokenMajor), ctx);
            g.throughput(Throughput::Bytes(bytes));
            let seqs = decode_seqs(&tables, ctx);
            let mut step = engine.step();
            engine.plan(&mut step, &pages, 0, &seqs, None).unwrap();
            let bufs = (&q_buf, &out_buf);
            g.bench_function(BenchmarkId::new(dtype.name(), ctx), |b| {
                b.iter(|| device_step(&engine, &pages, &mut step, 1, bufs, 0))
            });
            let secs = best_of(5, || device_step(&engine, &pages, &mut step, 1, bufs, 0));
            row.push((dtype, secs, bytes as f64));
        }
        summary.push((ctx, row));
    }
    g.finish();
    eprintln!("\nwgpu decode by K/V dtype, device-resident (best of 5; GB/s of bytes read):");
    for (ctx, row) in summary {
        let f16 = row[0].1;
        let cells: Vec<String> = row
            .iter()
            .map(|(d, secs, bytes)| {
                format!(
                    "{} {:.2} ms {:.2} GB/s ({:.2}x)",
                    d.name(),
                    secs * 1e3,
                    bytes / secs / 1e9,
                    f16 / secs
                )
            })
            .collect();
        eprintln!("  ctx {ctx:>6}: {}", cells.join("; "));
    }
}

/// [`LAYERS`] layers of the decode workload's heads, each sequence `ctx`
/// tokens; every page holds the same random bytes (the values do not
/// change the timing).
fn thirty_layer_pages(ctx: usize) -> (PageBuf, Vec<Vec<PageId>>) {
    let layout = KvLayout::new(LayoutSpec::new(
        LAYERS,
        Q_HEADS,
        KV_HEADS,
        HEAD_DIM,
        BLOCK,
        KvDtype::F16,
    ))
    .expect("layout");
    let per_seq = ctx.div_ceil(BLOCK as usize);
    let total = (per_seq * BATCH) as u32;
    let mut pages = PageBuf::new(layout, total).expect("pages");
    let vals = Rng::new(30).vec(layout.page_elems());
    let mut bytes = vec![0u8; layout.page_bytes()];
    KvDtype::F16.encode_row(&vals, &mut bytes).expect("encode");
    for p in 0..total {
        pages
            .page_mut(PageId(p))
            .expect("page")
            .copy_from_slice(&bytes);
    }
    let ids: Vec<PageId> = (0..total).map(PageId).collect();
    (pages, ids.chunks(per_seq).map(<[PageId]>::to_vec).collect())
}

fn thirty_layer_step(c: &mut Criterion) {
    let Ok(engine) = WgpuEngine::new() else {
        return;
    };
    let mut g = c.benchmark_group("wgpu_decode_step_30_layers");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    let mut summary = Vec::new();
    for ctx in STEP_CONTEXTS {
        let (host, tables) = thirty_layer_pages(ctx);
        let pages = engine.upload(&host).expect("upload");
        drop(host);
        let seqs: Vec<SeqAttention<'_>> = decode_seqs(&tables, ctx);
        let per_layer = BATCH * (Q_HEADS * HEAD_DIM) as usize;
        let stride = (per_layer as u64 * 4).next_multiple_of(engine.offset_alignment());
        let q = Rng::new(31).vec((stride / 4) as usize * LAYERS as usize);
        let q_buf = device_buffer(&engine, &q);
        let out_buf = device_buffer(&engine, &vec![0f32; q.len()]);
        let mut step = engine.step();
        let mut out = vec![0f32; per_layer];
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let mut host_calls = || {
            for layer in 0..LAYERS {
                let at = layer as usize * (stride / 4) as usize;
                let batch = AttentionBatch::new(layer, 0, &seqs, &q[at..at + per_layer], scale);
                engine.attend(&pages, &batch, &mut out).unwrap();
            }
        };
        let bufs = (&q_buf, &out_buf);
        let mut chained = || {
            engine.plan(&mut step, &pages, 0, &seqs, None).unwrap();
            device_step(&engine, &pages, &mut step, LAYERS, bufs, stride)
        };
        g.bench_function(BenchmarkId::new("chained_one_submission", ctx), |b| {
            b.iter(&mut chained)
        });
        g.bench_function(BenchmarkId::new("host_slice_calls", ctx), |b| {
            b.iter(&mut host_calls)
        });
        summary.push((ctx, best_of(5, &mut chained), best_of(5, &mut host_calls)));
    }
    g.finish();
    eprintln!("\n30-layer decode step (best of 5):");
    for (ctx, chained, calls) in summary {
        eprintln!(
            "  ctx {ctx:>5}: chained on the device, one submission {:8.2} ms; \
             30 host-slice calls {:8.2} ms ({:.2}x)",
            chained * 1e3,
            calls * 1e3,
            calls / chained
        );
    }
}

criterion_group!(benches, decode, eight_bit, thirty_layer_step);
criterion_main!(benches);
