//! Grow-only device buffers: the metadata, staging and parameter buffers
//! that calls reuse, so a warm engine creates no buffer per call.

use kvslice_core::{DeviceFailure, Error, Result};

use crate::gpu::Gpu;

/// One reusable buffer, made on first use and replaced by a larger one
/// (the next power of two) only when a call needs more.
#[derive(Debug)]
pub(crate) struct Scratch {
    label: &'static str,
    usage: wgpu::BufferUsages,
    buf: Option<wgpu::Buffer>,
}

impl Scratch {
    /// An empty scratch of `usage` (plus `COPY_DST`, so it can be written;
    /// a `MAP_READ` scratch gets nothing else, as WebGPU requires).
    pub(crate) const fn new(label: &'static str, usage: wgpu::BufferUsages) -> Self {
        Self {
            label,
            usage,
            buf: None,
        }
    }

    /// A buffer of at least `bytes` bytes (at least one word). Call inside
    /// [`Gpu::scoped`].
    pub(crate) fn at_least(&mut self, gpu: &Gpu, bytes: u64) -> Result<&wgpu::Buffer> {
        let bytes = bytes.max(16).next_multiple_of(4);
        let storage = self.usage.contains(wgpu::BufferUsages::STORAGE);
        if storage && bytes > gpu.max_binding {
            return Err(Error::Device {
                kind: DeviceFailure::Unsupported,
                detail: format!(
                    "{} needs {bytes} bytes, over the {}-byte binding limit; split the batch",
                    self.label, gpu.max_binding
                ),
            });
        }
        if self.buf.as_ref().is_none_or(|b| b.size() < bytes) {
            let mut size = bytes.next_power_of_two();
            if storage {
                size = size.min(gpu.max_binding);
            }
            let usage = self.usage | wgpu::BufferUsages::COPY_DST;
            self.buf = Some(gpu.create_buffer(self.label, size, usage));
        }
        Ok(self.buf.as_ref().expect("made above"))
    }

    /// The buffer [`at_least`](Self::at_least) last returned.
    pub(crate) fn current(&self) -> &wgpu::Buffer {
        self.buf.as_ref().expect("sized before use")
    }

    /// Queues `bytes` (padded to whole words) for the start of the buffer:
    /// they land before the next submission's commands run.
    pub(crate) fn write(&mut self, gpu: &Gpu, bytes: &[u8]) -> Result<&wgpu::Buffer> {
        let buf = self.at_least(gpu, bytes.len() as u64)?;
        write_words(gpu, buf, 0, bytes);
        Ok(buf)
    }
}

/// `queue.write_buffer` of `bytes` at `offset`, padded to whole words.
pub(crate) fn write_words(gpu: &Gpu, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
    if bytes.len().is_multiple_of(4) {
        gpu.queue.write_buffer(buf, offset, bytes);
    } else {
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().next_multiple_of(4), 0);
        gpu.queue.write_buffer(buf, offset, &padded);
    }
}

/// Little-endian bytes of 32-bit words.
pub(crate) fn le_bytes(words: impl IntoIterator<Item = u32>) -> Vec<u8> {
    words.into_iter().flat_map(u32::to_le_bytes).collect()
}

/// Uniform parameter blocks, one slot per recorded dispatch, each at an
/// offset the adapter's uniform alignment allows. Slots live in a chain of
/// buffers, each twice the last: when one fills, the next is used (made
/// only the first time), and [`reset`](Self::reset) starts again at the
/// first, so a step that records as much as before creates nothing.
#[derive(Debug)]
pub(crate) struct ParamSlots {
    bufs: Vec<wgpu::Buffer>,
    /// Buffer in use, and slots used in it.
    cur: usize,
    used: u64,
}

/// Bytes of one parameter block (`Params` in `shaders/common.wgsl`).
pub(crate) const PARAMS_BYTES: u64 = 64;

impl ParamSlots {
    pub(crate) const fn new() -> Self {
        Self {
            bufs: Vec::new(),
            cur: 0,
            used: 0,
        }
    }

    /// Frees every slot: the commands that read them have been submitted.
    pub(crate) fn reset(&mut self) {
        self.cur = 0;
        self.used = 0;
    }

    /// Queues `words` into a fresh slot and returns its buffer and offset.
    /// Call inside [`Gpu::scoped`].
    pub(crate) fn push(&mut self, gpu: &Gpu, words: [u32; 16]) -> Result<(wgpu::Buffer, u64)> {
        let stride = gpu.uniform_align.max(PARAMS_BYTES);
        let slots = |b: &wgpu::Buffer| b.size() / stride;
        if self
            .bufs
            .get(self.cur)
            .is_some_and(|b| self.used >= slots(b))
        {
            self.cur += 1;
            self.used = 0;
        }
        if self.cur == self.bufs.len() {
            let n = self.bufs.last().map_or(8, |b| 2 * slots(b));
            let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
            self.bufs
                .push(gpu.create_buffer("kvslice params", n * stride, usage));
        }
        let buf = self.bufs[self.cur].clone();
        let offset = self.used * stride;
        write_words(gpu, &buf, offset, &le_bytes(words));
        self.used += 1;
        Ok((buf, offset))
    }
}
