//! The postgres sink against a real PostgreSQL (start it with
//! `scripts/with-postgres.sh`), through the real runtime over the in-memory bus,
//! or called directly where a test needs to replay a batch.
#![cfg(feature = "postgres-sink")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::{Runtime, Status, StopReason};
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::OutgoingMessage;
use iggy_connect::state::MemoryStateStore;
use sqlx::PgPool;

use crate::support::postgres::{
    connect, count, create_database, database_url, execute, sink_config, unique, wait_for,
};
use crate::support::proxy::Proxy;

const WAIT: Duration = Duration::from_secs(30);
const TOPIC: &str = "events";

struct Pipeline {
    runtime: Arc<Runtime>,
    bus: MemoryBus,
    key: String,
    stream: String,
}

impl Pipeline {
    async fn start(schema: &str, on_error: &str, plugin_config: &str) -> Self {
        let key = unique("pg_sink");
        let stream = format!("{key}_stream");
        let bus = MemoryBus::new();
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            Duration::from_secs(5),
        );
        runtime
            .add(sink_config(
                &key,
                &stream,
                TOPIC,
                schema,
                on_error,
                plugin_config,
            ))
            .unwrap();
        runtime.start_enabled().await;
        Self {
            runtime,
            bus,
            key,
            stream,
        }
    }

    /// Sends payloads as one batch; ids continue from `first_id`.
    async fn produce(&self, first_id: u128, payloads: &[&[u8]]) {
        let producer = self
            .bus
            .producer(&ProducerTarget {
                stream: self.stream.clone(),
                topic: TOPIC.into(),
                partitions: 1,
                batch_length: 1000,
                linger_time: Duration::ZERO,
            })
            .await
            .unwrap();
        let messages: Vec<OutgoingMessage> = payloads
            .iter()
            .enumerate()
            .map(|(index, payload)| OutgoingMessage {
                id: Some(first_id + index as u128),
                headers: Vec::new(),
                payload: Bytes::copy_from_slice(payload),
                partition: None,
                origin_timestamp: None,
            })
            .collect();
        producer.send(&messages).await.unwrap();
    }

    fn drained(&self) -> bool {
        self.bus.is_drained(
            &self.stream,
            TOPIC,
            &format!("iggy-connect-sink-{}", self.key),
        )
    }

    async fn wait_until_drained(&self) {
        wait_for("the topic to be drained", WAIT, || async { self.drained() }).await;
    }

    fn view(&self) -> iggy_connect::engine::runtime::ConnectorView {
        self.runtime.view(ConnectorKind::Sink, &self.key).unwrap()
    }
}

fn plugin_config(table: &str, extra: &str) -> String {
    plugin_config_for(&database_url(), table, extra)
}

fn plugin_config_for(url: &str, table: &str, extra: &str) -> String {
    format!("connection_string = \"{url}\"\ntarget_table = \"{table}\"\n{extra}")
}

fn json_payloads(first: u32, count: u32) -> Vec<Vec<u8>> {
    (first..first + count)
        .map(|n| format!("{{\"n\":{n},\"name\":\"event {n}\"}}").into_bytes())
        .collect()
}

fn refs(payloads: &[Vec<u8>]) -> Vec<&[u8]> {
    payloads.iter().map(Vec::as_slice).collect()
}

#[tokio::test]
async fn each_payload_format_stores_the_payload_and_upstream_metadata_columns() {
    let pool = connect(&database_url()).await;
    for (format, schema, check) in [
        (
            "bytea",
            "raw",
            "convert_from(payload, 'UTF8')::jsonb ->> 'name'",
        ),
        ("json", "json", "payload ->> 'name'"),
        ("text", "text", "payload::jsonb ->> 'name'"),
    ] {
        let table = unique(&format!("sink_{format}"));
        let pipeline = Pipeline::start(
            schema,
            "stop",
            &plugin_config(
                &table,
                &format!(
                    "auto_create_table = true\npayload_format = \"{format}\"\nbatch_size = 40"
                ),
            ),
        )
        .await;
        let payloads = json_payloads(0, 250);
        for (batch, chunk) in payloads.chunks(100).enumerate() {
            pipeline
                .produce(1 + batch as u128 * 100, &refs(chunk))
                .await;
        }
        pipeline.wait_until_drained().await;
        pipeline.runtime.shutdown().await;
        assert_eq!(
            count(&pool, &format!("SELECT count(*) FROM {table}")).await,
            250,
            "{format}"
        );
        let name: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {check} FROM {table} WHERE id = 8"
        )))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(name, "event 7", "{format}");
        let (stream, topic, offset, partition, has_times): (String, String, i64, i32, bool) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT iggy_stream, iggy_topic, iggy_offset, iggy_partition_id, \
                 iggy_timestamp IS NOT NULL AND iggy_origin_timestamp IS NOT NULL AND iggy_checksum IS NOT NULL \
                 FROM {table} WHERE id = 250"
            )))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            (
                stream.as_str(),
                topic.as_str(),
                offset,
                partition,
                has_times
            ),
            (pipeline.stream.as_str(), TOPIC, 249, 0, true)
        );
    }
}

