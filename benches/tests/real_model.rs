//! SmolLM2-135M-Instruct through kvslice, checked against candle-transformers'
//! own quantized_llama on the same GGUF, and the cache path checked against
//! itself (reuse on and off).
//!
//! Needs the model (`benches/scripts/fetch-model.sh`). Without it each test
//! prints `SKIPPED` and why; with `KVSLICE_REQUIRE_MODEL=1` (as CI sets) it
//! fails instead.

#![cfg(feature = "llm")]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kvslice_benches::llm::peer::CandleLlama;
use kvslice_benches::llm::{
    LlmError, Matmuls, ModelFile, Reuse, Runner, cache_layout, default_model_path, model_required,
};
use kvslice_core::{AttentionEngine, CacheStore, KvDtype, LruPolicy, PageView};

type Loaded = Option<(ModelFile, PathBuf)>;

/// The model with candle's quantized matmuls, loaded once per test binary,
/// or `None` (after printing why) when it is absent and not required.
fn model(test: &str) -> Option<&'static (ModelFile, PathBuf)> {
    static MODEL: OnceLock<Loaded> = OnceLock::new();
    model_as(test, &MODEL, Matmuls::Quantized)
}

/// The same with f32 matmuls ([`Matmuls::Dense`]).
fn dense_model(test: &str) -> Option<&'static (ModelFile, PathBuf)> {
    static MODEL: OnceLock<Loaded> = OnceLock::new();
    model_as(test, &MODEL, Matmuls::Dense)
}

/// The same with prompts through f32 weights ([`Matmuls::DensePrefill`],
/// `kvslice kv-accuracy`'s mode): prefill in a fraction of the time.
fn dense_prefill_model(test: &str) -> Option<&'static (ModelFile, PathBuf)> {
    static MODEL: OnceLock<Loaded> = OnceLock::new();
    model_as(test, &MODEL, Matmuls::DensePrefill)
}

fn model_as(
    test: &str,
    cell: &'static OnceLock<Loaded>,
    matmuls: Matmuls,
) -> Option<&'static (ModelFile, PathBuf)> {
    let loaded = cell.get_or_init(|| {
        let path = default_model_path();
        if !path.exists() {
            return None;
        }
        Some((
            ModelFile::load(&path, matmuls).expect("the model loads"),
            path,
        ))
    });
    if loaded.is_none() {
        let why = format!(
            "no model at {} (run benches/scripts/fetch-model.sh)",
            default_model_path().display()
        );
        assert!(!model_required(), "KVSLICE_REQUIRE_MODEL=1 but {why}");
        println!("SKIPPED {test}: {why}");
    }
    loaded.as_ref()
}

const PROMPTS: [&str; 5] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "How do I boil an egg? Give short steps.",
];

fn prompt_ids(m: &ModelFile, user: &str) -> Vec<u32> {
    let text = m
        .codec
        .chat(
            &[
                ("system", "You are a helpful AI assistant."),
                ("user", user),
            ],
            true,
        )
        .unwrap();
    m.codec.encode(&text).unwrap()
}

fn store(m: &ModelFile, dtype: KvDtype, pages: u32) -> CacheStore<'static, LruPolicy> {
    CacheStore::new(
        cache_layout(&m.llama.config, dtype).unwrap(),
        pages,
        LruPolicy::new(pages),
    )
    .unwrap()
}

/// Greedy tokens and the logits after the prompt, through kvslice.
fn ours<E>(
    m: &ModelFile,
    engine: &E,
    dtype: KvDtype,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<f32>)
where
    E: for<'v> AttentionEngine<PageView<'v>>,
{
    let layout = cache_layout(&m.llama.config, dtype).unwrap();
    let store = store(m, dtype, 4096);
    let g = Runner::new(&m.llama, engine, layout, [7; 16])
        .generate(&store, prompt, n, &[], Reuse::None, &mut |_| {})
        .unwrap();
    (g.tokens, g.first_logits)
}

