//! The mysql source in `mode = "cdc"` against a real MariaDB 10.11 with the
//! row binlog on (tests/support/mariadb.rs), driven by the real runtime over
//! the in-memory bus, or directly through the `Source` interface where a test
//! must stop between two batches.
#![cfg(feature = "mysql-source")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::mysql::source::CdcState;
use iggy_connect::connectors::{ConnectorKind, decode_state};
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::{MemoryStateStore, StateStore};
use serde_json::{Value, json};

use crate::support::drive::{build, drain};
use crate::support::mariadb::{connect, create_database, execute, unique};
use crate::support::wait::eventually as wait_for;

const WAIT: Duration = Duration::from_secs(30);
const TOPIC: &str = "changes";

struct Pipeline {
    runtime: Arc<Runtime>,
    bus: MemoryBus,
    state: Arc<dyn StateStore>,
    key: String,
    stream: String,
}

impl Pipeline {
    async fn start(
        key: &str,
        plugin_config: &str,
        bus: MemoryBus,
        state: Arc<dyn StateStore>,
    ) -> Self {
        let stream = format!("{key}_stream");
        let runtime = Runtime::new(Arc::new(bus.clone()), state.clone(), Duration::from_secs(5));
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
            state,
            key: key.to_owned(),
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

    async fn wait_for_count(&self, expected: usize) {
        let what = format!("{expected} messages on {}", self.stream);
        wait_for(&what, WAIT, || async {
            self.bus.messages(&self.stream, TOPIC).len() >= expected
        })
        .await;
    }

    async fn saved(&self) -> Option<CdcState> {
        let bytes = self.state.load(&self.key).await.unwrap()?;
        Some(decode_state(&bytes.data).unwrap())
    }

    fn view(&self) -> iggy_connect::engine::runtime::ConnectorView {
        self.runtime.view(ConnectorKind::Source, &self.key).unwrap()
    }
}

fn cdc_config(url: &str, tables: &[&str], extra: &str) -> String {
    let tables: Vec<String> = tables.iter().map(|table| format!("\"{table}\"")).collect();
    format!(
        "connection_string = \"{url}\"\nmode = \"cdc\"\ntables = [{}]\npoll_interval = \"20ms\"\n{extra}",
        tables.join(", ")
    )
}

/// `(operation_type, data.id or old_data.id)` of each payload.
fn operations(payloads: &[Value]) -> Vec<(String, Value)> {
    payloads
        .iter()
        .map(|payload| {
            let operation = payload["operation_type"].as_str().unwrap().to_owned();
            let id = match &payload["data"] {
                Value::Null => payload["old_data"]["id"].clone(),
                data => data["id"].clone(),
            };
            (operation, id)
        })
        .collect()
}

fn memory_state() -> Arc<dyn StateStore> {
    Arc::new(MemoryStateStore::new())
}

#[tokio::test]
async fn inserts_updates_deletes_and_truncates_arrive_once_each_in_commit_order() {
    let url = create_database("cdc_ops").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT, qty INT)",
    )
    .await;
    execute(&pool, "CREATE TABLE other (id BIGINT PRIMARY KEY)").await;
    execute(&pool, "CREATE TABLE ignored (id BIGINT PRIMARY KEY)").await;
    let key = unique("cdc_ops");
    let config = cdc_config(
        &url,
        &["items", "other"],
        "snapshot = \"never\"\ncapture_operations = [\"INSERT\", \"UPDATE\", \"DELETE\", \"TRUNCATE\"]",
    );
    let pipeline = Pipeline::start(&key, &config, MemoryBus::new(), memory_state()).await;
    wait_for("the start position saved", WAIT, || async {
        pipeline.saved().await.is_some()
    })
    .await;
    execute(
        &pool,
        "START TRANSACTION; INSERT INTO items VALUES (1, 'one', 1), (2, 'two', 2); \
         INSERT INTO other VALUES (10); INSERT INTO ignored VALUES (99); COMMIT",
    )
    .await;
    execute(
        &pool,
        "UPDATE items SET qty = qty + 10, name = 'uno' WHERE id = 1",
    )
    .await;
    execute(&pool, "UPDATE items SET id = 3 WHERE id = 2").await;
    execute(&pool, "DELETE FROM items WHERE id = 1").await;
    execute(&pool, "TRUNCATE TABLE other").await;
    execute(&pool, "INSERT INTO items VALUES (4, 'four', 4)").await;
    pipeline.wait_for_count(8).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.runtime.shutdown().await;
    let payloads = pipeline.payloads();
    let expected: Vec<(String, Value)> = [
        ("INSERT", json!(1)),
        ("INSERT", json!(2)),
        ("INSERT", json!(10)),
        ("UPDATE", json!(1)),
        ("UPDATE", json!(3)),
        ("DELETE", json!(1)),
        ("TRUNCATE", Value::Null),
        ("INSERT", json!(4)),
    ]
    .into_iter()
    .map(|(operation, id)| (operation.to_owned(), id))
    .collect();
    assert_eq!(operations(&payloads), expected);
    assert_eq!(
        payloads[3]["data"],
        json!({"id": 1, "name": "uno", "qty": 11})
    );
    assert_eq!(
        payloads[3]["old_data"],
        json!({"id": 1, "name": "one", "qty": 1})
    );
    assert_eq!(
        payloads[4]["old_data"]["id"], 2,
        "a key change carries the old key"
    );
    assert_eq!(
        payloads[5]["data"],
        json!({"id": 1, "name": "uno", "qty": 11})
    );
    assert_eq!(payloads[6]["table_name"], "other");
    assert_eq!(payloads[0]["table_name"], "items");
    // The commit time, not the processing time: RFC 3339 UTC to the second.
    let timestamp = payloads[0]["timestamp"].as_str().unwrap();
    assert!(
        timestamp.ends_with('Z') && timestamp.len() == 20,
        "{timestamp}"
    );
    // Ids come from the binlog position: distinct, and the same when read again.
    let ids: std::collections::HashSet<u128> = pipeline
        .bus
        .messages(&pipeline.stream, TOPIC)
        .iter()
        .map(|message| message.id)
        .collect();
    assert_eq!(ids.len(), 8);
}

