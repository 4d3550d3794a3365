//! The connector conformance suite: the same checks for every connector, each
//! connector supplying only a small fixture (its backend: how to point the
//! connector at it, feed or read it back, and inject a fault).
//!
//! Run it (PostgreSQL comes from the script):
//!   scripts/with-postgres.sh cargo nextest run --features full --test conformance
//! One connector or one check: add `-E 'test(/postgres_sink::/)'` or
//! `-E 'test(restore)'`.
//!
//! Adding a connector: write `fixtures/<name>_<kind>.rs` (a `SourceBackend`
//! or `SinkBackend`) and one `source_conformance!`/`sink_conformance!` line
//! below; `every_registered_connector_has_a_fixture` fails until you do.
//! `self_tests.rs` runs every check against deliberately broken connectors,
//! proving each check can fail.

mod fixtures;
mod reference;
mod self_tests;
mod sink;
mod source;
#[path = "../support/wait.rs"]
#[allow(dead_code)]
mod wait;

use std::sync::atomic::{AtomicU32, Ordering};

use iggy_connect::connectors::Registry;

/// What a check found wrong, or `Ok`.
pub type Outcome = Result<(), String>;

/// Fails the check with a message when `condition` does not hold.
#[macro_export]
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

/// Every source check, run on one connector with a fresh backend each.
macro_rules! source_conformance {
    ($module:ident, $name:literal, $backend:expr) => {
        mod $module {
            use super::source::{self, SourceSubject};
            #[allow(unused_imports)]
            use super::*;

            async fn run(check: &str) {
                let subject = SourceSubject::registered($name);
                let backend = $backend;
                if let Err(failure) = source::run(check, &subject, &backend).await {
                    panic!("{} source, {check}: {failure}", $name);
                }
            }

            #[tokio::test]
            async fn fresh_start() {
                run("fresh_start").await;
            }
            #[tokio::test]
            async fn restore() {
                run("restore").await;
            }
            #[tokio::test]
            async fn corrupt_state_refused() {
                run("corrupt_state_refused").await;
            }
            #[tokio::test]
            async fn state_round_trip() {
                run("state_round_trip").await;
            }
            #[tokio::test]
            async fn nothing_destructive_before_commit() {
                run("nothing_destructive_before_commit").await;
            }
            #[tokio::test]
            async fn cancelled_poll_loses_nothing() {
                run("cancelled_poll_loses_nothing").await;
            }
            #[tokio::test]
            async fn open_while_down_is_retried() {
                run("open_while_down_is_retried").await;
            }
        }
    };
}

/// Every sink check, run on one connector with a fresh backend each.
macro_rules! sink_conformance {
    ($module:ident, $name:literal, $backend:expr) => {
        mod $module {
            use super::sink::{self, SinkSubject};
            #[allow(unused_imports)]
            use super::*;

            async fn run(check: &str) {
                let subject = SinkSubject::registered($name);
                let backend = $backend;
                if let Err(failure) = sink::run(check, &subject, &backend).await {
                    panic!("{} sink, {check}: {failure}", $name);
                }
            }

            #[tokio::test]
            async fn ok_means_durable() {
                run("ok_means_durable").await;
            }
            #[tokio::test]
            async fn replayed_batch_not_duplicated() {
                run("replayed_batch_not_duplicated").await;
            }
            #[tokio::test]
            async fn rejections_in_range() {
                run("rejections_in_range").await;
            }
            #[tokio::test]
            async fn transient_error_retried() {
                run("transient_error_retried").await;
            }
            #[tokio::test]
            async fn open_while_down_is_retried() {
                run("open_while_down_is_retried").await;
            }
        }
    };
}

