//! The SurrealDB sink.

#[cfg(feature = "surrealdb-sink")]
pub mod sink;