#[tokio::test]
async fn values_are_rendered_as_the_polling_mode_renders_them() {
    let url = create_database("cdc_types").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE typed (id BIGINT UNSIGNED PRIMARY KEY, tiny TINYINT, flag BOOLEAN, small SMALLINT UNSIGNED, \
         medium MEDIUMINT, big BIGINT, price DECIMAL(12,3), ratio DOUBLE, approx FLOAT, label VARCHAR(20), fixed CHAR(4), \
         body TEXT, raw VARBINARY(8), blobby BLOB, day DATE, at DATETIME(6), at0 DATETIME, stamp TIMESTAMP(3) NULL, \
         span TIME, year_ YEAR, kind ENUM('new','paid','it''s'), tags SET('a','b','c'), bits BIT(10), doc JSON, missing INT)",
    )
    .await;
    let insert = "INSERT INTO typed VALUES \
        (18446744073709551615, -5, TRUE, 65535, -8388608, -9223372036854775808, 12345.678, 0.25, 1.5, 'say \"hi\"', 'ab', \
         'long text', X'00ff10', X'cafe', '2024-02-29', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05', \
         '2024-01-02 03:04:05.500', '-26:03:04', 2024, 'it''s', 'a,c', b'1000000001', '{\"a\": [1, 2]}', NULL), \
        (1, 0, FALSE, 0, 0, 0, -0.5, -1e300, 0, '', '', '', X'', X'', '1999-12-31', '1999-12-31 23:59:59.000001', \
         '1999-12-31 23:59:59', '1999-12-31 23:59:59.000', '00:00:00', 1999, 'new', '', b'0', '[]', 7)";
    let key = unique("cdc_types");
    let cdc = Pipeline::start(
        &key,
        &cdc_config(&url, &["typed"], "snapshot = \"never\""),
        MemoryBus::new(),
        memory_state(),
    )
    .await;
    wait_for("the start position saved", WAIT, || async {
        cdc.saved().await.is_some()
    })
    .await;
    execute(&pool, insert).await;
    cdc.wait_for_count(2).await;
    cdc.runtime.shutdown().await;
    let polling_key = unique("poll_types");
    let polling_config = format!(
        "connection_string = \"{url}\"\nmode = \"polling\"\ntables = [\"typed\"]\npoll_interval = \"20ms\"\ntracking_column = \"id\""
    );
    let polling = Pipeline::start(
        &polling_key,
        &polling_config,
        MemoryBus::new(),
        memory_state(),
    )
    .await;
    polling.wait_for_count(2).await;
    polling.runtime.shutdown().await;
    let by_id = |payloads: Vec<Value>| -> Vec<Value> {
        let mut rows: Vec<Value> = payloads
            .into_iter()
            .map(|payload| payload["data"].clone())
            .collect();
        rows.sort_by_key(|row| row["id"].to_string());
        rows
    };
    let streamed = by_id(cdc.payloads());
    let polled = by_id(polling.payloads());
    for (streamed, polled) in streamed.iter().zip(&polled) {
        for (column, value) in polled.as_object().unwrap() {
            // MariaDB's JSON is a LONGTEXT with a binary collation, which
            // the polling mode's driver reports as binary (hex); the binlog
            // mode reads the column's type from the catalog: its text.
            if column == "doc" {
                continue;
            }
            assert_eq!(&streamed[column], value, "column {column}");
        }
        assert_eq!(
            streamed.as_object().unwrap().len(),
            polled.as_object().unwrap().len()
        );
    }
    assert_eq!(streamed[0]["id"], json!(1));
    assert_eq!(streamed[1]["id"], json!(18446744073709551615u64));
    assert_eq!(streamed[1]["kind"], "it's");
    assert_eq!(streamed[1]["tags"], "a,c");
    assert_eq!(streamed[1]["doc"], r#"{"a": [1, 2]}"#);
}

