//! The integration tests, one binary: a module per area (`api`, `cli`, `run`,
//! `faults`, ...) and per backend (`postgres_sink`, `mqtt`, ...). A backend's
//! module gates itself on its Cargo features with an inner `#![cfg(...)]`, so
//! any feature set builds this binary with the tests of what it compiled in:
//!   scripts/test                                          # everything (`full,faulty-sink`)
//!   scripts/test -E 'test(/^postgres_sink::/)'             # one module
//!   cargo nextest run --no-default-features --features http-sink --test it
//! The connector conformance suite is the other test binary (tests/conformance/).

#[path = "../support/mod.rs"]
mod support;

mod api;
mod api_in_process;
mod cli;
mod clickhouse_sink;
mod dashboards;
mod delta_sink;
mod dlq_cli;
mod docs;
mod doris_sink;
mod elasticsearch_sink;
mod elasticsearch_source;
mod faults;
mod file_sink;
mod file_source;
mod http_iggy;
mod http_kit;
mod http_sink;
mod http_source;
mod http_state;
mod iceberg_sink;
mod iggy_bus;
mod iggy_source;
mod iggy_test_server;
mod iggy_tls;
mod influxdb_sink;
mod influxdb_source;
mod kafka;
mod lake_stores;
mod layers;
mod meilisearch_sink;
mod mongodb_sink;
mod mongodb_source;
mod mqtt;
mod mqtt_tls;
mod mqtt_ws;
mod mysql_cdc;
mod mysql_faults;
mod mysql_sink;
mod mysql_source;
mod nats;
mod object_store_source;
mod otlp_sink;
mod otlp_source;
mod postgres_cdc;
mod postgres_cdc_faults;
mod postgres_iggy;
mod postgres_sink;
mod postgres_source;
mod postgres_state;
mod postgres_state_failover;
mod quickwit_sink;
mod rabbitmq;
mod rabbitmq_tls;
mod redis;
mod registry;
mod run;
mod s3_sink;
mod schemas;
mod surrealdb_sink;
mod tap_cli;
mod telemetry;
mod transforms_pipeline;
mod upstream_configs;
mod vrl_pipelines;
