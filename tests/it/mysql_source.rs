//! The mysql source against a real MariaDB 10.11 (tests/support/mariadb.rs),
//! driven by the real runtime over the in-memory bus. The four state tests
//! run in the conformance suite (fixtures/mysql_source.rs, all three modes).
#![cfg(feature = "mysql-source")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::MemoryStateStore;
use serde_json::Value;
use sqlx::MySqlPool;

use crate::support::mariadb::{connect, count, create_database, execute, unique};
use crate::support::wait::eventually as wait_for;

const WAIT: Duration = Duration::from_secs(30);
const TOPIC: &str = "rows";

struct Pipeline {
    runtime: Arc<Runtime>,
    bus: MemoryBus,
    key: String,
    stream: String,
}

impl Pipeline {
    async fn start(plugin_config: &str, bus: MemoryBus) -> Self {
        let key = unique("my_source");
        let stream = format!("{key}_stream");
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            Duration::from_secs(5),
        );
        let text = format!(
            "type = \"source\"\nkey = \"{key}\"\nenabled = true\npath = \"mysql\"\n\
             max_consecutive_nacks = 0\n\n\
             [[streams]]\nstream = \"{stream}\"\ntopic = \"{TOPIC}\"\nschema = \"json\"\n\n\
             [plugin_config]\n{plugin_config}\n"
        );
        let (config, _) = parse_connector_file(
            Path::new("test.toml"),
            &text,
            &EnvVars::from_pairs(Vec::new()),
        )
        .unwrap_or_else(|issues| panic!("bad test config: {issues:?}\n{text}"));
        runtime.add(config).unwrap();
        runtime.start_enabled().await;
        Self {
            runtime,
            bus,
            key,
            stream,
        }
    }

    fn payloads(&self) -> Vec<Value> {
        self.bus
            .messages(&self.stream, TOPIC)
            .iter()
            .map(|message| serde_json::from_slice(&message.payload).unwrap())
            .collect()
    }

    /// `data.id` of every delivered row, in delivery order.
    fn ids(&self) -> Vec<i64> {
        self.payloads()
            .iter()
            .map(|payload| payload["data"]["id"].as_i64().unwrap())
            .collect()
    }

    async fn wait_for_count(&self, expected: usize) {
        let what = format!("{expected} messages on {}", self.stream);
        wait_for(&what, WAIT, || async {
            self.bus.messages(&self.stream, TOPIC).len() >= expected
        })
        .await;
    }

    fn view(&self) -> iggy_connect::engine::runtime::ConnectorView {
        self.runtime.view(ConnectorKind::Source, &self.key).unwrap()
    }

    fn nacks(&self) -> u64 {
        self.view().metrics.nacks.get()
    }
}

fn plugin_config(url: &str, table: &str, extra: &str) -> String {
    format!(
        "connection_string = \"{url}\"\nmode = \"polling\"\ntables = [\"{table}\"]\npoll_interval = \"20ms\"\n{extra}"
    )
}

async fn create_rows(pool: &MySqlPool, table: &str, extra_columns: &str, rows: i64) {
    execute(
        pool,
        &format!(
            "CREATE TABLE {table} (id BIGINT AUTO_INCREMENT PRIMARY KEY, name TEXT NOT NULL, \
             amount DECIMAL(10,2), created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6){extra_columns})"
        ),
    )
    .await;
    insert_rows(pool, table, rows).await;
}

async fn insert_rows(pool: &MySqlPool, table: &str, rows: i64) {
    execute(
        pool,
        &format!(
            // Explicit ids: INSERT ... SELECT leaves AUTO_INCREMENT gaps.
            "INSERT INTO {table} (id, name, amount) SELECT base + seq, CONCAT('row ', base + seq), (base + seq) * 1.5 \
             FROM seq_1_to_{rows}, (SELECT COALESCE(MAX(id), 0) AS base FROM {table}) AS existing"
        ),
    )
    .await;
}

