//! A Llama-architecture GGUF: its configuration and weights, read with
//! candle's GGUF reader into candle's quantized matmuls.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use candle_core::Module;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use candle_nn::Embedding;
use sha2::{Digest, Sha256};

use super::error::{LlmError, Result};

/// The SmolLM2 file `benches/scripts/fetch-model.sh` fetches.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its size in bytes.
pub const SMOLLM2_BYTES: u64 = 98_362_432;
/// Its sha256.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the model is looked for: `$KVSLICE_MODEL_DIR`, else
/// `target/models` of this repository.
pub fn default_model_path() -> PathBuf {
    let dir = std::env::var_os("KVSLICE_MODEL_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/models"),
        PathBuf::from,
    );
    dir.join(SMOLLM2_FILE)
}

/// The shape of a Llama-architecture model, from its GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// Transformer layers.
    pub layers: u32,
    /// Query heads.
    pub q_heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Model width.
    pub d_model: usize,
    /// MLP hidden width.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Context length the model was trained for.
    pub context: usize,
}

fn meta<'a>(ct: &'a gguf_file::Content, key: &str) -> Result<&'a gguf_file::Value> {
    ct.metadata
        .get(key)
        .ok_or_else(|| LlmError::Format(format!("metadata key {key} is missing")))
}

fn meta_u32(ct: &gguf_file::Content, key: &str) -> Result<u32> {
    let v = meta(ct, key)?;
    v.to_u64()
        .ok()
        .and_then(|x| u32::try_from(x).ok())
        .or_else(|| v.to_i32().ok().and_then(|x| u32::try_from(x).ok()))
        .ok_or_else(|| LlmError::Format(format!("metadata key {key} is not an unsigned integer")))
}

impl LlamaConfig {
    /// Reads and checks the configuration of a `llama` GGUF.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self> {
        let arch = meta(ct, "general.architecture")?
            .to_string()
            .map_err(|_| LlmError::Format("general.architecture is not a string".into()))?;
        if arch != "llama" {
            return Err(LlmError::Unsupported(format!(
                "architecture {arch:?}; this runner reads \"llama\""
            )));
        }
        let q_heads = meta_u32(ct, "llama.attention.head_count")?;
        let kv_heads = meta_u32(ct, "llama.attention.head_count_kv")?;
        let d_model = meta_u32(ct, "llama.embedding_length")? as usize;
        let layers = meta_u32(ct, "llama.block_count")?;
        if q_heads == 0
            || kv_heads == 0
            || !q_heads.is_multiple_of(kv_heads)
            || !d_model.is_multiple_of(q_heads as usize)
        {
            return Err(LlmError::Unsupported(format!(
                "{q_heads} query heads, {kv_heads} kv heads, width {d_model}"
            )));
        }
        let head_dim = (d_model / q_heads as usize) as u32;
        if let Ok(rope_dim) = meta_u32(ct, "llama.rope.dimension_count")
            && rope_dim != head_dim
        {
            return Err(LlmError::Unsupported(format!(
                "partial RoPE ({rope_dim} of {head_dim} dimensions)"
            )));
        }
        let vocab = match meta_u32(ct, "llama.vocab_size") {
            Ok(v) => v as usize,
            Err(_) => meta(ct, "tokenizer.ggml.tokens")?
                .to_vec()
                .map_err(|_| LlmError::Format("tokenizer.ggml.tokens is not an array".into()))?
                .len(),
        };
        Ok(Self {
            layers,
            q_heads,
            kv_heads,
            head_dim,
            d_model,
            ffn: meta_u32(ct, "llama.feed_forward_length")? as usize,
            vocab,
            rope_base: meta(ct, "llama.rope.freq_base")
                .and_then(|v| v.to_f32().map_err(|e| LlmError::Format(e.to_string())))
                .unwrap_or(10_000.0),
            rms_eps: f64::from(
                meta(ct, "llama.attention.layer_norm_rms_epsilon")?
                    .to_f32()
                    .map_err(|e| LlmError::Format(e.to_string()))?,
            ),
            context: meta_u32(ct, "llama.context_length")? as usize,
        })
    }

    /// KV bytes one token holds across all layers at `bytes_per_elem`.
    pub fn kv_bytes_per_token(&self, bytes_per_elem: usize) -> usize {
        2 * self.layers as usize * self.kv_heads as usize * self.head_dim as usize * bytes_per_elem
    }
}