#[tokio::test]
async fn a_target_table_gone_for_a_while_is_retried_and_nothing_is_lost() {
    let pool = connect(&database_url()).await;
    let table = unique("sink_outage");
    let pipeline = Pipeline::start(
        "json",
        "stop",
        &plugin_config(
            &table,
            "auto_create_table = true\npayload_format = \"json\"",
        ),
    )
    .await;
    let payloads = json_payloads(0, 600);
    pipeline.produce(1, &refs(&payloads[..200])).await;
    wait_for("the table to be created", WAIT, || async {
        count(
            &pool,
            &format!("SELECT count(*) FROM pg_class WHERE relname = '{table}'"),
        )
        .await
            == 1
    })
    .await;
    wait_for("the first rows", WAIT, || async {
        count(&pool, &format!("SELECT count(*) FROM {table}")).await == 200
    })
    .await;
    execute(
        &pool,
        &format!("ALTER TABLE {table} RENAME TO {table}_away"),
    )
    .await;
    pipeline.produce(201, &refs(&payloads[200..400])).await;
    wait_for("failed writes being retried", WAIT, || async {
        pipeline.view().metrics.retries.get() >= 2
    })
    .await;
    assert!(
        !pipeline.drained(),
        "offsets must not move past unwritten messages"
    );
    execute(
        &pool,
        &format!("ALTER TABLE {table}_away RENAME TO {table}"),
    )
    .await;
    pipeline.produce(401, &refs(&payloads[400..])).await;
    pipeline.wait_until_drained().await;
    assert_eq!(pipeline.view().status.status, Status::Running);
    pipeline.runtime.shutdown().await;
    assert_eq!(
        count(
            &pool,
            &format!("SELECT count(DISTINCT id) FROM {table} WHERE id BETWEEN 1 AND 600")
        )
        .await,
        600
    );
}

/// Rule O1: the database cannot be reached when the runtime starts (a relay
/// in front of it refuses every connection). The sink keeps trying, and once
/// the database can be reached it writes every message, with no restart and
/// no API call.
#[tokio::test]
async fn a_database_unreachable_at_start_gets_every_message_once_it_is_reachable() {
    let pool = connect(&database_url()).await;
    let mut url = reqwest::Url::parse(&database_url()).unwrap();
    let host = match url.host_str() {
        Some("localhost") | None => "127.0.0.1".to_owned(),
        Some(host) => host.to_owned(),
    };
    let target = format!("{host}:{}", url.port().unwrap_or(5432));
    let proxy = Proxy::start(target.parse().unwrap()).await;
    proxy.set_down(true);
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(proxy.addr.port())).unwrap();
    let table = unique("sink_down_at_start");
    let pipeline = Pipeline::start(
        "json",
        "stop",
        &plugin_config_for(url.as_str(), &table, "auto_create_table = true"),
    )
    .await;
    pipeline.produce(1, &refs(&json_payloads(0, 100))).await;
    wait_for(
        "the sink to report the unreachable database",
        WAIT,
        || async { pipeline.view().status.last_error.is_some() },
    )
    .await;
    assert!(!pipeline.drained(), "nothing can be written yet");
    proxy.set_down(false);
    pipeline.wait_until_drained().await;
    assert_eq!(
        count(&pool, &format!("SELECT count(*) FROM {table}")).await,
        100
    );
    assert_eq!(pipeline.view().status.status, Status::Running);
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn connections_killed_mid_stream_are_retried_and_nothing_is_lost() {
    let admin = connect(&database_url()).await;
    let url = create_database(&admin).await;
    let database = url.rsplit_once('/').unwrap().1.to_owned();
    let pool = connect(&url).await;
    let table = unique("sink_killed");
    let pipeline = Pipeline::start(
        "json",
        "stop",
        &plugin_config_for(&url, &table, "auto_create_table = true\nbatch_size = 25"),
    )
    .await;
    let payloads = json_payloads(0, 2000);
    for (batch, chunk) in payloads.chunks(100).enumerate() {
        pipeline
            .produce(1 + batch as u128 * 100, &refs(chunk))
            .await;
        // Kill every connection to the sink's database but the killer's own.
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&database)
        .execute(&admin)
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    pipeline.wait_until_drained().await;
    assert_eq!(pipeline.view().status.status, Status::Running);
    pipeline.runtime.shutdown().await;
    let pool_check = connect(&url).await;
    drop(pool);
    assert_eq!(
        count(
            &pool_check,
            &format!("SELECT count(DISTINCT id) FROM {table}")
        )
        .await,
        2000
    );
}

