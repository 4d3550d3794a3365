//! The mysql sink against a real MariaDB 10.11 (tests/support/mariadb.rs),
//! through the real runtime over the in-memory bus, or called directly where
//! a test needs to replay a batch or see one write's answer.
#![cfg(feature = "mysql-sink")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::{ConnectorConfig, parse_connector_file};
use iggy_connect::connectors::{ConnectorKind, SinkError};
use iggy_connect::engine::{Runtime, Status, StopReason};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{Payload, SinkMessage};
use iggy_connect::state::MemoryStateStore;
use sqlx::MySqlPool;

use crate::support;
use crate::support::mariadb::{connect, count, create_database, execute, unique};
use crate::support::wait::eventually as wait_for;

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
        let key = unique("my_sink");
        let stream = format!("{key}_stream");
        let bus = MemoryBus::new();
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            Duration::from_secs(5),
        );
        runtime
            .add(sink_config(&key, &stream, schema, on_error, plugin_config))
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
    async fn produce(&self, first_id: u128, payloads: &[Vec<u8>]) {
        let payloads = payloads
            .iter()
            .map(|payload| Bytes::copy_from_slice(payload));
        support::sinks::send(&self.bus, &self.stream, TOPIC, first_id, payloads).await;
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

fn sink_config(
    key: &str,
    stream: &str,
    schema: &str,
    on_error: &str,
    plugin_config: &str,
) -> ConnectorConfig {
    let text = format!(
        "type = \"sink\"\nkey = \"{key}\"\nenabled = true\npath = \"mysql\"\non_error = \"{on_error}\"\n\n\
         [[streams]]\nstream = \"{stream}\"\ntopics = [\"{TOPIC}\"]\nschema = \"{schema}\"\n\
         batch_length = 100\npoll_interval = \"5ms\"\n\n\
         [plugin_config]\n{plugin_config}\n"
    );
    match parse_connector_file(
        Path::new("test.toml"),
        &text,
        &EnvVars::from_pairs(Vec::new()),
    ) {
        Ok((config, _)) => config,
        Err(issues) => panic!("bad test config: {issues:?}\n{text}"),
    }
}

fn plugin_config(url: &str, table: &str, extra: &str) -> String {
    format!("connection_string = \"{url}\"\ntarget_table = \"{table}\"\n{extra}")
}

fn json_payloads(first: u32, count: u32) -> Vec<Vec<u8>> {
    (first..first + count)
        .map(|n| format!("{{\"n\":{n},\"name\":\"event {n}\"}}").into_bytes())
        .collect()
}

fn messages(first_id: u128, payloads: &[Vec<u8>]) -> Vec<SinkMessage> {
    payloads
        .iter()
        .enumerate()
        .map(|(index, payload)| SinkMessage {
            id: first_id + index as u128,
            offset: index as u64,
            partition_id: 1,
            timestamp: 1_700_000_000_000_000,
            origin_timestamp: 1_700_000_000_000_001,
            checksum: 7,
            headers: Vec::new(),
            payload: Payload::Raw(Bytes::copy_from_slice(payload)),
        })
        .collect()
}

async fn database() -> (String, MySqlPool) {
    let url = create_database("sink").await;
    let pool = connect(&url).await;
    (url, pool)
}

#[tokio::test]
async fn each_payload_format_stores_the_payload_and_the_metadata_columns() {
    let (url, pool) = database().await;
    for (format, schema) in [("bytea", "raw"), ("json", "json"), ("text", "text")] {
        let table = format!("sink_{format}");
        let pipeline = Pipeline::start(
            schema,
            "stop",
            &plugin_config(
                &url,
                &table,
                &format!(
                    "auto_create_table = true\npayload_format = \"{format}\"\nbatch_size = 40"
                ),
            ),
        )
        .await;
        let payloads = json_payloads(0, 250);
        for (batch, chunk) in payloads.chunks(100).enumerate() {
            pipeline.produce(1 + batch as u128 * 100, chunk).await;
        }
        pipeline.wait_until_drained().await;
        pipeline.runtime.shutdown().await;
        assert_eq!(
            count(&pool, &format!("SELECT count(*) FROM {table}")).await,
            250,
            "{format}"
        );
        let name: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT JSON_VALUE(CONVERT(payload USING utf8mb4), '$.name') FROM {table} WHERE id = 8"
        )))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(name, "event 7", "{format}");
        let (stream, topic, offset, partition, has_times): (String, String, i64, i32, bool) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT iggy_stream, iggy_topic, iggy_offset, iggy_partition_id, \
                 iggy_timestamp > '2020-01-01' AND iggy_origin_timestamp IS NOT NULL AND iggy_checksum IS NOT NULL \
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
async fn a_batch_written_twice_is_stored_once_and_the_second_write_succeeds() {
    let (url, pool) = database().await;
    let sink = support::sinks::open(
        "mysql",
        &serde_json::json!({
            "connection_string": url,
            "target_table": "twice",
            "auto_create_table": true,
            "payload_format": "json",
            "batch_size": 7,
        }),
    )
    .await;
    let batch = messages(u128::MAX - 99, &json_payloads(0, 100));
    sink.write(&support::sinks::topic(), &batch).await.unwrap();
    sink.write(&support::sinks::topic(), &batch).await.unwrap();
    // A replay that overlaps: half old, half new.
    let overlap = messages(u128::MAX - 149, &json_payloads(0, 100));
    sink.write(&support::sinks::topic(), &overlap[..75])
        .await
        .unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM twice").await, 150);
    let top: String = sqlx::query_scalar("SELECT CAST(MAX(id) AS CHAR) FROM twice")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(top, u128::MAX.to_string(), "the whole u128 id is kept");
    let stamp: String =
        sqlx::query_scalar("SELECT CAST(iggy_timestamp AS CHAR) FROM twice ORDER BY id LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        stamp, "2023-11-14 22:13:20.000000",
        "microseconds since the epoch, UTC"
    );
}

