//! The Delta Lake sink.

#[cfg(feature = "delta-sink")]
pub mod sink;
