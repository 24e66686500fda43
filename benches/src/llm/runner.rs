//! Generation through kvslice: the coordinator names every block, the
//! store holds and shares the pages, the attention engine reads and writes
//! them; candle does the dense math (projections, norms, RoPE, MLP).
//!
//! Pages hold one layer each (`LayerGrouping::PerLayer`), so a strategy can
//! keep the K/V of every layer of a prefix (token-level reuse) or of only
//! the last N layers (layer-level reuse): a hit then recomputes the prefix
//! through the first layers and feeds only the new tokens to the last N.

use std::time::{Duration, Instant};

use candle_core::{Module, Tensor};
use kvslice_core::coordinator::TokenBudget;
use kvslice_core::{
    AttentionBatch, AttentionEngine, CacheStore, Coordinator, EvictionPolicy, HashSecret, KvDtype,
    KvLayout, KvWrite, LayerGrouping, LayoutSpec, PageId, PageMemoryMut, PageMut, PageRef,
    PageView, Request, SeqAttention, SliceKey,
};

use super::error::{LlmError, Result};
use super::weights::{Llama, LlamaConfig};

/// Tokens per page.
pub const BLOCK_TOKENS: u32 = 16;

/// Which K/V a generation looks up and publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Every prompt is computed from scratch; nothing is published.
    None,
    /// Every layer's K/V of the cached prefix is reused (token-level).
    Tokens,
    /// Only the last `n` layers' K/V are kept: a hit recomputes the prefix
    /// through the other layers and skips it in these (layer-level).
    LastLayers(u32),
}

impl Reuse {
    /// The first layer whose K/V is cached (the model's layer count for
    /// [`Reuse::None`]).
    fn first_cached_layer(self, layers: u32) -> u32 {
        match self {
            Reuse::None => layers,
            Reuse::Tokens => 0,
            Reuse::LastLayers(n) => layers - n.min(layers),
        }
    }
}

/// The page layout of a model's KV cache: one layer per page,
/// [`BLOCK_TOKENS`] tokens per page.
pub fn cache_layout(config: &LlamaConfig, dtype: KvDtype) -> Result<KvLayout> {
    Ok(KvLayout::new(
        LayoutSpec::new(
            config.layers,
            config.q_heads,
            config.kv_heads,
            config.head_dim,
            BLOCK_TOKENS,
            dtype,
        )
        .with_grouping(LayerGrouping::PerLayer),
    )?)
}

/// What one generation did and how long it took.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// Generated tokens (the stop token included, if one came).
    pub tokens: Vec<u32>,
    /// Prompt tokens computed over (after the runner's budget cut any).
    pub prompt_tokens: usize,
    /// Prompt positions the runner's token budget dropped before planning.
    pub dropped: Option<std::ops::Range<usize>>,
    /// Prompt tokens whose K/V came from the cache.
    pub reused_tokens: usize,
    /// From the call to the first generated token: lookup, prefill, logits.
    pub ttft: Duration,
    /// Each decode step (one token through the model).
    pub steps: Vec<Duration>,
    /// Logits after the prompt (what picked the first token).
    pub first_logits: Vec<f32>,
    /// Pages of the pool in use at the end of prefill (cached plus this
    /// request's).
    pub pages_in_use: u32,
}

/// What teacher-forced scoring of a text found ([`Runner::score`]): for
/// each token after the first, the model's greedy choice there and the
/// log-probability it gave the text's token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    /// The most likely token at each predicted position.
    pub greedy: Vec<u32>,
    /// The natural log-probability of the text's token there.
    pub logprobs: Vec<f64>,
}

impl Scored {
    /// Mean negative log-likelihood per predicted token, in nats.
    ///
    /// ```
    /// use kvslice_benches::llm::Scored;
    ///
    /// let s = Scored { greedy: vec![1, 2], logprobs: vec![-1.0, -3.0] };
    /// assert_eq!(s.mean_nll(), 2.0);
    /// ```
    pub fn mean_nll(&self) -> f64 {
        -self.logprobs.iter().sum::<f64>() / self.logprobs.len().max(1) as f64
    }

