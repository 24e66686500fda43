//! What can go wrong between a model file and generated text.

use std::fmt;
use std::path::PathBuf;

/// An error of the real-model runner: each variant names the problem so a
/// user can act on it (fetch the model again, shorten the prompt, ...).
#[derive(Debug)]
pub enum LlmError {
    /// The model file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not the expected download (truncated or corrupted).
    Checksum {
        /// The file.
        path: PathBuf,
        /// The sha256 the known model has.
        expected: String,
        /// The sha256 of the file on disk.
        actual: String,
    },
    /// The file is not a readable GGUF (truncated, not GGUF, bad metadata).
    Format(String),
    /// A workload file or option the runner cannot use (not the model's
    /// fault).
    Input(String),
    /// A GGUF this runner does not handle (architecture, tensor type, shape).
    Unsupported(String),
    /// The GGUF's tokenizer could not be built or could not encode/decode.
    Tokenizer(String),
    /// The chat template could not be rendered.
    Template(String),
    /// A prompt (plus the tokens to generate) longer than the context.
    PromptTooLong {
        /// Prompt tokens plus tokens to generate.
        tokens: usize,
        /// The most the model or runner takes.
        context: usize,
    },
    /// The cache refused something (capacity, bad input).
    Cache(kvslice_core::Error),
    /// The dense math failed.
    Tensor(candle_core::Error),
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LlmError::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            LlmError::Checksum {
                path,
                expected,
                actual,
            } => write!(
                f,
                "{} has sha256 {actual}, expected {expected}: the file is truncated or \
                 corrupted; fetch it again (benches/scripts/fetch-model.sh)",
                path.display()
            ),
            LlmError::Format(m) => write!(f, "not a usable GGUF file: {m}"),
            LlmError::Input(m) => write!(f, "bad input: {m}"),
            LlmError::Unsupported(m) => write!(f, "unsupported model: {m}"),
            LlmError::Tokenizer(m) => write!(f, "tokenizer: {m}"),
            LlmError::Template(m) => write!(f, "chat template: {m}"),
            LlmError::PromptTooLong { tokens, context } => write!(
                f,
                "prompt plus generated tokens is {tokens} tokens, over the context of {context}"
            ),
            LlmError::Cache(e) => write!(f, "cache: {e}"),
            LlmError::Tensor(e) => write!(f, "tensor math: {e}"),
        }
    }
}

impl std::error::Error for LlmError {}

impl From<kvslice_core::Error> for LlmError {
    fn from(e: kvslice_core::Error) -> Self {
        LlmError::Cache(e)
    }
}

impl From<candle_core::Error> for LlmError {
    fn from(e: candle_core::Error) -> Self {
        LlmError::Tensor(e)
    }
}

/// Results of the runner.
pub type Result<T> = std::result::Result<T, LlmError>;
