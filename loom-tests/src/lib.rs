//! loom models of kvslice-core's lock-free protocols.
//!
//! Core has no lock-free protocol yet (the page pool and slice map land
//! next), so there is no model here yet.
