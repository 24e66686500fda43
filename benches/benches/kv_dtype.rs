//! Decode over 8-bit K/V (int8 and fp8 E4M3, a scale per row) against f16
//! K/V, and each against the read loop over the bytes it actually reads
//! (codes and scales), in interleaved rounds of one run. Each dtype's
//! decode also runs with every block table cycling over its sequence's
//! first two pages (cache-resident K/V): its compute ceiling. int8 runs
//! twice: with f32 queries, and scored against int8 queries
//! (`CpuEngine::with_int8_queries`, where the CPU has AVX-512 VNNI and
//! VBMI; the row says "n/a" elsewhere). fp8 runs twice too: on the f32
//! kernels, and on bf16 dot products (`CpuEngine::with_fp8_bf16`, where
//! the CPU has AVX-512 BF16 beside VNNI and VBMI).
//!
//! Workload: 32 query heads, 8 kv heads, head_dim 128, 16-token pages with
//! keys dim-major (the CPU engine's order), batch 8, contexts 8k and 32k,
//! every core. Each row reports the median over the rounds of the mean of
//! `REPS` calls.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench kv_dtype
//! KVSLICE_BENCH_ROUNDS=11 cargo bench -p kvslice-benches --bench kv_dtype
//! KVSLICE_BENCH_KERNELS=avx2+fma+f16c cargo bench -p kvslice-benches --bench kv_dtype
//! ```
//!
//! `KVSLICE_BENCH_KERNELS` names one of `Kernels::supported()` (the first,
//! the engine's own, by default): an AVX-512 host measures AVX2's set.

use std::hint::black_box;
use std::io::Write;

use kvslice_benches::decode_workload::{
    BATCH, CPU_KEY_ORDER, HEAD_DIM, Q_HEADS, cached_tables, decode_seqs, fill_as, kv_bytes_of,
};
use kvslice_benches::read_loop::stream_read;
use kvslice_benches::rounds;
use kvslice_core::testkit::{Rng, max_rel_err};
use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, PageGeometry};
use kvslice_cpu::{CpuEngine, Kernels};

/// Calls per timing, averaged.
const REPS: u32 = 3;

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let rounds = rounds::from_env(7);
    let engine = match std::env::var("KVSLICE_BENCH_KERNELS") {
        Ok(name) => {
            let all = Kernels::supported();
            let Some(k) = all.iter().find(|k| k.name == name) else {
                let names: Vec<_> = all.iter().map(|k| k.name).collect();
                eprintln!("KVSLICE_BENCH_KERNELS={name}: this CPU runs {names:?}");
                std::process::exit(2);
            };
            CpuEngine::new().with_kernels(*k)
        }
        Err(_) => CpuEngine::new(),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "kv_dtype: kvslice-cpu kernels {}, {threads} threads, {rounds} rounds of {REPS} calls",
        engine.kernels().name
    );
    let dtypes = [KvDtype::F16, KvDtype::I8, KvDtype::F8E4M3];
    // (label, index into `dtypes`, engine): f16 first, the baseline.
    let mut runs = vec![("f16", 0, engine.clone()), ("int8", 1, engine.clone())];
    let int8_queries = engine.clone().with_int8_queries(true);
    if int8_queries.int8_queries() {
        runs.push(("int8, int8 queries", 1, int8_queries));
    } else {
        println!(
            "int8 queries: n/a (kernels {} lack them)",
            engine.kernels().name
        );
    }
    runs.push(("fp8-e4m3", 2, engine.clone()));
    let fp8_bf16 = engine.clone().with_fp8_bf16(true);
    if fp8_bf16.fp8_bf16() {
        runs.push(("fp8-e4m3, bf16 products", 2, fp8_bf16));
    } else {
        println!(
            "fp8 on bf16 products: n/a (kernels {} lack them)",
            engine.kernels().name
        );
    }
    for ctx in [8192usize, 32768] {
        eprint!("ctx {ctx}: writing pages");
        let data: Vec<_> = dtypes
            .iter()
            .map(|&dt| {
                let (pages, tables) = fill_as(ctx, dt, CPU_KEY_ORDER);
                eprint!(" {}", dt.name());
                let bytes = kv_bytes_of(pages.layout(), ctx);
                (dt, pages, tables, bytes)
            })
            .collect();
        eprintln!();
        let q = Rng::new(9).vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let mut outs: Vec<Vec<f32>> = vec![vec![0f32; q.len()]; runs.len()];
        let mut attend = vec![Vec::new(); runs.len()];
        let mut read = vec![Vec::new(); runs.len()];
        let mut cached = vec![Vec::new(); runs.len()];
        for round in 0..rounds {
            eprint!("\rround {}/{rounds}", round + 1);
            let _ = std::io::stderr().flush();
            for (i, (_, at, engine)) in runs.iter().enumerate() {
                let (_, pages, tables, bytes) = &data[*at];
                let seqs = decode_seqs(tables, ctx);
                let batch = AttentionBatch::new(0, 0, &seqs, &q, scale);
                let out = &mut outs[i];
                attend[i].push(rounds::mean_secs(REPS, || {
                    engine.attend(pages, &batch, out).unwrap();
                    black_box(&*out);
                }));
                let hot = cached_tables(tables);
                let hot_seqs = decode_seqs(&hot, ctx);
                let hot_batch = AttentionBatch::new(0, 0, &hot_seqs, &q, scale);
                let mut hot_out = vec![0f32; q.len()];
                cached[i].push(rounds::mean_secs(REPS, || {
                    engine.attend(pages, &hot_batch, &mut hot_out).unwrap();
                    black_box(&hot_out);
                }));
                let span = &pages.bytes()[..*bytes as usize];
                read[i].push(rounds::mean_secs(REPS, || {
                    black_box(stream_read(span, threads));
                }));
            }
        }
        eprintln!();
        // The 8-bit outputs against f16's: the cost in accuracy of reading
        // fewer bytes, on the same random K/V (f16's own rounding aside).
        let f16_out: Vec<f64> = outs[0].iter().map(|&x| f64::from(x)).collect();
        let f16_time = rounds::median(attend[0].clone());
        println!(
            "| ctx | dtype | MB read | decode ms | GB/s | vs f16 | read loop GB/s | of read loop | cache-resident ms | max rel diff vs f16 |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for (i, (label, at, _)) in runs.iter().enumerate() {
            let bytes = &data[*at].3;
            let (t, r) = (
                rounds::median(attend[i].clone()),
                rounds::median(read[i].clone()),
            );
            let hot = rounds::median(cached[i].clone());
            let gb = *bytes as f64 / 1e9;
            println!(
                "| {ctx} | {} | {:.1} | {:.2} | {:.2} | {:.2}x | {:.2} | {:.0}% | {:.2} | {:.1e} |",
                label,
                *bytes as f64 / 1e6,
                t * 1e3,
                gb / t,
                f16_time / t,
                gb / r,
                100.0 * r / t,
                hot * 1e3,
                max_rel_err(&outs[i], &f16_out),
            );
        }
    }
}