#[tokio::test]
async fn refused_sends_keep_the_saved_position_and_the_changes_come_once_accepted() {
    let url = create_database("cdc_refused").await;
    let pool = connect(&url).await;
    execute(&pool, "CREATE TABLE items (id BIGINT PRIMARY KEY)").await;
    let key = unique("cdc_refused");
    let bus = MemoryBus::new();
    let pipeline = Pipeline::start(
        &key,
        &cdc_config(&url, &["items"], "snapshot = \"never\""),
        bus.clone(),
        memory_state(),
    )
    .await;
    wait_for("the start position saved", WAIT, || async {
        pipeline.saved().await.is_some()
    })
    .await;
    let before = pipeline.saved().await.unwrap();
    bus.refuse_sends(u32::MAX);
    execute(&pool, "INSERT INTO items SELECT seq FROM seq_1_to_50").await;
    wait_for("refused sends", WAIT, || async {
        pipeline.view().metrics.nacks.get() >= 3
    })
    .await;
    assert_eq!(
        pipeline.saved().await.unwrap(),
        before,
        "nothing saved while Iggy refuses"
    );
    assert!(pipeline.payloads().is_empty());
    bus.refuse_sends(0);
    pipeline.wait_for_count(50).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.runtime.shutdown().await;
    let ids: Vec<i64> = pipeline
        .payloads()
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, (1..=50).collect::<Vec<_>>());
    let after = pipeline.saved().await.unwrap();
    assert_eq!(after.binlog.file, before.binlog.file);
    assert!(after.binlog.position > before.binlog.position);
}

#[tokio::test]
async fn the_binlog_past_the_committed_position_is_reported_as_lag_until_delivered() {
    let url = create_database("cdc_lag").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT)",
    )
    .await;
    let key = unique("cdc_lag");
    let bus = MemoryBus::new();
    let pipeline = Pipeline::start(
        &key,
        &cdc_config(&url, &["items"], "snapshot = \"never\""),
        bus.clone(),
        memory_state(),
    )
    .await;
    wait_for("the start position saved", WAIT, || async {
        pipeline.saved().await.is_some()
    })
    .await;
    bus.refuse_sends(u32::MAX);
    let before = binlog_position(&pool).await;
    execute(
        &pool,
        "INSERT INTO items SELECT seq, repeat('x', 1000) FROM seq_1_to_3000",
    )
    .await;
    let written = binlog_position(&pool).await - before;
    let lag_bytes = || pipeline.view().lag.and_then(|lag| lag.bytes);
    wait_for("the insert's binlog reported as lag", WAIT, || async {
        lag_bytes().is_some_and(|bytes| bytes >= written)
    })
    .await;
    let lag = pipeline.view().lag.unwrap();
    assert_eq!((lag.messages, lag.partitions.len()), (None, 0));
    bus.refuse_sends(0);
    pipeline.wait_for_count(3000).await;
    // Other tests write to the same binlog meanwhile, so the lag does not
    // fall under a fixed figure; what it must show is the position committed
    // past (at least) half the insert: the binlog written since `before`,
    // less the lag, is how far the source committed since.
    wait_for("the lag to drop once delivered", WAIT, || async {
        let since_before = binlog_position(&pool).await - before;
        lag_bytes().is_some_and(|bytes| bytes + written / 2 < since_before)
    })
    .await;
    pipeline.runtime.shutdown().await;
}

