//! Shared test support of the test binaries (`it`, `conformance`) and the
//! bench binaries. A module that needs a connector's feature gates itself
//! with an inner `#![cfg(...)]`.
#![allow(dead_code)]

pub mod accounting;
pub mod azurite;
pub mod binary;
pub mod clickhouse;
pub mod clickhouse_http;
pub mod delta;
pub mod doris;
pub mod drive;
pub mod elasticsearch;
pub mod gunzip;
pub mod harness;
pub mod http_server;
pub mod iceberg;
pub mod iceberg_rest;
pub mod iggy_server;
pub mod influxdb;
pub mod influxdb_http;
pub mod json;
pub mod kafka;
pub mod mariadb;
pub mod meilisearch;
pub mod mongodb;
pub mod mosquitto;
pub mod nats_server;
pub mod otlp_receiver;
pub mod pki;
pub mod ports;
pub mod postgres;
pub mod prometheus;
pub mod proxy;
pub mod quickwit;
pub mod rabbitmq;
pub mod redis;
pub mod s3;
pub mod schema_registry;
pub mod sinks;
pub mod state_server;
pub mod surrealdb;
pub mod wait;
