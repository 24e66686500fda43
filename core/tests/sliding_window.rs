//! Sliding windows through the store: a windowed sequence holds at most
//! `ceil(W / page) + 1` pages however long it grows, in a store of exactly
//! that many pages (released pages are freed or become evictable, nothing
//! leaks, nothing referenced is freed); and a cached prefix whose early
//! blocks were evicted is reused under a window, with the same output as
//! computing it all.

use std::collections::VecDeque;

use kvslice_core::testkit::Rng;
use kvslice_core::{
    AttentionBatch, AttentionEngine, BlockHash, CacheStore, Coordinator, Error, EvictionPolicy,
    HashSecret, KvDtype, KvLayout, KvWrite, LayoutSpec, Life, LruPolicy, PageId, PageMut, PageRef,
    PageView, ReferenceEngine, Request, SeqAttention, SequenceMap, SequenceTable, SliceKey,
};

/// A page a sequence holds: being filled, or published and referenced.
enum Held<'s> {
    Fill(PageMut<'s, 'static>),
    Cached(PageRef<'s, 'static>),
}

impl Held<'_> {
    fn id(&self) -> PageId {
        match self {
            Held::Fill(p) => p.handle().id(),
            Held::Cached(r) => r.handle().id(),
        }
    }
}

fn key(seq: u64, block: u32) -> SliceKey {
    SliceKey {
        block: BlockHash(u128::from(seq) << 64 | u128::from(block)),
        block_index: block,
        layer_group: 0,
        head_shard: 0,
    }
}

/// Every page of `store` is free or cached, and none is referenced.
fn all_returned<E: EvictionPolicy>(store: &CacheStore<'static, E>) {
    for id in 0..store.pool().capacity() {
        let info = store.pool().page_info(PageId(id)).unwrap();
        assert_eq!(info.refs, 0, "page {id} still referenced");
        assert!(
            matches!(info.life, Life::Free | Life::Cached),
            "page {id}: {info:?}"
        );
    }
}

#[test]
fn windowed_sequences_hold_a_bounded_number_of_pages() {
    let mut rng = Rng::new(0x37);
    // Under Miri, which interprets every store operation: 4 shorter cases,
    // one per page size.
    let (cases, longest) = if cfg!(miri) { (4, 200) } else { (200, 700) };
    for case in 0..cases {
        let bt = [1u32, 3, 4, 16][case % 4];
        let window = 1 + rng.below(80) as u32;
        let len = 1 + rng.below(longest) as usize;
        let publish_every = 1 + rng.below(3);
        let bound = window.div_ceil(bt) as usize + 1;
        let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, bt, KvDtype::F32)).unwrap();
        // Exactly the bound: any page held past it would exhaust the store.
        let store = CacheStore::new(layout, bound as u32, LruPolicy::new(bound as u32)).unwrap();
        let guard = store.pin();
        let req = store.begin_request();
        let mut seqs = SequenceMap::new(bt);
        seqs.create(7).unwrap();
        let mut held: VecDeque<Held<'_>> = VecDeque::new();
        let mut most = 0;
        for pos in 0..len {
            if pos % bt as usize == 0 {
                let page = store.allocate(1, &guard).unwrap().pop().unwrap();
                seqs.push_page(7, page.handle().id()).unwrap();
                held.push_back(Held::Fill(page));
            }
            // The peak: the token at `pos` is written and attends now.
            let n = seqs.held_pages(7).unwrap();
            assert!(n <= bound, "case {case}: {n} pages held, bound {bound}");
            most = most.max(n);
            seqs.advance(7, 1).unwrap();
            let block = (pos / bt as usize) as u32;
            if (pos + 1) % bt as usize == 0 && u64::from(block) % publish_every == 0 {
                let Some(Held::Fill(page)) = held.pop_back() else {
                    panic!("the last page is being filled");
                };
                let r = store
                    .publish(&req, page, key(case as u64, block), None, bt, &guard)
                    .unwrap();
                held.push_back(Held::Cached(r));
            }
            seqs.slide_window(7, window, |p| {
                let gone = held.pop_front().expect("a held page");
                assert_eq!(gone.id(), p, "pages leave in order");
            })
            .unwrap();
            assert_eq!(seqs.held_pages(7).unwrap(), held.len());
        }
        seqs.remove(7, |p| {
            let gone = held.pop_front().unwrap();
            assert_eq!(gone.id(), p);
        })
        .unwrap();
        assert!(held.is_empty());
        store.end_request(req).unwrap();
        all_returned(&store);
        if len >= 2 * (window + bt) as usize {
            // Long enough for the steady state: the token opening a page
            // sees its page and the `window - 1` keys before it.
            let exact = (window - 1).div_ceil(bt) as usize + 1;
            assert_eq!(most, exact, "case {case}: window {window}, pages of {bt}");
        }
    }
}

