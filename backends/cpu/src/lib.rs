//! kvslice-cpu: paged attention on the CPU.
//!
//! New to kvslice? The embedding guide is `docs/GUIDE.md` in the
//! repository (rendered as `kvslice_benches::guide`, whose doc tests run
//! its code); results against peers are in `docs/BENCHMARKS.md`.
//!
//! [`CpuEngine`] implements [`kvslice_core::AttentionEngine`] for any
//! [`kvslice_core::PageMemoryMut`]: decode and causal prefill over block
//! tables, GQA, K/V stored as f32, f16 or bf16 and converted on load (in
//! registers for decode, through a widening pass for prefill), f32
//! accumulation with an online softmax, and split-K across threads for long
//! contexts (the calling thread and pool workers that start in time,
//! `work_sharing`). Pages are read in rising address order, and the next region
//! of K or V is prefetched while one is computed. The inner loops are
//! chosen at run time ([`Kernels::detect`]): AVX-512 (F, BW, VL) or AVX2 +
//! FMA + F16C on x86-64, NEON on aarch64, else a portable scalar version;
//! CI runs the NEON tests under qemu and the AVX-512 tests under Bochs, as
//! no machine it runs on has either. Every input check runs before any
//! compute (`AttentionBatch::validate`).

#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod engine;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod kernels;
#[doc(hidden)]
pub mod work_sharing;

pub use engine::{BUILDER_LIMIT, CpuEngine};
pub use kernels::{
    FourRowKernels, Fp8Bf16Kernels, Int8Queries, Int8QueryKernels, Int8ScoresSoftmaxFn, Kernels,
    MAX_INT8_QUERY_DIMS, SPLIT_512_NAME, SoftmaxState, StoredKernels, raw_scale,
};
