//! The stdout sink.

#[cfg(feature = "stdout-sink")]
pub mod sink;
