//! [`WgpuEngine`]: the attention and write passes, recorded and submitted.

use std::sync::{Arc, Mutex, PoisonError};

use kvslice_core::{
    AttentionBatch, AttentionEngine, DeviceFailure, Error, KvLayout, KvPart, KvWrite, PageBuf,
    PageGeometry, Result,
};

use crate::gpu::{AdapterSummary, GUARANTEED_BINDING_BYTES, Gpu};
use crate::pages::DevicePages;
use crate::scratch::{ParamSlots, Scratch, le_bytes};
use crate::shader::Pipelines;
use crate::step::{DeviceAttend, DeviceRegion, DeviceStep, append_dests};

/// Workgroup memory the attention kernel may use for its query tile.
const QUERY_TILE_BYTES: u32 = 8 << 10;
/// Most rows per tile (GQA group × tokens).
const MAX_TILE_ROWS: u32 = 16;

/// Paged attention on a GPU through wgpu compute shaders.
///
/// K/V live in [`DevicePages`] made by this engine. Decode and prefill are
/// one algorithm: query rows are tiled per kv head (so a GQA group reads
/// its pages once), long contexts are split across workgroups, and a second
/// pass merges the splits by log-sum-exp (flash-decoding). Where the
/// adapter has subgroups, groups of lanes share each key; elsewhere one
/// thread scores one key. Runtimes that keep queries and output on the
/// device use [`plan`](Self::plan) and [`record_attend`](Self::record_attend).
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
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) pipelines: Pipelines,
    max_binding: u64,
    pub(crate) target_workgroups: u32,
    pub(crate) native_f16: bool,
    pub(crate) subgroups: bool,
    /// The host-slice API's reusable buffers, one call at a time.
    host: Mutex<HostScratch>,
}

/// Workgroups a batch should spread over: enough to fill a GPU's compute
/// units (2048), or for a CPU adapter (lavapipe, which runs workgroups on
/// the cores) a few per core, since each split costs a partial and a merge.
fn default_target_workgroups(a: &AdapterSummary) -> u32 {
    if a.device_type == format!("{:?}", wgpu::DeviceType::Cpu) {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get() as u32);
        8 * cores
    } else {
        2048
    }
}

/// Buffers the host-slice calls stage through: queries up, output down,
/// new K/V up, and the step they plan into.
#[derive(Debug)]
struct HostScratch {
    step: DeviceStep,
    queries: Scratch,
    output: Scratch,
    readback: Scratch,
    k: Scratch,
    v: Scratch,
    dests: Scratch,
    write_params: ParamSlots,
}