/// A weight matrix: quantized as in the file, and optionally dequantized
/// to f32 for chunks of many tokens.
pub(super) struct Weight {
    quantized: QMatMul,
    dense: Option<QMatMul>,
    /// Chunks of at least this many rows use `dense`.
    dense_rows: usize,
}

/// Rows from which a chunk goes through the dense weights: prefill is a
/// matrix product there (candle's f32 GEMM), while a decode step reads the
/// 4-bit weights once.
const DENSE_ROWS: usize = 8;

impl Weight {
    fn new(q: QTensor, matmuls: Matmuls) -> Result<Self> {
        let dense_rows = match matmuls {
            Matmuls::Quantized => usize::MAX,
            Matmuls::DensePrefill => DENSE_ROWS,
            Matmuls::Dense => 0,
        };
        let dense = if dense_rows < usize::MAX {
            Some(QMatMul::Tensor(q.dequantize(&q.device())?))
        } else {
            None
        };
        Ok(Self {
            quantized: QMatMul::from_qtensor(q)?,
            dense,
            dense_rows,
        })
    }

    /// `x · Wᵀ` for `x` of shape `(1, rows, in)`.
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.dense {
            Some(d) if x.dim(1)? >= self.dense_rows => d.forward(x),
            _ => self.quantized.forward(x),
        }
    }
}

/// One transformer layer's weights.
pub(super) struct Layer {
    pub attn_norm: Tensor,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub ffn_norm: Tensor,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// How the runner multiplies by the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Matmuls {
    /// candle's quantized matmul everywhere, exactly as candle-transformers'
    /// quantized_llama computes (activations quantized to 8 bits): the
    /// outputs of the two runners can be compared token for token.
    #[default]
    Quantized,
    /// Chunks of 8 or more tokens (prefill) through weights dequantized to
    /// f32 at load (4.4x the weights' memory), single tokens through the
    /// quantized ones. Much faster prefill where candle has no SIMD kernel
    /// for the file's quantization (Q4_1 on x86), slightly different
    /// logits (no 8-bit activations).
    DensePrefill,
    /// Every matmul through the dequantized f32 weights: slower decode, but
    /// outputs that move continuously with their inputs. The quantized
    /// matmuls round each activation row to 8 bits, so a difference in the
    /// last bit anywhere (another summation order in attention, f16 pages)
    /// can flip a rounding and move the logits by a few percent; with f32
    /// matmuls two runners that compute the same function agree to
    /// rounding error, token for token.
    Dense,
}

/// The weights of a Llama-architecture model, on the CPU.
pub struct Llama {
    /// Its shape.
    pub config: LlamaConfig,
    pub(super) embed: Embedding,
    pub(super) layers: Vec<Layer>,
    pub(super) norm: Tensor,
    pub(super) output: Weight,
    /// RoPE tables, `(context, head_dim / 2)`.
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) device: Device,
}

/// Weight types candle's quantized matmul takes on the CPU.
fn supported(dtype: GgmlDType) -> bool {
    use GgmlDType::*;
    matches!(
        dtype,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K | Q8K
    )
}

/// Checks the file against the known model's size and sha256 when it is
/// that model (by name), so a truncated or corrupted download is named as
/// such rather than failing somewhere in the GGUF reader.
pub fn verify_known_model(path: &Path) -> Result<()> {
    if path.file_name().and_then(|n| n.to_str()) != Some(SMOLLM2_FILE) {
        return Ok(());
    }
    let io = |source| LlmError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != SMOLLM2_SHA256 {
        return Err(LlmError::Checksum {
            path: path.to_path_buf(),
            expected: SMOLLM2_SHA256.into(),
            actual,
        });
    }
    Ok(())
}

