//! The GGUF's own tokenizer (gpt2-style byte-level BPE, built with the
//! `tokenizers` crate from the file's vocabulary and merges) and its chat
//! template (rendered with minijinja).

use candle_core::quantized::gguf_file;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer};

use super::error::{LlmError, Result};

/// GGUF token type of control tokens (`<|im_start|>`, ...).
const CONTROL: i32 = 3;

/// Text ↔ token ids, plus the ids that end a turn.
pub struct TextCodec {
    tokenizer: Tokenizer,
    /// Tokens that end generation (the GGUF's eos).
    pub eos: Vec<u32>,
    template: Option<String>,
}

fn strings(ct: &gguf_file::Content, key: &str) -> Result<Vec<String>> {
    let v = ct
        .metadata
        .get(key)
        .ok_or_else(|| LlmError::Tokenizer(format!("{key} is missing")))?;
    let items = v
        .to_vec()
        .map_err(|_| LlmError::Tokenizer(format!("{key} is not an array")))?;
    items
        .iter()
        .map(|s| {
            s.to_string()
                .cloned()
                .map_err(|_| LlmError::Tokenizer(format!("{key} holds a non-string")))
        })
        .collect()
}

impl TextCodec {
    /// Builds the tokenizer the GGUF describes. Only byte-level BPE
    /// (`tokenizer.ggml.model = gpt2`) is supported.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self> {
        let model = ct
            .metadata
            .get("tokenizer.ggml.model")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_default();
        if model != "gpt2" {
            return Err(LlmError::Tokenizer(format!(
                "tokenizer model {model:?}; only byte-level BPE (\"gpt2\") is supported"
            )));
        }
        let tokens = strings(ct, "tokenizer.ggml.tokens")?;
        let merges = strings(ct, "tokenizer.ggml.merges")?;
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges: Merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| LlmError::Tokenizer(format!("malformed merge {m:?}")))
            })
            .collect::<Result<_>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        let mut tokenizer = Tokenizer::new(bpe);
        // llama.cpp's "smollm" pre-tokenizer: digits one by one, then GPT-2's
        // byte-level split, with no space added before the text.
        tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        // Without token types the chat template's control tokens would be
        // split as text, and without an eos generation never stops: both
        // are errors, not a quietly worse tokenizer.
        let types: Vec<i32> = ct
            .metadata
            .get("tokenizer.ggml.token_type")
            .ok_or_else(|| {
                LlmError::Tokenizer(
                    "tokenizer.ggml.token_type is missing (control tokens cannot be told from text)"
                        .into(),
                )
            })?
            .to_vec()
            .map_err(|_| LlmError::Tokenizer("token_type is not an array".into()))?
            .iter()
            .map(|t| t.to_i32().unwrap_or(1))
            .collect();
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == CONTROL)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        tokenizer
            .add_special_tokens(special)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        let eos = ct
            .metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(|v| v.to_u32().ok())
            .filter(|&id| (id as usize) < tokens.len())
            .ok_or_else(|| {
                LlmError::Tokenizer(
                    "tokenizer.ggml.eos_token_id is missing or not a token (generation would not stop)"
                        .into(),
                )
            })?;
        let eos = vec![eos];
        let template = ct
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
            .cloned();
        Ok(Self {
            tokenizer,
            eos,
            template,
        })
    }

    /// Token ids of `text` (special tokens in it are matched as such).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))
    }

    /// Renders a conversation (`(role, content)` pairs) with the GGUF's chat
    /// template, ending with the assistant's turn opened when
    /// `add_generation_prompt`.
    pub fn chat(&self, messages: &[(&str, &str)], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .template
            .as_deref()
            .ok_or_else(|| LlmError::Template("the GGUF has no tokenizer.chat_template".into()))?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|&(role, content)| minijinja::context! { role => role, content => content })
            .collect();
        let env = minijinja::Environment::new();
        env.render_str(
            template,
            minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
            },
        )
        .map_err(|e| LlmError::Template(e.to_string()))
    }
}