fn assert_each_once(ids: &[i64], expected: std::ops::RangeInclusive<i64>) {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    let wanted: Vec<i64> = expected.collect();
    assert_eq!(sorted, wanted, "every row exactly once");
}

fn assert_each_at_least_once(ids: &[i64], expected: std::ops::RangeInclusive<i64>) {
    let mut seen = ids.to_vec();
    seen.sort_unstable();
    seen.dedup();
    let wanted: Vec<i64> = expected.collect();
    assert_eq!(seen, wanted, "every row at least once");
}

#[tokio::test]
async fn cursor_mode_delivers_every_row_once_in_the_database_record_shape_and_follows_new_rows() {
    let url = create_database("src").await;
    let pool = connect(&url).await;
    create_rows(&pool, "orders", "", 2500).await;
    let pipeline = Pipeline::start(
        &plugin_config(&url, "orders", "batch_size = 1000"),
        MemoryBus::new(),
    )
    .await;
    pipeline.wait_for_count(2500).await;
    insert_rows(&pool, "orders", 10).await;
    pipeline.wait_for_count(2510).await;
    pipeline.runtime.shutdown().await;

    assert_each_once(&pipeline.ids(), 1..=2510);
    let first = &pipeline.payloads()[0];
    assert_eq!(first["table_name"], "orders");
    assert_eq!(first["operation_type"], "SELECT");
    assert!(first["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(first["old_data"], Value::Null);
    assert_eq!(first["data"]["name"], "row 1");
    assert_eq!(first["data"]["amount"], serde_json::json!(1.5));
    assert!(first["data"]["created_at"].as_str().unwrap().len() >= 19);
    let messages = pipeline.bus.messages(&pipeline.stream, TOPIC);
    assert_eq!(messages[0].id as u64, 1, "the key is the id's low 64 bits");
}

#[tokio::test]
async fn cursor_mode_redelivers_a_refused_batch_and_skips_nothing() {
    let url = create_database("src").await;
    let pool = connect(&url).await;
    create_rows(&pool, "orders", "", 300).await;
    let bus = MemoryBus::new();
    bus.refuse_sends(3);
    let pipeline = Pipeline::start(&plugin_config(&url, "orders", "batch_size = 100"), bus).await;
    pipeline.wait_for_count(300).await;
    pipeline.runtime.shutdown().await;
    assert!(pipeline.nacks() >= 3);
    assert_each_at_least_once(&pipeline.ids(), 1..=300);
}

/// Runs a destructive mode with refused sends and checks that no row is
/// consumed while its batch is not in the bus.
async fn destructive_mode_consumes_rows_only_after_commit(
    extra_columns: &str,
    settings: &str,
    remaining_sql: &str,
) {
    let url = create_database("src").await;
    let pool = connect(&url).await;
    create_rows(&pool, "orders", extra_columns, 300).await;
    let bus = MemoryBus::new();
    bus.refuse_sends(4);
    let pipeline = Pipeline::start(
        &plugin_config(&url, "orders", &format!("batch_size = 100\n{settings}")),
        bus,
    )
    .await;
    wait_for("two NACKs (or a stop)", WAIT, || async {
        pipeline.nacks() >= 2 || pipeline.view().status.status == Status::Error
    })
    .await;
    assert!(pipeline.nacks() >= 2, "{:?}", pipeline.view().status);
    assert!(pipeline.bus.messages(&pipeline.stream, TOPIC).is_empty());
    assert_eq!(
        count(&pool, remaining_sql).await,
        300,
        "no row may be consumed before its batch is delivered"
    );
    pipeline.wait_for_count(300).await;
    wait_for("every row consumed", WAIT, || async {
        count(&pool, remaining_sql).await == 0
    })
    .await;
    pipeline.runtime.shutdown().await;
    assert_each_once(&pipeline.ids(), 1..=300);
}

#[tokio::test]
async fn delete_after_read_deletes_rows_only_after_their_batch_is_committed() {
    destructive_mode_consumes_rows_only_after_commit(
        "",
        "delete_after_read = true",
        "SELECT count(*) FROM orders",
    )
    .await;
}

#[tokio::test]
async fn processed_column_marks_rows_only_after_their_batch_is_committed() {
    destructive_mode_consumes_rows_only_after_commit(
        ", done BOOLEAN NOT NULL DEFAULT FALSE",
        "processed_column = \"done\"",
        "SELECT count(*) FROM orders WHERE NOT done",
    )
    .await;
}

#[tokio::test]
async fn custom_query_reads_through_its_placeholders_at_least_once_under_refused_sends() {
    let url = create_database("src").await;
    let pool = connect(&url).await;
    create_rows(&pool, "orders", "", 300).await;
    let bus = MemoryBus::new();
    bus.refuse_sends(2);
    let query = "SELECT * FROM $table WHERE id > $offset AND id % 3 <> 0 \
                 AND created_at <= '$now' + INTERVAL 1 DAY AND $now_unix > 0 ORDER BY id LIMIT $limit";
    let pipeline = Pipeline::start(
        &plugin_config(
            &url,
            "orders",
            &format!("batch_size = 50\ninitial_offset = 0\ncustom_query = \"{query}\""),
        ),
        bus,
    )
    .await;
    pipeline.wait_for_count(200).await;
    pipeline.runtime.shutdown().await;
    let ids = pipeline.ids();
    assert!(
        ids.iter().all(|id| id % 3 != 0),
        "the query's filter applies"
    );
    let mut seen = ids.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (1..=300).filter(|id| id % 3 != 0).collect::<Vec<_>>());
}

#[tokio::test]
async fn rows_sharing_a_tracking_value_across_a_batch_boundary_are_all_delivered() {
    let url = create_database("src").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE ties (id BIGINT AUTO_INCREMENT PRIMARY KEY, name TEXT, updated_at DATETIME(6) NOT NULL); \
         INSERT INTO ties (id, name, updated_at) \
         SELECT seq, CONCAT('row ', seq), TIMESTAMP '2024-01-01 00:00:00' + INTERVAL ((seq - 1) DIV 30) SECOND \
         FROM seq_1_to_250",
    )
    .await;
    let pipeline = Pipeline::start(
        &plugin_config(
            &url,
            "ties",
            "batch_size = 100\ntracking_column = \"updated_at\"",
        ),
        MemoryBus::new(),
    )
    .await;
    pipeline.wait_for_count(250).await;
    // A later row: once it is delivered, polls have run past the ties, and
    // none of them may have brought a row back.
    execute(
        &pool,
        "INSERT INTO ties (id, name, updated_at) VALUES (251, 'late', '2024-01-02 00:00:00')",
    )
    .await;
    pipeline.wait_for_count(251).await;
    pipeline.runtime.shutdown().await;
    assert_each_once(&pipeline.ids(), 1..=251);
}

