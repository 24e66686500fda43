//! The device-resident API: a batch planned once per step into reusable
//! buffers, and attention and K/V appends recorded into a caller's command
//! encoder, reading queries and new K/V from (and writing output to) the
//! caller's own buffers.

use std::collections::HashSet;
use std::sync::Arc;

use kvslice_core::{
    AttentionBatch, BatchShape, DeviceFailure, Error, KvLayout, PageGeometry, PageId, Result,
    SeqAttention,
};

use crate::engine::{Params, WgpuEngine};
use crate::gpu::Gpu;
use crate::pages::DevicePages;
use crate::plan::{KEY_TILE, plan, tile_rows};
use crate::scratch::{PARAMS_BYTES, ParamSlots, Scratch, le_bytes};
use crate::shader::{Kernel, ShaderKey, WORKGROUP_SIZE, first_pool_binding};

/// A region of a caller's buffer: `buffer` from byte `offset` on. The
/// length is what the call needs (queries, output or K/V of the planned
/// batch); the buffer must hold it, have `STORAGE` usage, and `offset`
/// must be a multiple of [`WgpuEngine::offset_alignment`].
#[derive(Debug, Clone, Copy)]
pub struct DeviceRegion<'a> {
    /// The caller's buffer, made on this engine's [`device`](WgpuEngine::device).
    pub buffer: &'a wgpu::Buffer,
    /// First byte of the region.
    pub offset: u64,
}

impl<'a> DeviceRegion<'a> {
    /// The region at the start of `buffer`.
    ///
    /// ```no_run
    /// let engine = kvslice_wgpu::WgpuEngine::new()?;
    /// let buf = engine.device().create_buffer(&wgpu::BufferDescriptor {
    ///     label: None,
    ///     size: 1024,
    ///     usage: wgpu::BufferUsages::STORAGE,
    ///     mapped_at_creation: false,
    /// });
    /// let region = kvslice_wgpu::DeviceRegion::new(&buf);
    /// assert_eq!(region.offset, 0);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn new(buffer: &'a wgpu::Buffer) -> Self {
        Self { buffer, offset: 0 }
    }

    /// The region of `buffer` from byte `offset` on.
    pub fn at(buffer: &'a wgpu::Buffer, offset: u64) -> Self {
        Self { buffer, offset }
    }
}

/// One layer's attention over a planned [`DeviceStep`]: queries
/// `q_tokens × q_heads × head_dim` f32 (token-major, as
/// [`AttentionBatch::queries`]) in, output of the same shape out.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttend<'a> {
    /// Model layer (its page group must be the planned pages' layout).
    pub layer: u32,
    /// Score scale, usually `1/sqrt(head_dim)`.
    pub scale: f32,
    /// The queries.
    pub queries: DeviceRegion<'a>,
    /// Where the output goes.
    pub out: DeviceRegion<'a>,
}

/// One layer's new K/V for a planned [`DeviceStep`]: each sequence's last
/// `q_len` tokens (positions `kv_len − q_len ..kv_len`), in batch order,
/// each `q_tokens × kv_heads × head_dim` f32 (token-major, as
/// [`kvslice_core::KvWrite`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceAppend<'a> {
    /// Model layer.
    pub layer: u32,
    /// New keys.
    pub k: DeviceRegion<'a>,
    /// New values.
    pub v: DeviceRegion<'a>,
}

/// The longest context a device plan takes (2^31 - 1 tokens).
const MAX_DEVICE_CONTEXT: usize = (1 << 31) - 1;

/// What a plan fixed, checked by every recorded call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planned {
    pub layout: KvLayout,
    /// The layer group whose pages the block tables name.
    pub layer_group: u32,
    pub num_pages: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub gqa: u32,
    pub rows: u32,
    pub window: u32,
    pub q_tokens: u32,
    pub work_items: u32,
    pub merge_items: u32,
    /// Lanes per key of the subgroup kernel; 0 for the other.
    pub group: u32,
    /// A page where two appended tokens would share a slot, if any.
    pub clashing_page: Option<u32>,
}

