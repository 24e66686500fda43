//! `kvslice profile`: the multi-turn chat experiment. The same workload
//! (conversations sharing one system prompt, served turn by turn and
//! interleaved, as a multi-user server sees them) runs under several reuse
//! strategies; each reports time to first token, decode step latency,
//! throughput, KV memory held and the prompt tokens taken from the cache.
//!
//! The assistant replies that later turns carry come from the first
//! strategy's run and are the same for every strategy, so every strategy
//! serves exactly the same prompts.

use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvslice_core::{AttentionEngine, CacheStore, KvDtype, PageView};
use plotters::prelude::*;
use serde_json::{Value, json};

use super::ModelFile;
use super::error::{LlmError, Result};
use super::runner::{BLOCK_TOKENS, Reuse, Runner, cache_layout};

/// Conversations to serve.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The system prompt every conversation starts with.
    pub system: String,
    /// Each conversation's user turns.
    pub conversations: Vec<Vec<String>>,
}

impl Workload {
    /// The chat of conversation `c` up to its turn `t`: the system prompt,
    /// each earlier turn with its reply from `replies`, then turn `t`.
    fn messages<'a>(&'a self, c: usize, t: usize, replies: &[&'a str]) -> Vec<(&'a str, &'a str)> {
        let turns = &self.conversations[c];
        let mut messages = vec![("system", self.system.as_str())];
        for (user, reply) in turns[..t].iter().zip(replies) {
            messages.extend([("user", user.as_str()), ("assistant", *reply)]);
        }
        messages.push(("user", &turns[t]));
        messages
    }

