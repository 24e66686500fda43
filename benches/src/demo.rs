//! `kvslice demo`: a walk-through of the coordinator and the reference
//! engine. Requests that share a system prompt get canonical keys, a
//! single-threaded prefix cache (a plain hash map) reports which blocks hit,
//! the reference engine writes the missing K/V into pages, and decode
//! attention runs over the shared pages.

use std::collections::HashMap;

use kvslice_core::{
    AttentionBatch, AttentionEngine, Coordinator, HashSecret, KeyScope, KvDtype, KvLayout, KvWrite,
    LayoutSpec, PageBuf, PageId, ReferenceEngine, Request, SeqAttention, SliceKey,
};

const POOL_PAGES: u32 = 64;

/// Deterministic stand-in for a model's K/V projection of a token.
fn project(token: u32, pos: usize, salt: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x =
                (token as u64 * 2654435761 + pos as u64 * 40503 + (i as u64 + salt as u64) * 97)
                    % 2001;
            x as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Runs the walk-through, printing to stdout.
pub fn demo() -> Result<(), kvslice_core::Error> {
    let layout = KvLayout::new(LayoutSpec::new(1, 4, 2, 16, 4, KvDtype::F16))?;
    let coord = Coordinator::new(layout, HashSecret::from_bytes(*b"kvslice-demo-key"));
    let engine = ReferenceEngine;
    let mut pages = PageBuf::new(layout, POOL_PAGES)?;
    let mut cache: HashMap<SliceKey, PageId> = HashMap::new();
    let mut next_page = 0u32;

    let system: Vec<u32> = (1000..1010).collect();
    let users: [(&str, &[u8], &[u32]); 4] = [
        ("alice", b"acme", &[1, 2, 3]),
        ("bob", b"acme", &[7, 8, 9, 10, 11, 12]),
        ("carol", b"acme", &[1, 2, 3]),
        ("dave", b"globex", &[1, 2, 3]),
    ];
    println!(
        "kvslice demo: layout 1 layer, 4 q heads / 2 kv heads, head_dim 16, {} tokens per page, f16",
        layout.block_tokens()
    );
    println!("(a single-threaded walk-through; `kvslice replay` drives the real store)\n");

    let (mut hit_blocks, mut total_blocks) = (0usize, 0usize);
    for (user, tenant, suffix) in users {
        let tokens: Vec<u32> = system.iter().chain(suffix).copied().collect();
        let scope = KeyScope {
            salt: tenant,
            adapter: None,
        };
        let plan = coord.plan(&Request::new(&tokens).with_scope(scope))?;
        let keys: Vec<SliceKey> = plan.keys_for(0, 0)?.collect();
        let hits = keys
            .iter()
            .take(plan.full_blocks())
            .take_while(|k| cache.contains_key(k))
            .count();

        let mut table = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let page = match cache.get(key) {
                Some(&p) if i < hits => p,
                _ => {
                    let p = PageId(next_page);
                    next_page += 1;
                    p
                }
            };
            table.push(page);
        }
        // Compute K/V only for the tokens after the cached prefix.
        let start = hits * layout.block_tokens() as usize;
        let row = (layout.num_kv_heads() * layout.head_dim()) as usize;
        let k: Vec<f32> = tokens[start..]
            .iter()
            .enumerate()
            .flat_map(|(i, &t)| project(t, start + i, 0, row))
            .collect();
        let v: Vec<f32> = tokens[start..]
            .iter()
            .enumerate()
            .flat_map(|(i, &t)| project(t, start + i, 1, row))
            .collect();
        engine.write_kv(
            &mut pages,
            &KvWrite {
                layer: 0,
                shard: 0,
                block_table: &table,
                start,
                k: &k,
                v: &v,
            },
        )?;
        for (key, page) in keys.iter().zip(&table).take(plan.full_blocks()) {
            cache.entry(*key).or_insert(*page);
        }

        let q = project(
            tokens.len() as u32,
            tokens.len(),
            2,
            (layout.num_q_heads() * layout.head_dim()) as usize,
        );
        let seqs = [SeqAttention {
            block_table: &table,
            kv_len: tokens.len(),
            q_len: 1,
        }];
        let mut out = vec![0f32; q.len()];
        let scale = 1.0 / (layout.head_dim() as f32).sqrt();
        engine.attend(
            &pages,
            &AttentionBatch::new(0, 0, &seqs, &q, scale),
            &mut out,
        )?;

        hit_blocks += hits;
        total_blocks += keys.len();
        println!(
            "{user:>6} ({}) {} tokens → {} blocks, {hits} cached",
            String::from_utf8_lossy(tenant),
            tokens.len(),
            keys.len()
        );
        for (b, key) in plan.blocks().iter().zip(&keys) {
            let status = if (b.index as usize) < hits {
                "hit "
            } else {
                "miss"
            };
            println!(
                "         block {} [{status}] key {}…  valid {}/{}",
                b.index,
                &key.block.to_string()[..12],
                b.valid_tokens,
                layout.block_tokens()
            );
        }
        println!(
            "         decode output head 0: [{:.4}, {:.4}, {:.4}, …]\n",
            out[0], out[1], out[2]
        );
    }
    println!(
        "blocks: {total_blocks}, hits: {hit_blocks} ({:.0}%), pages used: {next_page} of {POOL_PAGES}",
        100.0 * hit_blocks as f64 / total_blocks as f64
    );
    Ok(())
}