/// A step's batch on the device: the cut of the batch into workgroups,
/// block tables and append destinations, in buffers reused from step to
/// step (grown only when a batch outgrows them), plus a parameter slot
/// per recorded call.
///
/// Make one with [`WgpuEngine::step`], then per decode step:
/// [`WgpuEngine::plan`] once, and [`WgpuEngine::record_append`] /
/// [`WgpuEngine::record_attend`] for each layer, into your own encoder.
///
/// **Contract.** Planning queues its metadata for the next submission, so
/// submit the commands recorded against one plan before planning this
/// step again (or alternate two steps). Recorded calls read the caller's
/// buffers when the commands run; nothing is read back to the host.
#[derive(Debug)]
pub struct DeviceStep {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) planned: Option<Planned>,
    pub(crate) work: Scratch,
    pub(crate) merges: Scratch,
    pub(crate) tables: Scratch,
    pub(crate) dests: Scratch,
    pub(crate) partials: Scratch,
    pub(crate) params: ParamSlots,
}

impl DeviceStep {
    pub(crate) fn new(gpu: Arc<Gpu>) -> Self {
        let storage = wgpu::BufferUsages::STORAGE;
        Self {
            gpu,
            planned: None,
            work: Scratch::new("kvslice work", storage),
            merges: Scratch::new("kvslice merges", storage),
            tables: Scratch::new("kvslice tables", storage),
            dests: Scratch::new("kvslice append slots", storage),
            partials: Scratch::new("kvslice partials", storage),
            params: ParamSlots::new(),
        }
    }

    /// Says that everything recorded with this step has been submitted
    /// (`queue().submit`), so the parameter slots its calls took are free
    /// for the next recordings, as [`WgpuEngine::plan`] frees them. A step
    /// recorded into many submissions on one plan needs this between
    /// them; without it, every call takes a new slot and the step's
    /// parameter buffers keep growing. Called before the submission, the
    /// recorded passes would read later calls' parameters.
    ///
    /// ```no_run
    /// # use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageId, SeqAttention};
    /// # use kvslice_wgpu::{DeviceAttend, DeviceRegion, WgpuEngine};
    /// # let engine = WgpuEngine::new()?;
    /// # let layout = KvLayout::new(LayoutSpec::new(1, 4, 1, 8, 4, KvDtype::F16))?;
    /// # let pages = engine.pages(layout, 2)?;
    /// # let table = [PageId(0), PageId(1)];
    /// # let seqs = [SeqAttention { block_table: &table, kv_len: 6, q_len: 1 }];
    /// # let usage = wgpu::BufferUsages::STORAGE;
    /// # let make = |label| engine.device().create_buffer(&wgpu::BufferDescriptor {
    /// #     label: Some(label), size: 128, usage, mapped_at_creation: false,
    /// # });
    /// # let (q, out) = (make("q"), make("out"));
    /// let mut step = engine.step();
    /// engine.plan(&mut step, &pages, 0, &seqs, None)?;
    /// for _ in 0..100 {
    ///     let mut encoder = engine.device().create_command_encoder(&Default::default());
    ///     let call = DeviceAttend { layer: 0, scale: 0.35, queries: DeviceRegion::new(&q), out: DeviceRegion::new(&out) };
    ///     engine.record_attend(&mut encoder, &pages, &mut step, &call)?;
    ///     engine.queue().submit([encoder.finish()]);
    ///     step.submitted();
    /// }
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn submitted(&mut self) {
        self.params.reset();
    }

    /// Query tokens of the planned batch (0 before the first plan).
    pub fn q_tokens(&self) -> u32 {
        self.planned.as_ref().map_or(0, |p| p.q_tokens)
    }

    fn planned_for(&self, pages: &DevicePages) -> Result<&Planned> {
        let p = self
            .planned
            .as_ref()
            .ok_or(Error::InvalidValue("this step has not been planned"))?;
        if p.layout != *pages.layout() || p.num_pages != pages.num_pages() {
            return Err(Error::InvalidValue(
                "pages differ in layout or page count from those the step was planned on",
            ));
        }
        Ok(p)
    }
}

