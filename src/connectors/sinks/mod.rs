//! One module per sink connector, each behind its own cargo feature.

#[cfg(feature = "faulty-sink")]
pub mod faulty;
#[cfg(feature = "stdout-sink")]
pub mod stdout;

#[cfg(feature = "http-sink")]
pub mod http;
#[cfg(feature = "postgres-sink")]
pub mod postgres;
