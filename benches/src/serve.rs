//! `kvslice serve`: an end-to-end serving loop over the tiny model.
//!
//! A stream of requests shares a few system prompts. Each request's full
//! prompt blocks are looked up in the [`CacheStore`]; cached blocks skip
//! prefill, the rest is computed through the attention engine, decode steps
//! follow, and the newly computed full blocks are published for later
//! requests. Every request is then recomputed from scratch in private pages
//! and its generated tokens and logits compared with the reused run.
//!
//! K/V lives in the store's own pool pages: the engine reads the cached
//! prefix and writes the new blocks through a [`PageView`] of the pages the
//! request holds.

use std::time::Instant;

use kvslice_core::testkit::Rng;
use kvslice_core::{
    AttentionEngine, CacheStore, Coordinator, Error, HashSecret, KvDtype, KvLayout, LayoutSpec,
    LruPolicy, PageBuf, PageId, PageMemoryMut, PageMut, PageRef, PageView, Request, Result,
};

use crate::model::{Model, ModelSpec, argmax};

/// Tokens per page in the serving demo.
pub const BLOCK_TOKENS: u32 = 16;

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Requests in the stream.
    pub requests: usize,
    /// Distinct system prompts the requests share.
    pub system_prompts: usize,
    /// Tokens in each system prompt.
    pub system_tokens: usize,
    /// Most tokens of a request's own suffix (uniform in 1..=this).
    pub max_suffix_tokens: usize,
    /// Greedy decode steps per request.
    pub decode_steps: usize,
    /// Cache capacity in pages.
    pub capacity_pages: u32,
    /// Seed for weights and prompts.
    pub seed: u64,
    /// Storage dtype of K/V pages (int8 and fp8 on the cpu and reference
    /// engines only).
    pub kv_dtype: KvDtype,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            requests: 24,
            system_prompts: 3,
            system_tokens: 96,
            max_suffix_tokens: 40,
            decode_steps: 8,
            capacity_pages: 256,
            seed: 7,
            kv_dtype: KvDtype::F16,
        }
    }
}

/// What a serving run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeReport {
    /// Engine name.
    pub engine: String,
    /// Requests served.
    pub requests: usize,
    /// Prompt tokens over all requests.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the cache.
    pub reused_tokens: usize,
    /// Full prompt blocks found cached over full prompt blocks looked up.
    pub block_hit_ratio: f64,
    /// Prompt + generated tokens per second with cache reuse.
    pub tokens_per_sec_reuse: f64,
    /// The same, recomputing every prompt from scratch.
    pub tokens_per_sec_scratch: f64,
    /// Largest relative difference of final logits, reuse vs scratch.
    pub max_logit_rel_diff: f64,
    /// Whether every generated token matched.
    pub tokens_match: bool,
    /// Bytes of K/V page memory.
    pub kv_bytes: usize,
    /// Bytes of weights.
    pub weight_bytes: usize,
}

struct Generation {
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

fn layout(spec: &ModelSpec, dtype: KvDtype) -> Result<KvLayout> {
    KvLayout::new(LayoutSpec::new(
        spec.layers,
        spec.q_heads,
        spec.kv_heads,
        spec.head_dim,
        BLOCK_TOKENS,
        dtype,
    ))
}

fn prompts(cfg: &ServeConfig) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(cfg.seed ^ 0x5151);
    let systems: Vec<Vec<u32>> = (0..cfg.system_prompts.max(1))
        .map(|_| {
            (0..cfg.system_tokens)
                .map(|_| rng.below(256) as u32)
                .collect()
        })
        .collect();
    (0..cfg.requests)
        .map(|i| {
            let mut p = systems[i % systems.len()].clone();
            let n = 1 + rng.below(cfg.max_suffix_tokens.max(1) as u64) as usize;
            p.extend((0..n).map(|_| rng.below(256) as u32));
            p
        })
        .collect()
}

/// Greedy decode from a prefilled sequence.
fn decode<P: PageMemoryMut + ?Sized, E: AttentionEngine<P>>(
    model: &Model,
    engine: &E,
    pages: &mut P,
    table: &[PageId],
    mut pos: usize,
    mut logits: Vec<f32>,
    steps: usize,
) -> Result<Generation> {
    let mut tokens = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = argmax(&logits);
        tokens.push(t);
        logits = model.forward(engine, pages, table, pos, &[t])?;
        pos += 1;
    }
    Ok(Generation { tokens, logits })
}

/// The largest difference between two logit vectors, relative to the
/// largest magnitude of `b`; infinite where either holds a non-finite
/// value (`f32::max` would skip a NaN and report agreement).
fn logit_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let scale = b
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    f64::from(diff / scale)
}