/// A page that `s`'s new tokens are appended to and that its table also
/// holds at another position, if any: the append would overwrite that
/// block's K/V (what the host's `KvWrite::validate` refuses).
fn held_twice(s: &SeqAttention<'_>, bt: u32) -> Option<u32> {
    let bt = bt as usize;
    // `q_len` is at least 1 (validated).
    let written = (s.kv_len - s.q_len) / bt..(s.kv_len - 1) / bt + 1;
    written.into_iter().find_map(|b| {
        let page = s.block_table[b];
        s.block_table
            .iter()
            .enumerate()
            .any(|(i, &p)| p == page && i != b)
            .then_some(page.0)
    })
}

/// The `(page, position)` words of positions `positions` of a sequence
/// whose pages are `table` (`bt` tokens each): where the append kernel puts
/// each token.
pub(crate) fn append_dests(
    table: &[PageId],
    positions: std::ops::Range<usize>,
    bt: u32,
) -> impl Iterator<Item = u32> + '_ {
    positions.flat_map(move |pos| [table[pos / bt as usize].0, pos as u32])
}

fn binding<'a>(region: &DeviceRegion<'a>, bytes: u64) -> wgpu::BindingResource<'a> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: region.buffer,
        offset: region.offset,
        size: wgpu::BufferSize::new(bytes.max(4)),
    })
}

fn uniform(slot: &(wgpu::Buffer, u64)) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: &slot.0,
        offset: slot.1,
        size: wgpu::BufferSize::new(PARAMS_BYTES),
    })
}

impl WgpuEngine {
    /// A new, unplanned [`DeviceStep`] on this engine's device.
    pub fn step(&self) -> DeviceStep {
        DeviceStep::new(Arc::clone(&self.gpu))
    }

