//! wgpu paged attention: decode K/V bytes read per second, against the
//! device's buffer-to-buffer copy bandwidth measured in the same run.
//!
//! Decode workload (as the CPU bench): 32 query heads, 8 kv heads,
//! head_dim 128, f16 K/V in 16-token pages, batch 8, contexts 1k, 8k, 32k
//! (`KVSLICE_BENCH_CONTEXTS=1024,8192` picks others). Each iteration is one
//! `attend` call as a caller sees it: queries uploaded, both passes run,
//! output read back. On lavapipe (Mesa's CPU Vulkan) the numbers only prove
//! that it runs; `benches/gpu-bench.sh` runs this on a real GPU.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench wgpu_attention
//! ```

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvslice_benches::decode_workload::{BATCH, HEAD_DIM, Q_HEADS, decode_seqs, fill, kv_bytes};
use kvslice_core::testkit::Rng;
use kvslice_core::{AttentionBatch, AttentionEngine, KeyOrder};
use kvslice_wgpu::WgpuEngine;

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
        "adapter: {} ({}, {}), f16 read {}",
        a.name,
        a.backend,
        a.device_type,
        if engine.native_f16() {
            "natively"
        } else {
            "by unpack2x16float"
        }
    );
    let copy = engine.copy_bandwidth(256 << 20, 5).expect("copy bandwidth");
    eprintln!(
        "device copy bandwidth: {:.1} GB/s (read + write)",
        copy / 1e9
    );

    let mut summary = Vec::new();
    let mut g = c.benchmark_group("wgpu_decode_f16_32q8kv_d128_b8");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for ctx in contexts() {
        // Shuffled tables: pages of a sequence are not one contiguous run.
        let (host, tables) = fill(ctx, true, KeyOrder::TokenMajor);
        let pages = engine.upload(&host).expect("upload");
        drop(host);
        let kv_bytes = kv_bytes(ctx);
        g.throughput(Throughput::Bytes(kv_bytes));
        let seqs = decode_seqs(&tables, ctx);
        let q = Rng::new(9).vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
        let mut out = vec![0f32; q.len()];
        let batch = AttentionBatch::new(0, 0, &seqs, &q, 1.0 / (HEAD_DIM as f32).sqrt());
        g.bench_function(BenchmarkId::new("kvslice_wgpu", ctx), |b| {
            b.iter(|| engine.attend(&pages, &batch, &mut out).unwrap())
        });
        // The same calls timed directly, for the fraction printed below.
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            engine.attend(&pages, &batch, &mut out).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        summary.push((ctx, kv_bytes as f64 / best));
    }
    g.finish();
    eprintln!("\nwgpu decode on {} (best of 5 calls each):", a.name);
    for (ctx, bw) in summary {
        eprintln!(
            "  ctx {ctx:>6}: {:8.2} GB/s of K/V read = {:5.1}% of copy bandwidth ({:.1} GB/s)",
            bw / 1e9,
            100.0 * bw / copy,
            copy / 1e9
        );
    }
}

criterion_group!(benches, decode);
criterion_main!(benches);
