//! A tiny decoder-only transformer with deterministic random weights, for
//! the serving demo: token embedding, per layer RMSNorm → attention (paged,
//! through an [`AttentionEngine`]) → residual → RMSNorm → MLP → residual,
//! and logits through the tied embedding. Just enough model for prefix reuse
//! to be tested end to end; the numbers mean nothing.

use kvslice_core::testkit::Rng;
use kvslice_core::{
    AttentionBatch, AttentionEngine, KvWrite, PageId, PageMemoryMut, Result, SeqAttention,
};

/// Shape of the model.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    /// Vocabulary size.
    pub vocab: usize,
    /// Transformer layers.
    pub layers: u32,
    /// Query heads.
    pub q_heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// MLP hidden width.
    pub mlp: usize,
}

impl ModelSpec {
    /// The shape: 4 layers, 8 query heads, 2 kv heads, head_dim 64.
    pub const SMALL: ModelSpec = ModelSpec {
        vocab: 256,
        layers: 4,
        q_heads: 8,
        kv_heads: 2,
        head_dim: 64,
        mlp: 512,
    };

    fn d_model(&self) -> usize {
        (self.q_heads * self.head_dim) as usize
    }

    fn d_kv(&self) -> usize {
        (self.kv_heads * self.head_dim) as usize
    }
}

struct Layer {
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
}

/// The weights.
pub struct Model {
    spec: ModelSpec,
    embed: Vec<f32>,
    layers: Vec<Layer>,
}

/// `x (n × i) · w (i × o)`, row-major.
fn matmul(x: &[f32], w: &[f32], i: usize, o: usize) -> Vec<f32> {
    let n = x.len() / i;
    let mut out = vec![0f32; n * o];
    for r in 0..n {
        let xr = &x[r * i..(r + 1) * i];
        let or = &mut out[r * o..(r + 1) * o];
        for (k, &xv) in xr.iter().enumerate() {
            let wr = &w[k * o..(k + 1) * o];
            for (a, b) in or.iter_mut().zip(wr) {
                *a += xv * b;
            }
        }
    }
    out
}

fn rms_norm(x: &[f32], d: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    }
    out
}

impl Model {
    /// Weights drawn from a fixed seed, scaled like a real initialisation.
    pub fn new(spec: ModelSpec, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let (d, dkv) = (spec.d_model(), spec.d_kv());
        let mut w = |i: usize, o: usize| -> Vec<f32> {
            let s = 1.0 / (i as f32).sqrt();
            rng.vec(i * o).into_iter().map(|v| v * s * 1.7).collect()
        };
        let embed = w(spec.vocab, d);
        let layers = (0..spec.layers)
            .map(|_| Layer {
                wq: w(d, d),
                wk: w(d, dkv),
                wv: w(d, dkv),
                wo: w(d, d),
                w1: w(d, spec.mlp),
                w2: w(spec.mlp, d),
            })
            .collect();
        Self {
            spec,
            embed,
            layers,
        }
    }

    /// The model's shape.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        4 * (self.embed.len()
            + self
                .layers
                .iter()
                .map(|l| {
                    l.wq.len() + l.wk.len() + l.wv.len() + l.wo.len() + l.w1.len() + l.w2.len()
                })
                .sum::<usize>())
    }

    /// Runs `tokens` (positions `start..start + tokens.len()` of a sequence
    /// whose pages are `table`) through every layer: writes their K/V into
    /// the pages and attends over the whole context so far. Returns the
    /// logits of the last token.
    pub fn forward<P: PageMemoryMut + ?Sized, E: AttentionEngine<P>>(
        &self,
        engine: &E,
        pages: &mut P,
        table: &[PageId],
        start: usize,
        tokens: &[u32],
    ) -> Result<Vec<f32>> {
        let s = &self.spec;
        let (d, dkv, hd) = (s.d_model(), s.d_kv(), s.head_dim as usize);
        let n = tokens.len();
        let mut x: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| self.embed[t as usize % s.vocab * d..][..d].iter().copied())
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, d);
            let q = matmul(&h, &layer.wq, d, d);
            let k = matmul(&h, &layer.wk, d, dkv);
            let v = matmul(&h, &layer.wv, d, dkv);
            engine.write_kv(
                pages,
                &KvWrite {
                    layer: li as u32,
                    shard: 0,
                    block_table: table,
                    start,
                    k: &k,
                    v: &v,
                },
            )?;
            let seqs = [SeqAttention {
                block_table: table,
                kv_len: start + n,
                q_len: n,
            }];
            let mut attn = vec![0f32; n * d];
            engine.attend(
                pages,
                &AttentionBatch::new(li as u32, 0, &seqs, &q, scale),
                &mut attn,
            )?;
            let o = matmul(&attn, &layer.wo, d, d);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms_norm(&x, d);
            let mut m = matmul(&h, &layer.w1, d, s.mlp);
            m.iter_mut().for_each(|v| *v = *v / (1.0 + (-*v).exp())); // SiLU
            let m = matmul(&m, &layer.w2, s.mlp, d);
            x.iter_mut().zip(&m).for_each(|(a, b)| *a += b);
        }
        let last = rms_norm(&x[(n - 1) * d..], d);
        // Tied embedding: logits[v] = <last, embed[v]>.
        Ok((0..s.vocab)
            .map(|t| {
                last.iter()
                    .zip(&self.embed[t * d..(t + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect())
    }
}

/// The most likely next token.
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0 as u32
}
