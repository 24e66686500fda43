//! The device-resident page pool: the same pages as a host [`PageBuf`],
//! split into storage bindings of whole pages.

use std::sync::Arc;

use kvslice_core::{
    DeviceFailure, Error, KeyOrder, KvLayout, PageBuf, PageGeometry, PageId, PageMemory,
    PageMemoryMut, Result,
};

use crate::gpu::Gpu;

/// K/V pages in device memory, mirroring the core pool's page ids.
///
/// Pages are grouped into chunks of `pages_per_chunk` whole pages, one
/// storage buffer each, no larger than the binding limit the engine was
/// built with (128 MiB unless told otherwise, and never more than the
/// adapter allows). Create one with [`WgpuEngine::pages`](crate::WgpuEngine::pages)
/// or [`WgpuEngine::upload`](crate::WgpuEngine::upload).
pub struct DevicePages {
    pub(crate) gpu: Arc<Gpu>,
    layout: KvLayout,
    num_pages: u32,
    pub(crate) pages_per_chunk: u32,
    pub(crate) chunks: Vec<wgpu::Buffer>,
}

impl std::fmt::Debug for DevicePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePages")
            .field("num_pages", &self.num_pages)
            .field("pages_per_chunk", &self.pages_per_chunk)
            .field("chunks", &self.chunks.len())
            .finish_non_exhaustive()
    }
}

impl PageGeometry for DevicePages {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn num_pages(&self) -> u32 {
        self.num_pages
    }
}

