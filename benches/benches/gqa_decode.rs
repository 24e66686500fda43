//! Decode at every common GQA group size: the workload of `kv_dtype` (8 kv
//! heads, head_dim 128, f16 K/V in 16-token pages, keys dim-major, batch
//! 8, every core) with 8 to 64 query heads, i.e. 1 to 8 query heads per
//! kv head, one query token per sequence; and steps of 2, 4 and 8 query
//! tokens per sequence (as speculative decoding verifies a draft) at 4
//! query heads per kv head. Each case runs the CPU engine twice in the same rounds:
//! with decode's rows in groups of four through the four-row kernels (the
//! default) and with them together (`CpuEngine::with_row_groups(false)`,
//! the engine before the groups), and the read loop over the same bytes.
//! Every row is the median over the rounds of the mean of `REPS` calls,
//! the two engines taking turns to go first;
//! both engines read the same K/V, so "of read loop" compares like with
//! like across group sizes.
//!
//! ```sh
//! cargo bench -p kvslice-benches --bench gqa_decode
//! KVSLICE_BENCH_ROUNDS=9 cargo bench -p kvslice-benches --bench gqa_decode
//! ```

use std::hint::black_box;
use std::io::Write;

use kvslice_benches::decode_workload::{
    BATCH, BLOCK, CPU_KEY_ORDER, HEAD_DIM, KV_HEADS, decode_seqs, fill_as, kv_bytes_of,
};
use kvslice_benches::read_loop::stream_read;
use kvslice_benches::rounds;
use kvslice_core::testkit::{Rng, max_rel_err};
use kvslice_core::{
    AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec, PageBuf, PageGeometry, PageId,
    PageMemory, PageMemoryMut, Result,
};
use kvslice_cpu::CpuEngine;

/// Calls per timing, averaged.
const REPS: u32 = 3;

/// (query heads per kv head, query tokens per sequence) measured.
const CASES: [(u32, usize); 9] = [
    (1, 1),
    (2, 1),
    (3, 1),
    (4, 1),
    (6, 1),
    (8, 1),
    (4, 2),
    (4, 4),
    (4, 8),
];

/// The workload's pages seen through a layout with another number of
/// query heads: the page bytes do not depend on it, so one fill serves
/// every group size.
struct Regrouped {
    layout: KvLayout,
    pages: PageBuf,
}

impl PageGeometry for Regrouped {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }
    fn num_pages(&self) -> u32 {
        self.pages.num_pages()
    }
}

impl PageMemory for Regrouped {
    fn page(&self, id: PageId) -> Result<&[u8]> {
        self.pages.page(id)
    }
}

impl PageMemoryMut for Regrouped {
    fn page_mut(&mut self, id: PageId) -> Result<&mut [u8]> {
        self.pages.page_mut(id)
    }
}

/// Mean seconds of `REPS` calls of `f`, after one untimed call (the
/// first call after the read loop ran slower, whichever engine made it).
fn warm_then_time(mut f: impl FnMut()) -> f64 {
    f();
    rounds::mean_secs(REPS, f)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let rounds = rounds::from_env(5);
    let grouped = CpuEngine::new();
    let together = CpuEngine::new().with_row_groups(false);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "gqa_decode: kvslice-cpu kernels {}, {threads} threads, {rounds} rounds of {REPS} calls",
        grouped.kernels().name
    );
    for ctx in [8192usize, 32768] {
        eprintln!("ctx {ctx}: writing pages");
        let (pages, tables) = fill_as(ctx, KvDtype::F16, CPU_KEY_ORDER);
        let bytes = kv_bytes_of(pages.layout(), ctx);
        let mut memory = Regrouped {
            layout: *pages.layout(),
            pages,
        };
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let n = CASES.len();
        let (mut fast, mut slow, mut read) = (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
        let mut diffs = vec![0f64; n];
        for round in 0..rounds {
            eprint!("\rround {}/{rounds}", round + 1);
            let _ = std::io::stderr().flush();
            for (i, &(g, tokens)) in CASES.iter().enumerate() {
                let mut seqs = decode_seqs(&tables, ctx);
                seqs.iter_mut().for_each(|s| s.q_len = tokens);
                memory.layout = KvLayout::new(
                    LayoutSpec::new(1, g * KV_HEADS, KV_HEADS, HEAD_DIM, BLOCK, KvDtype::F16)
                        .with_key_order(CPU_KEY_ORDER),
                )
                .expect("a valid layout");
                let q = Rng::new(9).vec(tokens * BATCH * (g * KV_HEADS * HEAD_DIM) as usize);
                let batch = AttentionBatch::new(0, 0, &seqs, &q, scale);
                let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                // Each engine goes first in every other round.
                for first in [round % 2 == 0, round % 2 == 1] {
                    if first {
                        fast[i].push(warm_then_time(|| {
                            grouped.attend(&memory, &batch, &mut a).unwrap();
                            black_box(&a);
                        }));
                    } else {
                        slow[i].push(warm_then_time(|| {
                            together.attend(&memory, &batch, &mut b).unwrap();
                            black_box(&b);
                        }));
                    }
                }
                let span = &memory.pages.bytes()[..bytes as usize];
                read[i].push(warm_then_time(|| {
                    black_box(stream_read(span, threads));
                }));
                let b64: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
                diffs[i] = diffs[i].max(max_rel_err(&a, &b64));
            }
        }
        eprintln!();
        println!(
            "| ctx | q heads per kv head | query tokens | grouped ms | together ms | grouped / together speed | grouped GB/s | of read loop | together, of read loop | max rel diff |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        let gb = bytes as f64 / 1e9;
        for (i, (g, tokens)) in CASES.iter().enumerate() {
            let (f, s, r) = (
                rounds::median(fast[i].clone()),
                rounds::median(slow[i].clone()),
                rounds::median(read[i].clone()),
            );
            println!(
                "| {ctx} | {g} | {tokens} | {:.2} | {:.2} | {:.2}x | {:.2} | {:.0}% | {:.0}% | {:.1e} |",
                f * 1e3,
                s * 1e3,
                s / f,
                gb / f,
                100.0 * r / f,
                100.0 * r / s,
                diffs[i],
            );
        }
    }
}