/// The server's binlog position (within one file: the test writes far less
/// than a file holds).
async fn binlog_position(pool: &sqlx::MySqlPool) -> u64 {
    use sqlx::Row;
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe("SHOW MASTER STATUS"))
        .fetch_one(pool)
        .await
        .unwrap();
    row.try_get(1).unwrap()
}

#[tokio::test]
async fn a_restart_resumes_from_the_saved_position_without_loss_or_repeats() {
    let url = create_database("cdc_restart").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT)",
    )
    .await;
    execute(
        &pool,
        "INSERT INTO items SELECT seq, CONCAT('row ', seq) FROM seq_1_to_30",
    )
    .await;
    let key = unique("cdc_restart");
    let state = memory_state();
    let bus = MemoryBus::new();
    let config = cdc_config(&url, &["items"], "batch_size = 7");
    let first = Pipeline::start(&key, &config, bus.clone(), state.clone()).await;
    first.wait_for_count(30).await;
    for id in 31..=60 {
        execute(
            &pool,
            &format!("INSERT INTO items VALUES ({id}, 'row {id}')"),
        )
        .await;
    }
    first.wait_for_count(40).await;
    first.runtime.shutdown().await;
    // Changes made while the connector is down, one in a new binlog file.
    for id in 61..=75 {
        execute(
            &pool,
            &format!("INSERT INTO items VALUES ({id}, 'row {id}')"),
        )
        .await;
    }
    execute(&pool, "FLUSH BINARY LOGS").await;
    for id in 76..=90 {
        execute(
            &pool,
            &format!("INSERT INTO items VALUES ({id}, 'row {id}')"),
        )
        .await;
    }
    let second = Pipeline::start(&key, &config, bus, state).await;
    second.wait_for_count(90).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.runtime.shutdown().await;
    let payloads = second.payloads();
    let ids: Vec<i64> = payloads
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=90).collect::<Vec<_>>(),
        "every row once, in order"
    );
    assert!(
        payloads[..30]
            .iter()
            .all(|payload| payload["operation_type"] == "SELECT")
    );
    assert!(
        payloads[30..]
            .iter()
            .all(|payload| payload["operation_type"] == "INSERT")
    );
}

