//! Fuzz harnesses (feature `fuzzing`), shared by the cargo-fuzz targets
//! and the stable corpus replays: the value decoder, and (with the
//! `client` feature) the tier's reading of a cluster's slot map.

#[cfg(feature = "client")]
mod slot_map;
mod value;

#[cfg(feature = "client")]
pub use slot_map::slot_map;
pub use value::value_decode;