    /// The fraction of positions where this and `other` chose the same
    /// greedy token (over the shorter of the two).
    ///
    /// ```
    /// use kvslice_benches::llm::Scored;
    ///
    /// let a = Scored { greedy: vec![1, 2, 3, 4], logprobs: vec![0.0; 4] };
    /// let b = Scored { greedy: vec![1, 2, 9, 4], logprobs: vec![0.0; 4] };
    /// assert_eq!(a.agreement(&b), 0.75);
    /// ```
    pub fn agreement(&self, other: &Scored) -> f64 {
        let n = self.greedy.len().min(other.greedy.len());
        let same = self
            .greedy
            .iter()
            .zip(&other.greedy)
            .filter(|(a, b)| a == b)
            .count();
        same as f64 / n.max(1) as f64
    }
}

/// `ln softmax(logits)[token]`, in f64.
fn log_prob(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    logits
        .get(token as usize)
        .map_or(f64::NEG_INFINITY, |&l| f64::from(l) - max - sum.ln())
}

/// Greedy generation over a [`Llama`] with its K/V in a [`CacheStore`].
pub struct Runner<'a, E: ?Sized> {
    model: &'a Llama,
    engine: &'a E,
    coord: Coordinator,
    budget: Option<TokenBudget>,
}

/// The most likely token (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl<'a, E> Runner<'a, E>
where
    E: for<'v> AttentionEngine<PageView<'v>> + ?Sized,
{
    /// A runner whose keys are salted with `secret` (one per deployment).
    pub fn new(model: &'a Llama, engine: &'a E, layout: KvLayout, secret: [u8; 16]) -> Self {
        Self {
            model,
            engine,
            coord: Coordinator::new(layout, HashSecret::from_bytes(secret)),
            budget: None,
        }
    }

    /// Cuts prompts longer than `budget` before they are planned, keyed
    /// and computed (see [`TokenBudget`]); the generation reports what
    /// went.
    pub fn with_budget(mut self, budget: TokenBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The coordinator's request for `seq`: the original prompt followed by
    /// `generated` tokens, cut as the prompt alone was (the budget grows
    /// with the generated tokens, so the dropped positions stay the same).
    fn request<'s>(&self, seq: &'s [u32], generated: usize) -> Request<'s> {
        match self.budget {
            Some(b) => Request::new(seq).with_budget(grown(b, generated)),
            None => Request::new(seq),
        }
    }

    /// Generates up to `max_new` tokens after `prompt` greedily, stopping
    /// after any of `stop`; `on_token` sees each token as it comes.
    ///
    /// With reuse, the cached prefix of the prompt is looked up (all but
    /// the last prompt token may come from the cache), only the rest is
    /// prefilled, and the full blocks computed here (prompt and generated
    /// tokens) are published for later requests. Every page is released
    /// before it returns, on error too.
    pub fn generate<P: EvictionPolicy>(
        &self,
        store: &CacheStore<'static, P>,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
        reuse: Reuse,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Generation> {
        let c = &self.model.config;
        let original = prompt;
        let (kept, dropped) = match self.budget {
            Some(b) => b.apply(original)?,
            None => (original.to_vec(), None),
        };
        let prompt = &kept[..];
        let total = prompt.len().saturating_add(max_new);
        if max_new == 0 {
            return Err(LlmError::Cache(kvslice_core::Error::InvalidValue(
                "max_new must be at least 1 (the first token is generated with the prompt)",
            )));
        }
        if prompt.is_empty() {
            return Err(LlmError::Cache(kvslice_core::Error::InvalidValue(
                "an empty prompt",
            )));
        }
        if total > c.context {
            return Err(LlmError::PromptTooLong {
                tokens: total,
                context: c.context,
            });
        }
        if store.layout() != self.coord.layout() {
            return Err(LlmError::Cache(kvslice_core::Error::InvalidValue(
                "the store's layout is not the runner's",
            )));
        }
        let started = Instant::now();
        let bt = BLOCK_TOKENS as usize;
        let layers = c.layers;
        let first_cached = reuse.first_cached_layer(layers);
        let guard = store.pin();
        let request = store.begin_request();
        // Whatever happens, the request ends: the policy then learns its
        // turn now, not when its slot is next reused.
        let served = (|| -> Result<Generation> {
            let plan = self.coord.plan(&self.request(original, 0))?;
            debug_assert_eq!(plan.dropped(), dropped);
            // The last prompt token is always computed: its logits pick the
            // first generated token.
            let cacheable = (prompt.len() - 1) / bt;
            let keys: Vec<Vec<SliceKey>> = (0..layers)
                .map(|l| Ok(plan.keys_for(l, 0)?.take(cacheable).collect()))
                .collect::<Result<_>>()?;

            // Look up the cached groups; the usable prefix is the shortest hit.
            let mut held: Vec<Vec<PageRef<'_, 'static>>> =
                (0..layers).map(|_| Vec::new()).collect();
            let mut hits = if first_cached < layers { cacheable } else { 0 };
            for l in first_cached..layers {
                if hits == 0 {
                    break;
                }
                let found = store.lookup_prefix(
                    &request,
                    &keys[l as usize][..hits],
                    hits * bt,
                    &guard,
                    &mut held[l as usize],
                )?;
                hits = hits.min(found);
            }
            held.iter_mut().for_each(|h| h.truncate(hits));
            let start = hits * bt;

            // Fresh pages for everything else, all or nothing.
            let blocks = total.div_ceil(bt);
            let need: Vec<usize> = (0..layers)
                .map(|l| blocks - if l >= first_cached { hits } else { 0 })
                .collect();
            let mut fresh_all = store
                .allocate(need.iter().sum::<usize>() as u32, &guard)?
                .into_iter();
            let mut fresh: Vec<Vec<PageMut<'_, 'static>>> = need
                .iter()
                .map(|&n| fresh_all.by_ref().take(n).collect())
                .collect();
            let tables: Vec<Vec<PageId>> = (0..layers as usize)
                .map(|l| {
                    held[l]
                        .iter()
                        .map(|r| r.handle().id())
                        .chain(fresh[l].iter().map(|p| p.handle().id()))
                        .collect()
                })
                .collect();
            // The first position each layer computes: every prompt token below
            // the cached layers, the uncached suffix in them.
            let starts: Vec<usize> = (0..layers)
                .map(|l| if l >= first_cached { start } else { 0 })
                .collect();

            let mut out = Generation {
                prompt_tokens: prompt.len(),
                dropped: dropped.clone(),
                reused_tokens: start,
                ..Generation::default()
            };
            {
                let mut view = PageView::new(store.pool());
                held.iter().flatten().for_each(|r| view.add_ref(r));
                fresh.iter_mut().flatten().for_each(|p| view.add_mut(p));
                let first = starts[0];
                let logits = self.forward(&mut view, &tables, &prompt[first..], first, &starts)?;
                out.pages_in_use = store.pool().capacity() - store.pool().free_pages();
                let mut next = argmax(&logits);
                out.first_logits = logits;
                out.ttft = started.elapsed();
                let mut pos = prompt.len();
                loop {
                    out.tokens.push(next);
                    on_token(next);
                    if out.tokens.len() == max_new || stop.contains(&next) {
                        break;
                    }
                    let t0 = Instant::now();
                    let logits = self.forward(&mut view, &tables, &[next], pos, &[])?;
                    out.steps.push(t0.elapsed());
                    next = argmax(&logits);
                    pos += 1;
                }
            }

            // Publish the full blocks whose K/V were computed: the prompt and
            // every generated token but the last, which was never fed back.
            if first_cached < layers {
                let generated = &out.tokens[..out.tokens.len() - 1];
                let mut seq = original.to_vec();
                seq.extend_from_slice(generated);
                let done = self.coord.plan(&self.request(&seq, generated.len()))?;
                let full = done.full_blocks();
                for l in first_cached..layers {
                    let li = l as usize;
                    let pages = std::mem::take(&mut fresh[li]);
                    let keys = done.keys_for(l, 0)?.skip(hits);
                    let mut parent = held[li].pop();
                    for ((b, page), key) in (hits..full).zip(pages).zip(keys) {
                        debug_assert_eq!(key.block_index as usize, b);
                        let r = store.publish(
                            &request,
                            page,
                            key,
                            parent.as_ref(),
                            BLOCK_TOKENS,
                            &guard,
                        )?;
                        parent = Some(r);
                    }
                }
            }
            Ok(out)
        })();
        store.end_request(request)?;
        served
    }

    /// Scores `tokens` teacher-forced from position `from` on: the tokens
    /// before `from` are prefilled in one pass, then one decode step per
    /// token, each attending over the K/V of the tokens before it as the
    /// store's pages hold them (so in the store's dtype), nothing looked up
    /// or published. Position `i` of the result predicts
    /// `tokens[from + i]` (`from` is at least 1). Every page is released
    /// before it returns, on error too.
    pub fn score<P: EvictionPolicy>(
        &self,
        store: &CacheStore<'static, P>,
        tokens: &[u32],
        from: usize,
    ) -> Result<Scored> {
        let c = &self.model.config;
        if from == 0 || from >= tokens.len() {
            return Err(LlmError::Cache(kvslice_core::Error::InvalidValue(
                "scoring predicts tokens from 1 to the last",
            )));
        }
        if tokens.len() > c.context {
            return Err(LlmError::PromptTooLong {
                tokens: tokens.len(),
                context: c.context,
            });
        }
        if store.layout() != self.coord.layout() {
            return Err(LlmError::Cache(kvslice_core::Error::InvalidValue(
                "the store's layout is not the runner's",
            )));
        }
        let guard = store.pin();
        let blocks = tokens.len().div_ceil(BLOCK_TOKENS as usize);
        let mut all = store
            .allocate(c.layers * blocks as u32, &guard)?
            .into_iter();
        let mut fresh: Vec<Vec<PageMut<'_, 'static>>> = (0..c.layers)
            .map(|_| all.by_ref().take(blocks).collect())
            .collect();
        let tables: Vec<Vec<PageId>> = fresh
            .iter()
            .map(|l| l.iter().map(|p| p.handle().id()).collect())
            .collect();
        let mut view = PageView::new(store.pool());
        fresh.iter_mut().flatten().for_each(|p| view.add_mut(p));
        let mut out = Scored::default();
        let mut logits = self.forward(&mut view, &tables, &tokens[..from], 0, &[])?;
        for pos in from..tokens.len() {
            out.greedy.push(argmax(&logits));
            out.logprobs.push(log_prob(&logits, tokens[pos]));
            if pos + 1 < tokens.len() {
                logits = self.forward(&mut view, &tables, &tokens[pos..=pos], pos, &[])?;
            }
        }
        Ok(out)
    }

    /// Runs `tokens` (positions `pos..pos + tokens.len()`) through the
    /// model, writing their K/V into the pages of `tables` (one table per
    /// layer). `starts[l]`, if given, is the first position layer `l`
    /// computes (non-decreasing): rows before it are dropped there, their
    /// K/V being cached already. Returns the last position's logits.
    fn forward<M: PageMemoryMut + ?Sized>(
        &self,
        pages: &mut M,
        tables: &[Vec<PageId>],
        tokens: &[u32],
        pos: usize,
        starts: &[usize],
    ) -> Result<Vec<f32>>
    where
        E: AttentionEngine<M>,
    {
        let m = self.model;
        let c = &m.config;
        let (qh, kvh, hd) = (c.q_heads as usize, c.kv_heads as usize, c.head_dim as usize);
        let end = pos + tokens.len();
        let ids = Tensor::new(tokens, &m.device)?.unsqueeze(0)?;
        let mut x = m.embed.forward(&ids)?;
        let mut cur = pos;
        let eps = c.rms_eps as f32;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut attn = Vec::new();
        for (l, layer) in m.layers.iter().enumerate() {
            if let Some(&s) = starts.get(l)
                && s > cur
            {
                x = x.narrow(1, s - cur, end - s)?;
                cur = s;
            }
            let t = end - cur;
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, eps)?;
            let cos = m.cos.narrow(0, cur, t)?;
            let sin = m.sin.narrow(0, cur, t)?;
            // (1, t, heads·d) → (1, heads, t, d) for RoPE → token-major rows.
            let rope = |y: Tensor, heads: usize| -> Result<Vec<f32>> {
                let y = y
                    .reshape((1, t, heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()?;
                let y = candle_nn::rotary_emb::rope_i(&y, &cos, &sin)?;
                Ok(y.transpose(1, 2)?.flatten_all()?.to_vec1::<f32>()?)
            };
            let q = rope(layer.wq.forward(&h)?, qh)?;
            let k = rope(layer.wk.forward(&h)?, kvh)?;
            let v = layer.wv.forward(&h)?.flatten_all()?.to_vec1::<f32>()?;
            let table = &tables[l];
            let l = l as u32;
            self.engine.write_kv(
                pages,
                &KvWrite {
                    layer: l,
                    shard: 0,
                    block_table: table,
                    start: cur,
                    k: &k,
                    v: &v,
                },
            )?;
            let seqs = [SeqAttention {
                block_table: table,
                kv_len: end,
                q_len: t,
            }];
            attn.clear();
            attn.resize(t * qh * hd, 0.0);
            self.engine.attend(
                pages,
                &AttentionBatch::new(l, 0, &seqs, &q, scale),
                &mut attn,
            )?;
            let y = Tensor::from_slice(&attn, (1, t, qh * hd), &m.device)?;
            x = (layer.wo.forward(&y)? + x)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, eps)?;
            let g = candle_nn::ops::silu(&layer.gate.forward(&h)?)?;
            x = (layer.down.forward(&(g * layer.up.forward(&h)?)?)? + x)?;
        }
        let last = x.narrow(1, end - cur - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last.contiguous()?, &m.norm, eps)?;
        let logits = m.output.forward(&last)?;
        Ok(logits
            .squeeze(0)?
            .squeeze(0)?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1()?)
    }
}

/// `b` grown by `generated` tokens, so that a prompt followed by its
/// generated tokens is cut where the prompt alone was. Saturates: a budget
/// near `usize::MAX` cuts nothing either way.
fn grown(b: TokenBudget, generated: usize) -> TokenBudget {
    TokenBudget {
        max_tokens: b.max_tokens.saturating_add(generated),
        ..b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslice_core::coordinator::Truncation;

    /// A budget of `usize::MAX` grown by the generated tokens still cuts
    /// nothing (it used to overflow: a panic with overflow checks, and in
    /// release a wrapped budget that cut the prompt plus its tokens).
    #[test]
    fn a_huge_budget_grows_without_overflow() {
        let b = TokenBudget {
            max_tokens: usize::MAX,
            truncation: Truncation::KeepLast,
        };
        assert_eq!(grown(b, 3).dropped(10).unwrap(), None);
        let small = TokenBudget {
            max_tokens: 4,
            truncation: Truncation::KeepLast,
        };
        assert_eq!(grown(small, 2).dropped(8).unwrap(), Some(0..2));
    }
}