/// Largest difference of two logit vectors, over the largest magnitude.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The check: 5 prompts × 48 new tokens, token for token equal to
/// candle-transformers' quantized_llama on the same GGUF, with the
/// reference and the CPU engine.
///
/// Both runners multiply by the GGUF's weights dequantized to f32
/// (`Matmuls::Dense`; the peer loads the same tensors dequantized) and keep
/// K/V in f32 (our pages, its tensors), so they compute the same function
/// and differ only in the order of floating-point sums inside attention.
/// The logits after each prompt must then agree to 1e-4 of the largest
/// logit: sums of a few hundred f32 products differ by ~1e-7 relative, and
/// 30 layers amplify that by at most ~1e3 (measured: an f16 rounding of
/// K/V, 2.4e-4 relative, moves the logits by ~5e-3 relative).
///
/// With candle's quantized matmuls (the GGUF's default) the same check
/// cannot hold for any two implementations: each activation row is
/// rounded to 8 bits, so a last-bit difference can flip a rounding and move
/// the logits by 2-5%. `quantized_runs_agree_with_candle_to_the_first_tokens`
/// reports that case.
#[test]
fn greedy_output_matches_candle_quantized_llama() {
    let Some((m, path)) = dense_model("greedy_output_matches_candle_quantized_llama") else {
        return;
    };
    let mut peer = CandleLlama::load(path, Matmuls::Dense).unwrap();
    let cpu = kvslice_cpu::CpuEngine::new();
    for p in PROMPTS {
        let ids = prompt_ids(m, p);
        let theirs = peer.generate(&ids, 48, &[]).unwrap();
        for (name, (tokens, logits)) in [
            (
                "reference",
                ours(m, &kvslice_core::ReferenceEngine, KvDtype::F32, &ids, 48),
            ),
            ("cpu", ours(m, &cpu, KvDtype::F32, &ids, 48)),
        ] {
            let d = rel_diff(&logits, &theirs.first_logits);
            println!("{name} {p:?}: logits rel diff {d:.2e}");
            assert!(d < 1e-4, "{name}, {p:?}: logits differ by {d}");
            assert_eq!(
                tokens,
                theirs.tokens,
                "{name}, {p:?}: {:?} vs candle {:?}",
                m.codec.decode(&tokens),
                m.codec.decode(&theirs.tokens)
            );
        }
    }
}

