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
use kvslice_core::{
    AttentionBatch, AttentionEngine, CacheStore, KvDtype, KvWrite, LruPolicy, PageView,
};

use super::ModelFile;
use super::error::Result;
use super::profile::Workload;
use super::runner::{BLOCK_TOKENS, Reuse, Runner, cache_layout};

/// A fixed English passage, 192 tokens, whose log-likelihood every
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
    /// Whether the queries were rounded to int8 ([`RoundedQueries`]).
    pub int8_queries: bool,
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

/// An engine with every query row (`head_dim` elements) rounded to int8
/// against its largest magnitude before `inner` sees it, as
/// `CpuEngine::with_int8_queries` rounds them for its int8 kernels (which
/// then give the attention of the rounded queries to about 2e-5): the
/// accuracy cost of int8 queries, on any engine and any step: the
/// kernels take decode's rows (AVX-512 VNNI and VBMI only), while scoring
/// a text runs it through prefill, which keeps f32 queries in the engine.
///
/// ```
/// use kvslice_benches::llm::kv_accuracy::RoundedQueries;
/// use kvslice_core::testkit::{Rng, Scenario, max_rel_err};
/// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, LayoutSpec, ReferenceEngine};
///
/// let layout = KvLayout::new(LayoutSpec::new(1, 6, 2, 64, 16, KvDtype::I8))?;
/// let mut rng = Rng::new(4);
/// let sc = Scenario::random(layout, &[(200, 1)], &mut rng)?;
/// let q = sc.random_queries(0, &mut rng)?;
/// let seqs = sc.seq_attention(0, 0)?;
/// let batch = AttentionBatch::new(0, 0, &seqs, &q, 0.125);
/// let mut out = vec![0.0; q.len()];
/// RoundedQueries::new(&ReferenceEngine, 64).attend(&sc.pages, &batch, &mut out)?;
/// let err = max_rel_err(&out, &sc.naive_f64(0, 0, &q, 0.125)?);
/// assert!(err > 0.0 && err < 5e-2);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
pub struct RoundedQueries<'e, E: ?Sized> {
    inner: &'e E,
    head_dim: usize,
}

impl<'e, E: ?Sized> RoundedQueries<'e, E> {
    /// `inner` with its queries rounded, rows of `head_dim`.
    pub fn new(inner: &'e E, head_dim: usize) -> Self {
        Self {
            inner,
            head_dim: head_dim.max(1),
        }
    }
}

impl<P: ?Sized, E: AttentionEngine<P> + ?Sized> AttentionEngine<P> for RoundedQueries<'_, E> {
    fn attend(
        &self,
        pages: &P,
        batch: &AttentionBatch<'_>,
        out: &mut [f32],
    ) -> kvslice_core::Result<()> {
        let mut q = batch.queries.to_vec();
        for row in q.chunks_mut(self.head_dim) {
            let top = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            // Non-finite rows pass unchanged, for the engine to refuse.
            if top > 0.0 && top.is_finite() {
                let (inv, unit) = (127.0 / top, top / 127.0);
                row.iter_mut()
                    .for_each(|x| *x = (*x * inv).round_ties_even() * unit);
            }
        }
        let rounded = AttentionBatch {
            queries: &q,
            ..*batch
        };
        self.inner.attend(pages, &rounded, out)
    }

    fn write_kv(&self, pages: &mut P, write: &KvWrite<'_>) -> kvslice_core::Result<()> {
        self.inner.write_kv(pages, write)
    }
}