impl DevicePages {
    /// Allocates `num_pages` zeroed pages, split into chunks of at most
    /// `max_chunk_bytes`. The first kernel of each kind binds all chunks, so
    /// their number is bounded by the adapter's storage-buffer limit.
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        layout: KvLayout,
        num_pages: u32,
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        if layout.key_order() == KeyOrder::DimMajor {
            // The shaders read and write token-major keys only.
            return Err(Error::Unsupported(
                "dim-major keys (KeyOrder::DimMajor): the wgpu engine reads token-major keys; \
                 use KeyOrder::TokenMajor with it",
            ));
        }
        let page_bytes = layout.page_bytes() as u64;
        let limit = max_chunk_bytes.min(gpu.max_binding);
        let pages_per_chunk = (limit / page_bytes).min(u64::from(u32::MAX)) as u32;
        if pages_per_chunk == 0 {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!(
                    "a page of {page_bytes} bytes exceeds the {limit}-byte binding limit"
                ),
            });
        }
        let chunks = num_pages.div_ceil(pages_per_chunk).max(1);
        let room = chunk_room(gpu.max_storage_buffers, gpu.max_bindings);
        if chunks > room {
            return Err(Error::Device {
                kind: DeviceFailure::OutOfMemory,
                detail: format!(
                    "{num_pages} pages of {page_bytes} bytes need {chunks} bindings of {limit} bytes; \
                     the adapter allows {room}"
                ),
            });
        }
        let buffers = gpu.scoped(|| {
            (0..chunks)
                .map(|c| {
                    let pages = (num_pages - c * pages_per_chunk)
                        .min(pages_per_chunk)
                        .max(1);
                    gpu.create_buffer(
                        "kvslice pages",
                        (u64::from(pages) * page_bytes).div_ceil(4) * 4,
                        wgpu::BufferUsages::STORAGE
                            | wgpu::BufferUsages::COPY_DST
                            | wgpu::BufferUsages::COPY_SRC,
                    )
                })
                .collect::<Vec<_>>()
        })?;
        Ok(Self {
            gpu,
            layout,
            num_pages,
            pages_per_chunk,
            chunks: buffers,
        })
    }

    /// Number of storage bindings the pages are split into.
    ///
    /// ```no_run
    /// # use kvslice_core::{KvDtype, KvLayout, LayoutSpec};
    /// # let engine = kvslice_wgpu::WgpuEngine::new()?;
    /// let layout = KvLayout::new(LayoutSpec::new(1, 4, 2, 64, 16, KvDtype::F16))?;
    /// let pages = engine.pages(layout, 1024)?;
    /// assert!(pages.num_chunks() >= 1);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn num_chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Overwrites every page with the host's, byte for byte.
    pub fn upload_from(&mut self, host: &PageBuf) -> Result<()> {
        if host.layout() != &self.layout || host.num_pages() != self.num_pages {
            return Err(Error::InvalidValue(
                "host pages must have this memory's layout and page count",
            ));
        }
        let page_bytes = self.layout.page_bytes();
        let gpu = Arc::clone(&self.gpu);
        gpu.scoped(|| -> Result<()> {
            for (c, buf) in self.chunks.iter().enumerate() {
                let first = c as u32 * self.pages_per_chunk;
                let last = (first + self.pages_per_chunk).min(host.num_pages());
                if first >= last {
                    break;
                }
                let mut bytes = Vec::with_capacity((last - first) as usize * page_bytes + 3);
                for id in first..last {
                    bytes.extend_from_slice(host.page(PageId(id))?);
                }
                // Writes are whole words; the pad lands in the chunk's tail.
                bytes.resize(bytes.len().div_ceil(4) * 4, 0);
                gpu.queue.write_buffer(buf, 0, &bytes);
            }
            Ok(())
        })??;
        gpu.wait()
    }

    /// Copies every page back into a new host [`PageBuf`].
    pub fn download(&self) -> Result<PageBuf> {
        let mut host = PageBuf::new(self.layout, self.num_pages)?;
        let page_bytes = self.layout.page_bytes();
        for (c, buf) in self.chunks.iter().enumerate() {
            let first = c as u32 * self.pages_per_chunk;
            let last = (first + self.pages_per_chunk).min(self.num_pages);
            let bytes = self
                .gpu
                .read_back(buf, u64::from(last - first) * page_bytes as u64)?;
            for (i, id) in (first..last).enumerate() {
                host.page_mut(PageId(id))?
                    .copy_from_slice(&bytes[i * page_bytes..(i + 1) * page_bytes]);
            }
        }
        Ok(host)
    }

    /// Copies pages `ids` of `host` (same layout; whole-word pages) into
    /// the same page ids here.
    pub(crate) fn stage<M: PageMemory + ?Sized>(&mut self, host: &M, ids: &[PageId]) -> Result<()> {
        let page_bytes = host.layout().page_bytes() as u64;
        let gpu = std::sync::Arc::clone(&self.gpu);
        gpu.scoped(|| -> Result<()> {
            for &id in ids {
                let chunk = &self.chunks[(id.0 / self.pages_per_chunk) as usize];
                let offset = u64::from(id.0 % self.pages_per_chunk) * page_bytes;
                gpu.queue.write_buffer(chunk, offset, host.page(id)?);
            }
            Ok(())
        })?
    }
}

/// Pool chunks a kernel can bind: the attention kernel binds four other
/// storage buffers, and its chunks take bindings 5 on (binding indices
/// stay below `max_bindings`, 1,000 by default, whatever the storage
/// limit).
fn chunk_room(max_storage_buffers: u32, max_bindings: u32) -> u32 {
    let first = crate::shader::first_pool_binding(crate::shader::Kernel::Attend);
    max_storage_buffers
        .saturating_sub(4)
        .min(max_bindings.saturating_sub(first))
}

#[cfg(test)]
mod tests {
    use super::chunk_room;

    #[test]
    fn chunks_fit_both_storage_and_binding_limits() {
        // lavapipe-like: the storage limit binds.
        assert_eq!(chunk_room(8, 1000), 4);
        // A large GPU's storage limit past the binding indices: bindings 5
        // to 999 are all there is.
        assert_eq!(chunk_room(1 << 20, 1000), 995);
        assert_eq!(chunk_room(3, 1000), 0);
        assert_eq!(chunk_room(1 << 20, 4), 0);
    }
}
