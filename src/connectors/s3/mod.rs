//! The S3 sink.

#[cfg(feature = "s3-sink")]
pub mod sink;
