//! The first design sketch's own example, runnable: a 1000 × 1000 f32
//! tensor cut into 100 × 100 chunks, each keyed by its coordinates
//! (`Coordinator::region_key`), cached in a store of 64 chunk pages, with
//! an "engine" that sums a chunk read from its page. Two passes in
//! row-major order, for LRU and for the default policy; every sum is
//! checked against a direct computation from the tensor.
//!
//! ```sh
//! cargo run --release --example chunked_tensor
//! ```
//!
//! A cyclic scan of 100 chunks through 64 slots is LRU's worst case: each
//! chunk is evicted just before it is needed again, so the second pass
//! misses every chunk. The default policy does no better here: it ranks
//! blocks by the returns it learned per conversation turn and chain
//! depth, and single-chunk requests with no parents give it nothing to
//! learn from, so it falls back to recency. Clock and the chain policy are
//! recency-based too. TinyLFU's admission filter is the one that resists
//! the scan: a new chunk seen once may not evict a chunk seen as often, so
//! part of the first pass survives to be hit in the second (the table the
//! example prints has the counts; `cargo test --example chunked_tensor`
//! checks them).

use kvslice_core::{
    CacheStore, Coordinator, EvictionPolicy, HashSecret, KeyScope, KvDtype, KvLayout, KvPart,
    KvRows, KvRowsMut, LayoutSpec, PageRef, StoreStats, evict,
};

const N: usize = 1000;
const CHUNK: usize = 100;
const CHUNKS: usize = N / CHUNK;
const CAPACITY: u32 = 64;
const TENSOR: u64 = 1;

/// The tensor's element at (row, column): any deterministic values.
fn element(row: usize, col: usize) -> f32 {
    ((row * 31 + col * 17) % 97) as f32 * 0.25 - 12.0
}

/// The engine: the sum of a chunk, read from its page (the chunk's rows
/// are the page's K rows, one 100-wide row per "token").
fn chunk_sum(page: &PageRef<'_, '_>) -> f64 {
    match page.rows(KvPart::K, 0, 0).expect("layer 0, head 0") {
        KvRows::F32(values) => values.iter().map(|&x| f64::from(x)).sum(),
        _ => unreachable!("the layout stores f32"),
    }
}

fn direct_sum(ci: usize, cj: usize) -> f64 {
    (ci * CHUNK..(ci + 1) * CHUNK)
        .flat_map(|r| (cj * CHUNK..(cj + 1) * CHUNK).map(move |c| f64::from(element(r, c))))
        .sum()
}

/// One row-major pass over the chunks: a hit reads the cached page; a
/// miss copies the chunk into a fresh page (evicting if the store is
/// full) and publishes it under its key.
fn pass<E: EvictionPolicy>(store: &CacheStore<'static, E>, coord: &Coordinator) -> StoreStats {
    let scope = KeyScope::default();
    for ci in 0..CHUNKS {
        for cj in 0..CHUNKS {
            let (r0, c0) = ((ci * CHUNK) as u64, (cj * CHUNK) as u64);
            let index = (ci * CHUNKS + cj) as u32;
            let key = coord
                .region_key(
                    &scope,
                    TENSOR,
                    &[r0..r0 + CHUNK as u64, c0..c0 + CHUNK as u64],
                    index,
                )
                .expect("valid region");
            let guard = store.pin();
            let request = store.begin_request();
            let mut held = Vec::new();
            store
                .lookup_prefix(&request, &[key], CHUNK, &guard, &mut held)
                .expect("own ticket");
            let page = match held.pop() {
                Some(page) => page,
                None => {
                    let mut page = store.allocate(1, &guard).expect("a page").pop().unwrap();
                    let KvRowsMut::F32(dst) = page.rows_mut(KvPart::K, 0, 0).expect("rows") else {
                        unreachable!("the layout stores f32")
                    };
                    for (r, row) in dst.chunks_exact_mut(CHUNK).enumerate() {
                        for (c, x) in row.iter_mut().enumerate() {
                            *x = element(ci * CHUNK + r, cj * CHUNK + c);
                        }
                    }
                    store
                        .publish(&request, page, key, None, CHUNK as u32, &guard)
                        .expect("publish")
                }
            };
            let (got, want) = (chunk_sum(&page), direct_sum(ci, cj));
            assert!(
                (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                "chunk ({ci}, {cj}): sum {got} from the page, {want} directly"
            );
            drop(page);
            store.end_request(request).expect("own ticket");
        }
    }
    store.stats()
}

/// Hits on each of two passes with the policy `name`.
fn two_passes(layout: KvLayout, coord: &Coordinator, name: &str) -> [StoreStats; 2] {
    let policy = evict::by_name(name, CAPACITY).expect("known policy");
    let store = CacheStore::new(layout, CAPACITY, policy).expect("store");
    let first = pass(&store, coord);
    [first, pass(&store, coord)]
}

fn main() -> Result<(), kvslice_core::Error> {
    // A page holds one chunk: 100 "tokens" (rows) of head_dim 100, f32,
    // in its K half (the V half is unused here).
    let layout = KvLayout::new(LayoutSpec::new(
        1,
        1,
        1,
        CHUNK as u32,
        CHUNK as u32,
        KvDtype::F32,
    ))?;
    let coord = Coordinator::new(layout, HashSecret::from_bytes(*b"chunked-tensor!!"));
    println!(
        "{N} x {N} f32 tensor, {CHUNK} x {CHUNK} chunks ({} of them), store of {CAPACITY} chunk pages",
        CHUNKS * CHUNKS
    );
    println!("| policy | pass | hits | misses | evictions |");
    println!("| --- | --- | --- | --- | --- |");
    let mut second_pass_hits = Vec::new();
    for name in ["lru", "default", "clock", "tinylfu", "chain"] {
        let mut before = StoreStats::default();
        for (p, after) in (1..).zip(two_passes(layout, &coord, name)) {
            let hits = after.hit_blocks - before.hit_blocks;
            println!(
                "| {name} | {p} | {hits} | {} | {} |",
                after.miss_blocks - before.miss_blocks,
                after.evictions - before.evictions
            );
            if p == 2 {
                second_pass_hits.push((name, hits));
            }
            before = after;
        }
    }
    println!("every chunk's sum matched the direct computation");
    for (name, hits) in second_pass_hits {
        println!(
            "{name}: {hits} of {} chunks hit on the second pass",
            CHUNKS * CHUNKS
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_misses_the_whole_second_pass_and_tinylfu_resists_the_scan() {
        let layout = KvLayout::new(LayoutSpec::new(
            1,
            1,
            1,
            CHUNK as u32,
            CHUNK as u32,
            KvDtype::F32,
        ))
        .unwrap();
        let coord = Coordinator::new(layout, HashSecret::from_bytes([9; 16]));
        let [first, second] = two_passes(layout, &coord, "lru");
        assert_eq!((first.hit_blocks, first.evictions), (0, 36));
        assert_eq!((second.hit_blocks, second.evictions), (0, 136));
        let [_, second] = two_passes(layout, &coord, "tinylfu");
        assert!(second.hit_blocks > 0, "{second:?}");
    }
}
