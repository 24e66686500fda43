//! The adapter, device and queue, chosen from the environment, and the
//! translation of wgpu's failures into typed [`Error`]s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kvslice_core::{DeviceFailure, Error, Result};

/// Size of the largest storage binding this backend asks for: 128 MiB is
/// the smallest `max_storage_buffer_binding_size` WebGPU guarantees, so a
/// pool split into such bindings runs on every adapter.
pub const GUARANTEED_BINDING_BYTES: u64 = 128 << 20;

/// What the adapter is, as the test log and the benchmark print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The driver's device name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Vulkan, Metal, Dx12, ...
    pub backend: String,
    /// Discrete, integrated, CPU, ...
    pub device_type: String,
    /// Whether f16 arithmetic in shaders (`SHADER_F16`) is available.
    pub shader_f16: bool,
    /// Whether compute shaders may use subgroup operations (`SUBGROUP`).
    pub subgroups: bool,
    /// Smallest and largest subgroup size the adapter may use.
    pub subgroup_sizes: (u32, u32),
}

/// An opened device. Shared (through `Arc`) by the engine and every page
/// memory created from it, so a memory can be checked to belong to the
/// engine's device.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) summary: AdapterSummary,
    /// Largest single storage binding, in bytes (multiple of 4).
    pub(crate) max_binding: u64,
    /// Storage buffers one shader stage may bind.
    pub(crate) max_storage_buffers: u32,
    /// Binding indices stay below this.
    pub(crate) max_bindings: u32,
    pub(crate) max_workgroups_per_dim: u32,
    /// Offsets of storage bindings are multiples of this.
    pub(crate) storage_align: u64,
    /// Offsets of uniform bindings are multiples of this.
    pub(crate) uniform_align: u64,
    /// Buffers created through [`Gpu::create_buffer`], for the tests that
    /// show a warm engine creates none.
    buffers_created: AtomicU64,
    /// Set once by the lost-device callback or an uncaptured error.
    lost: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.summary)
            .field("max_binding", &self.max_binding)
            .finish_non_exhaustive()
    }
}

fn device_error(kind: DeviceFailure, detail: impl Into<String>) -> Error {
    Error::Device {
        kind,
        detail: detail.into(),
    }
}

/// Maps one wgpu error to ours.
pub(crate) fn from_wgpu(e: wgpu::Error) -> Error {
    match e {
        wgpu::Error::OutOfMemory { .. } => device_error(DeviceFailure::OutOfMemory, e.to_string()),
        wgpu::Error::Validation { description, .. } => {
            device_error(DeviceFailure::Validation, description)
        }
        wgpu::Error::Internal { description, .. } => {
            device_error(DeviceFailure::Internal, description)
        }
    }
}

