//! Shared test support. Each integration-test binary uses a subset of it.
#![allow(dead_code)]

pub mod accounting;
pub mod binary;
pub mod clickhouse;
pub mod clickhouse_http;
#[cfg(any(feature = "elasticsearch-sink", feature = "elasticsearch-source"))]
pub mod elasticsearch;
pub mod gunzip;
pub mod http_server;
pub mod iggy_server;
pub mod influxdb;
pub mod influxdb_http;
pub mod prometheus;
#[cfg(any(feature = "redis-sink", feature = "redis-source"))]
pub mod redis;
#[cfg(feature = "schema-registry")]
pub mod schema_registry;
pub mod sinks;
pub mod wait;
