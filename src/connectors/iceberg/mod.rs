//! The Apache Iceberg sink.

#[cfg(feature = "iceberg-sink")]
pub mod sink;
