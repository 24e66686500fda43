//! A runtime's decode loop on the device with kvslice's wgpu engine: per
//! step, one plan, then for each of 8 layers the new token's K/V appended
//! and attention recorded into one command encoder, one submission, and
//! nothing read back until the end. A prompt of 40 tokens is prefilled the
//! same way (q_len 40), then 24 tokens are decoded, for two sequences at
//! once.
//!
//! The "runtime" here is stand-in code that writes each layer's queries
//! and new K/V into its own device buffers (a real one computes them with
//! its own kernels). The last step's output is checked against the CPU
//! engine, which saw the same K/V through host writes.
//!
//! ```sh
//! cargo run --release --example wgpu_decode_step
//! ```

use kvslice_core::testkit::{Rng, max_rel_err};
use kvslice_core::{
    AttentionBatch, AttentionEngine, Error, KvDtype, KvLayout, KvWrite, LayoutSpec, PageBuf,
    PageId, SeqAttention,
};
use kvslice_cpu::CpuEngine;
use kvslice_wgpu::{DeviceAppend, DeviceAttend, DeviceRegion, WgpuEngine, wgpu};

const LAYERS: u32 = 8;
const Q_HEADS: u32 = 8;
const KV_HEADS: u32 = 2;
const HEAD_DIM: u32 = 64;
const BLOCK: u32 = 16;
const PROMPT: usize = 40;
const DECODE: usize = 24;
const SEQS: usize = 2;

fn main() -> Result<(), Error> {
    let Some(engine) = kvslice_wgpu::testing::engine_or_skip("wgpu_decode_step") else {
        return Ok(());
    };
    let worst = run(&engine)?;
    println!("last step against the CPU engine: max relative error {worst:.2e}");
    assert!(worst < 1e-3, "the device and the CPU disagree");
    Ok(())
}

/// The runtime's buffers for one step: queries, new keys, new values and
/// the attention output of every layer, each layer at its own offset.
struct StepBuffers {
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    out: wgpu::Buffer,
    q_stride: u64,
    kv_stride: u64,
}

