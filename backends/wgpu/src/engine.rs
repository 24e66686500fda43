//! [`WgpuEngine`]: the attention and write passes, recorded and submitted.

use std::sync::Arc;

use kvslice_core::{
    AttentionBatch, AttentionEngine, DeviceFailure, Error, KvLayout, KvPart, KvWrite, PageBuf,
    PageGeometry, Result,
};

use crate::gpu::{AdapterSummary, GUARANTEED_BINDING_BYTES, Gpu};
use crate::pages::DevicePages;
use crate::plan::{KEY_TILE, plan, tile_rows};
use crate::shader::{Kernel, Pipelines, ShaderKey, WORKGROUP_SIZE, first_pool_binding};

/// Workgroup memory the attention kernel may use for its query tile.
const QUERY_TILE_BYTES: u32 = 8 << 10;
/// Most rows per tile (GQA group × tokens).
const MAX_TILE_ROWS: u32 = 16;

/// Paged attention on a GPU through wgpu compute shaders.
///
/// K/V live in [`DevicePages`] made by this engine. Decode and prefill are
/// one algorithm: query rows are tiled per kv head (so a GQA group reads
/// its pages once), long contexts are split across workgroups, and a second
/// pass merges the splits by log-sum-exp (flash-decoding). f16 K/V is read
/// as `f16` where the adapter has `SHADER_F16`, else unpacked from words;
/// bf16 is widened by a shift.
///
/// ```no_run
/// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, KvWrite, LayoutSpec, PageId, SeqAttention};
/// use kvslice_wgpu::WgpuEngine;
///
/// let engine = WgpuEngine::new()?; // WGPU_BACKEND / WGPU_ADAPTER_NAME, or the default adapter
/// println!("adapter: {}", engine.adapter().name);
/// let layout = KvLayout::new(LayoutSpec::new(1, 2, 1, 2, 4, KvDtype::F16))?;
/// let mut pages = engine.pages(layout, 8)?;
/// let table = [PageId(3)];
/// let (k, v) = ([1.0, 0.0, 0.0, 1.0], [10.0, 0.0, 0.0, 20.0]);
/// engine.write_kv(&mut pages, &KvWrite { layer: 0, shard: 0, block_table: &table, start: 0, k: &k, v: &v })?;
/// let seqs = [SeqAttention { block_table: &table, kv_len: 2, q_len: 1 }];
/// let q = [0.0, 0.0, 50.0, 0.0];
/// let mut out = [0.0f32; 4];
/// engine.attend(&pages, &AttentionBatch::new(0, 0, &seqs, &q, 1.0), &mut out)?;
/// assert_eq!(&out[..2], &[5.0, 10.0]);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug)]
pub struct WgpuEngine {
    gpu: Arc<Gpu>,
    pipelines: Pipelines,
    max_binding: u64,
    target_workgroups: u32,
    native_f16: bool,
}

impl WgpuEngine {
    /// Opens the adapter named by the environment (`WGPU_BACKEND`,
    /// `WGPU_ADAPTER_NAME`, `WGPU_POWER_PREF`) or the default one.
    ///
    /// Fails with [`DeviceFailure::NoAdapter`] when there is none, naming
    /// the adapters that do exist.
    pub fn new() -> Result<Self> {
        let gpu = Arc::new(Gpu::open()?);
        Ok(Self {
            native_f16: gpu.summary.shader_f16,
            max_binding: GUARANTEED_BINDING_BYTES.min(gpu.max_binding),
            target_workgroups: 2048,
            pipelines: Pipelines::default(),
            gpu,
        })
    }

