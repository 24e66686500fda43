//! The model commands of the `kvslice` binary: `generate`, `profile` and
//! `model-bench`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use kvslice_core::coordinator::{TokenBudget, Truncation};
use kvslice_core::{AttentionEngine, CacheStore, PageView};

use super::peer::CandleLlama;
use super::profile::{Workload, default_strategies, plot, profile, table};
use super::runner::{BLOCK_TOKENS, Reuse, Runner, cache_layout};
use super::{Matmuls, ModelFile, default_model_path};
use crate::parse_kv_dtype;

/// An attention engine for host pages, chosen by name.
pub type DynEngine = dyn for<'v> AttentionEngine<PageView<'v>>;

/// `reference`, `cpu`, `cpu-rows-together` (the CPU engine with decode's
/// query rows of a kv head as one group: `CpuEngine::with_row_groups`, to
/// measure the groups) or `wgpu` (on the first adapter wgpu finds).
pub fn engine(name: &str) -> Result<Box<DynEngine>, String> {
    Ok(match name {
        "cpu" => Box::new(kvslice_cpu::CpuEngine::new()),
        "cpu-rows-together" => Box::new(kvslice_cpu::CpuEngine::new().with_row_groups(false)),
        "reference" => Box::new(kvslice_core::ReferenceEngine),
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            let engine = kvslice_wgpu::WgpuEngine::new().map_err(|e| e.to_string())?;
            eprintln!("wgpu adapter: {}", engine.adapter().name);
            Box::new(kvslice_wgpu::StagingEngine::new(engine))
        }
        other => {
            return Err(format!(
                "unknown engine {other:?}; known: cpu, cpu-rows-together, reference, wgpu"
            ));
        }
    })
}

/// Options every model command shares.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF (default: `$KVSLICE_MODEL_DIR` or target/models, where
    /// benches/scripts/fetch-model.sh puts SmolLM2-135M-Instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Attention engine: cpu, cpu-rows-together (decode's query rows as
    /// one group, to measure the CPU engine's row groups), reference or wgpu.
    #[arg(long, default_value = "cpu")]
    pub engine: String,
    /// Storage dtype of K/V pages: f16, bf16, f32, int8 or fp8-e4m3 (8-bit
    /// types with a scale per row; every engine reads them).
    #[arg(long, default_value = "f16")]
    pub kv_dtype: String,
    /// `dense-prefill`: prompts through weights dequantized to f32, single
    /// tokens through the quantized ones (fast prefill); `quantized`:
    /// candle's quantized matmul everywhere, as candle-transformers' own
    /// runner computes; `dense`: f32 weights everywhere.
    #[arg(long, default_value = "dense-prefill")]
    pub matmuls: String,
}

/// Matmul mode by name.
pub fn matmuls(name: &str) -> Result<Matmuls, String> {
    match name {
        "quantized" => Ok(Matmuls::Quantized),
        "dense-prefill" => Ok(Matmuls::DensePrefill),
        "dense" => Ok(Matmuls::Dense),
        other => Err(format!(
            "unknown matmuls {other:?}; known: quantized, dense-prefill, dense"
        )),
    }
}

impl ModelArgs {
    fn load(&self) -> Result<(ModelFile, PathBuf), String> {
        self.load_as(matmuls(&self.matmuls)?)
    }

    fn load_as(&self, mode: Matmuls) -> Result<(ModelFile, PathBuf), String> {
        let path = self.model.clone().unwrap_or_else(default_model_path);
        if !path.exists() {
            return Err(format!(
                "no model at {}: run benches/scripts/fetch-model.sh (or pass --model)",
                path.display()
            ));
        }
        let t0 = Instant::now();
        let model = ModelFile::load(&path, mode).map_err(|e| e.to_string())?;
        eprintln!(
            "loaded {} in {:.1} s: {} layers, {} q / {} kv heads, head_dim {}",
            path.display(),
            t0.elapsed().as_secs_f64(),
            model.llama.config.layers,
            model.llama.config.q_heads,
            model.llama.config.kv_heads,
            model.llama.config.head_dim
        );
        Ok((model, path))
    }
}