impl StepBuffers {
    fn new(engine: &WgpuEngine, tokens: usize) -> Self {
        let align = engine.offset_alignment();
        let q_stride = (tokens as u64 * u64::from(Q_HEADS * HEAD_DIM) * 4).next_multiple_of(align);
        let kv_stride =
            (tokens as u64 * u64::from(KV_HEADS * HEAD_DIM) * 4).next_multiple_of(align);
        let buffer = |label, bytes| {
            engine.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes * u64::from(LAYERS),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        Self {
            q: buffer("q", q_stride),
            k: buffer("k", kv_stride),
            v: buffer("v", kv_stride),
            out: buffer("out", q_stride),
            q_stride,
            kv_stride,
        }
    }
}

fn bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs the prompt and the decode steps; returns the last step's largest
/// relative error against the CPU engine over the last layer.
fn run(engine: &WgpuEngine) -> Result<f64, Error> {
    let layout = KvLayout::new(LayoutSpec::new(
        LAYERS,
        Q_HEADS,
        KV_HEADS,
        HEAD_DIM,
        BLOCK,
        KvDtype::F16,
    ))?;
    let blocks = (PROMPT + DECODE).div_ceil(BLOCK as usize) as u32;
    let pages_total = blocks * SEQS as u32;
    let mut pages = engine.pages(layout, pages_total)?;
    let mut host = PageBuf::new(layout, pages_total)?;
    let tables: Vec<Vec<PageId>> = (0..SEQS as u32)
        .map(|s| (0..blocks).map(|b| PageId(s * blocks + b)).collect())
        .collect();
    let mut rng = Rng::new(7);
    let mut step = engine.step();
    let mut worst = 0f64;

    let mut kv_len = 0;
    let mut q_len = PROMPT;
    while kv_len < PROMPT + DECODE {
        kv_len += q_len;
        let seqs: Vec<SeqAttention<'_>> = tables
            .iter()
            .map(|t| SeqAttention {
                block_table: t,
                kv_len,
                q_len,
            })
            .collect();
        let tokens = SEQS * q_len;
        let bufs = StepBuffers::new(engine, tokens);
        // The runtime's kernels would write these; here the host does.
        let mut layer_data = Vec::new();
        for layer in 0..u64::from(LAYERS) {
            let q = rng.vec(tokens * (Q_HEADS * HEAD_DIM) as usize);
            let k = rng.vec(tokens * (KV_HEADS * HEAD_DIM) as usize);
            let v = rng.vec(tokens * (KV_HEADS * HEAD_DIM) as usize);
            engine
                .queue()
                .write_buffer(&bufs.q, layer * bufs.q_stride, &bytes(&q));
            engine
                .queue()
                .write_buffer(&bufs.k, layer * bufs.kv_stride, &bytes(&k));
            engine
                .queue()
                .write_buffer(&bufs.v, layer * bufs.kv_stride, &bytes(&v));
            layer_data.push((q, k, v));
        }

        // The step: one plan, every layer recorded, one submission.
        engine.plan(&mut step, &pages, 0, &seqs, None)?;
        let mut encoder = engine.device().create_command_encoder(&Default::default());
        for layer in 0..LAYERS {
            let (q_at, kv_at) = (
                u64::from(layer) * bufs.q_stride,
                u64::from(layer) * bufs.kv_stride,
            );
            let append = DeviceAppend {
                layer,
                k: DeviceRegion::at(&bufs.k, kv_at),
                v: DeviceRegion::at(&bufs.v, kv_at),
            };
            engine.record_append(&mut encoder, &mut pages, &mut step, &append)?;
            let attend = DeviceAttend {
                layer,
                scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                queries: DeviceRegion::at(&bufs.q, q_at),
                out: DeviceRegion::at(&bufs.out, q_at),
            };
            engine.record_attend(&mut encoder, &pages, &mut step, &attend)?;
        }
        engine.queue().submit([encoder.finish()]);

        // The CPU engine over the same K/V, written on the host.
        let row = (KV_HEADS * HEAD_DIM) as usize;
        for (layer, (_, k, v)) in layer_data.iter().enumerate() {
            for (s, table) in tables.iter().enumerate() {
                let part = s * q_len * row..(s + 1) * q_len * row;
                CpuEngine::new().write_kv(
                    &mut host,
                    &KvWrite {
                        layer: layer as u32,
                        shard: 0,
                        block_table: table,
                        start: kv_len - q_len,
                        k: &k[part.clone()],
                        v: &v[part],
                    },
                )?;
            }
        }
        if kv_len == PROMPT + DECODE {
            let last = LAYERS - 1;
            let (q, _, _) = &layer_data[last as usize];
            let mut want = vec![0f32; q.len()];
            let batch = AttentionBatch::new(last, 0, &seqs, q, 1.0 / (HEAD_DIM as f32).sqrt());
            CpuEngine::new().attend(&host, &batch, &mut want)?;
            let got = read(engine, &bufs.out, u64::from(last) * bufs.q_stride, q.len())?;
            let want: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
            worst = max_rel_err(&got, &want);
        }
        q_len = 1;
    }
    Ok(worst)
}

/// `floats` f32 of `buf` from byte `at`, copied back to the host (the one
/// readback of the run).
fn read(
    engine: &WgpuEngine,
    buf: &wgpu::Buffer,
    at: u64,
    floats: usize,
) -> Result<Vec<f32>, Error> {
    let size = floats as u64 * 4;
    let staging = engine.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = engine.device().create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buf, at, &staging, 0, size);
    engine.queue().submit([encoder.finish()]);
    staging.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    engine
        .device()
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Device {
            kind: kvslice_core::DeviceFailure::Lost,
            detail: e.to_string(),
        })?;
    let view = staging.get_mapped_range(..).expect("mapped");
    Ok(view
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill and 24 decode steps on the device match the CPU engine.
    #[test]
    fn device_steps_match_the_cpu_engine() {
        let Some(engine) = kvslice_wgpu::testing::engine_or_skip("wgpu_decode_step") else {
            return;
        };
        let worst = run(&engine).unwrap();
        assert!(worst < 1e-3, "{worst:e}");
    }
}