    /// The adapter in use.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.gpu.summary
    }

    /// Largest page-pool binding for memories made after this call
    /// (default 128 MiB; never more than the adapter allows).
    pub fn with_max_binding_bytes(mut self, bytes: u64) -> Self {
        self.max_binding = bytes.min(self.gpu.max_binding);
        self
    }

    /// About how many workgroups a batch should spread over; contexts are
    /// split until tiles × splits reaches it (default 2048).
    pub fn with_target_workgroups(mut self, n: u32) -> Self {
        self.target_workgroups = n.max(1);
        self
    }

    /// Reads f16 K/V as `f16` (needs `SHADER_F16`; ignored without it) or,
    /// with `false`, unpacks it from 32-bit words with `unpack2x16float`.
    pub fn with_native_f16(mut self, on: bool) -> Self {
        self.native_f16 = on && self.gpu.summary.shader_f16;
        self
    }

    /// Whether f16 K/V is read natively.
    pub fn native_f16(&self) -> bool {
        self.native_f16
    }

    /// `num_pages` zeroed pages of `layout` on the device.
    pub fn pages(&self, layout: KvLayout, num_pages: u32) -> Result<DevicePages> {
        DevicePages::new(Arc::clone(&self.gpu), layout, num_pages, self.max_binding)
    }

    /// Like [`pages`](Self::pages) with an explicit split: each binding holds
    /// `pages_per_binding` pages (within the adapter's limits).
    pub fn pages_in_bindings(
        &self,
        layout: KvLayout,
        num_pages: u32,
        pages_per_binding: u32,
    ) -> Result<DevicePages> {
        let bytes = u64::from(pages_per_binding.max(1)) * layout.page_bytes() as u64;
        DevicePages::new(Arc::clone(&self.gpu), layout, num_pages, bytes)
    }

    /// A device copy of `host`.
    pub fn upload(&self, host: &PageBuf) -> Result<DevicePages> {
        let mut pages = self.pages(*host.layout(), host.num_pages())?;
        pages.upload_from(host)?;
        Ok(pages)
    }

    /// The device's copy bandwidth in bytes per second (read plus write
    /// traffic of a buffer-to-buffer copy of up to `bytes`, best of `reps`):
    /// the ceiling decode bandwidth is compared with.
    ///
    /// ```no_run
    /// let engine = kvslice_wgpu::WgpuEngine::new()?;
    /// let bw = engine.copy_bandwidth(256 << 20, 5)?;
    /// println!("{:.0} GB/s", bw / 1e9);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn copy_bandwidth(&self, bytes: u64, reps: u32) -> Result<f64> {
        self.gpu.copy_bandwidth(bytes, reps)
    }

    /// Destroys the device now. Every later call on this engine or its
    /// memories fails with [`DeviceFailure::Lost`]; build a new engine.
    pub fn destroy(&self) {
        self.gpu.destroy();
    }

    #[cfg(test)]
    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn check_memory(&self, pages: &DevicePages) -> Result<()> {
        self.gpu.check_alive()?;
        if !Arc::ptr_eq(&pages.gpu, &self.gpu) {
            return Err(Error::InvalidValue(
                "pages belong to another engine's device",
            ));
        }
        Ok(())
    }

    fn storage(&self, label: &str, bytes: Vec<u8>) -> Result<wgpu::Buffer> {
        self.buffer(
            label,
            bytes.len() as u64,
            wgpu::BufferUsages::STORAGE,
            Some(bytes),
        )
    }

    /// A buffer of `size` bytes (at least one word), filled with `init`
    /// (padded in place to whole words). Call inside the caller's error
    /// scope: one scope covers a whole call's allocations and submission.
    fn buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        init: Option<Vec<u8>>,
    ) -> Result<wgpu::Buffer> {
        let size = size.max(4).div_ceil(4) * 4;
        if usage.contains(wgpu::BufferUsages::STORAGE) && size > self.gpu.max_binding {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!(
                    "{label} needs {size} bytes, over the {}-byte binding limit; split the batch",
                    self.gpu.max_binding
                ),
            });
        }
        let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: usage | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Some(mut bytes) = init {
            bytes.resize(size as usize, 0);
            self.gpu.queue.write_buffer(&buf, 0, &bytes);
        }
        Ok(buf)
    }

    /// `(x, y)` workgroups covering `n`, within the per-dimension limit.
    fn grid(&self, n: u32) -> Result<(u32, u32)> {
        let max = self.gpu.max_workgroups_per_dim.max(1);
        let x = n.clamp(1, max);
        let y = n.div_ceil(x);
        if y > max {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!("{n} workgroups exceed the dispatch limit"),
            });
        }
        Ok((x, y))
    }

    fn params(&self, p: &Params) -> Result<wgpu::Buffer> {
        self.buffer(
            "kvslice params",
            64,
            wgpu::BufferUsages::UNIFORM,
            Some(le_bytes(p.words())),
        )
    }

    fn bind(
        &self,
        pipeline: &wgpu::ComputePipeline,
        buffers: &[&wgpu::Buffer],
        pool: Option<(&DevicePages, u32)>,
    ) -> wgpu::BindGroup {
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        if let Some((pages, first)) = pool {
            entries.extend(
                pages
                    .chunks
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: first + i as u32,
                        resource: b.as_entire_binding(),
                    }),
            );
        }
        self.gpu
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
    }

    fn base_params(layout: &KvLayout, layer_in_group: u32, pages: &DevicePages) -> Result<Params> {
        let k = layout.head_region(KvPart::K, layer_in_group, 0)?;
        let v = layout.head_region(KvPart::V, layer_in_group, 0)?;
        Ok(Params {
            block_tokens: layout.block_tokens(),
            page_elems: layout.page_elems() as u32,
            pages_per_chunk: pages.pages_per_chunk,
            k_base: k.start as u32,
            v_base: v.start as u32,
            head_stride: k.len() as u32,
            ..Params::default()
        })
    }
}

