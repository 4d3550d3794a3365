//! One module per source connector, each behind its own cargo feature.

#[cfg(feature = "random-source")]
pub mod random;

#[cfg(feature = "http-source")]
pub mod http;
#[cfg(feature = "postgres-source")]
pub mod postgres;
