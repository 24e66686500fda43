//! A 20,000-token generation under a 2,048-token sliding window, in pages
//! of 16 tokens, through a cache store of exactly `ceil(2048 / 16) + 1 =
//! 129` pages: each step writes the new token's K/V, attends over the
//! window with the CPU engine, publishes every full page, and hands the
//! pages that left the window back to the store
//! (`SequenceTable::slide_window`): published ones become evictable,
//! and allocation recycles them. Without the window the sequence would
//! hold 1,250 pages.
//!
//! ```sh
//! cargo run --release --example sliding_window
//! ```
//!
//! Prints the pages held every 2,000 tokens and the peak, and checks every
//! 997th step's output against the reference engine.

use std::collections::VecDeque;

use kvslice_core::testkit::{Rng, max_rel_err};
use kvslice_core::{
    AttentionBatch, AttentionEngine, BlockHash, CacheStore, KvDtype, KvLayout, KvWrite, LayoutSpec,
    LruPolicy, PageId, PageMut, PageRef, PageView, ReferenceEngine, SeqAttention, SequenceMap,
    SequenceTable, SliceKey,
};
use kvslice_cpu::CpuEngine;

const TOKENS: usize = 20_000;
const WINDOW: u32 = 2048;
const BLOCK: u32 = 16;
const SEQ: u64 = 1;

enum Held<'s> {
    Fill(PageMut<'s, 'static>),
    Cached(PageRef<'s, 'static>),
}

fn main() -> Result<(), kvslice_core::Error> {
    let (peak, worst) = generate(TOKENS)?;
    assert!(peak <= bound(), "more pages held than the window needs");
    assert!(worst < 1e-5, "CPU and reference engines disagree");
    Ok(())
}

/// Pages a sequence under the window may hold.
fn bound() -> usize {
    WINDOW.div_ceil(BLOCK) as usize + 1
}

/// Generates `tokens` tokens, printing the table; returns the peak pages
/// held and the largest relative error against the reference engine.
fn generate(tokens: usize) -> Result<(usize, f64), kvslice_core::Error> {
    // A small model's layer: 8 query heads over 2 kv heads of 64.
    let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, 64, BLOCK, KvDtype::F16))?;
    let bound = bound() as u32;
    let store = CacheStore::new(layout, bound, LruPolicy::new(bound))?;
    let engine = CpuEngine::new().with_threads(1);
    let guard = store.pin();
    let req = store.begin_request();
    let mut seqs = SequenceMap::new(BLOCK);
    seqs.create(SEQ)?;
    let mut held: VecDeque<Held<'_>> = VecDeque::new();
    let mut rng = Rng::new(2048);
    let (kv_width, q_width) = (2 * 64, 8 * 64);
    let (mut peak, mut checked, mut worst) = (0usize, 0, 0f64);
    println!("| tokens | pages held | pages free in the store |");
    println!("| --- | --- | --- |");
    for pos in 0..tokens {
        if pos % BLOCK as usize == 0 {
            let page = store.allocate(1, &guard)?.pop().expect("one page");
            seqs.push_page(SEQ, page.handle().id())?;
            held.push_back(Held::Fill(page));
        }
        peak = peak.max(seqs.held_pages(SEQ)?);
        let (k, v, q) = (rng.vec(kv_width), rng.vec(kv_width), rng.vec(q_width));
        let mut out = vec![0f32; q_width];
        {
            let mut view = PageView::new(store.pool());
            for h in held.iter_mut() {
                match h {
                    Held::Fill(p) => view.add_mut(p),
                    Held::Cached(r) => view.add_ref(r),
                }
            }
            let table = seqs.block_table(SEQ)?;
            let write = KvWrite {
                layer: 0,
                shard: 0,
                block_table: table,
                start: pos,
                k: &k,
                v: &v,
            };
            engine.write_kv(&mut view, &write)?;
            let seq = [SeqAttention {
                block_table: table,
                kv_len: pos + 1,
                q_len: 1,
            }];
            let batch = AttentionBatch::for_layer(0, &seq, &q, 0.125).window(WINDOW);
            engine.attend(&view, &batch, &mut out)?;
            if pos % 997 == 0 {
                let mut want = vec![0f32; q_width];
                ReferenceEngine.attend(&view, &batch, &mut want)?;
                let want: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
                worst = worst.max(max_rel_err(&out, &want));
                checked += 1;
            }
        }
        seqs.advance(SEQ, 1)?;
        if (pos + 1) % BLOCK as usize == 0 {
            let Some(Held::Fill(page)) = held.pop_back() else {
                unreachable!("the newest page is being filled");
            };
            let key = SliceKey {
                block: BlockHash(u128::from(SEQ) << 64 | (pos / BLOCK as usize) as u128),
                block_index: (pos / BLOCK as usize) as u32,
                layer_group: 0,
                head_shard: 0,
            };
            // No parent: eviction takes leaves, and a window's blocks must
            // go while later ones are held.
            let r = store.publish(&req, page, key, None, BLOCK, &guard)?;
            held.push_back(Held::Cached(r));
        }
        seqs.slide_window(SEQ, WINDOW, |p: PageId| {
            held.pop_front().expect("released pages are held");
            debug_assert_ne!(p, PageId::PLACEHOLDER);
        })?;
        if (pos + 1) % 2000 == 0 {
            println!(
                "| {} | {} | {} |",
                pos + 1,
                seqs.held_pages(SEQ)?,
                store.pool().free_pages()
            );
        }
    }
    println!(
        "peak: {peak} pages held (bound ceil({WINDOW}/{BLOCK}) + 1 = {bound}; \
         {} without the window); {} evictions",
        tokens.div_ceil(BLOCK as usize),
        store.stats().evictions
    );
    println!(
        "{checked} steps checked against the reference engine: max relative error {worst:.1e}"
    );
    drop(held);
    seqs.remove(SEQ, |_| ())?;
    store.end_request(req)?;
    Ok((peak, worst))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The token opening a page sees its page and the 2,047 keys before
    /// it, 128 pages: 129 in all, exactly the bound.
    #[test]
    fn twenty_thousand_tokens_hold_the_window_only() {
        let (peak, worst) = generate(TOKENS).unwrap();
        assert_eq!(peak, bound());
        assert!(worst < 1e-5, "{worst:e}");
    }
}