// One line per connector (a connector may run with several fixtures).
#[cfg(feature = "random-source")]
source_conformance!(
    random_source,
    "random",
    fixtures::random_source::Backend::new()
);
#[cfg(feature = "mongodb-source")]
source_conformance!(
    mongodb_source,
    "mongodb",
    fixtures::mongodb_source::Backend::cursor()
);
#[cfg(feature = "mongodb-source")]
source_conformance!(
    mongodb_source_delete,
    "mongodb",
    fixtures::mongodb_source::Backend::delete_after_read()
);
#[cfg(feature = "mongodb-source")]
source_conformance!(
    mongodb_source_mark,
    "mongodb",
    fixtures::mongodb_source::Backend::processed_field()
);
#[cfg(feature = "postgres-source")]
source_conformance!(
    postgres_source,
    "postgres",
    fixtures::postgres_source::Backend::cursor().await
);
#[cfg(feature = "postgres-source")]
source_conformance!(
    postgres_source_delete,
    "postgres",
    fixtures::postgres_source::Backend::delete_after_read().await
);
#[cfg(feature = "postgres-source")]
source_conformance!(
    postgres_source_mark,
    "postgres",
    fixtures::postgres_source::Backend::processed_column().await
);
#[cfg(feature = "postgres-source")]
source_conformance!(
    postgres_source_cdc,
    "postgres",
    fixtures::postgres_cdc_source::Backend::new().await
);
#[cfg(feature = "mysql-source")]
source_conformance!(
    mysql_source,
    "mysql",
    fixtures::mysql_source::Backend::cursor().await
);
#[cfg(feature = "mysql-source")]
source_conformance!(
    mysql_source_delete,
    "mysql",
    fixtures::mysql_source::Backend::delete_after_read().await
);
#[cfg(feature = "mysql-source")]
source_conformance!(
    mysql_source_mark,
    "mysql",
    fixtures::mysql_source::Backend::processed_column().await
);
#[cfg(feature = "mysql-source")]
source_conformance!(
    mysql_source_cdc,
    "mysql",
    fixtures::mysql_source::Backend::binlog().await
);
#[cfg(feature = "http-source")]
source_conformance!(http_source, "http", fixtures::http_source::Backend::new());
#[cfg(feature = "iggy-source")]
source_conformance!(
    iggy_source,
    "iggy",
    fixtures::iggy_source::Backend::new().await
);
#[cfg(feature = "elasticsearch-source")]
source_conformance!(
    elasticsearch_source,
    "elasticsearch",
    fixtures::elasticsearch_source::Backend::new(
        fixtures::elasticsearch_server::Flavor::Elasticsearch8
    )
    .await
);
#[cfg(feature = "elasticsearch-source")]
source_conformance!(
    opensearch_source,
    "elasticsearch",
    fixtures::elasticsearch_source::Backend::new(
        fixtures::elasticsearch_server::Flavor::OpenSearch2
    )
    .await
);
#[cfg(feature = "influxdb-source")]
source_conformance!(
    influxdb_source,
    "influxdb",
    fixtures::influxdb_source::Backend::new().await
);
#[cfg(feature = "nats-source")]
source_conformance!(
    nats_source,
    "nats",
    fixtures::nats_source::Backend::new().await
);
#[cfg(feature = "otlp-source")]
source_conformance!(otlp_source, "otlp", fixtures::otlp_source::Backend::new());
#[cfg(feature = "stdout-sink")]
sink_conformance!(
    stdout_sink,
    "stdout",
    fixtures::stdout_sink::Backend::new().await
);
#[cfg(feature = "faulty-sink")]
sink_conformance!(faulty_sink, "faulty", fixtures::faulty_sink::Backend::new());
#[cfg(feature = "postgres-sink")]
sink_conformance!(
    postgres_sink,
    "postgres",
    fixtures::postgres_sink::Backend::new().await
);
#[cfg(feature = "http-sink")]
sink_conformance!(http_sink, "http", fixtures::http_sink::Backend::new().await);
#[cfg(feature = "elasticsearch-sink")]
sink_conformance!(
    elasticsearch_sink,
    "elasticsearch",
    fixtures::elasticsearch_sink::Backend::new().await
);
#[cfg(feature = "clickhouse-sink")]
sink_conformance!(
    clickhouse_sink,
    "clickhouse",
    fixtures::clickhouse_sink::Backend::new().await
);
#[cfg(feature = "mysql-sink")]
sink_conformance!(
    mysql_sink,
    "mysql",
    fixtures::mysql_sink::Backend::new().await
);
#[cfg(feature = "influxdb-sink")]
sink_conformance!(
    influxdb_sink,
    "influxdb",
    fixtures::influxdb_sink::Backend::new().await
);
#[cfg(feature = "doris-sink")]
sink_conformance!(
    doris_sink,
    "doris",
    fixtures::doris_sink::Backend::new().await
);

#[cfg(feature = "mongodb-sink")]
sink_conformance!(
    mongodb_sink,
    "mongodb",
    fixtures::mongodb_sink::Backend::new().await
);
#[cfg(feature = "nats-sink")]
sink_conformance!(nats_sink, "nats", fixtures::nats_sink::Backend::new().await);
#[cfg(feature = "meilisearch-sink")]
sink_conformance!(
    meilisearch_sink,
    "meilisearch",
    fixtures::meilisearch_sink::Backend::new().await
);
#[cfg(feature = "quickwit-sink")]
sink_conformance!(
    quickwit_sink,
    "quickwit",
    fixtures::quickwit_sink::Backend::new().await
);