/// With candle's quantized matmuls and f16 pages, the first tokens agree
/// and the logits after the prompt agree to a few percent (see above why no
/// tighter bound holds); the lengths of the agreeing prefixes are printed.
#[test]
fn quantized_runs_agree_with_candle_to_the_first_tokens() {
    let Some((m, path)) = model("quantized_runs_agree_with_candle_to_the_first_tokens") else {
        return;
    };
    let mut peer = CandleLlama::load(path, Matmuls::Quantized).unwrap();
    let cpu = kvslice_cpu::CpuEngine::new();
    for p in PROMPTS {
        let ids = prompt_ids(m, p);
        let theirs = peer.generate(&ids, 16, &[]).unwrap();
        let (tokens, logits) = ours(m, &cpu, KvDtype::F16, &ids, 16);
        let same = tokens
            .iter()
            .zip(&theirs.tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let d = rel_diff(&logits, &theirs.first_logits);
        println!("{p:?}: logits rel diff {d:.2e}, first {same} of 16 tokens equal");
        assert!(d < 0.1, "{p:?}: logits differ by {d}");
        assert!(same >= 4, "{p:?}: only {same} equal tokens");
    }
}

/// The wgpu engine on whatever adapter is there (lavapipe in CI) for one
/// prompt; needs the model and an adapter (`KVSLICE_REQUIRE_GPU=1` fails
/// rather than skips without one).
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_engine_matches_candle_on_one_prompt() {
    let Some((m, path)) = dense_model("wgpu_engine_matches_candle_on_one_prompt") else {
        return;
    };
    let engine = match kvslice_wgpu::WgpuEngine::new() {
        Ok(e) => e,
        Err(e) => {
            assert!(
                std::env::var("KVSLICE_REQUIRE_GPU").as_deref() != Ok("1"),
                "KVSLICE_REQUIRE_GPU=1 but no wgpu adapter: {e}"
            );
            println!("SKIPPED wgpu_engine_matches_candle_on_one_prompt: no wgpu adapter ({e})");
            return;
        }
    };
    println!("adapter: {}", engine.adapter().name);
    let engine = kvslice_wgpu::StagingEngine::new(engine);
    let ids = prompt_ids(m, PROMPTS[0]);
    let theirs = CandleLlama::load(path, Matmuls::Dense)
        .unwrap()
        .generate(&ids, 48, &[])
        .unwrap();
    let (tokens, logits) = ours(m, &engine, KvDtype::F32, &ids, 48);
    assert!(rel_diff(&logits, &theirs.first_logits) < 1e-4);
    assert_eq!(tokens, theirs.tokens);
}

/// Turn 2 of a conversation, served after turn 1 published its blocks,
/// produces exactly the tokens it produces with reuse off, and takes most
/// of its prompt from the cache; the same with layer-level reuse.
#[test]
fn reuse_produces_the_tokens_of_no_reuse() {
    let Some((m, _)) = dense_model("reuse_produces_the_tokens_of_no_reuse") else {
        return;
    };
    let cpu = kvslice_cpu::CpuEngine::new();
    for (name, engine) in [
        ("reference", &kvslice_core::ReferenceEngine as &DynEngine),
        ("cpu", &cpu),
    ] {
        reuse_matches(m, name, engine);
    }
}

type DynEngine = dyn for<'v> AttentionEngine<PageView<'v>>;

fn reuse_matches(m: &ModelFile, name: &str, engine: &DynEngine) {
    let layout = cache_layout(&m.llama.config, KvDtype::F16).unwrap();
    let runner = Runner::new(&m.llama, engine, layout, [9; 16]);
    let sys = (
        "system",
        "You are a helpful AI assistant. Answer briefly and precisely.",
    );
    let t1 = m
        .codec
        .encode(&m.codec.chat(&[sys, ("user", PROMPTS[2])], true).unwrap())
        .unwrap();
    for reuse in [Reuse::Tokens, Reuse::LastLayers(15)] {
        let store = store(m, KvDtype::F16, 4096);
        let first = runner
            .generate(&store, &t1, 32, &m.codec.eos, reuse, &mut |_| {})
            .unwrap();
        let end = first
            .tokens
            .iter()
            .position(|t| m.codec.eos.contains(t))
            .unwrap_or(first.tokens.len());
        let reply = m.codec.decode(&first.tokens[..end]).unwrap();
        let t2 = m
            .codec
            .encode(
                &m.codec
                    .chat(
                        &[
                            sys,
                            ("user", PROMPTS[2]),
                            ("assistant", &reply),
                            ("user", "And at sunset?"),
                        ],
                        true,
                    )
                    .unwrap(),
            )
            .unwrap();
        let reused = runner
            .generate(&store, &t2, 32, &m.codec.eos, reuse, &mut |_| {})
            .unwrap();
        let fresh_store = self::store(m, KvDtype::F16, 4096);
        let scratch = runner
            .generate(
                &fresh_store,
                &t2,
                32,
                &m.codec.eos,
                Reuse::None,
                &mut |_| {},
            )
            .unwrap();
        let d = rel_diff(&reused.first_logits, &scratch.first_logits);
        println!(
            "{name} {reuse:?}: turn 2 has {} prompt tokens, {} from the cache; logits rel diff {d:.1e}",
            reused.prompt_tokens, reused.reused_tokens
        );
        assert!(
            reused.reused_tokens >= t1.len() / 16 * 16 - 16,
            "{reuse:?}: too few reused"
        );
        assert_eq!(scratch.reused_tokens, 0);
        assert_eq!(reused.tokens, scratch.tokens, "{name} {reuse:?}");
        // The pages are f16: a K/V value whose f32 differs in the last bit
        // (another chunking of the same matmul) can round to the other f16
        // neighbour, 4.9e-4 apart, so 1e-3 rather than the f32 test's 1e-4.
        assert!(d < 1e-3, "{name} {reuse:?}: logits differ by {d}");
    }
}

/// K/V held per token is the layout's figure: 30 layers × 3 kv heads × 64
/// × (K, V) × 2 bytes = 23,040 bytes in f16, and the pool holds no more
/// pages than the blocks written.
#[test]
fn kv_bytes_per_token_are_the_layouts() {
    let Some((m, _)) = model("kv_bytes_per_token_are_the_layouts") else {
        return;
    };
    let layout = cache_layout(&m.llama.config, KvDtype::F16).unwrap();
    let per_token = layout.page_bytes() * m.llama.config.layers as usize / 16;
    assert_eq!(per_token, 23_040);
    assert_eq!(m.llama.config.kv_bytes_per_token(2), 23_040);
    let store = store(m, KvDtype::F16, 4096);
    let ids = prompt_ids(m, PROMPTS[0]);
    let g = Runner::new(&m.llama, &kvslice_cpu::CpuEngine::new(), layout, [1; 16])
        .generate(&store, &ids, 8, &[], Reuse::Tokens, &mut |_| {})
        .unwrap();
    let blocks = (ids.len() + 8).div_ceil(16) as u32;
    assert_eq!(g.pages_in_use, blocks * 30, "pages held during the request");
    // After it: only the published full blocks stay.
    let full = ((ids.len() + 7) / 16) as u32;
    assert_eq!(
        store.pool().capacity() - store.pool().free_pages(),
        full * 30
    );
}

/// 8-bit K/V on the real model: teacher-forced over f16's own greedy
/// replies, f16 agrees with itself exactly (scoring computes what
/// generation did), and int8 and fp8 pages, and int8 with the queries
/// rounded to int8, keep most greedy tokens and the passage's
/// log-likelihood (the full run, `kvslice kv-accuracy --int8-queries`,
/// measured 96.0%, 95.4% and 95.4%, +0.005, +0.009 and +0.005 nats,
/// docs/QUANTIZATION.md).
/// Every page goes back to the pool.
#[test]
fn eight_bit_kv_keeps_the_greedy_tokens_and_likelihood() {
    use kvslice_benches::llm::kv_accuracy::{PASSAGE, kv_accuracy};
    use kvslice_benches::llm::profile::Workload;

    let Some((m, _)) = dense_prefill_model("eight_bit_kv_keeps_the_greedy_tokens_and_likelihood")
    else {
        return;
    };
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/chat_workload.json");
    let mut workload = Workload::read(Path::new(path)).unwrap();
    workload.conversations.truncate(3);
    let text = &PASSAGE[..PASSAGE.find(" In summer").unwrap()];
    let dtypes = [KvDtype::F16, KvDtype::I8, KvDtype::F8E4M3];
    let engine = kvslice_cpu::CpuEngine::new();
    let rows = kv_accuracy(m, &engine, &dtypes, true, &workload, text, 24, false).unwrap();
    for r in &rows {
        println!(
            "{}{}: agreement {:.3} over {} tokens, NLL {:.4} over {}",
            r.dtype.name(),
            if r.int8_queries { ", int8 queries" } else { "" },
            r.agreement,
            r.reply_tokens,
            r.nll,
            r.text_tokens
        );
    }
    assert!(
        rows[0].reply_tokens >= 40,
        "{} reply tokens",
        rows[0].reply_tokens
    );
    assert_eq!(rows[0].agreement, 1.0, "f16 scored against its own replies");
    assert!(
        rows[3].int8_queries && rows[3].dtype == KvDtype::I8,
        "{rows:?}"
    );
    for r in &rows[1..] {
        assert!(
            r.agreement >= 0.85,
            "{}: agreement {}",
            r.dtype.name(),
            r.agreement
        );
        let cost = r.nll - rows[0].nll;
        assert!(cost.abs() < 0.05, "{}: NLL {cost:+} nats", r.dtype.name());
        assert!(r.kv_bytes_per_token * 100 < rows[0].kv_bytes_per_token * 54);
    }
}

/// A prompt longer than the context is a clear error that leaves the cache
/// as it was; so is a prompt too big for the cache.
#[test]
fn oversized_prompts_are_errors_and_change_nothing() {
    let Some((m, _)) = model("oversized_prompts_are_errors_and_change_nothing") else {
        return;
    };
    let layout = cache_layout(&m.llama.config, KvDtype::F16).unwrap();
    let cpu = kvslice_cpu::CpuEngine::new();
    let runner = Runner::new(&m.llama, &cpu, layout, [1; 16]);
    let store = store(m, KvDtype::F16, 64);
    let long = vec![42u32; m.llama.config.context];
    let err = runner
        .generate(&store, &long, 1, &[], Reuse::Tokens, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, LlmError::PromptTooLong { .. }), "{err}");
    let err = runner
        .generate(&store, &long[..100], 1, &[], Reuse::Tokens, &mut |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("capacity"), "{err}");
    assert_eq!(store.pool().free_pages(), 64);
    assert_eq!(store.stats().inserts, 0);
}