#[tokio::test]
async fn an_interrupted_snapshot_resumes_after_its_last_delivered_key_and_streams_what_changed() {
    let url = create_database("cdc_snapshot").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE items (id BIGINT PRIMARY KEY, name TEXT)",
    )
    .await;
    execute(
        &pool,
        "INSERT INTO items SELECT seq, CONCAT('row ', seq) FROM seq_1_to_1000",
    )
    .await;
    let config = json!({
        "connection_string": url,
        "mode": "cdc",
        "tables": ["items"],
        "batch_size": 100,
        "poll_interval": "20ms",
    });
    let mut source = build("mysql", config.clone());
    source.open(None).await.unwrap();
    let mut first = Vec::new();
    let state = drain(source.as_ref(), &mut first, WAIT, |payloads| {
        payloads.len() >= 300
    })
    .await
    .unwrap();
    // Changed while the snapshot runs: after its position, so streamed.
    execute(&pool, "UPDATE items SET name = 'early' WHERE id = 900").await;
    // One more batch polled, never committed: the process dies here.
    let lost = source.poll().await.unwrap();
    assert_eq!(lost.records.len(), 100);
    source.close().await.unwrap();
    execute(
        &pool,
        "UPDATE items SET name = 'changed' WHERE id IN (50, 700); DELETE FROM items WHERE id = 800; \
         INSERT INTO items VALUES (1001, 'late')",
    )
    .await;
    let mut source = build("mysql", config);
    source.open(Some(&state)).await.unwrap();
    let mut second = Vec::new();
    let streamed = |payloads: &[Value]| {
        payloads
            .iter()
            .filter(|payload| payload["operation_type"] != "SELECT")
            .count()
    };
    drain(source.as_ref(), &mut second, WAIT, |payloads| {
        streamed(payloads) >= 5
    })
    .await;
    let batch = source.poll().await.unwrap();
    assert!(
        batch.records.is_empty(),
        "nothing more: {} records",
        batch.records.len()
    );
    source.close().await.unwrap();

    let ids = |payloads: &[Value], operation: &str| -> Vec<i64> {
        payloads
            .iter()
            .filter(|payload| payload["operation_type"] == operation)
            .map(|payload| payload["data"]["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&first, "SELECT"), (1..=300).collect::<Vec<_>>());
    let resumed: Vec<i64> = (301..=1001).filter(|id| *id != 800).collect();
    assert_eq!(
        ids(&second, "SELECT"),
        resumed,
        "resumed after key 300 under a newer snapshot"
    );
    assert_eq!(ids(&second, "UPDATE"), [900, 50, 700]);
    assert_eq!(ids(&second, "DELETE"), [800]);
    assert_eq!(ids(&second, "INSERT"), [1001]);
    let saved: CdcState = decode_state(&state).unwrap();
    assert!(saved.binlog.position > 0 && !saved.snapshot.unwrap().done);
}

#[tokio::test]
async fn a_missing_table_or_a_table_without_a_key_stops_the_source_naming_it() {
    let url = create_database("cdc_missing").await;
    let pool = connect(&url).await;
    execute(&pool, "CREATE TABLE keyless (name TEXT)").await;
    for (table, expected) in [
        ("nowhere", "table nowhere does not exist"),
        ("keyless", "table keyless has no primary key"),
    ] {
        let key = unique("cdc_missing");
        let pipeline = Pipeline::start(
            &key,
            &cdc_config(&url, &[table], ""),
            MemoryBus::new(),
            memory_state(),
        )
        .await;
        wait_for("the source to fail", WAIT, || async {
            pipeline.view().status.status == Status::Error
        })
        .await;
        let message = pipeline.view().status.last_error.unwrap().message;
        assert!(message.contains(expected), "{message}");
        pipeline.runtime.shutdown().await;
    }
}

#[tokio::test]
async fn a_killed_binlog_connection_reconnects_after_the_last_transaction_taken_and_loses_nothing()
{
    let url = create_database("cdc_kill").await;
    let pool = connect(&url).await;
    execute(&pool, "CREATE TABLE items (id BIGINT PRIMARY KEY)").await;
    let key = unique("cdc_kill");
    let pipeline = Pipeline::start(
        &key,
        &cdc_config(&url, &["items"], "snapshot = \"never\"\nbatch_size = 5"),
        MemoryBus::new(),
        memory_state(),
    )
    .await;
    wait_for("the start position saved", WAIT, || async {
        pipeline.saved().await.is_some()
    })
    .await;
    let mut next = 1;
    for round in 0..3 {
        for _ in 0..20 {
            execute(&pool, &format!("INSERT INTO items VALUES ({next})")).await;
            next += 1;
        }
        pipeline.wait_for_count(20 * (round + 1)).await;
        let dumps: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        // The test's server runs this connector only: every dump thread is its.
        assert!(
            !dumps.is_empty(),
            "the connector reads the binlog as a replica"
        );
        for id in dumps {
            execute(&pool, &format!("KILL {id}")).await;
        }
    }
    for _ in 0..20 {
        execute(&pool, &format!("INSERT INTO items VALUES ({next})")).await;
        next += 1;
    }
    pipeline.wait_for_count(80).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.runtime.shutdown().await;
    let ids: Vec<i64> = pipeline
        .payloads()
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=80).collect::<Vec<_>>(),
        "every change once, in order, across reconnects"
    );
}

#[tokio::test]
async fn a_restart_before_any_change_streams_what_was_written_while_down_in_transactions_of_a_whole_batch()
 {
    let url = create_database("cdc_large").await;
    let pool = connect(&url).await;
    execute(
        &pool,
        "CREATE TABLE items (id BIGINT PRIMARY KEY, body TEXT)",
    )
    .await;
    let key = unique("cdc_large");
    let state = memory_state();
    let bus = MemoryBus::new();
    let config = cdc_config(&url, &["items"], "snapshot = \"never\"\nbatch_size = 1000");
    let first = Pipeline::start(&key, &config, bus.clone(), state.clone()).await;
    wait_for("the saved position", WAIT, || async {
        first.saved().await.is_some()
    })
    .await;
    first.runtime.shutdown().await;
    for start in [0, 1000, 2000] {
        execute(
            &pool,
            &format!(
                "INSERT INTO items SELECT seq, REPEAT(MD5(seq), 29) FROM seq_{}_to_{}",
                start + 1,
                start + 1000
            ),
        )
        .await;
    }
    let second = Pipeline::start(&key, &config, bus, state).await;
    second.wait_for_count(3000).await;
    second.runtime.shutdown().await;
    let ids: Vec<i64> = second
        .payloads()
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=3000).collect::<Vec<_>>(),
        "every row once, in order"
    );
}
