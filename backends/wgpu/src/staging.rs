//! [`StagingEngine`]: GPU attention over pages that live on the host.

use std::sync::{Mutex, PoisonError};

use kvslice_core::{
    AttentionBatch, AttentionEngine, DeviceFailure, Error, KvWrite, PageGeometry, PageId,
    PageMemoryMut, Result, write_kv,
};

use crate::{DevicePages, WgpuEngine};

/// Runs a [`WgpuEngine`] over host memory (a `PageBuf`, or a `PageView` of
/// the core pool): each `attend` copies the pages its batch reads into a
/// device copy and computes there; `write_kv` writes the host pages.
///
/// This is for callers whose cache store is host-resident (the `kvslice
/// serve` loop): it is correct with no synchronisation protocol at all, at
/// the price of moving the context over the bus on every call. A runtime
/// that keeps its pool on the device uses [`DevicePages`] directly.
///
/// ```no_run
/// use kvslice_core::{AttentionBatch, AttentionEngine, KvDtype, KvLayout, KvWrite, LayoutSpec, PageBuf, PageId, SeqAttention};
/// use kvslice_wgpu::{StagingEngine, WgpuEngine};
///
/// let engine = StagingEngine::new(WgpuEngine::new()?);
/// let layout = KvLayout::new(LayoutSpec::new(1, 1, 1, 2, 4, KvDtype::F32))?;
/// let mut host = PageBuf::new(layout, 2)?;
/// let table = [PageId(1)];
/// engine.write_kv(&mut host, &KvWrite { layer: 0, shard: 0, block_table: &table, start: 0, k: &[1.0, 0.0], v: &[3.0, 4.0] })?;
/// let seqs = [SeqAttention { block_table: &table, kv_len: 1, q_len: 1 }];
/// let mut out = [0.0f32; 2];
/// engine.attend(&host, &AttentionBatch::new(0, 0, &seqs, &[1.0, 1.0], 1.0), &mut out)?;
/// assert_eq!(out, [3.0, 4.0]);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug)]
pub struct StagingEngine {
    engine: WgpuEngine,
    staged: Mutex<Option<DevicePages>>,
}

impl StagingEngine {
    /// Wraps `engine`; the device copy is made on first use.
    pub fn new(engine: WgpuEngine) -> Self {
        Self {
            engine,
            staged: Mutex::new(None),
        }
    }

    /// The engine doing the work.
    pub fn engine(&self) -> &WgpuEngine {
        &self.engine
    }
}

impl<P: PageMemoryMut + ?Sized> AttentionEngine<P> for StagingEngine {
    fn attend(&self, pages: &P, batch: &AttentionBatch<'_>, out: &mut [f32]) -> Result<()> {
        let shape = batch.validate(pages, out.len())?;
        let layout = shape.layout;
        if !layout.page_bytes().is_multiple_of(4) {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: "staging copies whole pages, which must be whole 32-bit words".into(),
            });
        }
        let mut staged = self.staged.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = staged
            .as_ref()
            .is_some_and(|d| d.layout() == &layout && d.num_pages() >= pages.num_pages());
        if !fits {
            *staged = Some(self.engine.pages(layout, pages.num_pages())?);
        }
        let device = staged.as_mut().expect("made above");
        let bt = layout.block_tokens() as usize;
        // The blocks a window hides may be released already: placeholders,
        // not pages, and nothing the shaders read.
        let mut ids: Vec<PageId> = batch
            .seqs
            .iter()
            .flat_map(|s| {
                let first = s.first_block(batch.window, bt as u32);
                s.block_table[first..s.kv_len.div_ceil(bt)].iter().copied()
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        device.stage(pages, &ids)?;
        self.engine.attend(device, batch, out)
    }

    fn write_kv(&self, pages: &mut P, w: &KvWrite<'_>) -> Result<()> {
        write_kv(pages, w)
    }
}
