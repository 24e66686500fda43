//! kvslice-wgpu: paged attention on GPUs through wgpu compute shaders.
//!
//! New to kvslice? The embedding guide is `docs/GUIDE.md` in the
//! repository (rendered as `kvslice_benches::guide`, whose doc tests run
//! its code); results against peers are in `docs/BENCHMARKS.md`.
//!
//! - [`WgpuEngine`] implements [`kvslice_core::AttentionEngine`] for
//!   [`DevicePages`], a device-resident mirror of the core page pool (same
//!   page ids, same byte layout) split into storage bindings of at most
//!   128 MiB, with the real limits read from the adapter.
//! - The device-resident API for runtimes whose forward pass runs on the
//!   device: [`WgpuEngine::plan`] a [`DeviceStep`] once per step, then
//!   [`WgpuEngine::record_append`] and [`WgpuEngine::record_attend`] each
//!   layer into your own encoder, reading and writing your buffers
//!   ([`DeviceRegion`]); no readback, no buffer made per call. The
//!   host-slice calls are that API wrapped.
//! - Decode and causal prefill share one two-pass algorithm: query-row
//!   tiles per kv head (GQA reads each kv head once per tile) split along
//!   the context across workgroups, then a log-sum-exp merge
//!   (flash-decoding). Where the adapter has subgroups, lane groups share
//!   each key (16-byte loads, scores summed by subgroup shuffles, state in
//!   registers); elsewhere one thread scores one key. Scores and softmax
//!   stay in f32.
//! - K/V in f32, f16, bf16, int8 or fp8 (E4M3) with a scale per row; new
//!   K/V is rounded (or quantised) by a kernel with the host's formulas
//!   (bit for bit for f16 and bf16; int8 and fp8 rows within a code of
//!   the host's where the adapter's division is not exact).
//! - The adapter comes from `WGPU_BACKEND` / `WGPU_ADAPTER_NAME` or is the
//!   default; device loss, validation errors and out-of-memory are
//!   [`kvslice_core::Error::Device`] with a [`kvslice_core::DeviceFailure`].
//!
//! The same randomized accuracy suite as the CPU backend holds it to the
//! reference engine (`tests/accuracy.rs`); on a machine without a GPU it
//! runs on Mesa's lavapipe.

mod engine;
mod gpu;
mod pages;
mod plan;
mod scratch;
mod shader;
mod staging;
mod step;
pub mod testing;

pub use engine::WgpuEngine;
pub use gpu::{AdapterSummary, GUARANTEED_BINDING_BYTES};
pub use pages::DevicePages;
pub use staging::StagingEngine;
pub use step::{DeviceAppend, DeviceAttend, DeviceRegion, DeviceStep};
/// The wgpu this crate is built on: make the buffers and encoders you pass
/// to the device-resident calls with this version.
pub use wgpu;