/// The uniform every kernel reads (`Params` in `shaders/common.wgsl`).
#[derive(Debug, Default, Clone, Copy)]
struct Params {
    block_tokens: u32,
    page_elems: u32,
    pages_per_chunk: u32,
    k_base: u32,
    v_base: u32,
    head_stride: u32,
    q_heads: u32,
    gqa: u32,
    scale: f32,
    num_items: u32,
    grid_x: u32,
    start: u32,
    tokens: u32,
    kv_heads: u32,
    /// Sliding window in tokens; `u32::MAX` for none.
    window: u32,
}

impl Params {
    fn words(&self) -> [u32; 16] {
        [
            self.block_tokens,
            self.page_elems,
            self.pages_per_chunk,
            self.k_base,
            self.v_base,
            self.head_stride,
            self.q_heads,
            self.gqa,
            self.scale.to_bits(),
            self.num_items,
            self.grid_x,
            self.start,
            self.tokens,
            self.kv_heads,
            self.window,
            0,
        ]
    }
}

fn le_bytes(words: impl IntoIterator<Item = u32>) -> Vec<u8> {
    words.into_iter().flat_map(u32::to_le_bytes).collect()
}

impl AttentionEngine<DevicePages> for WgpuEngine {
    fn attend(
        &self,
        pages: &DevicePages,
        batch: &AttentionBatch<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        self.check_memory(pages)?;
        let shape = batch.validate(pages, out.len())?;
        if shape.q_tokens == 0 {
            return Ok(());
        }
        let layout = shape.layout;
        let hd = layout.head_dim();
        let max_rows = (QUERY_TILE_BYTES / (4 * hd)).min(MAX_TILE_ROWS);
        if max_rows == 0 {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!("head_dim {hd} over the {} supported", QUERY_TILE_BYTES / 4),
            });
        }
        let max_rows = 1 << max_rows.ilog2();
        let gqa = layout.gqa_ratio();
        let kv_heads = shape.shard.num_kv_heads();
        let q_heads = shape.shard.num_q_heads();
        let longest = batch.seqs.iter().map(|s| s.q_len).max().unwrap_or(1) as u32;
        let rows = tile_rows(longest.saturating_mul(gqa), max_rows);
        let cut = plan(
            batch.seqs,
            batch.window,
            layout.block_tokens(),
            kv_heads,
            gqa,
            rows,
            self.target_workgroups,
        );
        debug_assert_eq!(cut.split % KEY_TILE, 0);

        let key = |kernel| ShaderKey {
            kernel,
            dtype: layout.dtype(),
            head_dim: hd,
            rows,
            chunks: pages.chunks.len() as u32,
            native_f16: self.native_f16,
        };
        let attend = self.pipelines.get(&self.gpu, key(Kernel::Attend))?;
        let merge = self.pipelines.get(&self.gpu, key(Kernel::Merge))?;

        let base = Params {
            q_heads,
            gqa,
            scale: batch.scale,
            window: batch.window.unwrap_or(u32::MAX),
            ..Self::base_params(&layout, shape.layer_in_group, pages)?
        };
        let (ax, ay) = self.grid(cut.work.len() as u32)?;
        let (mx, my) = self.grid(cut.merge.len() as u32)?;
        let out_bytes = out.len() as u64 * 4;
        let output = self.gpu.scoped(|| -> Result<wgpu::Buffer> {
            let attend_params = self.params(&Params {
                num_items: cut.work.len() as u32,
                grid_x: ax,
                ..base
            })?;
            let merge_params = self.params(&Params {
                num_items: cut.merge.len() as u32,
                grid_x: mx,
                ..base
            })?;
            let queries = self.storage(
                "kvslice queries",
                le_bytes(batch.queries.iter().map(|x| x.to_bits())),
            )?;
            let work = self.storage(
                "kvslice work",
                le_bytes(cut.work.iter().flat_map(|w| w.words())),
            )?;
            let merges = self.storage(
                "kvslice merges",
                le_bytes(cut.merge.iter().flat_map(|m| m.words())),
            )?;
            let tables = self.storage("kvslice tables", le_bytes(cut.tables.iter().copied()))?;
            let partial_bytes = cut.work.len() as u64 * u64::from(rows) * u64::from(hd + 2) * 4;
            let partials = self.buffer(
                "kvslice partials",
                partial_bytes,
                wgpu::BufferUsages::STORAGE,
                None,
            )?;
            let output = self.buffer(
                "kvslice output",
                out_bytes,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                None,
            )?;
            let attend_group = self.bind(
                &attend,
                &[&attend_params, &queries, &work, &tables, &partials],
                Some((pages, first_pool_binding(Kernel::Attend))),
            );
            let merge_group =
                self.bind(&merge, &[&merge_params, &merges, &partials, &output], None);
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&attend);
                pass.set_bind_group(0, &attend_group, &[]);
                pass.dispatch_workgroups(ax, ay, 1);
                pass.set_pipeline(&merge);
                pass.set_bind_group(0, &merge_group, &[]);
                pass.dispatch_workgroups(mx, my, 1);
            }
            self.gpu.queue.submit([enc.finish()]);
            Ok(output)
        })??;
        let bytes = self.gpu.read_back(&output, out_bytes)?;
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    fn write_kv(&self, pages: &mut DevicePages, w: &KvWrite<'_>) -> Result<()> {
        self.check_memory(pages)?;
        let shape = w.validate(&*pages)?;
        if shape.tokens == 0 {
            return Ok(());
        }
        let layout = shape.layout;
        let bt = layout.block_tokens() as usize;
        // `validate` refused a touched page that appears twice, so the
        // shader's writes never race.
        let dtype = layout.dtype();
        let es = dtype.size_bytes();
        let mut payload = vec![0u8; (w.k.len() + w.v.len()) * es];
        let (kb, vb) = payload.split_at_mut(w.k.len() * es);
        dtype.encode_row(w.k, kb)?;
        dtype.encode_row(w.v, vb)?;
        let table = &w.block_table[..=(w.start + shape.tokens - 1) / bt];

        let key = ShaderKey {
            kernel: Kernel::WriteKv,
            dtype,
            head_dim: layout.head_dim(),
            rows: 1,
            chunks: pages.chunks.len() as u32,
            native_f16: false,
        };
        let pipeline = self.pipelines.get(&self.gpu, key)?;
        let items = (w.k.len() + w.v.len()) as u32;
        let (gx, gy) = self.grid(items.div_ceil(WORKGROUP_SIZE))?;
        let base = Self::base_params(&layout, shape.layer_in_group, pages)?;
        let table = le_bytes(table.iter().map(|p| p.0));
        self.gpu.scoped(|| -> Result<()> {
            let params = self.params(&Params {
                start: w.start as u32,
                tokens: shape.tokens as u32,
                kv_heads: shape.kv_heads as u32,
                num_items: items,
                grid_x: gx,
                ..base
            })?;
            let payload = self.storage("kvslice payload", payload)?;
            let table = self.storage("kvslice table", table)?;
            let group = self.bind(
                &pipeline,
                &[&params, &payload, &table],
                Some((pages, first_pool_binding(Kernel::WriteKv))),
            );
            let mut enc = self.gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(gx, gy, 1);
            }
            self.gpu.queue.submit([enc.finish()]);
            Ok(())
        })??;
        self.gpu.wait()
    }
}