/// `kvslice generate`.
#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    /// Model, engine and K/V dtype.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A user message (rendered with the model's chat template).
    #[arg(long, conflicts_with = "chat")]
    pub prompt: Option<String>,
    /// A file of user messages, one per line: a conversation whose turns
    /// reuse the previous turns' cached K/V.
    #[arg(long)]
    pub chat: Option<PathBuf>,
    /// An optional system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate per turn.
    #[arg(long, default_value_t = 128, value_parser = crate::at_least_one())]
    pub max_new: usize,
    /// Recompute every prompt instead of reusing cached K/V.
    #[arg(long)]
    pub no_reuse: bool,
    /// Cache capacity in pages of 16 tokens of one layer (16384: 8k tokens
    /// of every layer, 201 MB in f16 for SmolLM2-135M).
    #[arg(long, default_value_t = 16_384)]
    pub capacity_pages: u32,
    /// Most prompt tokens to keep before caching; a longer prompt is cut
    /// by `--truncate` before it is keyed and computed.
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// What happens to a prompt over `--max-prompt-tokens`: `refuse`,
    /// `keep-last` (its last tokens), or `sinks:N` (its first N tokens and
    /// its last ones, as StreamingLLM keeps attention sinks).
    #[arg(long, default_value = "refuse", requires = "max_prompt_tokens")]
    pub truncate: String,
}

/// The `--max-prompt-tokens` / `--truncate` budget, if any, checked
/// (a zero budget, or sinks that leave no tail, is an error here rather
/// than at the first request).
fn budget(args: &GenerateArgs) -> Result<Option<TokenBudget>, String> {
    let Some(max_tokens) = args.max_prompt_tokens else {
        return Ok(None);
    };
    let truncation = match args.truncate.as_str() {
        "refuse" => Truncation::Refuse,
        "keep-last" => Truncation::KeepLast,
        other => match other.strip_prefix("sinks:").map(str::parse) {
            Some(Ok(first)) => Truncation::KeepFirstAndLast { first },
            _ => {
                return Err(format!(
                    "--truncate {other:?}: give refuse, keep-last or sinks:N"
                ));
            }
        },
    };
    let budget = TokenBudget {
        max_tokens,
        truncation,
    };
    // An empty sequence fits any budget: only the budget's own values
    // can be refused.
    budget.dropped(0).map_err(|e| {
        format!(
            "--max-prompt-tokens {max_tokens} --truncate {}: {e}",
            args.truncate
        )
    })?;
    Ok(Some(budget))
}

