//! kvslice-wgpu: the wgpu compute-shader attention backend.
//!
//! Not implemented yet: this crate holds its place in the workspace and
//! exports nothing (and does not depend on wgpu, to keep builds lean until
//! it does). Until it lands, use `kvslice_core::ReferenceEngine`.
