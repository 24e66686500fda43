//! The peer: candle-transformers' own `quantized_llama`, with its built-in
//! KV cache (a tensor per layer, grown by concatenation) and no kvslice,
//! on the same GGUF. Greedy output through kvslice is checked against it,
//! and decode is timed against it.

use std::io::Cursor;
use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::{MAX_SEQ_LEN, ModelWeights};

use super::error::Result;
use super::runner::argmax;
use super::weights::{Matmuls, read_gguf};

/// candle-transformers' quantized Llama.
pub struct CandleLlama {
    model: ModelWeights,
}

/// What a generation of the peer produced.
#[derive(Debug, Clone, Default)]
pub struct PeerGeneration {
    /// Generated tokens (the stop token included, if one came).
    pub tokens: Vec<u32>,
    /// Logits after the prompt.
    pub first_logits: Vec<f32>,
    /// Prefill and first token.
    pub ttft: Duration,
    /// Each decode step.
    pub steps: Vec<Duration>,
}

impl CandleLlama {
    /// The longest sequence the peer takes (its RoPE tables stop there).
    pub const MAX_TOKENS: usize = MAX_SEQ_LEN;

    /// Loads the GGUF at `path`. With [`Matmuls::Dense`] every tensor is
    /// dequantized to f32 first (a GGUF re-encoded in memory), so the peer
    /// multiplies by f32 weights as the runner's dense mode does; any other
    /// mode loads the file as it is.
    pub fn load(path: &Path, matmuls: Matmuls) -> Result<Self> {
        let (ct, mut reader) = read_gguf(path)?;
        let model = if matmuls == Matmuls::Dense {
            let mut names: Vec<&String> = ct.tensor_infos.keys().collect();
            names.sort();
            let tensors = names
                .iter()
                .map(|n| {
                    let t = ct
                        .tensor(&mut reader, n, &Device::Cpu)?
                        .dequantize(&Device::Cpu)?;
                    Ok(QTensor::quantize(&t, GgmlDType::F32)?)
                })
                .collect::<Result<Vec<_>>>()?;
            let meta: Vec<(&str, &gguf_file::Value)> =
                ct.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
            let named: Vec<(&str, &QTensor)> =
                names.iter().map(|n| n.as_str()).zip(&tensors).collect();
            let mut buf = Cursor::new(Vec::new());
            gguf_file::write(&mut buf, &meta, &named)?;
            buf.set_position(0);
            let dense = gguf_file::Content::read(&mut buf)?;
            ModelWeights::from_gguf(dense, &mut buf, &Device::Cpu)?
        } else {
            ModelWeights::from_gguf(ct, &mut reader, &Device::Cpu)?
        };
        Ok(Self { model })
    }

    /// Greedy generation from a fresh cache.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        stop: &[u32],
    ) -> Result<PeerGeneration> {
        let started = Instant::now();
        self.model.clear_kv_cache();
        let ids = Tensor::new(prompt, &Device::Cpu)?.unsqueeze(0)?;
        let logits: Vec<f32> = self.model.forward(&ids, 0)?.squeeze(0)?.to_vec1()?;
        let mut out = PeerGeneration {
            ttft: started.elapsed(),
            ..PeerGeneration::default()
        };
        let mut next = argmax(&logits);
        out.first_logits = logits;
        let mut pos = prompt.len();
        loop {
            out.tokens.push(next);
            if out.tokens.len() == max_new || stop.contains(&next) {
                break;
            }
            let t0 = Instant::now();
            let ids = Tensor::new(&[next], &Device::Cpu)?.unsqueeze(0)?;
            let logits: Vec<f32> = self.model.forward(&ids, pos)?.squeeze(0)?.to_vec1()?;
            out.steps.push(t0.elapsed());
            next = argmax(&logits);
            pos += 1;
        }
        Ok(out)
    }
}