/// Streams a conversation's replies and prints what the cache did.
pub fn run_generate(args: &GenerateArgs) -> Result<(), String> {
    let turns: Vec<String> = match (&args.prompt, &args.chat) {
        (Some(p), None) => vec![p.clone()],
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| format!("reading {}: {e}", f.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        _ => return Err("give --prompt TEXT or --chat FILE".into()),
    };
    if turns.is_empty() {
        return Err("the chat file has no messages".into());
    }
    // Options first: a typo should not cost a model load.
    let engine = engine(&args.model.engine)?;
    let dtype = parse_kv_dtype(&args.model.kv_dtype)?;
    let budget = budget(args)?;
    let (model, _) = args.model.load()?;
    let layout = cache_layout(&model.llama.config, dtype).map_err(|e| e.to_string())?;
    let store = CacheStore::new(
        layout,
        args.capacity_pages,
        kvslice_core::DensityPolicy::new(args.capacity_pages),
    )
    .map_err(|e| e.to_string())?;
    let mut runner = Runner::new(&model.llama, &*engine, layout, *b"kvslice-generate");
    if let Some(b) = budget {
        runner = runner.with_budget(b);
    }
    let reuse = if args.no_reuse {
        Reuse::None
    } else {
        Reuse::Tokens
    };
    let mut history: Vec<(String, String)> = Vec::new();
    if let Some(s) = &args.system {
        history.push(("system".into(), s.clone()));
    }
    for turn in turns {
        history.push(("user".into(), turn.clone()));
        let messages: Vec<(&str, &str)> = history
            .iter()
            .map(|(r, c)| (r.as_str(), c.as_str()))
            .collect();
        let text = model
            .codec
            .chat(&messages, true)
            .map_err(|e| e.to_string())?;
        let prompt = model.codec.encode(&text).map_err(|e| e.to_string())?;
        println!("\n> {turn}");
        let mut printed = 0;
        let mut ids = Vec::new();
        let mut stdout = std::io::stdout();
        let codec = &model.codec;
        let g = runner
            .generate(&store, &prompt, args.max_new, &codec.eos, reuse, &mut |t| {
                if codec.eos.contains(&t) {
                    return;
                }
                ids.push(t);
                if let Ok(s) = codec.decode(&ids)
                    && let Some(new) = streamed(&s, printed, false)
                {
                    let _ = write!(stdout, "{new}");
                    let _ = stdout.flush();
                    printed += new.len();
                }
            })
            .map_err(|e| e.to_string())?;
        let reply = codec.decode(&ids).map_err(|e| e.to_string())?;
        if let Some(rest) = streamed(&reply, printed, true) {
            print!("{rest}");
        }
        println!();
        if let Some(d) = &g.dropped {
            eprintln!(
                "[prompt over the budget: positions {}..{} dropped ({} tokens) before caching]",
                d.start,
                d.end,
                d.len()
            );
        }
        let decode_s: f64 = g.steps.iter().map(|d| d.as_secs_f64()).sum();
        eprintln!(
            "[{} prompt tokens, {} from the cache; TTFT {:.1} ms; {} tokens at {:.1} tokens/s]",
            g.prompt_tokens,
            g.reused_tokens,
            g.ttft.as_secs_f64() * 1e3,
            g.tokens.len(),
            g.steps.len() as f64 / decode_s.max(1e-9)
        );
        history.push(("assistant".into(), reply));
    }
    let s = store.stats();
    eprintln!(
        "cache: {} pages in use of {}, {:.0} KB of K/V per token",
        store.pool().capacity() - store.pool().free_pages(),
        store.pool().capacity(),
        (layout.page_bytes() * model.llama.config.layers as usize) as f64
            / f64::from(BLOCK_TOKENS)
            / 1e3
    );
    eprintln!(
        "store: {} blocks hit by lookups (each layer's: a prompt reuses the prefix all layers hit), {} inserted, {} evicted",
        s.hit_blocks, s.inserts, s.evictions
    );
    Ok(())
}

/// What of `decoded` (the reply so far) to print after the `printed`
/// bytes already shown. A token may end inside a character, which decodes
/// as U+FFFD until the next token completes it: those trailing U+FFFDs
/// wait, unless the reply is `done`.
fn streamed(decoded: &str, printed: usize, done: bool) -> Option<&str> {
    let stable = if done {
        decoded
    } else {
        decoded.trim_end_matches('\u{FFFD}')
    };
    (stable.len() > printed && stable.is_char_boundary(printed)).then(|| &stable[printed..])
}

/// `kvslice profile`.
#[derive(Args, Clone, Debug)]
pub struct ProfileArgs {
    /// Model, engine and K/V dtype.
    #[command(flatten)]
    pub model: ModelArgs,
    /// The workload (JSON: a system prompt and conversations of user turns).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/data/chat_workload.json"))]
    pub workload: PathBuf,
    /// Use only the first N conversations.
    #[arg(long, value_parser = crate::at_least_one())]
    pub conversations: Option<usize>,
    /// Tokens generated per turn (at most).
    #[arg(long, default_value_t = 32, value_parser = crate::at_least_one())]
    pub max_new: usize,
    /// Strategies to run (comma-separated), or all of them.
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// One JSON object per strategy on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Where to write the SVG plot (KV memory against wall time).
    #[arg(long, default_value = "kvslice-profile.svg")]
    pub out: PathBuf,
}

/// `kvslice kv-accuracy`.
#[derive(Args, Clone, Debug)]
pub struct KvAccuracyArgs {
    /// The GGUF (default: as for `generate`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Attention engine: cpu, reference or wgpu.
    #[arg(long, default_value = "cpu")]
    pub engine: String,
    /// K/V dtypes to compare (comma-separated), the first the baseline.
    #[arg(long, value_delimiter = ',', default_value = "f16,int8,fp8-e4m3")]
    pub kv_dtypes: Vec<String>,
    /// The workload whose first turns are answered and scored.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/data/chat_workload.json"))]
    pub workload: PathBuf,
    /// Tokens of each baseline reply (at most).
    #[arg(long, default_value_t = 48, value_parser = crate::at_least_one())]
    pub max_new: usize,
    /// A text file whose log-likelihood is scored (default: a built-in
    /// passage of 192 tokens).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Also score int8 pages with the queries rounded to int8, as
    /// `CpuEngine::with_int8_queries` rounds them.
    #[arg(long)]
    pub int8_queries: bool,
}

/// Scores each K/V dtype's cache against the first's on the real model.
pub fn run_kv_accuracy(args: &KvAccuracyArgs) -> Result<(), String> {
    let dtypes = args
        .kv_dtypes
        .iter()
        .map(|d| parse_kv_dtype(d))
        .collect::<Result<Vec<_>, _>>()?;
    if dtypes.is_empty() {
        return Err("give at least one --kv-dtypes".into());
    }
    let workload = Workload::read(&args.workload).map_err(|e| e.to_string())?;
    let text = match &args.text {
        Some(f) => {
            std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?
        }
        None => super::kv_accuracy::PASSAGE.to_string(),
    };
    let model_args = ModelArgs {
        model: args.model.clone(),
        engine: args.engine.clone(),
        kv_dtype: dtypes[0].name().into(),
        matmuls: "dense-prefill".into(),
    };
    let engine = engine(&args.engine)?;
    let (model, _) = model_args.load()?;
    let rows = super::kv_accuracy::kv_accuracy(
        &model,
        &*engine,
        &dtypes,
        args.int8_queries,
        &workload,
        &text,
        args.max_new,
        true,
    )
    .map_err(|e| e.to_string())?;
    println!(
        "{} first turns answered by {} ({} reply tokens), scored teacher-forced; NLL over {} text tokens\n",
        workload.conversations.len(),
        dtypes[0].name(),
        rows[0].reply_tokens,
        rows[0].text_tokens
    );
    print!("{}", super::kv_accuracy::table(&rows));
    Ok(())
}

/// Runs the chat workload under every strategy and reports.
pub fn run_profile(args: &ProfileArgs) -> Result<(), String> {
    let mut workload = Workload::read(&args.workload).map_err(|e| e.to_string())?;
    if let Some(n) = args.conversations {
        workload.conversations.truncate(n);
    }
    // Options first: a typo should not cost a model load.
    let engine = engine(&args.model.engine)?;
    let dtype = parse_kv_dtype(&args.model.kv_dtype)?;
    let (model, _) = args.model.load()?;
    let mut strategies = default_strategies(model.llama.config.layers);
    if !args.strategies.is_empty() {
        let known: Vec<String> = strategies.iter().map(|s| s.name.clone()).collect();
        for n in &args.strategies {
            if !known.contains(n) {
                return Err(format!(
                    "unknown strategy {n:?}; known: {}",
                    known.join(", ")
                ));
            }
        }
        // The first strategy fixes the replies every other one replays.
        strategies.retain(|s| s.name == "no-reuse" || args.strategies.contains(&s.name));
    }
    let reports = profile(
        &model,
        &*engine,
        &workload,
        &strategies,
        args.max_new,
        dtype,
        !args.json,
    )
    .map_err(|e| e.to_string())?;
    if args.json {
        for r in &reports {
            println!("{}", r.to_json());
        }
    } else {
        let turns: usize = workload.conversations.iter().map(Vec::len).sum();
        let r0 = &reports[0];
        println!(
            "{} conversations, {} turns ({} prompt tokens, {} to {} each; {} generated), up to {} \
             new tokens per turn, {} engine, {} K/V pages\n",
            workload.conversations.len(),
            turns,
            r0.prompt_tokens,
            r0.prompt_range.0,
            r0.prompt_range.1,
            r0.generated_tokens,
            args.max_new,
            args.model.engine,
            args.model.kv_dtype
        );
        print!("{}", table(&reports));
        let base = &reports[0];
        for r in &reports[1..] {
            println!(
                "{:<22} wall time {:+.1}% against no reuse; mean TTFT of later turns {:.2}x faster",
                r.name,
                (r.wall_secs / base.wall_secs - 1.0) * 100.0,
                base.mean_ttft_later_ms / r.mean_ttft_later_ms.max(1e-9)
            );
        }
    }
    plot(
        &reports,
        "SmolLM2-135M, multi-turn chat: wall time vs KV memory",
        &args.out,
    )
    .map_err(|e| format!("plotting: {e}"))?;
    eprintln!("plot written to {}", args.out.display());
    Ok(())
}

/// `kvslice model-bench`.
#[derive(Args, Clone, Debug)]
pub struct ModelBenchArgs {
    /// Model, engine and K/V dtype.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Contexts at which decode steps are timed.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4000")]
    pub contexts: Vec<usize>,
    /// Decode steps timed at each context.
    #[arg(long, default_value_t = 16, value_parser = crate::at_least_one())]
    pub steps: usize,
    /// Prompt length of the prefill timing.
    #[arg(long, default_value_t = 1024)]
    pub prefill: usize,
    /// One JSON object per row on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Decode step latency and prefill time, kvslice against candle's own
/// quantized_llama, in one run.
pub fn run_model_bench(args: &ModelBenchArgs) -> Result<(), String> {
    // Options first: a typo should not cost three model loads.
    let engine = engine(&args.model.engine)?;
    let dtype = parse_kv_dtype(&args.model.kv_dtype)?;
    let (model, path) = args.model.load_as(Matmuls::Quantized)?;
    let (dense, _) = args.model.load_as(Matmuls::DensePrefill)?;
    let mut peer = CandleLlama::load(&path, Matmuls::Quantized).map_err(|e| e.to_string())?;
    let layout = cache_layout(&model.llama.config, dtype).map_err(|e| e.to_string())?;
    // Keys cover tokens and layout, not weights: the two matmul modes'
    // K/V differ slightly, so their runners key apart (neither reuses
    // here, but a store they shared must never serve one the other's).
    let runner = Runner::new(&model.llama, &*engine, layout, *b"kvslice-bench-q4");
    let dense_runner = Runner::new(&dense.llama, &*engine, layout, *b"kvslice-bench-dp");
    // A long, natural prompt: the workload's text, repeated.
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/chat_workload.json"),
    )
    .map_err(|e| e.to_string())?;
    let base = model.codec.encode(&text).map_err(|e| e.to_string())?;
    let tokens = |n: usize| -> Vec<u32> { base.iter().copied().cycle().take(n).collect() };
    let mut rows = Vec::new();
    let mut bench = |what: String, ctx: usize, steps: usize| -> Result<(), String> {
        if ctx + steps > CandleLlama::MAX_TOKENS {
            return Err(format!(
                "context {ctx} + {steps} steps is past candle's limit of {} tokens",
                CandleLlama::MAX_TOKENS
            ));
        }
        let prompt = tokens(ctx);
        let pages = ((ctx + steps + 1).div_ceil(BLOCK_TOKENS as usize)
            * model.llama.config.layers as usize) as u32;
        let store = CacheStore::new(layout, pages, kvslice_core::LruPolicy::new(pages))
            .map_err(|e| e.to_string())?;
        let ours = runner
            .generate(&store, &prompt, steps + 1, &[], Reuse::None, &mut |_| {})
            .map_err(|e| e.to_string())?;
        let fast = dense_runner
            .generate(&store, &prompt, steps + 1, &[], Reuse::None, &mut |_| {})
            .map_err(|e| e.to_string())?;
        let theirs = peer
            .generate(&prompt, steps + 1, &[])
            .map_err(|e| e.to_string())?;
        let ms =
            |d: &[std::time::Duration]| median(d.iter().map(|d| d.as_secs_f64() * 1e3).collect());
        let row = serde_json::json!({
            "what": what, "context": ctx,
            "kvslice_ms": if steps == 0 { ours.ttft.as_secs_f64() * 1e3 } else { ms(&ours.steps) },
            "kvslice_dense_prefill_ms": if steps == 0 { fast.ttft.as_secs_f64() * 1e3 } else { ms(&fast.steps) },
            "candle_ms": if steps == 0 { theirs.ttft.as_secs_f64() * 1e3 } else { ms(&theirs.steps) },
            "same_tokens": ours.tokens == theirs.tokens,
        });
        eprintln!("{row}");
        rows.push(row);
        Ok(())
    };
    for &ctx in &args.contexts {
        bench("decode step (median)".into(), ctx, args.steps)?;
    }
    bench(
        format!("prefill of {} tokens", args.prefill),
        args.prefill,
        0,
    )?;
    if args.json {
        rows.iter().for_each(|r| println!("{r}"));
        return Ok(());
    }
    println!(
        "\n{:<28} {:>8}  {:>12}  {:>12}  {:>14}  {:>18}  same tokens",
        "what", "context", "kvslice ms", "candle ms", "kvslice/candle", "dense-prefill ms"
    );
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let (a, b) = (f("kvslice_ms"), f("candle_ms"));
        println!(
            "{:<28} {:>8}  {:>12.2}  {:>12.2}  {:>14.3}  {:>18.2}  {}",
            r["what"].as_str().unwrap_or(""),
            r["context"],
            a,
            b,
            a / b.max(1e-9),
            f("kvslice_dense_prefill_ms"),
            r["same_tokens"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::streamed;

    /// An emoji split over two tokens: nothing of it is shown until it is
    /// whole, then all of it, and the text after it as it comes.
    #[test]
    fn a_character_split_over_tokens_is_shown_whole() {
        let mut printed = 0;
        let mut shown = String::new();
        for decoded in ["Hi ", "Hi \u{FFFD}", "Hi \u{1F600}", "Hi \u{1F600} there"] {
            if let Some(new) = streamed(decoded, printed, false) {
                shown.push_str(new);
                printed += new.len();
            }
        }
        assert_eq!(shown, "Hi \u{1F600} there");
        // A reply that really ends in U+FFFD shows it at the end.
        assert_eq!(streamed("ok\u{FFFD}", 2, false), None);
        assert_eq!(streamed("ok\u{FFFD}", 2, true), Some("\u{FFFD}"));
    }
}