async fn table_refusing_bad_rows(pool: &PgPool) -> String {
    let table = unique("sink_refuse");
    execute(
        pool,
        &format!(
            "CREATE TABLE {table} (id DECIMAL(39, 0) PRIMARY KEY, iggy_offset BIGINT, \
             iggy_timestamp TIMESTAMPTZ, iggy_stream TEXT, iggy_topic TEXT, iggy_partition_id INTEGER, \
             iggy_checksum BIGINT, iggy_origin_timestamp TIMESTAMPTZ, \
             payload TEXT CHECK (payload <> 'bad'), created_at TIMESTAMPTZ DEFAULT NOW())"
        ),
    )
    .await;
    table
}

fn with_bad_rows(bad: &[usize]) -> Vec<Vec<u8>> {
    (0..50)
        .map(|index| {
            if bad.contains(&index) {
                b"bad".to_vec()
            } else {
                format!("good {index}").into_bytes()
            }
        })
        .collect()
}

#[tokio::test]
async fn refused_rows_are_skipped_by_index_and_the_rest_is_written() {
    let pool = connect(&database_url()).await;
    let table = table_refusing_bad_rows(&pool).await;
    let pipeline = Pipeline::start(
        "text",
        "skip",
        &plugin_config(&table, "payload_format = \"text\"\nbatch_size = 20"),
    )
    .await;
    pipeline.produce(1, &refs(&with_bad_rows(&[17, 33]))).await;
    pipeline.wait_until_drained().await;
    pipeline.runtime.shutdown().await;
    assert_eq!(
        count(&pool, &format!("SELECT count(*) FROM {table}")).await,
        48
    );
    assert_eq!(
        count(
            &pool,
            &format!("SELECT count(*) FROM {table} WHERE id IN (18, 34)")
        )
        .await,
        0,
        "the refused messages are the ones at indexes 17 and 33"
    );
    assert_eq!(pipeline.view().metrics.skipped.get(), 2);
}

#[tokio::test]
async fn a_refused_row_with_on_error_stop_stops_the_sink_without_committing() {
    let pool = connect(&database_url()).await;
    let table = table_refusing_bad_rows(&pool).await;
    let pipeline = Pipeline::start(
        "text",
        "stop",
        &plugin_config(&table, "payload_format = \"text\""),
    )
    .await;
    pipeline.produce(1, &refs(&with_bad_rows(&[5]))).await;
    wait_for("the sink to stop", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    let status = pipeline.view().status;
    assert_eq!(status.stop_reason, Some(StopReason::Rejected));
    assert!(!pipeline.drained());
    pipeline.runtime.shutdown().await;
    assert_eq!(
        count(&pool, &format!("SELECT count(*) FROM {table}")).await,
        0
    );
}

#[tokio::test]
async fn a_missing_table_without_auto_create_fails_the_start_naming_it() {
    let table = unique("sink_missing");
    let pipeline = Pipeline::start("json", "stop", &plugin_config(&table, "")).await;
    wait_for("the sink to fail", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    let message = pipeline.view().status.last_error.unwrap().message;
    assert!(
        message.contains(&table) && message.contains("auto_create_table"),
        "{message}"
    );
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn an_existing_table_whose_columns_do_not_fit_fails_the_start_before_any_message() {
    let pool = connect(&database_url()).await;
    // Upstream's layout without the metadata columns the default writes; with
    // and without auto_create_table (CREATE TABLE IF NOT EXISTS keeps it).
    for extra in ["", "auto_create_table = true\n"] {
        let table = unique("sink_misfit");
        execute(
            &pool,
            &format!("CREATE TABLE {table} (id DECIMAL(39, 0) PRIMARY KEY, payload JSONB)"),
        )
        .await;
        let pipeline = Pipeline::start("json", "stop", &plugin_config(&table, extra)).await;
        // No message is produced: only a check at open can stop the sink.
        wait_for("the sink to fail at open", WAIT, || async {
            pipeline.view().status.status == Status::Error
        })
        .await;
        let message = pipeline.view().status.last_error.unwrap().message;
        assert!(
            message.contains(&table)
                && message.contains("does not fit")
                && message.contains("iggy_offset"),
            "{extra}: {message}"
        );
        assert!(!message.contains(" at line "), "{message}");
        pipeline.runtime.shutdown().await;
    }
}