/// Serves the stream twice (with reuse, then from scratch) and compares.
pub fn serve<E>(engine: &E, engine_name: &str, cfg: &ServeConfig) -> Result<ServeReport>
where
    E: AttentionEngine<PageBuf> + for<'a> AttentionEngine<PageView<'a>>,
{
    let spec = ModelSpec::SMALL;
    let model = Model::new(spec, cfg.seed);
    let layout = layout(&spec, cfg.kv_dtype)?;
    let bt = BLOCK_TOKENS as usize;
    let requests = prompts(cfg);
    // Before a policy sizes its tables by the capacity, and in usize: a
    // request's page count cut to 32 bits would pass the check.
    crate::policy::check_capacity(cfg.capacity_pages)?;
    let longest = requests
        .iter()
        .map(|p| p.len())
        .max()
        .unwrap_or(0)
        .saturating_add(cfg.decode_steps);
    if longest.div_ceil(bt) > cfg.capacity_pages as usize {
        return Err(Error::InvalidValue("capacity is smaller than one request"));
    }
    let store = CacheStore::new(
        layout,
        cfg.capacity_pages,
        LruPolicy::new(cfg.capacity_pages),
    )?;
    let coord = Coordinator::new(layout, HashSecret::from_bytes(*b"kvslice-serve-!!"));

    // With reuse.
    let started = Instant::now();
    let (mut reused_tokens, mut looked_up, mut hit_blocks) = (0, 0, 0);
    let mut reuse_out = Vec::with_capacity(requests.len());
    for tokens in &requests {
        let guard = store.pin();
        let plan = coord.plan(&Request::new(tokens))?;
        let keys: Vec<_> = plan.keys_for(0, 0)?.collect();
        // Blocks wholly before the last prompt token: the last token is
        // always recomputed, since its logits start decoding.
        let cacheable = (tokens.len() - 1) / bt;
        let mut held: Vec<PageRef<'_, 'static>> = Vec::new();
        let req = store.begin_request();
        let hits =
            store.lookup_prefix(&req, &keys[..cacheable], cacheable * bt, &guard, &mut held)?;
        let need = (tokens.len() + cfg.decode_steps).div_ceil(bt) - hits;
        let mut fresh: Vec<PageMut<'_, 'static>> = store.allocate(need as u32, &guard)?;
        let table: Vec<PageId> = held
            .iter()
            .map(|r| r.handle().id())
            .chain(fresh.iter().map(|p| p.handle().id()))
            .collect();
        let start = hits * bt;
        let generation = {
            let mut view = PageView::new(store.pool());
            held.iter().for_each(|r| view.add_ref(r));
            fresh.iter_mut().for_each(|p| view.add_mut(p));
            let logits = model.forward(engine, &mut view, &table, start, &tokens[start..])?;
            decode(
                &model,
                engine,
                &mut view,
                &table,
                tokens.len(),
                logits,
                cfg.decode_steps,
            )?
        };
        // Publish the prompt's newly computed full blocks, parent first.
        let full = tokens.len() / bt;
        for (i, page) in (hits..).zip(fresh) {
            if i < full {
                let r = store.publish(&req, page, keys[i], held.last(), BLOCK_TOKENS, &guard)?;
                held.push(r);
            }
        }
        store.end_request(req)?;
        reused_tokens += start;
        looked_up += cacheable;
        hit_blocks += hits;
        reuse_out.push(generation);
    }
    let reuse_secs = started.elapsed().as_secs_f64();

    // From scratch, in private pages.
    let started = Instant::now();
    let mut scratch_out = Vec::with_capacity(requests.len());
    for tokens in &requests {
        let n = (tokens.len() + cfg.decode_steps).div_ceil(bt);
        let mut own = PageBuf::new(layout, n as u32)?;
        let table: Vec<PageId> = (0..n as u32).map(PageId).collect();
        let logits = model.forward(engine, &mut own, &table, 0, tokens)?;
        scratch_out.push(decode(
            &model,
            engine,
            &mut own,
            &table,
            tokens.len(),
            logits,
            cfg.decode_steps,
        )?);
    }
    let scratch_secs = started.elapsed().as_secs_f64();

    let mut max_diff = 0f64;
    let mut tokens_match = true;
    for (a, b) in reuse_out.iter().zip(&scratch_out) {
        tokens_match &= a.tokens == b.tokens;
        max_diff = max_diff.max(logit_rel_diff(&a.logits, &b.logits));
    }
    let prompt_tokens: usize = requests.iter().map(|p| p.len()).sum();
    let all_tokens = (prompt_tokens + requests.len() * cfg.decode_steps) as f64;
    Ok(ServeReport {
        engine: engine_name.to_string(),
        requests: requests.len(),
        prompt_tokens,
        reused_tokens,
        block_hit_ratio: hit_blocks as f64 / looked_up.max(1) as f64,
        tokens_per_sec_reuse: all_tokens / reuse_secs,
        tokens_per_sec_scratch: all_tokens / scratch_secs,
        max_logit_rel_diff: max_diff,
        tokens_match,
        kv_bytes: store.pool().capacity() as usize * layout.page_bytes(),
        weight_bytes: model.weight_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslice_core::ReferenceEngine;

    #[test]
    fn non_finite_logits_are_a_mismatch() {
        assert_eq!(logit_rel_diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(logit_rel_diff(&[1.0, 4.0], &[1.0, 2.0]) > 0.9);
        assert_eq!(logit_rel_diff(&[1.0, f32::NAN], &[1.0, 0.5]), f64::INFINITY);
        assert_eq!(
            logit_rel_diff(&[1.0, 0.5], &[f32::INFINITY, 0.5]),
            f64::INFINITY
        );
        assert_eq!(logit_rel_diff(&[1.0], &[1.0, 0.5]), f64::INFINITY);
    }

    /// Sizes past a page pool, or a request's page count past 32 bits, are
    /// errors before anything is allocated.
    #[test]
    fn impossible_sizes_are_errors_at_once() {
        for cfg in [
            ServeConfig {
                capacity_pages: u32::MAX,
                ..ServeConfig::default()
            },
            ServeConfig {
                decode_steps: 1 << 36,
                ..ServeConfig::default()
            },
        ] {
            assert!(matches!(
                serve(&ReferenceEngine, "reference", &cfg),
                Err(Error::InvalidValue(_))
            ));
        }
    }
}