/// A table whose CHECK refuses the payload 'bad'.
async fn table_refusing_bad_rows(pool: &MySqlPool) -> String {
    let table = unique("sink_refuse");
    execute(
        pool,
        &format!(
            "CREATE TABLE {table} (id DECIMAL(39, 0) PRIMARY KEY, iggy_offset BIGINT, \
             iggy_timestamp DATETIME(6), iggy_stream TEXT, iggy_topic TEXT, iggy_partition_id INT, \
             iggy_checksum BIGINT, iggy_origin_timestamp DATETIME(6), \
             payload LONGTEXT CHECK (payload <> 'bad'), created_at TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6))"
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
    let (url, pool) = database().await;
    let table = table_refusing_bad_rows(&pool).await;
    let pipeline = Pipeline::start(
        "text",
        "skip",
        &plugin_config(&url, &table, "payload_format = \"text\"\nbatch_size = 20"),
    )
    .await;
    pipeline.produce(1, &with_bad_rows(&[17, 33])).await;
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
async fn invalid_json_for_a_json_column_is_refused_by_index_without_writing_the_batch() {
    let (url, pool) = database().await;
    let sink = support::sinks::open(
        "mysql",
        &serde_json::json!({
            "connection_string": url,
            "target_table": "json_rows",
            "auto_create_table": true,
            "payload_format": "json",
        }),
    )
    .await;
    let mut payloads = json_payloads(0, 10);
    payloads[4] = b"{not json".to_vec();
    let error = sink
        .write(&support::sinks::topic(), &messages(1, &payloads))
        .await
        .unwrap_err();
    let SinkError::Rejected(rejected) = error else {
        panic!("expected a rejection, got {error}");
    };
    assert_eq!(
        rejected
            .iter()
            .map(|rejection| rejection.index)
            .collect::<Vec<_>>(),
        [4]
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM json_rows").await, 0);
}

#[tokio::test]
async fn a_refused_row_with_on_error_stop_stops_the_sink_without_committing() {
    let (url, pool) = database().await;
    let table = table_refusing_bad_rows(&pool).await;
    let pipeline = Pipeline::start(
        "text",
        "stop",
        &plugin_config(&url, &table, "payload_format = \"text\""),
    )
    .await;
    pipeline.produce(1, &with_bad_rows(&[5])).await;
    wait_for("the sink to stop", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    assert_eq!(
        pipeline.view().status.stop_reason,
        Some(StopReason::Rejected)
    );
    assert!(!pipeline.drained());
    pipeline.runtime.shutdown().await;
    assert_eq!(
        count(&pool, &format!("SELECT count(*) FROM {table}")).await,
        0
    );
}

#[tokio::test]
async fn a_lock_wait_timeout_is_transient_and_the_same_batch_succeeds_once_the_lock_is_gone() {
    let (url, pool) = database().await;
    // Before the sink connects: the setting applies to sessions opened later.
    execute(&pool, "SET GLOBAL innodb_lock_wait_timeout = 1").await;
    let sink = support::sinks::open(
        "mysql",
        &serde_json::json!({
            "connection_string": url,
            "target_table": "locked",
            "auto_create_table": true,
        }),
    )
    .await;
    let batch = messages(1, &json_payloads(0, 20));
    sink.write(&support::sinks::topic(), &batch[..1])
        .await
        .unwrap();
    // Another session holds the row of id 1 (which the batch writes again).
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM locked WHERE id = 1 FOR UPDATE")
        .fetch_all(&mut *holder)
        .await
        .unwrap();
    let error = sink
        .write(&support::sinks::topic(), &batch)
        .await
        .unwrap_err();
    assert!(
        matches!(error, SinkError::Transient { .. }) && error.to_string().contains("1205"),
        "{error}"
    );
    holder.rollback().await.unwrap();
    execute(&pool, "SET GLOBAL innodb_lock_wait_timeout = 50").await;
    sink.write(&support::sinks::topic(), &batch).await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM locked").await, 20);
}

#[tokio::test]
async fn connections_killed_mid_write_are_retried_and_nothing_is_lost() {
    let (url, pool) = database().await;
    let database = url.rsplit_once('/').unwrap().1.to_owned();
    let admin = connect(&support::mariadb::server().url("mysql")).await;
    let pipeline = Pipeline::start(
        "json",
        "stop",
        &plugin_config(&url, "killed", "auto_create_table = true\nbatch_size = 25"),
    )
    .await;
    let payloads = json_payloads(0, 500);
    let mut chunks = payloads.chunks(100).enumerate();
    // The first batch creates the table.
    let (_, first) = chunks.next().unwrap();
    pipeline.produce(1, first).await;
    pipeline.wait_until_drained().await;
    for (batch, chunk) in chunks {
        // A table lock holds the sink's next write on the server, so the
        // kill lands on a statement in flight, never on an idle connection
        // the pool would replace unnoticed.
        let mut holder = pool.acquire().await.unwrap();
        let holder_id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
            .fetch_one(&mut *holder)
            .await
            .unwrap();
        sqlx::query("LOCK TABLES killed WRITE")
            .execute(&mut *holder)
            .await
            .unwrap();
        pipeline.produce(1 + batch as u128 * 100, chunk).await;
        let mut blocked: Vec<i64> = Vec::new();
        wait_for("the sink's write to wait on the lock", WAIT, async || {
            blocked = sqlx::query_scalar(
                "SELECT id FROM information_schema.processlist \
                 WHERE db = ? AND state = 'Waiting for table metadata lock' AND id <> ?",
            )
            .bind(&database)
            .bind(holder_id)
            .fetch_all(&admin)
            .await
            .unwrap();
            !blocked.is_empty()
        })
        .await;
        for id in &blocked {
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(&admin)
                .await
                .unwrap();
        }
        sqlx::query("UNLOCK TABLES")
            .execute(&mut *holder)
            .await
            .unwrap();
    }
    pipeline.wait_until_drained().await;
    let view = pipeline.view();
    assert_eq!(view.status.status, Status::Running);
    assert!(
        view.metrics.retries.get() >= 4,
        "{}",
        view.metrics.retries.get()
    );
    pipeline.runtime.shutdown().await;
    assert_eq!(
        count(&pool, "SELECT count(DISTINCT id) FROM killed").await,
        500
    );
}

#[tokio::test]
async fn a_missing_table_without_auto_create_fails_the_start_naming_it() {
    let (url, _pool) = database().await;
    let pipeline = Pipeline::start("json", "stop", &plugin_config(&url, "nowhere", "")).await;
    wait_for("the sink to fail", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    let message = pipeline.view().status.last_error.unwrap().message;
    assert!(
        message.contains("`nowhere`") && message.contains("auto_create_table"),
        "{message}"
    );
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_table_without_the_columns_or_a_unique_id_fails_the_start_before_any_message() {
    let (url, pool) = database().await;
    for (table, create, expected) in [
        (
            "misfit",
            "CREATE TABLE misfit (id DECIMAL(39, 0) PRIMARY KEY, payload JSON)",
            "iggy_offset",
        ),
        (
            "no_key",
            "CREATE TABLE no_key (id DECIMAL(39, 0), payload LONGBLOB)",
            "primary key",
        ),
    ] {
        execute(&pool, create).await;
        let extra =
            "include_metadata = false\ninclude_checksum = false\ninclude_origin_timestamp = false";
        let extra = if table == "misfit" {
            "auto_create_table = true"
        } else {
            extra
        };
        let pipeline = Pipeline::start("json", "stop", &plugin_config(&url, table, extra)).await;
        wait_for("the sink to fail at open", WAIT, || async {
            pipeline.view().status.status == Status::Error
        })
        .await;
        let message = pipeline.view().status.last_error.unwrap().message;
        assert!(
            message.contains(table)
                && message.contains("does not fit")
                && message.contains(expected),
            "{table}: {message}"
        );
        pipeline.runtime.shutdown().await;
    }
}

#[tokio::test]
async fn bad_credentials_fail_the_start_with_the_server_message() {
    let server = support::mariadb::server();
    let url = format!("mysql://nobody:wrong@127.0.0.1:{}/mysql", server.port);
    let pipeline = Pipeline::start("json", "stop", &plugin_config(&url, "t", "")).await;
    wait_for("the sink to fail", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    let message = pipeline.view().status.last_error.unwrap().message;
    assert!(
        message.contains("Access denied") && message.contains("1045"),
        "{message}"
    );
    pipeline.runtime.shutdown().await;
}