impl Gpu {
    /// Opens the adapter the environment names (`WGPU_BACKEND`,
    /// `WGPU_ADAPTER_NAME`, `WGPU_POWER_PREF`), or the default one.
    pub(crate) fn open() -> Result<Self> {
        // One instance per process: devices opened from it check that a
        // resource passed to them is theirs (separate instances cannot tell).
        static INSTANCE: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
        let instance = INSTANCE.get_or_init(|| {
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
        });
        let adapter = pollster::block_on(Self::choose_adapter(instance))?;
        let info = adapter.get_info();
        let features = adapter.features();
        let shader_f16 = features.contains(wgpu::Features::SHADER_F16);
        let subgroups = features.contains(wgpu::Features::SUBGROUP);
        let have = adapter.limits();
        // Ask for what the adapter really has where it matters to us: big
        // and many storage bindings. Everything else stays at the defaults.
        let limits = wgpu::Limits {
            max_storage_buffer_binding_size: have.max_storage_buffer_binding_size,
            max_buffer_size: have.max_buffer_size,
            max_storage_buffers_per_shader_stage: have.max_storage_buffers_per_shader_stage,
            max_compute_workgroups_per_dimension: have.max_compute_workgroups_per_dimension,
            ..wgpu::Limits::downlevel_defaults()
        };
        let mut required_features = wgpu::Features::empty();
        if shader_f16 {
            required_features |= wgpu::Features::SHADER_F16;
        }
        if subgroups {
            required_features |= wgpu::Features::SUBGROUP;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("kvslice"),
            required_features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| device_error(DeviceFailure::Unsupported, e.to_string()))?;

        let lost = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, message| {
            let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
            s.get_or_insert(format!("{reason:?}: {message}"));
        });
        // Errors outside our error scopes would otherwise panic inside wgpu;
        // record them so the next call reports them.
        let slot = Arc::clone(&lost);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
            s.get_or_insert(format!("uncaptured: {e}"));
        }));

        let binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            .min(1 << 31);
        Ok(Self {
            device,
            queue,
            summary: AdapterSummary {
                name: info.name,
                backend: format!("{:?}", info.backend),
                device_type: format!("{:?}", info.device_type),
                shader_f16,
                subgroups,
                subgroup_sizes: (info.subgroup_min_size, info.subgroup_max_size),
            },
            max_binding: binding / 4 * 4,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
            max_bindings: limits.max_bindings_per_bind_group,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            storage_align: u64::from(limits.min_storage_buffer_offset_alignment),
            uniform_align: u64::from(limits.min_uniform_buffer_offset_alignment),
            buffers_created: AtomicU64::new(0),
            lost,
        })
    }

    async fn choose_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let seen = || {
            let names: Vec<String> = adapters
                .iter()
                .map(|a| {
                    let i = a.get_info();
                    format!("{} ({:?})", i.name, i.backend)
                })
                .collect();
            if names.is_empty() {
                "no adapters at all (is a Vulkan/Metal/DX12 driver installed?)".to_owned()
            } else {
                format!("adapters present: {}", names.join(", "))
            }
        };
        if let Ok(want) = std::env::var("WGPU_ADAPTER_NAME") {
            let want = want.to_lowercase();
            return adapters
                .iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&want))
                .cloned()
                .ok_or_else(|| {
                    device_error(
                        DeviceFailure::NoAdapter,
                        format!("WGPU_ADAPTER_NAME={want} matches none; {}", seen()),
                    )
                });
        }
        instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::from_env().unwrap_or_default(),
                ..Default::default()
            })
            .await
            .map_err(|e| device_error(DeviceFailure::NoAdapter, format!("{e}; {}", seen())))
    }

    /// `Err(Lost)` once the device is gone.
    pub(crate) fn check_alive(&self) -> Result<()> {
        let s = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        match &*s {
            Some(why) => Err(device_error(DeviceFailure::Lost, why.clone())),
            None => Ok(()),
        }
    }

    /// Destroys the device; every later call fails with `Lost`.
    pub(crate) fn destroy(&self) {
        self.device.destroy();
        let mut s = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        s.get_or_insert_with(|| "destroyed by the caller".to_owned());
    }

    /// Runs `f` inside out-of-memory, validation and internal error scopes
    /// and returns the first error any of them caught.
    pub(crate) fn scoped<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let value = f();
        // Pop in reverse order of pushing.
        let errors = [
            pollster::block_on(internal.pop()),
            pollster::block_on(validation.pop()),
            pollster::block_on(oom.pop()),
        ];
        self.check_alive()?;
        match errors.into_iter().flatten().next() {
            Some(e) => Err(from_wgpu(e)),
            None => Ok(value),
        }
    }

    /// Creates a buffer (every buffer of this crate is made here, so they
    /// can be counted). Call inside [`scoped`](Self::scoped).
    pub(crate) fn create_buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> wgpu::Buffer {
        self.buffers_created.fetch_add(1, Ordering::Relaxed);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        })
    }

    /// How many buffers [`create_buffer`](Self::create_buffer) has made.
    pub(crate) fn buffers_created(&self) -> u64 {
        self.buffers_created.load(Ordering::Relaxed)
    }

    /// Blocks until the queue is idle.
    pub(crate) fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| device_error(DeviceFailure::Lost, e.to_string()))?;
        self.check_alive()
    }

    /// Device-to-device copy bandwidth over `bytes`-byte buffers, in bytes
    /// moved per second (each copied byte is read once and written once, so
    /// this counts both), the best of `reps` timed copies.
    pub(crate) fn copy_bandwidth(&self, bytes: u64, reps: u32) -> Result<f64> {
        let bytes = bytes.min(self.device.limits().max_buffer_size) / 4 * 4;
        let make = |usage| self.create_buffer("kvslice copy bandwidth", bytes, usage);
        let (src, dst) = self.scoped(|| {
            (
                make(wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST),
                make(wgpu::BufferUsages::COPY_DST),
            )
        })?;
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) + 1 {
            let started = std::time::Instant::now();
            self.scoped(|| {
                let mut enc = self.device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes);
                self.queue.submit([enc.finish()]);
            })?;
            self.wait()?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best)
    }

    /// Copies `size` bytes of `src` (a COPY_SRC buffer) back to the host
    /// through a new staging buffer.
    pub(crate) fn read_back(&self, src: &wgpu::Buffer, size: u64) -> Result<Vec<u8>> {
        let padded = size.div_ceil(4) * 4;
        let staging = self.scoped(|| {
            let staging = self.create_buffer(
                "kvslice readback",
                padded.max(4),
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            );
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(src, 0, &staging, 0, padded);
            self.queue.submit([enc.finish()]);
            staging
        })?;
        let mut bytes = vec![0; size as usize];
        self.map_read(&staging, &mut bytes)?;
        Ok(bytes)
    }

    /// Waits for the queue, then copies the first `out.len()` bytes of
    /// `staging` (a MAP_READ buffer the submitted work filled) into `out`.
    pub(crate) fn map_read(&self, staging: &wgpu::Buffer, out: &mut [u8]) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| device_error(DeviceFailure::Lost, "map callback never ran"))?
            .map_err(|e| device_error(DeviceFailure::Internal, e.to_string()))?;
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| device_error(DeviceFailure::Internal, e.to_string()))?;
            out.copy_from_slice(&view[..out.len()]);
        }
        staging.unmap();
        Ok(())
    }
}
