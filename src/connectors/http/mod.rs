//! The HTTP source and sink, and the HTTP state store (`[state] storage = "http"`).

#[cfg(feature = "http-sink")]
pub mod sink;
#[cfg(feature = "http-source")]
pub mod source;
#[cfg(feature = "http-state")]
pub mod state;
