//! kvslice-cpu: the CPU SIMD attention backend.
//!
//! Not implemented yet: this crate holds its place in the workspace and
//! exports nothing. Until it lands, use `kvslice_core::ReferenceEngine`.
