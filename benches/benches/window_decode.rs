//! Sliding-window decode on the CPU engine: a batch at 32k tokens of context
//! with a 4096-token window against the same batch at 4096 tokens without
//! one, in the same run, interleaved. The windowed batch's block tables hold
//! placeholders for the 1792 pages before the window (released, as a
//! windowed runtime holds them) and the same 256 pages per sequence the
//! 4096-token batch reads, so the ratio is what the window costs on top of
//! reading it. The workload is the decode benches' (32 query heads, 8 kv
//! heads, head_dim 128, f16 pages of 16 tokens, batch 8, keys as the CPU
//! benches store them).
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench window_decode
//! ```

use std::time::Instant;

use kvslice_benches::decode_workload::{
    BATCH, BLOCK, CPU_KEY_ORDER, HEAD_DIM, Q_HEADS, decode_seqs, fill,
};
use kvslice_core::testkit::{Rng, max_rel_err};
use kvslice_core::{AttentionBatch, AttentionEngine, PageId, SeqAttention};
use kvslice_cpu::CpuEngine;

const WINDOW: usize = 4096;
const CONTEXT: usize = 32 * 1024;
/// Interleaved rounds, and calls timed per round.
const ROUNDS: usize = 15;
const CALLS: usize = 20;

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: one round.
    let quick = !std::env::args().any(|a| a == "--bench");
    let engine = CpuEngine::new();
    let (pages, tables) = fill(WINDOW, true, CPU_KEY_ORDER);
    let released = (CONTEXT - WINDOW) / BLOCK as usize;
    let windowed: Vec<Vec<PageId>> = tables
        .iter()
        .map(|t| {
            let mut w = vec![PageId::PLACEHOLDER; released];
            w.extend_from_slice(t);
            w
        })
        .collect();
    let plain = decode_seqs(&tables, WINDOW);
    let long: Vec<SeqAttention<'_>> = decode_seqs(&windowed, CONTEXT);
    let mut rng = Rng::new(4096);
    let q = rng.vec(BATCH * (Q_HEADS * HEAD_DIM) as usize);
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let short = AttentionBatch::for_layer(0, &plain, &q, scale);
    let slid = AttentionBatch::for_layer(0, &long, &q, scale).window(WINDOW as u32);

    // Same keys, same values: the same output.
    let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    engine.attend(&pages, &short, &mut a).expect("plain decode");
    engine
        .attend(&pages, &slid, &mut b)
        .expect("windowed decode");
    let err = max_rel_err(&b, &a.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
    assert!(err < 1e-6, "windowed decode differs: {err:e}");

    let time = |batch: &AttentionBatch<'_>, out: &mut [f32]| {
        let t = Instant::now();
        for _ in 0..CALLS {
            engine.attend(&pages, batch, out).expect("decode");
        }
        t.elapsed().as_secs_f64() / CALLS as f64
    };
    let (mut t_short, mut t_slid) = (Vec::new(), Vec::new());
    for _ in 0..if quick { 1 } else { ROUNDS } {
        t_short.push(time(&short, &mut a));
        t_slid.push(time(&slid, &mut b));
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let (s, w) = (median(&mut t_short), median(&mut t_slid));
    println!(
        "kernels {}, batch {BATCH}, {} rounds × {CALLS} calls (medians)",
        engine.kernels().name,
        t_short.len()
    );
    println!("| decode step | time (µs) |");
    println!("| --- | --- |");
    println!("| {WINDOW} tokens of context, no window | {:.1} |", s * 1e6);
    println!(
        "| {CONTEXT} tokens of context, window {WINDOW} | {:.1} |",
        w * 1e6
    );
    println!("ratio windowed / plain: {:.3} (target ≤ 1.3)", w / s);
}
