//! The ClickHouse sink.

#[cfg(feature = "clickhouse-sink")]
pub mod sink;
