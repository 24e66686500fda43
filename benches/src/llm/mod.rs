//! A real model through kvslice: SmolLM2-135M-Instruct (Llama
//! architecture, a Q4_1 GGUF) generating text with its K/V named by the
//! [`Coordinator`](kvslice_core::Coordinator), held and shared by the
//! [`CacheStore`](kvslice_core::CacheStore) and attended by an
//! [`AttentionEngine`](kvslice_core::AttentionEngine) (reference, CPU or
//! wgpu). candle does the dense math; every K/V byte goes through kvslice.
//!
//! - [`weights`]: the GGUF's configuration and weights (candle's reader and
//!   quantized matmuls), and the checks that name a bad file;
//! - [`tokenizer`]: the GGUF's byte-level BPE and chat template;
//! - [`runner`]: greedy generation with prefix reuse ([`Reuse`]);
//! - [`peer`]: candle-transformers' `quantized_llama`, the reference it is
//!   checked and timed against;
//! - [`profile`]: the multi-turn chat experiment behind `kvslice profile`.
//!
//! The model file is fetched by `benches/scripts/fetch-model.sh` into
//! `target/models/` (or `$KVSLICE_MODEL_DIR`); nothing here downloads.

pub mod cli;
mod error;
pub mod kv_accuracy;
pub mod peer;
pub mod profile;
pub mod runner;
pub mod tokenizer;
pub mod weights;

use std::path::Path;

pub use error::{LlmError, Result};
pub use runner::{Generation, Reuse, Runner, Scored, cache_layout};
pub use tokenizer::TextCodec;
pub use weights::{Llama, LlamaConfig, Matmuls, default_model_path};

/// A model file loaded: weights, tokenizer and chat template.
pub struct ModelFile {
    /// The weights.
    pub llama: Llama,
    /// The tokenizer and chat template.
    pub codec: TextCodec,
}

impl ModelFile {
    /// Loads a Llama GGUF. The known SmolLM2 file is checked against its
    /// sha256 first; any file must be a complete GGUF of the `llama`
    /// architecture with a byte-level BPE tokenizer.
    pub fn load(path: &Path, matmuls: Matmuls) -> Result<Self> {
        weights::verify_known_model(path)?;
        let (ct, mut reader) = weights::read_gguf(path)?;
        // The architecture first: it names the problem best.
        LlamaConfig::from_gguf(&ct)?;
        let codec = TextCodec::from_gguf(&ct)?;
        let llama = Llama::load(&ct, &mut reader, matmuls)?;
        Ok(Self { llama, codec })
    }
}

/// Whether tests that need the model must fail rather than skip
/// (`KVSLICE_REQUIRE_MODEL=1`, as CI sets it).
pub fn model_required() -> bool {
    std::env::var("KVSLICE_REQUIRE_MODEL").is_ok_and(|v| v == "1")
}
