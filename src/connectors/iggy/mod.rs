//! The Iggy (another cluster) source.

#[cfg(feature = "iggy-source")]
pub mod source;