#[tokio::test]
async fn every_configured_table_is_read_with_its_own_cursor_and_string_keys_work() {
    let url = create_database("src").await;
    let pool = connect(&url).await;
    create_rows(&pool, "left_rows", "", 120).await;
    execute(
        &pool,
        "CREATE TABLE codes (code VARCHAR(20) PRIMARY KEY, note TEXT); \
         INSERT INTO codes SELECT CONCAT('c', LPAD(seq, 4, '0'), '''\\\\'), 'x' FROM seq_1_to_80",
    )
    .await;
    let config = format!(
        "connection_string = \"{url}\"\ntables = [\"left_rows\", \"codes\"]\npoll_interval = \"20ms\"\n\
         batch_size = 25\ntracking_column = \"id\"\n"
    );
    // `codes` has no `id`: the start must name the table and the column.
    let pipeline = Pipeline::start(&config, MemoryBus::new()).await;
    wait_for("the source to fail", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    let message = pipeline.view().status.last_error.unwrap().message;
    assert!(
        message.contains("codes") && message.contains("tracking_column"),
        "{message}"
    );
    pipeline.runtime.shutdown().await;

    execute(
        &pool,
        "ALTER TABLE left_rows CHANGE id code BIGINT NOT NULL AUTO_INCREMENT",
    )
    .await;
    let config = config.replace("tracking_column = \"id\"", "tracking_column = \"code\"");
    let pipeline = Pipeline::start(&config, MemoryBus::new()).await;
    pipeline.wait_for_count(200).await;
    pipeline.runtime.shutdown().await;
    let mut per_table = std::collections::BTreeMap::<String, Vec<String>>::new();
    for payload in pipeline.payloads() {
        per_table
            .entry(payload["table_name"].as_str().unwrap().to_owned())
            .or_default()
            .push(payload["data"]["code"].to_string());
    }
    assert_eq!(per_table["left_rows"].len(), 120);
    let mut codes = per_table["codes"].clone();
    codes.dedup();
    assert_eq!(
        codes.len(),
        80,
        "each string key once, quotes and backslashes included"
    );
    assert!(codes[0].contains("c0001'\\\\"), "{}", codes[0]);
}

#[tokio::test]
async fn a_missing_table_stops_the_source_with_an_error_naming_it() {
    let url = create_database("src").await;
    let pipeline = Pipeline::start(&plugin_config(&url, "nowhere", ""), MemoryBus::new()).await;
    wait_for("the source to fail", WAIT, || async {
        pipeline.view().status.status == Status::Error
    })
    .await;
    let message = pipeline.view().status.last_error.unwrap().message;
    assert!(
        message.contains("nowhere") && message.contains("does not exist"),
        "{message}"
    );
    pipeline.runtime.shutdown().await;
}

/// A polling source built and opened directly, as the engine does.
async fn open_source(config: &str) -> Box<dyn iggy_connect::connectors::Source> {
    let entry = iggy_connect::connectors::Registry::sources()
        .iter()
        .find(|entry| entry.name == "mysql")
        .expect("the mysql source is compiled in");
    let table: toml::Table = toml::from_str(config).expect("TOML");
    let value = serde_json::to_value(table).expect("JSON");
    let mut source = (entry.build)(&value).expect("a valid config");
    source.open(None).await.expect("open");
    source
}

async fn pending(probe: &dyn iggy_connect::connectors::LagProbe) -> Option<u64> {
    probe.measure().await.expect("measured").messages
}

/// The polling source's lag counts the rows past its committed cursor (not
/// the one in flight), new rows included; in delete mode the rows not
/// consumed yet; a custom query has no probe.
#[tokio::test]
async fn polling_lag_counts_the_rows_past_the_committed_cursor() {
    let url = create_database("src_lag").await;
    let pool = connect(&url).await;
    create_rows(&pool, "orders", "", 10).await;
    let source = open_source(&plugin_config(&url, "orders", "batch_size = 3")).await;
    let probe = source
        .lag_probe()
        .expect("a polling source measures its lag");
    assert_eq!(pending(probe.as_ref()).await, Some(10));
    assert_eq!(source.poll().await.unwrap().records.len(), 3);
    assert_eq!(
        pending(probe.as_ref()).await,
        Some(10),
        "a batch in flight is not committed"
    );
    source.commit().await.unwrap();
    assert_eq!(pending(probe.as_ref()).await, Some(7));
    insert_rows(&pool, "orders", 5).await;
    assert_eq!(pending(probe.as_ref()).await, Some(12));

    let deleting = open_source(&plugin_config(
        &url,
        "orders",
        "batch_size = 4\ndelete_after_read = true",
    ))
    .await;
    let probe = deleting
        .lag_probe()
        .expect("a delete-mode source measures too");
    assert_eq!(deleting.poll().await.unwrap().records.len(), 4);
    deleting.commit().await.unwrap();
    assert_eq!(pending(probe.as_ref()).await, Some(11));

    let custom = open_source(&plugin_config(
        &url,
        "orders",
        "initial_offset = 0\ncustom_query = \"SELECT * FROM $table WHERE id > $offset ORDER BY id LIMIT $limit\"",
    ))
    .await;
    assert!(custom.lag_probe().is_none());
}