    /// Plans `seqs` (block tables, context and query lengths, as in
    /// [`AttentionBatch`]) of head shard `shard` over `pages`, with an
    /// attention `window` if any, and queues the plan's metadata into
    /// `step`'s buffers. Checked as [`AttentionBatch::validate`] checks a
    /// batch (everything but the queries, which live on the device).
    ///
    /// ```no_run
    /// use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageId, SeqAttention};
    /// use kvslice_wgpu::{DeviceAttend, DeviceRegion, WgpuEngine};
    ///
    /// let engine = WgpuEngine::new()?;
    /// let layout = KvLayout::new(LayoutSpec::new(2, 4, 1, 8, 4, KvDtype::F16))?;
    /// let pages = engine.pages(layout, 8)?;
    /// let table = [PageId(0), PageId(1)];
    /// let seqs = [SeqAttention { block_table: &table, kv_len: 6, q_len: 1 }];
    /// let mut step = engine.step();
    /// engine.plan(&mut step, &pages, 0, &seqs, None)?;
    /// // Your runtime's buffers: 1 token × 4 q heads × 8 dims of f32.
    /// let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    /// let make = |label| engine.device().create_buffer(&wgpu::BufferDescriptor {
    ///     label: Some(label), size: 128, usage, mapped_at_creation: false,
    /// });
    /// let (q, out) = (make("q"), make("out"));
    /// let mut encoder = engine.device().create_command_encoder(&Default::default());
    /// for layer in 0..2 {
    ///     engine.record_attend(&mut encoder, &pages, &mut step, &DeviceAttend {
    ///         layer,
    ///         scale: 0.35,
    ///         queries: DeviceRegion::new(&q),
    ///         out: DeviceRegion::new(&out),
    ///     })?;
    /// }
    /// engine.queue().submit([encoder.finish()]);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    ///
    /// The block tables name pages of layer group 0, which holds every
    /// layer in the default layout ([`LayerGrouping::AllLayers`]); with
    /// several groups, plan each group's tables into a step of its own
    /// with [`plan_group`](Self::plan_group).
    ///
    /// [`LayerGrouping::AllLayers`]: kvslice_core::LayerGrouping::AllLayers
    pub fn plan(
        &self,
        step: &mut DeviceStep,
        pages: &DevicePages,
        shard: u32,
        seqs: &[SeqAttention<'_>],
        window: Option<u32>,
    ) -> Result<()> {
        self.plan_group(step, pages, 0, shard, seqs, window)
    }

    /// [`plan`](Self::plan) for block tables of layer group `layer_group`:
    /// `record_append` and `record_attend` on the step then take only
    /// that group's layers (another layer is an [`Error::InvalidValue`],
    /// never a read of the wrong layer's K/V).
    ///
    /// ```no_run
    /// use kvslice_core::{KvDtype, KvLayout, LayerGrouping, LayoutSpec, PageId, SeqAttention};
    /// use kvslice_wgpu::WgpuEngine;
    ///
    /// let engine = WgpuEngine::new()?;
    /// let spec = LayoutSpec::new(2, 4, 1, 8, 4, KvDtype::F16).with_grouping(LayerGrouping::PerLayer);
    /// let layout = KvLayout::new(spec)?;
    /// let pages = engine.pages(layout, 8)?;
    /// // Layer 0's pages, then layer 1's, for the same six tokens.
    /// let tables = [[PageId(0), PageId(1)], [PageId(2), PageId(3)]];
    /// let mut steps = [engine.step(), engine.step()];
    /// for (group, (step, table)) in steps.iter_mut().zip(&tables).enumerate() {
    ///     let seqs = [SeqAttention { block_table: table, kv_len: 6, q_len: 1 }];
    ///     engine.plan_group(step, &pages, group as u32, 0, &seqs, None)?;
    /// }
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn plan_group(
        &self,
        step: &mut DeviceStep,
        pages: &DevicePages,
        layer_group: u32,
        shard: u32,
        seqs: &[SeqAttention<'_>],
        window: Option<u32>,
    ) -> Result<()> {
        self.check_memory(pages)?;
        self.check_step(step)?;
        let first_layer = pages.layout().group_layers(layer_group)?.start;
        let batch = AttentionBatch {
            window,
            ..AttentionBatch::new(first_layer, shard, seqs, &[], 1.0)
        };
        let shape = batch.validate_shape(pages)?;
        self.plan_checked(step, pages, &batch, &shape)
    }

    /// [`plan`](Self::plan) after validation.
    pub(crate) fn plan_checked(
        &self,
        step: &mut DeviceStep,
        pages: &DevicePages,
        batch: &AttentionBatch<'_>,
        shape: &BatchShape,
    ) -> Result<()> {
        let (kv_heads, q_tokens) = (shape.shard.num_kv_heads(), shape.q_tokens);
        let (layer_group, _) = pages.layout().layer_group(batch.layer)?;
        step.planned = None;
        step.params.reset();
        let layout = *pages.layout();
        let hd = layout.head_dim();
        let gqa = layout.gqa_ratio();
        let group = self.lane_group(&layout);
        let mut max_rows = self.max_tile_rows(hd)?;
        if let Some(g) = group {
            // Each lane keeps rows × (head_dim / g) query elements and as
            // many accumulators in registers: at most 64 of each.
            let per_lane = (64 * g / hd).max(1);
            max_rows = max_rows.min(1 << per_lane.ilog2());
        }
        // The shaders count positions in u32, and a split's end (a key
        // plus up to a context's worth, rounded up to a key tile) must
        // not wrap: contexts stay below 2^31.
        if batch.seqs.iter().any(|s| s.kv_len > MAX_DEVICE_CONTEXT) {
            return Err(Error::Overflow(
                "a context past 2^31 - 1 tokens on the device",
            ));
        }
        let rows = tile_rows(
            batch.seqs.iter().map(|s| s.q_len).max().unwrap_or(1) as u32 * gqa,
            max_rows,
        );
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
        // Where each sequence's new tokens go, and whether two land in one
        // slot (two writers of one slot would race).
        let bt = layout.block_tokens();
        let mut dests = Vec::with_capacity(2 * q_tokens);
        for s in batch.seqs {
            dests.extend(append_dests(
                s.block_table,
                s.kv_len - s.q_len..s.kv_len,
                bt,
            ));
        }
        let mut seen = HashSet::with_capacity(q_tokens);
        let clashing_page = dests
            .chunks_exact(2)
            .find(|d| !seen.insert((d[0], d[1] % bt)))
            .map(|d| d[0])
            .or_else(|| batch.seqs.iter().find_map(|s| held_twice(s, bt)));
        let gpu = &*self.gpu;
        let partial_bytes = cut.work.len() as u64 * u64::from(rows) * u64::from(hd + 2) * 4;
        gpu.scoped(|| -> Result<()> {
            step.work
                .write(gpu, &le_bytes(cut.work.iter().flat_map(|w| w.words())))?;
            step.merges
                .write(gpu, &le_bytes(cut.merge.iter().flat_map(|m| m.words())))?;
            step.tables
                .write(gpu, &le_bytes(cut.tables.iter().copied()))?;
            step.dests.write(gpu, &le_bytes(dests))?;
            step.partials.at_least(gpu, partial_bytes)?;
            Ok(())
        })??;
        step.planned = Some(Planned {
            layout,
            layer_group,
            num_pages: pages.num_pages(),
            q_heads: gqa * kv_heads,
            kv_heads,
            gqa,
            rows,
            window: batch.window.unwrap_or(u32::MAX),
            q_tokens: q_tokens as u32,
            work_items: cut.work.len() as u32,
            merge_items: cut.merge.len() as u32,
            group: group.unwrap_or(0),
            clashing_page,
        });
        Ok(())
    }

    /// Records one layer's attention over the planned batch into
    /// `encoder`: two compute dispatches, no submission, no readback. See
    /// [`plan`](Self::plan) for an example.
    ///
    /// Errors, all before anything is recorded: a step not planned or
    /// planned on pages of another layout, a layer outside the layout, a
    /// bad scale, a region too small for the batch, misaligned or without
    /// `STORAGE` usage, and (as [`DeviceFailure::Validation`]) buffers of
    /// another device. Queries are the caller's to keep finite: a
    /// non-finite query gives a non-finite output row.
    pub fn record_attend(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        pages: &DevicePages,
        step: &mut DeviceStep,
        call: &DeviceAttend<'_>,
    ) -> Result<()> {
        let (p, layer_in_group) = self.planned_layer(pages, step, call.layer)?;
        if !(call.scale.is_finite() && call.scale > 0.0) {
            return Err(Error::InvalidValue("scale must be finite and positive"));
        }
        let bytes = u64::from(p.q_tokens) * u64::from(p.q_heads * p.layout.head_dim()) * 4;
        self.check_region(
            ("queries", "queries region bytes (at least)"),
            &call.queries,
            bytes,
        )?;
        self.check_region(
            ("output", "output region bytes (at least)"),
            &call.out,
            bytes,
        )?;
        if p.q_tokens == 0 {
            return Ok(());
        }
        let key = |kernel, group| ShaderKey {
            kernel,
            dtype: p.layout.dtype(),
            head_dim: p.layout.head_dim(),
            rows: p.rows,
            chunks: pages.chunks.len() as u32,
            native_f16: self.native_f16 && kernel == Kernel::Attend,
            group,
        };
        let pass1 = match p.group {
            0 => key(Kernel::Attend, 0),
            g => key(Kernel::AttendSg, g),
        };
        let attend = self.pipelines.get(&self.gpu, pass1)?;
        let merge = self.pipelines.get(&self.gpu, key(Kernel::Merge, 0))?;
        let base = Params {
            q_heads: p.q_heads,
            gqa: p.gqa,
            scale: call.scale,
            window: p.window,
            ..Self::base_params(&p.layout, layer_in_group, pages)?
        };
        let (ax, ay) = self.grid(p.work_items)?;
        let (mx, my) = self.grid(p.merge_items)?;
        let gpu = &*self.gpu;
        // Bind groups first, in a scope of their own: one wgpu refuses
        // must not reach a pass, which would spoil the caller's encoder.
        let (attend_group, merge_group) = gpu.scoped(|| -> Result<_> {
            let attend_params = step.params.push(
                gpu,
                Params {
                    num_items: p.work_items,
                    grid_x: ax,
                    ..base
                }
                .words(),
            )?;
            let merge_params = step.params.push(
                gpu,
                Params {
                    num_items: p.merge_items,
                    grid_x: mx,
                    ..base
                }
                .words(),
            )?;
            let attend_group = self.bind_group(
                &attend,
                vec![
                    uniform(&attend_params),
                    binding(&call.queries, bytes),
                    step.work.current().as_entire_binding(),
                    step.tables.current().as_entire_binding(),
                    step.partials.current().as_entire_binding(),
                ],
                Some((pages, first_pool_binding(Kernel::Attend))),
            );
            let merge_group = self.bind_group(
                &merge,
                vec![
                    uniform(&merge_params),
                    step.merges.current().as_entire_binding(),
                    step.partials.current().as_entire_binding(),
                    binding(&call.out, bytes),
                ],
                None,
            );
            Ok((attend_group, merge_group))
        })??;
        gpu.scoped(|| {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&attend);
            pass.set_bind_group(0, &attend_group, &[]);
            pass.dispatch_workgroups(ax, ay, 1);
            pass.set_pipeline(&merge);
            pass.set_bind_group(0, &merge_group, &[]);
            pass.dispatch_workgroups(mx, my, 1);
        })
    }

    /// Records one layer's new K/V of the planned batch into `encoder`:
    /// each sequence's last `q_len` tokens are converted to the pages'
    /// dtype (rounded to nearest even, as the host path rounds) and stored
    /// in place. Record it before the same layer's
    /// [`record_attend`](Self::record_attend) so attention sees them.
    ///
    /// Errors as [`record_attend`](Self::record_attend), and
    /// [`Error::DuplicatePage`] when two appended tokens share a slot.
    pub fn record_append(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        pages: &mut DevicePages,
        step: &mut DeviceStep,
        call: &DeviceAppend<'_>,
    ) -> Result<()> {
        let (p, layer_in_group) = self.planned_layer(pages, step, call.layer)?;
        if let Some(page) = p.clashing_page {
            return Err(Error::DuplicatePage { page });
        }
        let bytes = u64::from(p.q_tokens) * u64::from(p.kv_heads * p.layout.head_dim()) * 4;
        self.check_region(
            ("new keys", "new keys region bytes (at least)"),
            &call.k,
            bytes,
        )?;
        self.check_region(
            ("new values", "new values region bytes (at least)"),
            &call.v,
            bytes,
        )?;
        if p.q_tokens == 0 {
            return Ok(());
        }
        let gpu = &*self.gpu;
        gpu.scoped(|| -> Result<()> {
            let dests = step.dests.current().as_entire_binding();
            self.encode_append(
                encoder,
                pages,
                &mut step.params,
                layer_in_group,
                p.q_tokens,
                p.kv_heads,
                [binding(&call.k, bytes), binding(&call.v, bytes), dests],
            )
        })?
    }

    /// Records the append kernel: `inputs` are the new keys, the new values
    /// (f32) and the destination `(page, position)` of each token.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode_append(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        pages: &DevicePages,
        params: &mut ParamSlots,
        layer_in_group: u32,
        tokens: u32,
        kv_heads: u32,
        inputs: [wgpu::BindingResource<'_>; 3],
    ) -> Result<()> {
        let layout = *pages.layout();
        let key = ShaderKey {
            kernel: Kernel::WriteKv,
            dtype: layout.dtype(),
            head_dim: layout.head_dim(),
            rows: 1,
            chunks: pages.chunks.len() as u32,
            native_f16: false,
            group: 0,
        };
        let pipeline = self.pipelines.get(&self.gpu, key)?;
        // One thread per element; per row for the scaled types, which
        // need the row's largest magnitude.
        let per_row = if layout.dtype().is_scaled() {
            1
        } else {
            layout.head_dim()
        };
        let items = [tokens, kv_heads, per_row]
            .into_iter()
            .try_fold(2u32, u32::checked_mul)
            .ok_or(Error::Overflow("new K/V elements of one append"))?;
        let (gx, gy) = self.grid(items.div_ceil(WORKGROUP_SIZE))?;
        let slot = params.push(
            &self.gpu,
            Params {
                tokens,
                kv_heads,
                num_items: items,
                grid_x: gx,
                ..Self::base_params(&layout, layer_in_group, pages)?
            }
            .words(),
        )?;
        let [k, v, dests] = inputs;
        // In a scope of its own, as in `record_attend`.
        let group = self.gpu.scoped(|| {
            self.bind_group(
                &pipeline,
                vec![uniform(&slot), k, v, dests],
                Some((pages, first_pool_binding(Kernel::WriteKv))),
            )
        })?;
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(gx, gy, 1);
        Ok(())
    }

    /// What a recorded call on `layer` of `pages` starts from: the checks
    /// every call shares, the plan, and the layer's index in its page.
    fn planned_layer(
        &self,
        pages: &DevicePages,
        step: &DeviceStep,
        layer: u32,
    ) -> Result<(Planned, u32)> {
        self.check_memory(pages)?;
        self.check_step(step)?;
        let p = *step.planned_for(pages)?;
        let (group, layer_in_group) = p.layout.layer_group(layer)?;
        if group != p.layer_group {
            // The tables name another group's pages: recording would read
            // (or write) their layer `layer_in_group` instead.
            return Err(Error::InvalidValue(
                "the layer is in another layer group than the step's plan (see plan_group)",
            ));
        }
        Ok((p, layer_in_group))
    }

    fn check_step(&self, step: &DeviceStep) -> Result<()> {
        if !Arc::ptr_eq(&step.gpu, &self.gpu) {
            return Err(Error::InvalidValue(
                "the step belongs to another engine's device",
            ));
        }
        Ok(())
    }

    /// A caller's region must fit `bytes`, be aligned and be a storage
    /// buffer; the device it belongs to is checked by wgpu when it is bound.
    fn check_region(
        &self,
        (what, size_what): (&str, &'static str),
        r: &DeviceRegion<'_>,
        bytes: u64,
    ) -> Result<()> {
        if !r.buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::Device {
                kind: DeviceFailure::Validation,
                detail: format!("the {what} buffer lacks STORAGE usage"),
            });
        }
        if !r.offset.is_multiple_of(self.gpu.storage_align) {
            return Err(Error::Device {
                kind: DeviceFailure::Validation,
                detail: format!(
                    "the {what} offset {} is not a multiple of {} (WgpuEngine::offset_alignment)",
                    r.offset, self.gpu.storage_align
                ),
            });
        }
        if bytes > self.gpu.max_binding {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!(
                    "the {what} region needs {bytes} bytes bound at once; the adapter binds at most {}",
                    self.gpu.max_binding
                ),
            });
        }
        let have = r.buffer.size().saturating_sub(r.offset);
        if have < bytes {
            return Err(Error::ShapeMismatch {
                what: size_what,
                expected: bytes,
                actual: have,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kvslice_core::{KvDtype, KvLayout, LayoutSpec, PageId, SeqAttention};

    /// Where the adapter has subgroups, an aligned layout takes the
    /// lane-group kernel (so the suites test it) and an unaligned one the
    /// one-key-per-thread kernel.
    #[test]
    fn the_kernel_follows_the_adapter_and_the_layout() {
        let Some(e) = crate::testing::engine_or_skip("kernel_choice") else {
            return;
        };
        let table = [PageId(0), PageId(1)];
        let seqs = [SeqAttention {
            block_table: &table,
            kv_len: 20,
            q_len: 1,
        }];
        let group = |e: &crate::WgpuEngine, hd| {
            let layout = KvLayout::new(LayoutSpec::new(1, 8, 2, hd, 16, KvDtype::F16)).unwrap();
            let pages = e.pages(layout, 2).unwrap();
            let mut step = e.step();
            e.plan(&mut step, &pages, 0, &seqs, None).unwrap();
            step.planned.unwrap().group
        };
        let sizes = e.adapter().subgroup_sizes;
        if e.adapter().subgroups && sizes.1 <= 64 {
            assert!(e.subgroups());
            let g = group(&e, 128);
            assert!(g >= 1 && g <= sizes.0 && 128 % (8 * g) == 0, "{g}");
        } else {
            assert!(!e.subgroups());
        }
        assert_eq!(group(&e, 7), 0, "odd rows are not 16-byte aligned");
        assert_eq!(group(&e.with_subgroups(false), 128), 0);
    }
}