/// Scores `dtypes` (the first the baseline) on the first turns of
/// `workload` with replies of up to `max_new` tokens, and on `text`; with
/// `int8_queries`, int8 pages once more under [`RoundedQueries`].
///
/// # Errors
/// Model, tokenizer or cache errors; an empty `dtypes`.
#[allow(clippy::too_many_arguments)]
pub fn kv_accuracy<E>(
    model: &ModelFile,
    engine: &E,
    dtypes: &[KvDtype],
    int8_queries: bool,
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
        let scored = dtypes.len() + usize::from(int8_queries);
        let bar = ProgressBar::new((prompts.len() * (scored + 1) + scored) as u64);
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
    let (store, runner) = store_for(model, engine, base)?;
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
        out.push(score(model, engine, dtype, &seqs, &text_ids, &bar)?);
    }
    if int8_queries {
        let rounded = RoundedQueries::new(engine, config.head_dim as usize);
        let mut row = score(model, &rounded, KvDtype::I8, &seqs, &text_ids, &bar)?;
        row.int8_queries = true;
        out.push(row);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// A cache of `dtype` with room for the longest sequence scored, every
/// layer, and a runner over it.
fn store_for<'m, E>(
    model: &'m ModelFile,
    engine: &'m E,
    dtype: KvDtype,
) -> Result<(CacheStore<'static, LruPolicy>, Runner<'m, E>)>
where
    E: for<'v> AttentionEngine<PageView<'v>> + ?Sized,
{
    let config = &model.llama.config;
    let layout = cache_layout(config, dtype)?;
    let pages = (config.context.div_ceil(BLOCK_TOKENS as usize) as u32) * config.layers;
    let store = CacheStore::new(layout, pages, LruPolicy::new(pages))?;
    Ok((
        store,
        Runner::new(&model.llama, engine, layout, *b"kvslice-kv-accur"),
    ))
}

/// One dtype's greedy agreement on the baseline's replies (`seqs`, each
/// with its prompt's length) and mean NLL of `text_ids`.
fn score<E>(
    model: &ModelFile,
    engine: &E,
    dtype: KvDtype,
    seqs: &[(usize, Vec<u32>)],
    text_ids: &[u32],
    bar: &ProgressBar,
) -> Result<DtypeAccuracy>
where
    E: for<'v> AttentionEngine<PageView<'v>> + ?Sized,
{
    bar.set_message(dtype.name().to_string());
    let (store, runner) = store_for(model, engine, dtype)?;
    let (mut same, mut total) = (0usize, 0usize);
    for (prompt_len, seq) in seqs {
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
    let nll = runner.score(&store, text_ids, 1)?.mean_nll();
    bar.inc(1);
    Ok(DtypeAccuracy {
        dtype,
        int8_queries: false,
        reply_tokens: total,
        agreement: same as f64 / total.max(1) as f64,
        nll,
        text_tokens: text_ids.len(),
        kv_bytes_per_token: store.layout().page_bytes()
            * store.layout().num_layer_groups() as usize
            / BLOCK_TOKENS as usize,
    })
}

/// The results as a Markdown table, NLL differences against the first.
///
/// ```
/// use kvslice_benches::llm::kv_accuracy::{DtypeAccuracy, table};
/// use kvslice_core::KvDtype;
///
/// let row = |dtype, agreement, nll| DtypeAccuracy {
///     dtype, int8_queries: false, reply_tokens: 100, agreement, nll, text_tokens: 50,
///     kv_bytes_per_token: 1,
/// };
/// let rounded = DtypeAccuracy { int8_queries: true, ..row(KvDtype::I8, 0.8, 2.75) };
/// let t = table(&[row(KvDtype::F16, 1.0, 2.0), row(KvDtype::I8, 0.9, 2.5), rounded]);
/// assert!(t.contains("| int8 | 90.0% | 2.5000 | +0.5000 |"));
/// assert!(t.contains("| int8, int8 queries | 80.0% | 2.7500 | +0.7500 |"));
/// ```
pub fn table(rows: &[DtypeAccuracy]) -> String {
    let base = rows.first().map_or(0.0, |r| r.nll);
    let mut s = String::from(
        "| K/V dtype | greedy agreement | mean NLL (nats/token) | vs first | K/V bytes per token |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {}{} | {:.1}% | {:.4} | {:+.4} | {} |\n",
            r.dtype.name(),
            if r.int8_queries { ", int8 queries" } else { "" },
            100.0 * r.agreement,
            r.nll,
            r.nll - base,
            r.kv_bytes_per_token
        ));
    }
    s
}
