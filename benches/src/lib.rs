//! The `kvslice` tool's library: trace parsing, replay through the real
//! store, eviction policies by name, sweeps with plots, and the demo.

pub mod decode_workload;
pub mod demo;
#[cfg(feature = "llm")]
pub mod llm;
pub mod model;
pub mod policy;
pub mod replay;
pub mod serve;
pub mod sweep;
pub mod trace;