/// A truncated file, a file with the known name but other bytes, and a
/// file that is not GGUF are errors that name the problem.
#[test]
fn bad_model_files_are_named() {
    let Some((_, path)) = model("bad_model_files_are_named") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("kvslice-bad-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(path).unwrap();
    let write = |name: &str, data: &[u8]| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    let load = |p: &Path| {
        ModelFile::load(p, Matmuls::Quantized)
            .err()
            .expect("an error")
    };
    let truncated = write("truncated.gguf", &bytes[..bytes.len() / 2]);
    assert!(matches!(load(&truncated), LlmError::Format(ref m) if m.contains("truncated")));
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let named = write(kvslice_benches::llm::weights::SMOLLM2_FILE, &flipped);
    assert!(matches!(load(&named), LlmError::Checksum { .. }));
    let junk = write("junk.gguf", b"not a model at all");
    assert!(matches!(load(&junk), LlmError::Format(_)));
    assert!(matches!(
        load(&dir.join("absent.gguf")),
        LlmError::Io { .. }
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// GGUFs of another architecture, or with a tokenizer this runner cannot
/// build, are named as such (written with candle's GGUF writer; no model
/// download needed).
#[test]
fn unsupported_ggufs_are_named() {
    use candle_core::quantized::gguf_file::{Value, write};
    let dir = std::env::temp_dir().join(format!("kvslice-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, meta: &[(&str, &Value)]| -> PathBuf {
        let p = dir.join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        write(&mut f, meta, &[]).unwrap();
        p
    };
    let s = |v: &str| Value::String(v.into());
    let u = Value::U32;
    let gpt2 = file("gpt2.gguf", &[("general.architecture", &s("gpt2"))]);
    let err = ModelFile::load(&gpt2, Matmuls::Quantized).err().unwrap();
    assert!(
        matches!(err, LlmError::Unsupported(ref m) if m.contains("gpt2")),
        "{err}"
    );
    let llama: Vec<(&str, Value)> = vec![
        ("general.architecture", s("llama")),
        ("llama.attention.head_count", u(4)),
        ("llama.attention.head_count_kv", u(2)),
        ("llama.embedding_length", u(64)),
        ("llama.block_count", u(1)),
        ("llama.feed_forward_length", u(128)),
        ("llama.vocab_size", u(8)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.context_length", u(128)),
        ("tokenizer.ggml.model", s("llama")),
    ];
    let meta: Vec<(&str, &Value)> = llama.iter().map(|(k, v)| (*k, v)).collect();
    let spm = file("spm.gguf", &meta);
    let err = ModelFile::load(&spm, Matmuls::Quantized).err().unwrap();
    assert!(
        matches!(err, LlmError::Tokenizer(ref m) if m.contains("byte-level")),
        "{err}"
    );
    // Byte-level BPE without token types, then without an eos: each named.
    let strings = |v: &[&str]| Value::Array(v.iter().map(|x| s(x)).collect());
    let mut gpt2_tok = llama.clone();
    gpt2_tok.pop();
    gpt2_tok.extend([
        ("tokenizer.ggml.model", s("gpt2")),
        (
            "tokenizer.ggml.tokens",
            strings(&["a", "b", "ab", "<|im_start|>"]),
        ),
        ("tokenizer.ggml.merges", strings(&["a b"])),
    ]);
    let load = |name: &str, meta: &[(&str, Value)]| {
        let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        ModelFile::load(&file(name, &meta), Matmuls::Quantized)
            .err()
            .unwrap()
    };
    let err = load("no-types.gguf", &gpt2_tok);
    assert!(
        matches!(err, LlmError::Tokenizer(ref m) if m.contains("token_type is missing")),
        "{err}"
    );
    gpt2_tok.push((
        "tokenizer.ggml.token_type",
        Value::Array([1, 1, 1, 3].map(Value::I32).to_vec()),
    ));
    let err = load("no-eos.gguf", &gpt2_tok);
    assert!(
        matches!(err, LlmError::Tokenizer(ref m) if m.contains("eos_token_id")),
        "{err}"
    );
    gpt2_tok.push(("tokenizer.ggml.eos_token_id", u(9)));
    let err = load("far-eos.gguf", &gpt2_tok);
    assert!(
        matches!(err, LlmError::Tokenizer(ref m) if m.contains("eos_token_id")),
        "{err}"
    );
    // With both, the tokenizer builds and the missing weights are named.
    gpt2_tok.pop();
    gpt2_tok.push(("tokenizer.ggml.eos_token_id", u(3)));
    let err = load("no-weights.gguf", &gpt2_tok);
    assert!(!matches!(err, LlmError::Tokenizer(_)), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A prompt over the runner's token budget is cut before it is keyed and
/// computed, under both truncation policies: the generation reports the
/// dropped positions, computes exactly the kept tokens (the same logits
/// and tokens, to the bit, as the kept tokens with no budget), and a
/// second identical request reuses the cut prompt's cached blocks and
/// starts with the same token.
#[test]
fn prompts_over_the_budget_are_cut_before_caching() {
    use kvslice_core::coordinator::{TokenBudget, Truncation};
    let Some((m, _)) = model("prompts_over_the_budget_are_cut_before_caching") else {
        return;
    };
    let layout = cache_layout(&m.llama.config, KvDtype::F16).unwrap();
    let engine = kvslice_cpu::CpuEngine::new();
    let ids = prompt_ids(m, &PROMPTS.join(" "));
    let max = 40;
    assert!(ids.len() > max, "the prompt must exceed the budget");
    for (truncation, dropped) in [
        (Truncation::KeepLast, 0..ids.len() - max),
        (
            Truncation::KeepFirstAndLast { first: 8 },
            8..8 + ids.len() - max,
        ),
    ] {
        let budget = TokenBudget {
            max_tokens: max,
            truncation,
        };
        let runner = Runner::new(&m.llama, &engine, layout, [3; 16]).with_budget(budget);
        let store = store(m, KvDtype::F16, 4096);
        let first = runner
            .generate(&store, &ids, 12, &[], Reuse::Tokens, &mut |_| {})
            .unwrap();
        assert_eq!(first.dropped, Some(dropped.clone()), "{truncation:?}");
        assert_eq!((first.prompt_tokens, first.reused_tokens), (max, 0));
        // The same tokens as the kept prompt generated with no budget.
        let kept: Vec<u32> = ids[..dropped.start]
            .iter()
            .chain(&ids[dropped.end..])
            .copied()
            .collect();
        let plain = Runner::new(&m.llama, &engine, layout, [3; 16])
            .generate(&store, &kept, 12, &[], Reuse::None, &mut |_| {})
            .unwrap();
        // Both computed the same 40 rows the same way: equal to the bit.
        assert_eq!(first.first_logits, plain.first_logits, "{truncation:?}");
        assert_eq!(first.tokens, plain.tokens, "{truncation:?}");
        // Cut the same way again: the cut prompt's full blocks are reused.
        let second = runner
            .generate(&store, &ids, 12, &[], Reuse::Tokens, &mut |_| {})
            .unwrap();
        assert_eq!(second.reused_tokens, (max - 1) / 16 * 16, "{truncation:?}");
        // Only the first token is compared. The reused prompt computes its
        // last 8 rows alone, not among 40, and the engine's attention for
        // a row can differ in the last bit with the rows it is tiled with
        // (about 1e-7 of the output's scale); these quantized matmuls
        // round activations to 8 bits, which can turn that into a logit
        // difference of 0.38 here, and a near tie in the third token then
        // goes the other way with AVX2's kernels (docs/MODEL.md).
        assert_eq!(second.tokens[0], first.tokens[0], "{truncation:?}");
    }
    // The default refuses, and the cache is untouched.
    let refuse = TokenBudget {
        max_tokens: max,
        truncation: Truncation::Refuse,
    };
    let store = store(m, KvDtype::F16, 4096);
    let err = Runner::new(&m.llama, &engine, layout, [3; 16])
        .with_budget(refuse)
        .generate(&store, &ids, 4, &[], Reuse::Tokens, &mut |_| {});
    assert!(err.is_err());
    assert_eq!(store.pool().free_pages(), 4096);
}

/// `profile` sizes its first strategy's store from the workload before any
/// reply exists: a conversation of many short turns, whose prompts are
/// mostly the chat template's markup and the replies, still fits (the
/// bound counts the rendered template and `max_new` per reply), and the
/// token strategy then reuses the earlier turns.
#[test]
fn profile_serves_many_short_turns() {
    use kvslice_benches::llm::profile::{Workload, default_strategies, profile};
    let Some((m, _)) = dense_prefill_model("profile_serves_many_short_turns") else {
        return;
    };
    let workload = Workload {
        system: "Be brief.".into(),
        conversations: vec![vec!["hi".to_string(); 16]],
    };
    let strategies: Vec<_> = default_strategies(m.llama.config.layers)
        .into_iter()
        .filter(|s| s.name == "no-reuse" || s.name == "token")
        .collect();
    let engine = kvslice_cpu::CpuEngine::new();
    let reports = profile(m, &engine, &workload, &strategies, 8, KvDtype::F16, false)
        .expect("the workload fits the first strategy's store");
    assert_eq!(reports.len(), 2);
    assert!(reports.iter().all(|r| r.requests == 16));
    // The last turn's prompt is past what the workload's characters and
    // 8 tokens per reply would have bounded (the old estimate).
    let old_bound = ("Be brief.".len() + 16 * 2 + 8 * 8).div_ceil(16) * 16 * 2;
    assert!(
        reports[0].prompt_range.1 > old_bound,
        "{:?}",
        reports[0].prompt_range
    );
    assert!(
        reports[1].prompt_hit_ratio > 0.5,
        "{}",
        reports[1].prompt_hit_ratio
    );
}