/// K, V and query rows of a token: a function of its id and position, so
/// two runs over the same tokens write the same pages.
fn rows(token: u32, pos: usize, width: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(u64::from(token) << 32 | pos as u64);
    (rng.vec(width), rng.vec(width), rng.vec(2 * width))
}

/// Runs `tokens[from..]` through windowed decode, one token a step, on top
/// of `held` (the pages of blocks `0..` that the caller has, placeholders
/// in `table` for the rest), publishing every full block; returns each
/// step's attention output.
#[allow(clippy::too_many_arguments)]
fn decode<'s>(
    store: &'s CacheStore<'static, LruPolicy>,
    keys: &[SliceKey],
    tokens: &[u32],
    from: usize,
    window: u32,
    table: &mut Vec<PageId>,
    held: &mut VecDeque<Held<'s>>,
) -> Vec<Vec<f32>> {
    let layout = *store.layout();
    let bt = layout.block_tokens() as usize;
    let hd = layout.head_dim() as usize;
    let guard = store.pin();
    let req = store.begin_request();
    let mut outs = Vec::new();
    for (pos, &token) in tokens.iter().enumerate().skip(from) {
        if pos % bt == 0 {
            let page = store.allocate(1, &guard).unwrap().pop().unwrap();
            table.push(page.handle().id());
            held.push_back(Held::Fill(page));
        }
        let (k, v, q) = rows(token, pos, hd);
        let mut out = vec![0f32; q.len()];
        {
            let mut view = PageView::new(store.pool());
            for h in held.iter_mut() {
                match h {
                    Held::Fill(p) => view.add_mut(p),
                    Held::Cached(r) => view.add_ref(r),
                }
            }
            let write = KvWrite {
                layer: 0,
                shard: 0,
                block_table: table,
                start: pos,
                k: &k,
                v: &v,
            };
            ReferenceEngine.write_kv(&mut view, &write).unwrap();
            let seqs = [SeqAttention {
                block_table: table,
                kv_len: pos + 1,
                q_len: 1,
            }];
            let batch = AttentionBatch::for_layer(0, &seqs, &q, 0.5).window(window);
            ReferenceEngine.attend(&view, &batch, &mut out).unwrap();
        }
        outs.push(out);
        if (pos + 1) % bt == 0 {
            let Some(Held::Fill(page)) = held.pop_back() else {
                panic!("the last page is being filled");
            };
            let r = store
                .publish(&req, page, keys[pos / bt], None, bt as u32, &guard)
                .unwrap();
            held.push_back(Held::Cached(r));
        }
        // Release what the next token's window no longer needs.
        let first = (pos + 2).saturating_sub(window as usize) / bt;
        while table.len() - held.len() < first {
            let gone = held.pop_front().unwrap();
            let at = table.len() - held.len() - 1;
            assert_eq!(table[at], gone.id());
            table[at] = PageId::PLACEHOLDER;
        }
    }
    store.end_request(req).unwrap();
    outs
}

#[test]
fn reuse_under_a_window_matches_computing_everything() {
    let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 8, 4, KvDtype::F32)).unwrap();
    let coord = Coordinator::new(layout, HashSecret::from_bytes([9; 16]));
    let window = 10;
    let tokens: Vec<u32> = (0..52).map(|i| (i * 7919) % 1000).collect();
    let keys: Vec<SliceKey> = coord
        .plan(&Request::new(&tokens))
        .unwrap()
        .keys_for(0, 0)
        .unwrap()
        .collect();

    // Everything from scratch.
    let scratch = CacheStore::new(layout, 64, LruPolicy::new(64)).unwrap();
    let (mut table, mut held) = (Vec::new(), VecDeque::new());
    let want = decode(&scratch, &keys, &tokens, 0, window, &mut table, &mut held);
    drop(held);

    // The first 40 tokens, cached; then the oldest blocks evicted.
    let store = CacheStore::new(layout, 64, LruPolicy::new(64)).unwrap();
    let (mut table, mut held) = (Vec::new(), VecDeque::new());
    decode(
        &store,
        &keys,
        &tokens[..40],
        0,
        window,
        &mut table,
        &mut held,
    );
    drop(held);
    let guard = store.pin();
    assert_eq!(store.evict(5, &guard).unwrap(), 5, "blocks 0..5 go");

    // The 52-token request: no prefix without a window, blocks 7..10
    // under it (token 40 sees 31..=40).
    let req = store.begin_request();
    let mut refs = Vec::new();
    assert_eq!(
        store
            .lookup_prefix(&req, &keys, tokens.len(), &guard, &mut refs)
            .unwrap(),
        0
    );
    let hit = store
        .lookup_window(&req, &keys, tokens.len(), window, &guard, &mut refs)
        .unwrap();
    assert_eq!((hit.first, hit.end), (7, 10));
    assert_eq!(refs.len(), 3);
    store.end_request(req).unwrap();
    let mut table = vec![PageId::PLACEHOLDER; hit.first];
    table.extend(refs.iter().map(|r| r.handle().id()));
    let mut held: VecDeque<Held<'_>> = refs.into_iter().map(Held::Cached).collect();
    let got = decode(
        &store,
        &keys,
        &tokens,
        hit.end * 4,
        window,
        &mut table,
        &mut held,
    );
    assert_eq!(got, want[hit.end * 4..], "reused output differs");
    drop(held);
    all_returned(&store);

    // A window of zero is refused.
    let req = store.begin_request();
    let mut refs = Vec::new();
    assert_eq!(
        store.lookup_window(&req, &keys, tokens.len(), 0, &guard, &mut refs),
        Err(Error::InvalidValue(
            "attention window must be at least one token"
        ))
    );
    store.end_request(req).unwrap();
}

