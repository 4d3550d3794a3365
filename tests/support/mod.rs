//! Shared test support. Each integration-test binary uses a subset of it.
#![allow(dead_code)]

pub mod accounting;
pub mod binary;
pub mod clickhouse;
pub mod clickhouse_http;
#[cfg(feature = "delta-sink")]
pub mod delta;
#[cfg(feature = "doris-sink")]
pub mod doris;
pub mod drive;
#[cfg(any(feature = "elasticsearch-sink", feature = "elasticsearch-source"))]
pub mod elasticsearch;
pub mod gunzip;
pub mod harness;
pub mod http_server;
#[cfg(feature = "iceberg-sink")]
pub mod iceberg;
#[cfg(feature = "iceberg-sink")]
pub mod iceberg_rest;
pub mod iggy_server;
pub mod influxdb;
pub mod influxdb_http;
#[cfg(any(feature = "mysql-source", feature = "mysql-sink"))]
pub mod mariadb;
#[cfg(feature = "meilisearch-sink")]
pub mod meilisearch;
#[cfg(any(feature = "mongodb-sink", feature = "mongodb-source"))]
pub mod mongodb;
#[cfg(any(feature = "mqtt-source", feature = "mqtt-sink"))]
pub mod mosquitto;
#[cfg(any(feature = "nats-source", feature = "nats-sink"))]
pub mod nats_server;
#[cfg(all(feature = "telemetry", feature = "otlp-source"))]
pub mod otlp_receiver;
pub mod ports;
pub mod prometheus;
pub mod proxy;
#[cfg(feature = "quickwit-sink")]
pub mod quickwit;
#[cfg(any(feature = "rabbitmq-source", feature = "rabbitmq-sink"))]
pub mod rabbitmq;
#[cfg(any(feature = "redis-sink", feature = "redis-source"))]
pub mod redis;
#[cfg(any(feature = "s3-sink", feature = "delta-sink", feature = "iceberg-sink"))]
pub mod s3;
#[cfg(feature = "schema-registry")]
pub mod schema_registry;
pub mod sinks;
#[cfg(feature = "surrealdb-sink")]
pub mod surrealdb;
pub mod wait;
