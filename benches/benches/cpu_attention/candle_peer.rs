use candle_core::{DType, Device, Tensor};
use candle_nn::attention::{AttnMask, flash_attn};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId};
use kvslice_core::{KvPart, PageBuf, PageId, PageMemory, f16};

use super::*;

/// candle's CPU flash attention on the same K/V, copied into unpaged
/// `(B, S, H, D)` tensors (its layout), queries rounded to f16.
pub fn bench(
    g: &mut BenchmarkGroup<'_, WallTime>,
    ctx: usize,
    pages: &PageBuf,
    tables: &[Vec<PageId>],
    q: &[f32],
    scale: f32,
) {
    let l = layout();
    let (hd, kvh, bt) = (HEAD_DIM as usize, KV_HEADS as usize, BLOCK as usize);
    let mut k = vec![f16::ZERO; BATCH * ctx * kvh * hd];
    let mut v = k.clone();
    for (s, table) in tables.iter().enumerate() {
        for t in 0..ctx {
            let page = pages.page(table[t / bt]).unwrap();
            for h in 0..kvh as u32 {
                for (part, dst) in [(KvPart::K, &mut k), (KvPart::V, &mut v)] {
                    let r = l.head_region(part, 0, h).unwrap();
                    let at = (r.start + (t % bt) * hd) * 2;
                    let o = ((s * ctx + t) * kvh + h as usize) * hd;
                    for d in 0..hd {
                        dst[o + d] = f16::from_le_bytes([page[at + 2 * d], page[at + 2 * d + 1]]);
                    }
                }
            }
        }
    }
    let dev = Device::Cpu;
    let kt = Tensor::from_vec(k, (BATCH, ctx, kvh, hd), &dev).unwrap();
    let vt = Tensor::from_vec(v, (BATCH, ctx, kvh, hd), &dev).unwrap();
    let qt = Tensor::from_vec(q.to_vec(), (BATCH, 1, Q_HEADS as usize, hd), &dev)
        .unwrap()
        .to_dtype(DType::F16)
        .unwrap();
    g.bench_function(BenchmarkId::new("candle_flash_attn", ctx), |b| {
        b.iter(|| flash_attn::<f16>(&qt, &kt, &vt, scale, AttnMask::None, None, None).unwrap())
    });
}
