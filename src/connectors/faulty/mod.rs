//! The test-only faulty sink.

#[cfg(feature = "faulty-sink")]
pub mod sink;