impl HostScratch {
    fn new(gpu: &Arc<Gpu>) -> Self {
        use wgpu::BufferUsages as U;
        Self {
            step: DeviceStep::new(Arc::clone(gpu)),
            queries: Scratch::new("kvslice queries", U::STORAGE),
            output: Scratch::new("kvslice output", U::STORAGE | U::COPY_SRC),
            readback: Scratch::new("kvslice readback", U::MAP_READ),
            k: Scratch::new("kvslice new keys", U::STORAGE),
            v: Scratch::new("kvslice new values", U::STORAGE),
            dests: Scratch::new("kvslice write slots", U::STORAGE),
            write_params: ParamSlots::new(),
        }
    }
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
            subgroups: Self::subgroups_usable(&gpu.summary),
            max_binding: GUARANTEED_BINDING_BYTES.min(gpu.max_binding),
            target_workgroups: default_target_workgroups(&gpu.summary),
            pipelines: Pipelines::default(),
            host: Mutex::new(HostScratch::new(&gpu)),
            gpu,
        })
    }

    /// The wgpu device: make the buffers and command encoders you pass to
    /// the device-resident calls ([`record_attend`](Self::record_attend))
    /// with it.
    pub fn device(&self) -> &wgpu::Device {
        &self.gpu.device
    }

    /// The device's queue, to submit what you recorded.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.gpu.queue
    }

    /// Offsets of [`DeviceRegion`]s must be multiples of this (the
    /// adapter's storage-binding offset alignment, in bytes).
    pub fn offset_alignment(&self) -> u64 {
        self.gpu.storage_align
    }

    /// Buffers this engine (and every memory and step made from it) has
    /// created so far. Calls reuse their buffers, so after the first call
    /// of a given size this stops growing.
    pub fn buffers_created(&self) -> u64 {
        self.gpu.buffers_created()
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
    /// split until tiles × splits reaches it (default 2048, or 8 per core
    /// on a CPU adapter).
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

    /// Scores keys with lane groups and subgroup shuffles where the adapter
    /// has subgroups (the default there) or, with `false`, one key per
    /// thread. Layouts whose rows are not 16-byte aligned always take the
    /// second path.
    pub fn with_subgroups(mut self, on: bool) -> Self {
        self.subgroups = on && Self::subgroups_usable(&self.gpu.summary);
        self
    }

    /// Whether the subgroup kernel is used where the layout allows.
    pub fn subgroups(&self) -> bool {
        self.subgroups
    }

    fn subgroups_usable(a: &AdapterSummary) -> bool {
        // A lane group must fit in one subgroup of a 64-thread workgroup.
        a.subgroups && a.subgroup_sizes.0 >= 1 && a.subgroup_sizes.1 <= 64
    }

    /// Lanes per key for the subgroup kernel on `layout`, or `None` for the
    /// one-key-per-thread kernel. Every row must start on 16 bytes (rows
    /// start at multiples of head_dim inside a page, so head_dim and the
    /// page stride must be whole 16-byte units) and each lane's share of a
    /// row must be whole 16-byte loads.
    pub(crate) fn lane_group(&self, layout: &KvLayout) -> Option<u32> {
        if !self.subgroups {
            return None;
        }
        let es = layout.dtype().size_bytes();
        let vw = 16 / es as u32;
        let hd = layout.head_dim();
        if !hd.is_multiple_of(vw) || !layout.page_bytes().is_multiple_of(16) {
            return None;
        }
        let g = self.gpu.summary.subgroup_sizes.0.min(hd / vw).min(64);
        let g = 1 << g.max(1).ilog2();
        hd.is_multiple_of(g * vw).then_some(g)
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

    pub(crate) fn check_memory(&self, pages: &DevicePages) -> Result<()> {
        self.gpu.check_alive()?;
        if !Arc::ptr_eq(&pages.gpu, &self.gpu) {
            return Err(Error::InvalidValue(
                "pages belong to another engine's device",
            ));
        }
        Ok(())
    }

    /// `(x, y)` workgroups covering `n`, within the per-dimension limit.
    pub(crate) fn grid(&self, n: u32) -> Result<(u32, u32)> {
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

    /// A bind group of `pipeline`: `resources` at bindings 0.., then the
    /// pool's chunks from binding `first` on.
    pub(crate) fn bind_group(
        &self,
        pipeline: &wgpu::ComputePipeline,
        resources: Vec<wgpu::BindingResource<'_>>,
        pool: Option<(&DevicePages, u32)>,
    ) -> wgpu::BindGroup {
        let mut entries: Vec<wgpu::BindGroupEntry<'_>> = resources
            .into_iter()
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource,
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

    /// Most query rows per tile for `head_dim` (a power of two).
    pub(crate) fn max_tile_rows(&self, hd: u32) -> Result<u32> {
        let max_rows = (QUERY_TILE_BYTES / (4 * hd)).min(MAX_TILE_ROWS);
        if max_rows == 0 {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!("head_dim {hd} over the {} supported", QUERY_TILE_BYTES / 4),
            });
        }
        Ok(1 << max_rows.ilog2())
    }

    pub(crate) fn base_params(
        layout: &KvLayout,
        layer_in_group: u32,
        pages: &DevicePages,
    ) -> Result<Params> {
        let k = layout.head_region(KvPart::K, layer_in_group, 0)?;
        let v = layout.head_region(KvPart::V, layer_in_group, 0)?;
        let scales = |part| {
            layout
                .scale_region(part, layer_in_group, 0)
                .map(|r| r.map_or(0, |r| r.start as u32))
        };
        Ok(Params {
            block_tokens: layout.block_tokens(),
            // The page stride: for the scaled types (one byte each) the
            // values and the scales after them.
            page_elems: (layout.page_bytes() / layout.dtype().size_bytes()) as u32,
            ks_base: scales(KvPart::K)?,
            vs_base: scales(KvPart::V)?,
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
pub(crate) struct Params {
    pub(crate) block_tokens: u32,
    pub(crate) page_elems: u32,
    pub(crate) pages_per_chunk: u32,
    pub(crate) k_base: u32,
    pub(crate) v_base: u32,
    pub(crate) head_stride: u32,
    pub(crate) q_heads: u32,
    pub(crate) gqa: u32,
    pub(crate) scale: f32,
    pub(crate) num_items: u32,
    pub(crate) grid_x: u32,
    /// Byte offsets of head 0's K and V scales in a page (scaled types).
    pub(crate) ks_base: u32,
    pub(crate) vs_base: u32,
    pub(crate) tokens: u32,
    pub(crate) kv_heads: u32,
    /// Sliding window in tokens; `u32::MAX` for none.
    pub(crate) window: u32,
}

impl Params {
    pub(crate) fn words(&self) -> [u32; 16] {
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
            self.ks_base,
            self.tokens,
            self.kv_heads,
            self.window,
            self.vs_base,
        ]
    }
}

impl AttentionEngine<DevicePages> for WgpuEngine {
    /// Plans, uploads the queries, records the passes, submits and reads
    /// the output back: [`record_attend`](Self::record_attend) wrapped for
    /// host slices, through buffers reused from call to call.
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
        let mut host = self.host.lock().unwrap_or_else(PoisonError::into_inner);
        let HostScratch {
            step,
            queries,
            output,
            readback,
            ..
        } = &mut *host;
        self.plan_checked(step, pages, batch, &shape)?;
        let bytes = out.len() as u64 * 4;
        let gpu = &*self.gpu;
        gpu.scoped(|| -> Result<()> {
            let q = queries.write(gpu, &le_bytes(batch.queries.iter().map(|x| x.to_bits())))?;
            let o = output.at_least(gpu, bytes)?;
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            self.record_attend(
                &mut enc,
                pages,
                step,
                &DeviceAttend {
                    layer: batch.layer,
                    scale: batch.scale,
                    queries: DeviceRegion::new(q),
                    out: DeviceRegion::new(o),
                },
            )?;
            let rb = readback.at_least(gpu, bytes)?;
            enc.copy_buffer_to_buffer(o, 0, rb, 0, bytes);
            gpu.queue.submit([enc.finish()]);
            Ok(())
        })??;
        let mut raw = vec![0u8; bytes as usize];
        gpu.map_read(readback.current(), &mut raw)?;
        for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    /// Uploads the new K/V as f32 and runs the append kernel, which
    /// rounds them to the pages' dtype exactly as the host does.
    fn write_kv(&self, pages: &mut DevicePages, w: &KvWrite<'_>) -> Result<()> {
        self.check_memory(pages)?;
        // `validate` refuses a table naming one touched page twice, so the
        // kernel's writes never race.
        let shape = w.validate(&*pages)?;
        if shape.tokens == 0 {
            return Ok(());
        }
        // The append kernel takes positions as u32.
        if w.start + shape.tokens > u32::MAX as usize {
            return Err(Error::Overflow("a position past 2^32 - 1 on the device"));
        }
        let dests = append_dests(
            w.block_table,
            w.start..w.start + shape.tokens,
            shape.layout.block_tokens(),
        );
        let mut host = self.host.lock().unwrap_or_else(PoisonError::into_inner);
        let HostScratch {
            k,
            v,
            dests: slots,
            write_params,
            ..
        } = &mut *host;
        write_params.reset();
        let gpu = &*self.gpu;
        gpu.scoped(|| -> Result<()> {
            let k = k.write(gpu, &le_bytes(w.k.iter().map(|x| x.to_bits())))?;
            let v = v.write(gpu, &le_bytes(w.v.iter().map(|x| x.to_bits())))?;
            let slots = slots.write(gpu, &le_bytes(dests))?;
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            self.encode_append(
                &mut enc,
                pages,
                write_params,
                shape.layer_in_group,
                shape.tokens as u32,
                shape.kv_heads as u32,
                [
                    k.as_entire_binding(),
                    v.as_entire_binding(),
                    slots.as_entire_binding(),
                ],
            )?;
            gpu.queue.submit([enc.finish()]);
            Ok(())
        })??;
        gpu.wait()
    }
}