/// A store of 16 pages of 4 tokens (one head of width 2, f32).
fn four_token_store() -> CacheStore<'static, LruPolicy> {
    let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32)).unwrap();
    CacheStore::new(layout, 16, LruPolicy::new(16)).unwrap()
}

/// Publishes `keys[b]` for each of `blocks`, full and without a parent,
/// and releases them: cached, nothing else.
fn cache_blocks(
    store: &CacheStore<'static, LruPolicy>,
    req: &kvslice_core::RequestTicket,
    keys: &[SliceKey],
    blocks: &[usize],
) {
    let guard = store.pin();
    let pages = store.allocate(blocks.len() as u32, &guard).unwrap();
    for (&b, page) in blocks.iter().zip(pages) {
        drop(store.publish(req, page, keys[b], None, 4, &guard).unwrap());
    }
}

#[test]
fn a_gap_inside_the_window_shortens_the_hit() {
    let store = four_token_store();
    let guard = store.pin();
    let req = store.begin_request();
    let keys: Vec<SliceKey> = (0..8).map(|b| key(1, b)).collect();
    // Cached: blocks 1, 2, 3 and 5, 6 (0, 4 and 7 missing).
    cache_blocks(&store, &req, &keys, &[1, 2, 3, 5, 6]);
    let mut refs = Vec::new();
    let mut look = |window| {
        refs.clear();
        let hit = store
            .lookup_window(&req, &keys, 32, window, &guard, &mut refs)
            .unwrap();
        assert_eq!(refs.len(), hit.end - hit.first);
        (hit.first, hit.end)
    };
    // Window 8: token 28 needs 21..=27, blocks 5 and 6: reuse up to 7.
    assert_eq!(look(8), (5, 7));
    // Window 12: token 28 needs 17..=27 (block 4 is missing); token 16
    // needs 5..=15, blocks 1..4: reuse up to 4.
    assert_eq!(look(12), (1, 4));
    // Window 16: token 16 needs 1..=15 (block 0 missing): nothing.
    assert_eq!(look(16), (0, 0));
    drop(refs);
    store.end_request(req).unwrap();
}

/// A windowed lookup's counters: the blocks its window needs are hits,
/// everything from the hit's end on is missed, and the blocks before the
/// window (not needed, present or not) count as neither; tokens likewise.
#[test]
fn a_windowed_lookup_counts_what_its_window_needs() {
    let store = four_token_store();
    let guard = store.pin();
    let req = store.begin_request();
    let keys: Vec<SliceKey> = (0..8).map(|b| key(2, b)).collect();
    // Cached: blocks 2, 5 and 6 (the rest missing).
    cache_blocks(&store, &req, &keys, &[2, 5, 6]);
    let before = store.stats();
    let mut refs = Vec::new();
    // 30 tokens, window 8: token 28 needs 21..=27, blocks 5 and 6.
    let hit = store
        .lookup_window(&req, &keys, 30, 8, &guard, &mut refs)
        .unwrap();
    assert_eq!((hit.first, hit.end), (5, 7));
    let s = store.stats();
    assert_eq!(s.lookups - before.lookups, 1);
    assert_eq!(s.hit_blocks - before.hit_blocks, 2);
    // Block 7, from the hit's end on; blocks 0..5 are neither.
    assert_eq!(s.miss_blocks - before.miss_blocks, 1);
    assert_eq!(s.hit_tokens - before.hit_tokens, 8);
    // Tokens 28 and 29, after the hit's 28.
    assert_eq!(s.miss_tokens - before.miss_tokens, 2);
    drop(refs);
    store.end_request(req).unwrap();
}