/// Opens a GGUF and reads its header and metadata.
pub fn read_gguf(path: &Path) -> Result<(gguf_file::Content, BufReader<File>)> {
    let file = File::open(path).map_err(|source| LlmError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = BufReader::new(file);
    let ct = gguf_file::Content::read(&mut reader)
        .map_err(|e| LlmError::Format(format!("{}: {e}", path.display())))?;
    // Every tensor must lie inside the file: a truncated download fails
    // here, by name, rather than mid-load.
    for (name, info) in &ct.tensor_infos {
        if !supported(info.ggml_dtype) {
            return Err(LlmError::Unsupported(format!(
                "tensor {name} has type {:?}",
                info.ggml_dtype
            )));
        }
        // Checked: a malformed header must not wrap into "in bounds".
        let elems = info.shape.elem_count();
        let bytes = (elems / info.ggml_dtype.block_size()).checked_mul(info.ggml_dtype.type_size());
        let end = bytes.and_then(|b| {
            ct.tensor_data_offset
                .checked_add(info.offset)?
                .checked_add(b as u64)
        });
        if end.is_none_or(|e| e > len) {
            return Err(LlmError::Format(format!(
                "{} is truncated: tensor {name} ends past byte {len}, the file's end",
                path.display()
            )));
        }
    }
    Ok((ct, reader))
}

impl Llama {
    /// Loads a Llama GGUF's weights (quantized matmuls stay quantized).
    pub fn load<R: Read + Seek>(
        ct: &gguf_file::Content,
        reader: &mut R,
        matmuls: Matmuls,
    ) -> Result<Self> {
        let config = LlamaConfig::from_gguf(ct)?;
        let device = Device::Cpu;
        let mut tensor = |name: &str| {
            ct.tensor(reader, name, &device)
                .map_err(|e| LlmError::Format(format!("tensor {name}: {e}")))
        };
        let embed_q = tensor("token_embd.weight")?;
        let (vocab, d) = embed_q.shape().dims2()?;
        if d != config.d_model || vocab != config.vocab {
            return Err(LlmError::Unsupported(format!(
                "token_embd is {vocab}x{d}, the metadata says {}x{}",
                config.vocab, config.d_model
            )));
        }
        let embed = Embedding::new(embed_q.dequantize(&device)?, d);
        // Tied embeddings when there is no output matrix.
        let output = match tensor("output.weight") {
            Ok(t) => t,
            Err(_) => tensor("token_embd.weight")?,
        };
        let norm = tensor("output_norm.weight")?.dequantize(&device)?;
        let mut layers = Vec::with_capacity(config.layers as usize);
        for i in 0..config.layers {
            let mut get = |what: &str| tensor(&format!("blk.{i}.{what}.weight"));
            let mut mm = |what: &str| Weight::new(get(what)?, matmuls);
            layers.push(Layer {
                wq: mm("attn_q")?,
                wk: mm("attn_k")?,
                wv: mm("attn_v")?,
                wo: mm("attn_output")?,
                gate: mm("ffn_gate")?,
                up: mm("ffn_up")?,
                down: mm("ffn_down")?,
                attn_norm: get("attn_norm")?.dequantize(&device)?,
                ffn_norm: get("ffn_norm")?.dequantize(&device)?,
            });
        }
        let (cos, sin) = rope_tables(&config, &device)?;
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            output: Weight::new(
                output,
                if matmuls == Matmuls::Dense {
                    Matmuls::Dense
                } else {
                    Matmuls::Quantized
                },
            )?,
            cos,
            sin,
            device,
        })
    }
}

/// cos and sin of `position × base^(-2i/d)`, computed as candle's
/// quantized_llama does (so both runners rotate identically), for the
/// model's whole context.
fn rope_tables(c: &LlamaConfig, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let d = c.head_dim as usize;
    let theta: Vec<f32> = (0..d)
        .step_by(2)
        .map(|i| 1f32 / c.rope_base.powf(i as f32 / d as f32))
        .collect();
    let theta = Tensor::new(theta.as_slice(), device)?;
    let angles = Tensor::arange(0, c.context as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((c.context, 1))?
        .matmul(&theta.reshape((1, d / 2))?)?;
    Ok((angles.cos()?, angles.sin()?))
}
