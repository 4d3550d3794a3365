//! The HTTP source and sink.

#[cfg(feature = "http-sink")]
pub mod sink;
#[cfg(feature = "http-source")]
pub mod source;
