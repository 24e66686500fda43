//! Decode steps of the CPU bench's workload back to back for a while, for
//! a profiler to sample: batch 8, 32 query heads, 8 kv heads, head_dim
//! 128, K/V in 16-token pages (f16, or `--dtype`), pages streamed from
//! memory or (with `--cached`) cycling over two pages per sequence.
//!
//! Where the VM hides the PMU (`perf` says "PMU not available"), perf's
//! timer-driven software clock still samples: a sample lands on the
//! instruction the core is waiting to retire, or the one after it.
//!
//! ```sh
//! cargo build --release -p kvslice-benches --example decode_loop
//! perf record -e cpu-clock -F 4000 -o decode.data \
//!     target/release/examples/decode_loop --ctx 8192 --secs 8
//! perf annotate -i decode.data --stdio -s kvslice_cpu::kernels::avx2::four_row_scores_softmax_avx2
//! ```

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use kvslice_benches::decode_workload::{
    BATCH, CPU_KEY_ORDER, HEAD_DIM, Q_HEADS, cached_tables, decode_seqs, fill_as, kv_bytes_of,
};
use kvslice_benches::parse_kv_dtype;
use kvslice_core::testkit::Rng;
use kvslice_core::{AttentionBatch, AttentionEngine, PageGeometry};
use kvslice_cpu::CpuEngine;

#[derive(Parser)]
#[command(about = "Decode steps back to back, for profiling")]
struct Args {
    /// Tokens per sequence.
    #[arg(long, default_value_t = 8192)]
    ctx: usize,
    /// Cycle every block table over its first two pages (cache-resident).
    #[arg(long)]
    cached: bool,
    /// Seconds of decode steps (after the pages are filled).
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// K/V storage type: f32, f16, bf16, int8 or fp8-e4m3.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Score int8 keys against int8 queries (`CpuEngine::with_int8_queries`).
    #[arg(long)]
    int8_queries: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.ctx == 0 || args.secs.is_nan() || args.secs <= 0.0 {
        eprintln!("error: --ctx and --secs must be positive");
        return ExitCode::FAILURE;
    }
    let dtype = match parse_kv_dtype(&args.dtype) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: --dtype: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (pages, tables) = fill_as(args.ctx, dtype, CPU_KEY_ORDER);
    let tables = if args.cached {
        cached_tables(&tables)
    } else {
        tables
    };
    let seqs = decode_seqs(&tables, args.ctx);
    let q = Rng::new(9).vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
    let mut out = vec![0f32; q.len()];
    let batch = AttentionBatch::new(0, 0, &seqs, &q, 1.0 / (HEAD_DIM as f32).sqrt());
    let engine = match args.threads {
        Some(t) => CpuEngine::new().with_threads(t),
        None => CpuEngine::new(),
    }
    .with_int8_queries(args.int8_queries);
    let start = Instant::now();
    let mut steps = 0u64;
    while start.elapsed().as_secs_f64() < args.secs {
        if let Err(e) = engine.attend(&pages, &batch, &mut out) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        steps += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let gib = (kv_bytes_of(pages.layout(), args.ctx) * steps) as f64 / secs / (1u64 << 30) as f64;
    println!(
        "{} kernels{}, {} K/V, ctx {}{}: {steps} steps in {secs:.1} s, {gib:.2} GiB/s of K/V",
        engine.kernels().name,
        if engine.int8_queries() {
            " (int8 queries)"
        } else {
            ""
        },
        dtype.name(),
        args.ctx,
        if args.cached { " (cached)" } else { "" },
    );
    ExitCode::SUCCESS
}
