//! The Meilisearch sink.

#[cfg(feature = "meilisearch-sink")]
pub mod sink;