#[cfg(feature = "redis-sink")]
sink_conformance!(
    redis_sink,
    "redis",
    fixtures::redis_sink::Backend::new().await
);
#[cfg(feature = "redis-source")]
source_conformance!(
    redis_source,
    "redis",
    fixtures::redis_source::Backend::streams().await
);
#[cfg(feature = "redis-source")]
source_conformance!(
    redis_source_pubsub,
    "redis",
    fixtures::redis_source::Backend::pubsub().await
);
#[cfg(feature = "rabbitmq-source")]
source_conformance!(
    rabbitmq_source,
    "rabbitmq",
    fixtures::rabbitmq_source::Backend::new().await
);
#[cfg(feature = "rabbitmq-sink")]
sink_conformance!(
    rabbitmq_sink,
    "rabbitmq",
    fixtures::rabbitmq_sink::Backend::new().await
);
#[cfg(all(feature = "otlp-sink", feature = "otlp-source"))]
sink_conformance!(otlp_sink, "otlp", fixtures::otlp_sink::Backend::new().await);
#[cfg(feature = "mqtt-source")]
source_conformance!(
    mqtt_source,
    "mqtt",
    fixtures::mqtt_source::Backend::new().await
);
#[cfg(feature = "mqtt-sink")]
sink_conformance!(mqtt_sink, "mqtt", fixtures::mqtt_sink::Backend::new().await);
#[cfg(feature = "mqtt-source")]
source_conformance!(
    mqtt5_source,
    "mqtt",
    fixtures::mqtt_source::Backend::speaking("5").await
);
#[cfg(feature = "mqtt-sink")]
sink_conformance!(
    mqtt5_sink,
    "mqtt",
    fixtures::mqtt_sink::Backend::speaking("5").await
);
#[cfg(feature = "surrealdb-sink")]
sink_conformance!(
    surrealdb_sink,
    "surrealdb",
    fixtures::surrealdb_sink::Backend::new().await
);
#[cfg(feature = "s3-sink")]
sink_conformance!(s3_sink, "s3", fixtures::s3_sink::Backend::new().await);
#[cfg(feature = "delta-sink")]
sink_conformance!(
    delta_sink,
    "delta",
    fixtures::delta_sink::Backend::new().await
);
#[cfg(feature = "iceberg-sink")]
sink_conformance!(
    iceberg_sink,
    "iceberg",
    fixtures::iceberg_sink::Backend::new().await
);

/// The connectors the lines above cover, by kind and name.
const COVERED_SOURCES: &[&str] = &[
    #[cfg(feature = "random-source")]
    "random",
    #[cfg(feature = "postgres-source")]
    "postgres",
    #[cfg(feature = "http-source")]
    "http",
    #[cfg(feature = "elasticsearch-source")]
    "elasticsearch",
    #[cfg(feature = "iggy-source")]
    "iggy",
    #[cfg(feature = "influxdb-source")]
    "influxdb",
    #[cfg(feature = "mongodb-source")]
    "mongodb",
    #[cfg(feature = "mysql-source")]
    "mysql",
    #[cfg(feature = "nats-source")]
    "nats",
    #[cfg(feature = "redis-source")]
    "redis",
    #[cfg(feature = "otlp-source")]
    "otlp",
    #[cfg(feature = "mqtt-source")]
    "mqtt",
    #[cfg(feature = "rabbitmq-source")]
    "rabbitmq",
];
const COVERED_SINKS: &[&str] = &[
    #[cfg(feature = "stdout-sink")]
    "stdout",
    #[cfg(feature = "faulty-sink")]
    "faulty",
    #[cfg(feature = "postgres-sink")]
    "postgres",
    #[cfg(feature = "http-sink")]
    "http",
    #[cfg(feature = "elasticsearch-sink")]
    "elasticsearch",
    #[cfg(feature = "clickhouse-sink")]
    "clickhouse",
    #[cfg(feature = "influxdb-sink")]
    "influxdb",
    #[cfg(feature = "doris-sink")]
    "doris",
    #[cfg(feature = "mongodb-sink")]
    "mongodb",
    #[cfg(feature = "mysql-sink")]
    "mysql",
    #[cfg(feature = "meilisearch-sink")]
    "meilisearch",
    #[cfg(feature = "quickwit-sink")]
    "quickwit",
    #[cfg(feature = "nats-sink")]
    "nats",
    #[cfg(feature = "redis-sink")]
    "redis",
    #[cfg(all(feature = "otlp-sink", feature = "otlp-source"))]
    "otlp",
    #[cfg(feature = "mqtt-sink")]
    "mqtt",
    #[cfg(feature = "rabbitmq-sink")]
    "rabbitmq",
    #[cfg(feature = "surrealdb-sink")]
    "surrealdb",
    #[cfg(feature = "s3-sink")]
    "s3",
    #[cfg(feature = "delta-sink")]
    "delta",
    #[cfg(feature = "iceberg-sink")]
    "iceberg",
];

#[test]
fn every_registered_connector_has_a_fixture() {
    let missing: Vec<String> = Registry::sources()
        .iter()
        .filter(|entry| !COVERED_SOURCES.contains(&entry.name))
        .map(|entry| format!("{} source", entry.name))
        .chain(
            Registry::sinks()
                .iter()
                .filter(|entry| !COVERED_SINKS.contains(&entry.name))
                .map(|entry| format!("{} sink", entry.name)),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "connectors without a conformance fixture: {missing:?}"
    );
}

/// A name no other check (or run) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Message ids of their own for each batch of messages the checks build.
pub fn id_base() -> u128 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    (u128::from(std::process::id()) << 64) | (u128::from(NEXT.fetch_add(1, Ordering::SeqCst)) << 32)
}
