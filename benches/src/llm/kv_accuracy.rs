//! `kvslice kv-accuracy`: what storing the real model's K/V in another
//! dtype costs. The first dtype (f16 by default) is the baseline: it
//! answers the first turn of every conversation of the profile workload
//! greedily, and each dtype then scores those prompts and replies
//! teacher-forced. The agreement rate is the fraction of reply tokens each
//! dtype's cache would have chosen too (so every position is judged on the
//! same history, and one early difference does not decide the rest); the
//! mean negative log-likelihood of a fixed text says how much the model's
//! predictions lose.

use indicatif::{ProgressBar, ProgressStyle};
use kvslice_core::{AttentionEngine, CacheStore, KvDtype, LruPolicy, PageView};

use super::ModelFile;
use super::error::Result;
use super::profile::Workload;
use super::runner::{BLOCK_TOKENS, Reuse, Runner, cache_layout};

/// A fixed English passage, about 220 tokens, whose log-likelihood every
/// dtype is scored on.
pub const PASSAGE: &str = "The lighthouse stood at the end of a narrow spit of rock, and \
for most of the year the keeper saw no one but the man who brought supplies by boat on the \
first Monday of each month. He kept a log of the weather, the ships that passed and the birds \
that rested on the gallery rail. In winter the storms came from the west, and the waves broke \
so high against the tower that salt crusted the windows of the lamp room. He cleaned them every \
morning with fresh water carried up one hundred and twelve steps. In summer the sea was calm and \
the evenings were long, and he read the books the supply boat left him: histories, novels, and \
once a manual on the repair of marine engines, which he read twice. When the light was finally \
automated, he moved to a village on the mainland, where he was surprised to find that he missed \
the noise of the wind more than he had ever missed the company of other people.";

/// What one dtype's cache did to the model's predictions.
#[derive(Debug, Clone, PartialEq)]
pub struct DtypeAccuracy {
    /// The K/V dtype.
    pub dtype: KvDtype,
    /// Reply tokens (of the baseline's replies) scored.
    pub reply_tokens: usize,
    /// Of those, the fraction this dtype's greedy choice matches.
    pub agreement: f64,
    /// Mean negative log-likelihood of [`PASSAGE`] (or the given text)
    /// per token, in nats.
    pub nll: f64,
    /// Tokens of that text.
    pub text_tokens: usize,
    /// K/V bytes per token of the model under this dtype.
    pub kv_bytes_per_token: usize,
}

/// Scores `dtypes` (the first the baseline) on the first turns of
/// `workload` with replies of up to `max_new` tokens, and on `text`.
///
/// # Errors
/// Model, tokenizer or cache errors; an empty `dtypes`.
pub fn kv_accuracy<E>(
    model: &ModelFile,
    engine: &E,
    dtypes: &[KvDtype],
    workload: &Workload,
    text: &str,
    max_new: usize,
    progress: bool,
) -> Result<Vec<DtypeAccuracy>>
where
    E: for<'v> AttentionEngine<PageView<'v>> + ?Sized,
{
    let Some(&base) = dtypes.first() else {
        return Err(kvslice_core::Error::InvalidValue("no dtype to score").into());
    };
    let codec = &model.codec;
    let config = &model.llama.config;
    let store_for = |dtype: KvDtype| -> Result<(CacheStore<'static, LruPolicy>, Runner<'_, E>)> {
        let layout = cache_layout(config, dtype)?;
        // Room for the longest sequence scored, every layer.
        let pages = (config.context.div_ceil(BLOCK_TOKENS as usize) as u32) * config.layers;
        let store = CacheStore::new(layout, pages, LruPolicy::new(pages))?;
        Ok((
            store,
            Runner::new(&model.llama, engine, layout, *b"kvslice-kv-accur"),
        ))
    };
    let prompts: Vec<Vec<u32>> = workload
        .conversations
        .iter()
        .map(|c| {
            let messages = [
                ("system", workload.system.as_str()),
                ("user", c[0].as_str()),
            ];
            codec.encode(&codec.chat(&messages, true)?)
        })
        .collect::<Result<_>>()?;
    let text_ids = codec.encode(text)?;
    let bar = if progress {
        let bar = ProgressBar::new((prompts.len() * (dtypes.len() + 1) + dtypes.len()) as u64);
        bar.set_style(
            ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({eta})")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    // The baseline's replies, eos dropped.
    bar.set_message(format!("{} replies", base.name()));
    let (store, runner) = store_for(base)?;
    let mut seqs = Vec::new();
    for prompt in &prompts {
        let g = runner.generate(
            &store,
            prompt,
            max_new,
            &codec.eos,
            Reuse::None,
            &mut |_| {},
        )?;
        let reply: Vec<u32> = g
            .tokens
            .into_iter()
            .take_while(|t| !codec.eos.contains(t))
            .collect();
        let mut seq = prompt.clone();
        seq.extend_from_slice(&reply);
        seqs.push((prompt.len(), seq));
        bar.inc(1);
    }
    drop((store, runner));
    let mut out = Vec::new();
    for &dtype in dtypes {
        bar.set_message(dtype.name().to_string());
        let (store, runner) = store_for(dtype)?;
        let (mut same, mut total) = (0usize, 0usize);
        for (prompt_len, seq) in &seqs {
            if seq.len() > *prompt_len {
                // The prompt prefilled, each reply token predicted.
                let scored = runner.score(&store, seq, *prompt_len)?;
                for (g, t) in scored.greedy.iter().zip(&seq[*prompt_len..]) {
                    same += usize::from(g == t);
                    total += 1;
                }
            }
            bar.inc(1);
        }
        let nll = runner.score(&store, &text_ids, 1)?.mean_nll();
        bar.inc(1);
        out.push(DtypeAccuracy {
            dtype,
            reply_tokens: total,
            agreement: same as f64 / total.max(1) as f64,
            nll,
            text_tokens: text_ids.len(),
            kv_bytes_per_token: store.layout().page_bytes()
                * store.layout().num_layer_groups() as usize
                / BLOCK_TOKENS as usize,
        });
    }
    bar.finish_and_clear();
    Ok(out)
}

/// The results as a Markdown table, NLL differences against the first.
///
/// ```
/// use kvslice_benches::llm::kv_accuracy::{DtypeAccuracy, table};
/// use kvslice_core::KvDtype;
///
/// let row = |dtype, agreement, nll| DtypeAccuracy {
///     dtype, reply_tokens: 100, agreement, nll, text_tokens: 50, kv_bytes_per_token: 1,
/// };
/// let t = table(&[row(KvDtype::F16, 1.0, 2.0), row(KvDtype::I8, 0.9, 2.5)]);
/// assert!(t.contains("| int8 | 90.0% | 2.5000 | +0.5000 |"));
/// ```
pub fn table(rows: &[DtypeAccuracy]) -> String {
    let base = rows.first().map_or(0.0, |r| r.nll);
    let mut s = String::from(
        "| K/V dtype | greedy agreement | mean NLL (nats/token) | vs first | K/V bytes per token |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.1}% | {:.4} | {:+.4} | {} |\n",
            r.dtype.name(),
            100.0 * r.agreement,
            r.nll,
            r.nll - base,
            r.kv_bytes_per_token
        ));
    }
    s
}
