//! The Apache Doris sink.

#[cfg(feature = "doris-sink")]
pub mod sink;