    /// Reads `{"system": ..., "conversations": [{"turns": [...]}, ...]}`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |what: &str| LlmError::Input(format!("{}: {what}", path.display()));
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
        let system = v["system"]
            .as_str()
            .ok_or_else(|| bad("no \"system\" string"))?
            .to_string();
        let conversations = v["conversations"]
            .as_array()
            .ok_or_else(|| bad("no \"conversations\" array"))?
            .iter()
            .map(|c| {
                c["turns"]
                    .as_array()
                    .ok_or_else(|| bad("a conversation without \"turns\""))?
                    .iter()
                    .map(|t| {
                        t.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| bad("a turn that is not a string"))
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        if conversations.is_empty() || conversations.iter().any(Vec::is_empty) {
            return Err(bad("an empty conversation list or conversation"));
        }
        Ok(Self {
            system,
            conversations,
        })
    }

    /// Requests in serving order: turn 1 of every conversation, then turn
    /// 2, ... (as (conversation, turn) pairs).
    pub fn order(&self) -> Vec<(usize, usize)> {
        let turns = self.conversations.iter().map(Vec::len).max().unwrap_or(0);
        (0..turns)
            .flat_map(|t| {
                (0..self.conversations.len())
                    .filter(move |&c| t < self.conversations[c].len())
                    .map(move |c| (c, t))
            })
            .collect()
    }
}

/// One way of running the workload.
#[derive(Debug, Clone)]
pub struct Strategy {
    /// Its name in reports.
    pub name: String,
    /// What is reused.
    pub reuse: Reuse,
    /// Cache capacity as a fraction of the workload's working set (1 =
    /// everything fits).
    pub capacity_fraction: f64,
    /// Eviction policy (see `kvslice replay --help`).
    pub policy: String,
}

/// The strategies of the experiment: no reuse, token-level reuse,
/// layer-level reuse of the last 8, 15 and 22 layers, and token-level reuse
/// in a cache of a quarter of the working set under the default policy and
/// under LRU.
pub fn default_strategies(layers: u32) -> Vec<Strategy> {
    let s = |name: String, reuse, capacity_fraction, policy: &str| Strategy {
        name,
        reuse,
        capacity_fraction,
        policy: policy.into(),
    };
    let mut v = vec![
        s("no-reuse".into(), Reuse::None, 1.0, "default"),
        s("token".into(), Reuse::Tokens, 1.0, "default"),
    ];
    for n in [8, 15, 22] {
        v.push(s(
            format!("layer-last-{n}"),
            Reuse::LastLayers(n.min(layers)),
            1.0,
            "default",
        ));
    }
    v.push(s(
        "token-quarter-default".into(),
        Reuse::Tokens,
        0.25,
        "default",
    ));
    v.push(s("token-quarter-lru".into(), Reuse::Tokens, 0.25, "lru"));
    v
}

/// What one strategy measured.
#[derive(Debug, Clone, Default)]
pub struct StrategyReport {
    /// Strategy name.
    pub name: String,
    /// Cache capacity in pages.
    pub capacity_pages: u32,
    /// Requests served.
    pub requests: usize,
    /// Time to first token, milliseconds: p50, p99.
    pub ttft_ms: (f64, f64),
    /// Mean time to first token of first turns and of later turns, ms.
    pub mean_ttft_first_ms: f64,
    /// See [`mean_ttft_first_ms`](Self::mean_ttft_first_ms).
    pub mean_ttft_later_ms: f64,
    /// Decode step latency, milliseconds: p50, p99.
    pub step_ms: (f64, f64),
    /// Generated tokens per second of decode time.
    pub decode_tokens_per_sec: f64,
    /// Prompt and generated tokens over the wall time.
    pub tokens_per_sec: f64,
    /// Most KV bytes held at once (pages in use × page bytes).
    pub peak_kv_bytes: usize,
    /// Prompt tokens whose K/V came from the cache, over all prompt tokens.
    pub prompt_hit_ratio: f64,
    /// Wall time of the whole workload, seconds.
    pub wall_secs: f64,
    /// Prompt tokens of all requests.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// The shortest and the longest prompt.
    pub prompt_range: (usize, usize),
    /// Generated tokens that equal the first strategy's, over all.
    pub agreement: f64,
    /// Every request's generated tokens, in serving order.
    pub outputs: Vec<Vec<u32>>,
}

impl StrategyReport {
    /// The report as JSON (without the outputs).
    pub fn to_json(&self) -> Value {
        json!({
            "strategy": self.name, "capacity_pages": self.capacity_pages, "requests": self.requests,
            "ttft_ms_p50": self.ttft_ms.0, "ttft_ms_p99": self.ttft_ms.1,
            "mean_ttft_first_turn_ms": self.mean_ttft_first_ms, "mean_ttft_later_turns_ms": self.mean_ttft_later_ms,
            "step_ms_p50": self.step_ms.0, "step_ms_p99": self.step_ms.1,
            "decode_tokens_per_sec": self.decode_tokens_per_sec, "tokens_per_sec": self.tokens_per_sec,
            "peak_kv_bytes": self.peak_kv_bytes, "prompt_hit_ratio": self.prompt_hit_ratio,
            "wall_secs": self.wall_secs, "agreement_with_first": self.agreement,
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "shortest_prompt": self.prompt_range.0, "longest_prompt": self.prompt_range.1,
        })
    }
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `strategies` over `workload`, each generating up to `max_new`
/// tokens per turn with `engine`. K/V pages are stored as `dtype`.
pub fn profile<E>(
    model: &ModelFile,
    engine: &E,
    workload: &Workload,
    strategies: &[Strategy],
    max_new: usize,
    dtype: KvDtype,
    progress: bool,
) -> Result<Vec<StrategyReport>>
where
    E: for<'v> AttentionEngine<PageView<'v>> + ?Sized,
{
    let codec = &model.codec;
    let layout = cache_layout(&model.llama.config, dtype)?;
    let layers = model.llama.config.layers as usize;
    let bt = BLOCK_TOKENS as usize;
    let order = workload.order();
    // The replies of the first strategy, by (conversation, turn).
    let mut replies: Vec<Vec<Option<String>>> = workload
        .conversations
        .iter()
        .map(|c| vec![None; c.len()])
        .collect();
    let mut reports: Vec<StrategyReport> = Vec::new();
    let mut working_set_pages = 0u32;
    let mut request_pages = 0u32;
    for (si, strategy) in strategies.iter().enumerate() {
        if si > 0 && working_set_pages == 0 {
            return Err(LlmError::Input(
                "the first strategy served no request".into(),
            ));
        }
        let capacity = if si == 0 {
            // Enough for the longest request twice over, before anything is
            // known (the first strategy publishes nothing anyway): each
            // conversation's last prompt as the template renders it with
            // empty replies, plus `max_new` tokens for each reply and for
            // the last one's generation.
            let mut longest = 0usize;
            for (c, turns) in workload.conversations.iter().enumerate() {
                let Some(last) = turns.len().checked_sub(1) else {
                    continue;
                };
                let empty = vec![""; last];
                let messages = workload.messages(c, last, &empty);
                let tokens = codec.encode(&codec.chat(&messages, true)?)?.len();
                longest = longest.max(tokens.saturating_add(turns.len().saturating_mul(max_new)));
            }
            longest
                .div_ceil(bt)
                .saturating_mul(layers * 2)
                .min(u32::MAX as usize) as u32
        } else {
            // At least the largest request, which holds all its pages.
            ((f64::from(working_set_pages) * strategy.capacity_fraction).ceil() as u32)
                .max(request_pages)
        };
        let policy = kvslice_core::evict::by_name(&strategy.policy, capacity)
            .ok_or_else(|| LlmError::Input(format!("unknown policy {:?}", strategy.policy)))?;
        let store = CacheStore::new(layout, capacity, policy)?;
        let runner = Runner::new(&model.llama, engine, layout, *b"kvslice-profile!");
        let bar = if progress {
            let bar = ProgressBar::new(order.len() as u64);
            bar.set_style(
                ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} turns ({eta})")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(strategy.name.clone());
            bar
        } else {
            ProgressBar::hidden()
        };
        let started = Instant::now();
        let mut report = StrategyReport {
            name: strategy.name.clone(),
            capacity_pages: capacity,
            requests: order.len(),
            ..StrategyReport::default()
        };
        let (mut ttfts, mut first, mut later, mut steps) = (vec![], vec![], vec![], vec![]);
        let (mut prompt_tokens, mut reused, mut generated, mut peak_pages) = (0, 0, 0usize, 0u32);
        let mut decode_time = Duration::ZERO;
        let mut final_prompt_pages = vec![0u32; workload.conversations.len()];
        for &(c, t) in &order {
            let earlier: Vec<&str> = replies[c][..t]
                .iter()
                .map(|r| r.as_deref().expect("earlier turns are served first"))
                .collect();
            let messages = workload.messages(c, t, &earlier);
            let prompt = codec.encode(&codec.chat(&messages, true)?)?;
            let g = runner.generate(
                &store,
                &prompt,
                max_new,
                &codec.eos,
                strategy.reuse,
                &mut |_| {},
            )?;
            if si == 0 {
                let end = g
                    .tokens
                    .iter()
                    .position(|x| codec.eos.contains(x))
                    .unwrap_or(g.tokens.len());
                replies[c][t] = Some(codec.decode(&g.tokens[..end])?);
                final_prompt_pages[c] =
                    ((prompt.len() + g.tokens.len()).div_ceil(bt) * layers) as u32;
                let pages = (prompt.len() + max_new).div_ceil(bt) * layers;
                request_pages = request_pages.max(pages as u32);
            }
            ttfts.push(ms(g.ttft));
            if t == 0 {
                first.push(ms(g.ttft))
            } else {
                later.push(ms(g.ttft))
            }
            steps.extend(g.steps.iter().map(|d| ms(*d)));
            decode_time += g.steps.iter().sum::<Duration>();
            prompt_tokens += g.prompt_tokens;
            report.prompt_range = if report.outputs.is_empty() {
                (g.prompt_tokens, g.prompt_tokens)
            } else {
                (
                    report.prompt_range.0.min(g.prompt_tokens),
                    report.prompt_range.1.max(g.prompt_tokens),
                )
            };
            reused += g.reused_tokens;
            generated += g.tokens.len();
            peak_pages = peak_pages.max(g.pages_in_use);
            report.outputs.push(g.tokens);
            bar.inc(1);
        }
        bar.finish_and_clear();
        if si == 0 {
            working_set_pages = final_prompt_pages.iter().sum();
        }
        report.wall_secs = started.elapsed().as_secs_f64();
        report.ttft_ms = (
            percentile(&mut ttfts.clone(), 0.5),
            percentile(&mut ttfts, 0.99),
        );
        report.mean_ttft_first_ms = first.iter().sum::<f64>() / first.len().max(1) as f64;
        report.mean_ttft_later_ms = later.iter().sum::<f64>() / later.len().max(1) as f64;
        report.step_ms = (
            percentile(&mut steps.clone(), 0.5),
            percentile(&mut steps, 0.99),
        );
        report.decode_tokens_per_sec = steps.len() as f64 / decode_time.as_secs_f64().max(1e-9);
        report.tokens_per_sec = (prompt_tokens + generated) as f64 / report.wall_secs;
        report.peak_kv_bytes = peak_pages as usize * layout.page_bytes();
        report.prompt_hit_ratio = reused as f64 / prompt_tokens.max(1) as f64;
        report.prompt_tokens = prompt_tokens;
        report.generated_tokens = generated;
        let (same, all) = reports.first().map_or((1, 1), |r0: &StrategyReport| {
            r0.outputs
                .iter()
                .zip(&report.outputs)
                .fold((0, 0), |(s, a), (x, y)| {
                    (
                        s + x.iter().zip(y).filter(|(p, q)| p == q).count(),
                        a + x.len().max(y.len()),
                    )
                })
        });
        report.agreement = same as f64 / all.max(1) as f64;
        reports.push(report);
    }
    Ok(reports)
}

/// The reports as an aligned table.
pub fn table(reports: &[StrategyReport]) -> String {
    let mut out = String::from(
        "strategy               pages  ttft_p50  ttft_p99  ttft_t1  ttft_t2+  step_p50  step_p99  decode_tok/s  tok/s    peak_kv_MB  hit    wall_s  agree\n",
    );
    for r in reports {
        out.push_str(&format!(
            "{:<22} {:>6}  {:>8.1}  {:>8.1}  {:>7.1}  {:>8.1}  {:>8.2}  {:>8.2}  {:>12.1}  {:>7.1}  {:>10.1}  {:>5.3}  {:>6.1}  {:>5.3}\n",
            r.name, r.capacity_pages, r.ttft_ms.0, r.ttft_ms.1, r.mean_ttft_first_ms, r.mean_ttft_later_ms,
            r.step_ms.0, r.step_ms.1, r.decode_tokens_per_sec, r.tokens_per_sec,
            r.peak_kv_bytes as f64 / 1e6, r.prompt_hit_ratio, r.wall_secs, r.agreement
        ));
    }
    out
}

/// Plots each strategy's total wall time and mean time to first token
/// against the KV memory it held at peak.
pub fn plot(
    reports: &[StrategyReport],
    title: &str,
    path: &Path,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = reports
        .iter()
        .map(|r| r.peak_kv_bytes as f64 / 1e6)
        .fold(1.0, f64::max)
        * 1.15;
    let y_max = reports.iter().map(|r| r.wall_secs).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("KV memory held at peak (MB)")
        .y_desc("wall time of the workload (s)")
        .draw()?;
    for (i, r) in reports.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let p = (r.peak_kv_bytes as f64 / 1e6, r.wall_secs);
        chart
            .draw_series([Circle::new(p, 6, color.filled())])?
            .label(format!("{} (TTFT p50 {:.0} ms)", r.name, r.ttft_ms.0))
            .legend(move |(x, y)| Circle::new((x + 8, y), 5, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
