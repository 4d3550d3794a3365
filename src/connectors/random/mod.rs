//! The random source.

#[cfg(feature = "random-source")]
pub mod source;
