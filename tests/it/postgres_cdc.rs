//! The postgres source in `mode = "cdc"` against a real PostgreSQL started
//! with `wal_level = logical` (`scripts/with-postgres.sh`), driven by the real
//! runtime over the in-memory bus, or directly through the `Source` interface
//! where a test must stop between two batches.
#![cfg(feature = "postgres-source")]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use iggy_connect::connectors::postgres::source::CdcState;
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::{MemoryStateStore, StateStore};
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::drive::{build, drain};
use crate::support::postgres::{Pipeline, connect, database_url, execute, unique, wait_for};

const WAIT: Duration = Duration::from_secs(30);

impl Pipeline {
    async fn start_cdc(
        key: &str,
        plugin_config: &str,
        bus: MemoryBus,
        state: Arc<dyn StateStore>,
    ) -> Self {
        Self::launch(key.to_owned(), "changes", "json", plugin_config, bus, state).await
    }

    /// The pipeline `key` on `tables` streaming from now on (`snapshot =
    /// "never"`, plus the config lines `extra`) into `bus`, its state in
    /// memory; returns once its slot is made.
    async fn start_streaming(
        pool: &PgPool,
        key: &str,
        tables: &[&str],
        extra: &str,
        bus: MemoryBus,
    ) -> Self {
        let config = cdc_config(tables, &format!("snapshot = \"never\"\n{extra}"));
        let pipeline = Self::start_cdc(key, &config, bus, Arc::new(MemoryStateStore::new())).await;
        slot_made(pool, &slot_of(key)).await;
        pipeline
    }
}

/// A table of the test's own, `prefix_...` (id BIGINT PRIMARY KEY, name TEXT).
async fn named_rows(pool: &PgPool, prefix: &str) -> String {
    let table = unique(prefix);
    execute(
        pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT)"),
    )
    .await;
    table
}

/// Waits until the replication slot `slot` exists.
async fn slot_made(pool: &PgPool, slot: &str) {
    wait_for("the slot", WAIT, || async {
        confirmed_flush(pool, slot).await.is_some()
    })
    .await;
}

fn cdc_config(tables: &[&str], extra: &str) -> String {
    let tables: Vec<String> = tables.iter().map(|table| format!("\"{table}\"")).collect();
    format!(
        "connection_string = \"{}\"\nmode = \"cdc\"\ntables = [{}]\npoll_interval = \"20ms\"\n{extra}",
        database_url(),
        tables.join(", ")
    )
}

/// The slot a connector with `key` and no `replication_slot` uses.
fn slot_of(key: &str) -> String {
    iggy_connect::connectors::postgres::source::derived_slot_name(key).unwrap()
}

async fn confirmed_flush(pool: &PgPool, slot: &str) -> Option<u64> {
    let text: Option<Option<String>> = sqlx::query_scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await
    .unwrap();
    text.flatten()
        .as_deref()
        .and_then(iggy_connect::connectors::postgres::source::parse_lsn)
}

/// Drops a test's slot once the server session of its last peek let go of it
/// (a peek cancelled by the shutdown runs on until the server notices).
async fn drop_slot(pool: &PgPool, slot: &str) {
    let sql = format!(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}'"
    );
    wait_for("the slot to be dropped", WAIT, || async {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(pool)
            .await
            .is_ok()
    })
    .await;
}

fn operations(payloads: &[Value]) -> Vec<(String, Value)> {
    payloads
        .iter()
        .map(|payload| {
            let id = match payload["operation_type"].as_str() {
                Some("DELETE") => payload["data"]["id"].clone(),
                Some("TRUNCATE") => Value::Null,
                _ => payload["data"]["id"].clone(),
            };
            (payload["operation_type"].as_str().unwrap().to_owned(), id)
        })
        .collect()
}

#[tokio::test]
async fn inserts_updates_deletes_and_truncates_arrive_once_each_in_commit_order() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_ops");
    let full = unique("cdc_full");
    execute(
        &pool,
        &format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, amount NUMERIC(10,2), \
               at TIMESTAMPTZ, flag BOOLEAN, tags INT[], doc JSONB, big TEXT); \
             ALTER TABLE {table} ALTER COLUMN big SET STORAGE EXTERNAL; \
             INSERT INTO {table} VALUES (1, 'one', 12.50, '2024-01-02 03:04:05.25+00', true, '{{1,2}}', \
               '{{\"a\": [1, {{\"b\": null}}]}}', repeat('x', 10000)); \
             CREATE TABLE {full} (id BIGINT PRIMARY KEY, name TEXT); \
             ALTER TABLE {full} REPLICA IDENTITY FULL"
        ),
    )
    .await;
    let key = unique("cdc_ops");
    let pipeline = Pipeline::start_cdc(
        &key,
        &cdc_config(
            &[&table, &full],
            "capture_operations = [\"INSERT\", \"UPDATE\", \"DELETE\", \"TRUNCATE\"]",
        ),
        MemoryBus::new(),
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    pipeline.wait_for_count(1).await;
    let before = SystemTime::now();
    execute(
        &pool,
        &format!(
            "BEGIN; \
             INSERT INTO {table} VALUES (2, 'two', 1.5, '2024-01-02 03:04:05.25+00', false, '{{}}', '[]', 'small'); \
             INSERT INTO {table} (id, name) VALUES (3, 'three'); COMMIT; \
             BEGIN; UPDATE {table} SET name = 'uno' WHERE id = 1; UPDATE {table} SET id = 20 WHERE id = 2; COMMIT; \
             DELETE FROM {table} WHERE id = 3; \
             INSERT INTO {full} VALUES (7, 'seven'); \
             UPDATE {full} SET name = 'SEVEN' WHERE id = 7; \
             DELETE FROM {full} WHERE id = 7; \
             TRUNCATE {table}"
        ),
    )
    .await;
    let after = SystemTime::now();
    pipeline.wait_for_count(10).await;
    // Nothing more comes (each change once).
    tokio::time::sleep(Duration::from_millis(300)).await;
    pipeline.runtime.shutdown().await;
    let payloads = pipeline.payloads();
    assert_eq!(
        operations(&payloads),
        [
            ("SELECT".into(), json!(1)),
            ("INSERT".into(), json!(2)),
            ("INSERT".into(), json!(3)),
            ("UPDATE".into(), json!(1)),
            ("UPDATE".into(), json!(20)),
            ("DELETE".into(), json!(3)),
            ("INSERT".into(), json!(7)),
            ("UPDATE".into(), json!(7)),
            ("DELETE".into(), json!(7)),
            ("TRUNCATE".into(), Value::Null),
        ]
    );
    let snapshot_row = &payloads[0]["data"];
    assert_eq!(payloads[0]["table_name"], table.as_str());
    // Streamed rows are rendered as polled (snapshot) rows are.
    let inserted = &payloads[1]["data"];
    for column in ["at", "doc", "tags"] {
        assert!(
            !inserted[column].is_null(),
            "{column} of the insert: {inserted}"
        );
    }
    assert_eq!(inserted["at"], snapshot_row["at"]);
    assert_eq!(inserted["amount"], json!(1.5));
    assert_eq!(inserted["flag"], json!(false));
    assert_eq!(inserted["doc"], json!([]));
    assert_eq!(inserted["tags"], json!([]));
    assert_eq!(snapshot_row["doc"], json!({"a": [1, {"b": null}]}));
    assert_eq!(snapshot_row["tags"], json!([1, 2]));
    assert_eq!(payloads[2]["data"]["amount"], Value::Null);
    // The update left the TOASTed column alone: PostgreSQL did not send it.
    let updated = payloads[3]["data"].as_object().unwrap();
    assert_eq!(updated["name"], "uno");
    assert_eq!(updated["at"], snapshot_row["at"]);
    assert_eq!(updated["amount"], snapshot_row["amount"]);
    assert!(!updated.contains_key("big"), "{updated:?}");
    assert_eq!(
        payloads[3]["old_data"],
        Value::Null,
        "key unchanged, identity default"
    );
    assert_eq!(payloads[4]["old_data"], json!({"id": 2}), "key changed");
    assert_eq!(payloads[5]["data"], json!({"id": 3}));
    assert_eq!(payloads[5]["old_data"], Value::Null);
    // REPLICA IDENTITY FULL: the whole old row.
    assert_eq!(payloads[7]["old_data"], json!({"id": 7, "name": "seven"}));
    assert_eq!(payloads[8]["data"], json!({"id": 7, "name": "SEVEN"}));
    assert_eq!(payloads[8]["old_data"], json!({"id": 7, "name": "SEVEN"}));
    assert_eq!(payloads[9]["table_name"], table.as_str());
    // Timestamps are commit times; one transaction's changes share one.
    let parse =
        |payload: &Value| humantime::parse_rfc3339(payload["timestamp"].as_str().unwrap()).unwrap();
    assert_eq!(payloads[1]["timestamp"], payloads[2]["timestamp"]);
    assert_ne!(payloads[2]["timestamp"], payloads[3]["timestamp"]);
    for payload in &payloads[1..] {
        let at = parse(payload);
        assert!(
            at >= before - Duration::from_secs(1) && at <= after + Duration::from_secs(1),
            "{payload}"
        );
    }
    // Ids: the commit LSN in the high bits, the position in the low bits.
    let messages = pipeline.bus.messages(&pipeline.stream, "changes");
    let ids: HashSet<u128> = messages.iter().map(|message| message.id).collect();
    assert_eq!(ids.len(), messages.len(), "distinct ids");
    assert_eq!(messages[1].id >> 64, messages[2].id >> 64);
    assert_eq!((messages[1].id as u32, messages[2].id as u32), (0, 1));
    assert!(messages[3].id >> 64 > messages[2].id >> 64);
    drop_slot(&pool, &slot_of(&key)).await;
}

#[tokio::test]
async fn refused_sends_leave_the_slot_where_it_was_and_the_changes_come_once_accepted() {
    let pool = connect(&database_url()).await;
    let table = named_rows(&pool, "cdc_refused").await;
    let key = unique("cdc_refused");
    let slot = slot_of(&key);
    let bus = MemoryBus::new();
    bus.refuse_sends(u32::MAX);
    let pipeline = Pipeline::start_streaming(&pool, &key, &[&table], "", bus).await;
    let start = confirmed_flush(&pool, &slot).await.unwrap();
    execute(
        &pool,
        &format!("INSERT INTO {table} SELECT n, 'row ' || n FROM generate_series(1, 50) AS n"),
    )
    .await;
    wait_for("three NACKs", WAIT, || async {
        pipeline.view().metrics.nacks.get() >= 3
    })
    .await;
    assert_eq!(
        confirmed_flush(&pool, &slot).await,
        Some(start),
        "confirmed_flush_lsn moved while Iggy refused every send"
    );
    pipeline.bus.refuse_sends(0);
    pipeline.wait_for_count(50).await;
    wait_for("the slot to advance", WAIT, || async {
        confirmed_flush(&pool, &slot)
            .await
            .is_some_and(|lsn| lsn > start)
    })
    .await;
    pipeline.runtime.shutdown().await;
    let ids: Vec<i64> = pipeline
        .payloads()
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, (1..=50).collect::<Vec<_>>());
    drop_slot(&pool, &slot).await;
}

#[tokio::test]
async fn the_wal_past_the_slots_confirmed_position_is_reported_as_lag_until_delivered() {
    let pool = connect(&database_url()).await;
    let table = named_rows(&pool, "cdc_lag").await;
    let key = unique("cdc_lag");
    let slot = slot_of(&key);
    let bus = MemoryBus::new();
    bus.refuse_sends(u32::MAX);
    let pipeline = Pipeline::start_streaming(&pool, &key, &[&table], "", bus).await;
    let before = current_wal(&pool).await;
    execute(
        &pool,
        &format!(
            "INSERT INTO {table} SELECT n, repeat('x', 1000) FROM generate_series(1, 5000) AS n"
        ),
    )
    .await;
    let written = current_wal(&pool).await - before;
    let lag_bytes = || pipeline.view().lag.and_then(|lag| lag.bytes);
    wait_for("the insert's WAL reported as lag", WAIT, || async {
        lag_bytes().is_some_and(|bytes| bytes >= written)
    })
    .await;
    let lag = pipeline.view().lag.unwrap();
    assert_eq!((lag.messages, lag.partitions.len()), (None, 0));
    pipeline.bus.refuse_sends(0);
    pipeline.wait_for_count(5000).await;
    // Other tests write WAL into the same server meanwhile, so the lag does
    // not fall under a fixed figure; what it must show is the slot confirmed
    // past (at least) half the insert: the WAL written since `before`, less
    // the lag, is what the slot confirmed since.
    wait_for("the lag to drop once delivered", WAIT, || async {
        let since_before = current_wal(&pool).await - before;
        lag_bytes().is_some_and(|bytes| bytes + written / 2 < since_before)
    })
    .await;
    pipeline.runtime.shutdown().await;
    drop_slot(&pool, &slot).await;
}

async fn current_wal(pool: &PgPool) -> u64 {
    let text: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await
        .unwrap();
    iggy_connect::connectors::postgres::source::parse_lsn(&text).unwrap()
}

#[tokio::test]
async fn a_restart_resumes_from_the_saved_position_without_loss_or_repeats() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_restart");
    execute(
        &pool,
        &format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT); \
             INSERT INTO {table} SELECT n, 'row ' || n FROM generate_series(1, 30) AS n"
        ),
    )
    .await;
    let key = unique("cdc_restart");
    let state: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new());
    let bus = MemoryBus::new();
    let config = cdc_config(&[&table], "batch_size = 7");
    let first = Pipeline::start_cdc(&key, &config, bus.clone(), state.clone()).await;
    first.wait_for_count(30).await;
    for id in 31..=60 {
        execute(
            &pool,
            &format!("INSERT INTO {table} VALUES ({id}, 'row {id}')"),
        )
        .await;
    }
    first.wait_for_count(40).await;
    first.runtime.shutdown().await;
    // Changes made while the connector is down.
    for id in 61..=90 {
        execute(
            &pool,
            &format!("INSERT INTO {table} VALUES ({id}, 'row {id}')"),
        )
        .await;
    }
    let second = Pipeline::start_cdc(&key, &config, bus, state).await;
    second.wait_for_count(90).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.runtime.shutdown().await;
    let ids: Vec<i64> = second
        .payloads()
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=90).collect::<Vec<_>>(),
        "every row once, in order"
    );
    drop_slot(&pool, &slot_of(&key)).await;
}

#[tokio::test]
async fn an_interrupted_snapshot_resumes_after_its_last_delivered_key_and_streams_what_changed() {
    let pool = connect(&database_url()).await;
    let table = named_rows(&pool, "cdc_snapshot").await;
    let slot = unique("cdc_snapshot_slot");
    let config = json!({
        "connection_string": database_url(),
        "mode": "cdc",
        "tables": [table],
        "replication_slot": slot,
        "batch_size": 100,
        "poll_interval": "20ms",
    });
    let mut source = build("postgres", config.clone());
    source.open(None).await.unwrap();
    // After the slot exists, before the snapshot: these inserts are in the
    // slot and in the snapshot; they must come once.
    execute(
        &pool,
        &format!("INSERT INTO {table} SELECT n, 'row ' || n FROM generate_series(1, 1000) AS n"),
    )
    .await;
    let mut first = Vec::new();
    let state = drain(source.as_ref(), &mut first, WAIT, |payloads| {
        payloads.len() >= 300
    })
    .await
    .unwrap();
    // One more batch polled, never committed: the process dies here.
    let lost = source.poll().await.unwrap();
    assert_eq!(lost.records.len(), 100);
    source.close().await.unwrap();
    execute(
        &pool,
        &format!(
            "UPDATE {table} SET name = 'changed' WHERE id IN (50, 700); DELETE FROM {table} WHERE id = 800; \
             INSERT INTO {table} VALUES (1001, 'late')"
        ),
    )
    .await;
    let mut source = build("postgres", config);
    source.open(Some(&state)).await.unwrap();
    let mut second = Vec::new();
    let streamed = |payloads: &[Value]| {
        payloads
            .iter()
            .filter(|payload| payload["operation_type"] != "SELECT")
            .count()
    };
    drain(source.as_ref(), &mut second, WAIT, |payloads| {
        streamed(payloads) >= 4
    })
    .await;
    // Nothing else is pending in the slot.
    let batch = source.poll().await.unwrap();
    assert!(batch.records.is_empty(), "{:?}", batch.records.len());
    source.close().await.unwrap();

    let ids = |payloads: &[Value], operation: &str| -> Vec<i64> {
        payloads
            .iter()
            .filter(|payload| payload["operation_type"] == operation)
            .map(|payload| payload["data"]["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(ids(&first, "SELECT"), (1..=300).collect::<Vec<_>>());
    let mut resumed: Vec<i64> = (301..=1001).filter(|id| *id != 800).collect();
    resumed.sort_unstable();
    assert_eq!(ids(&second, "SELECT"), resumed, "resumed after key 300");
    assert_eq!(ids(&second, "UPDATE"), [50, 700]);
    assert_eq!(ids(&second, "DELETE"), [800]);
    assert_eq!(
        ids(&second, "INSERT"),
        [1001],
        "the snapshot's own inserts are not streamed"
    );
    drop_slot(&pool, &slot).await;
}

#[tokio::test]
async fn two_connectors_have_slots_of_their_own_and_a_shared_slot_is_refused() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_two");
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY)"),
    )
    .await;
    let state: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new());
    let (left, right) = (unique("cdc_left"), unique("cdc_right"));
    let config = cdc_config(&[&table], "snapshot = \"never\"");
    let one = Pipeline::start_cdc(&left, &config, MemoryBus::new(), state.clone()).await;
    let two = Pipeline::start_cdc(&right, &config, MemoryBus::new(), state.clone()).await;
    for slot in [slot_of(&left), slot_of(&right)] {
        wait_for("both slots", WAIT, || async {
            confirmed_flush(&pool, &slot).await.is_some()
        })
        .await;
    }
    execute(
        &pool,
        &format!("INSERT INTO {table} SELECT generate_series(1, 20)"),
    )
    .await;
    one.wait_for_count(20).await;
    two.wait_for_count(20).await;
    // A third connector naming the first one's slot may not share it.
    let shared = unique("cdc_shared");
    let three = Pipeline::start_cdc(
        &shared,
        &cdc_config(
            &[&table],
            &format!(
                "snapshot = \"never\"\nreplication_slot = \"{}\"",
                slot_of(&left)
            ),
        ),
        MemoryBus::new(),
        state,
    )
    .await;
    wait_for("the third connector to fail", WAIT, || async {
        three.view().status.status == Status::Error
    })
    .await;
    let message = three.view().status.last_error.unwrap().message;
    assert!(message.contains("in use by another"), "{message}");
    for pipeline in [&one, &two, &three] {
        pipeline.runtime.shutdown().await;
    }
    assert_eq!(one.payloads().len(), 20);
    assert_eq!(two.payloads().len(), 20);
    drop_slot(&pool, &slot_of(&left)).await;
    drop_slot(&pool, &slot_of(&right)).await;
}

#[tokio::test]
async fn a_slot_of_another_plugin_is_refused_naming_it_and_lag_past_the_warning_degrades() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_plugin");
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY)"),
    )
    .await;
    let slot = unique("cdc_test_decoding");
    execute(
        &pool,
        &format!("SELECT pg_create_logical_replication_slot('{slot}', 'test_decoding')"),
    )
    .await;
    let key = unique("cdc_plugin");
    let wrong = Pipeline::start_cdc(
        &key,
        &cdc_config(&[&table], &format!("replication_slot = \"{slot}\"")),
        MemoryBus::new(),
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    wait_for("the start to fail", WAIT, || async {
        wrong.view().status.status == Status::Error
    })
    .await;
    let message = wrong.view().status.last_error.unwrap().message;
    assert!(
        message.contains("test_decoding") && message.contains(&slot),
        "{message}"
    );
    wrong.runtime.shutdown().await;
    drop_slot(&pool, &slot).await;

    let key = unique("cdc_lag");
    let lagging = Pipeline::start_cdc(
        &key,
        &cdc_config(&[&table], "slot_lag_warning = 1\nsnapshot = \"never\""),
        MemoryBus::new(),
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    execute(
        &pool,
        &format!("INSERT INTO {table} SELECT generate_series(1, 10)"),
    )
    .await;
    wait_for("degraded", WAIT, || async {
        lagging.view().degraded.is_some()
    })
    .await;
    let reason = lagging.view().degraded.unwrap();
    assert!(reason.contains("slot_lag_warning = 1"), "{reason}");
    lagging.runtime.shutdown().await;
    drop_slot(&pool, &slot_of(&key)).await;
}

/// Upstream's own example file, switched to `mode = "cdc"` and pointed at
/// the test database, runs as it is.
#[tokio::test]
async fn upstream_example_file_in_cdc_mode_runs_against_the_test_database() {
    let pool = connect(&database_url()).await;
    let (users, orders) = (unique("users"), unique("orders"));
    for table in [&users, &orders] {
        execute(
            &pool,
            &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT)"),
        )
        .await;
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/postgres_source.toml"))
        .find(|path| path.is_file())
        .expect("upstream's postgres_source.toml");
    let key = unique("cdc_upstream");
    let stream = unique("user_events");
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace(
            "postgresql://user:pass@localhost:5432/database",
            &database_url(),
        )
        .replace("mode = \"polling\"", "mode = \"cdc\"")
        .replace(
            "[\"users\", \"orders\"]",
            &format!("[\"{users}\", \"{orders}\"]"),
        )
        .replace("key = \"postgres\"", &format!("key = \"{key}\""))
        .replace(
            "stream = \"user_events\"",
            &format!("stream = \"{stream}\""),
        );
    assert!(
        text.contains("mode = \"cdc\"") && text.contains(&users),
        "{text}"
    );
    let (config, _) = iggy_connect::config::parse_connector_file(
        std::path::Path::new("postgres_source.toml"),
        &text,
        &iggy_connect::config::env::EnvVars::from_pairs(Vec::new()),
    )
    .unwrap();
    execute(&pool, &format!("INSERT INTO {users} VALUES (1, 'ada')")).await;
    let bus = MemoryBus::new();
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    // The snapshot (one batch: both tables fit) is done once its row is in.
    wait_for("the snapshot", WAIT, || async {
        !bus.messages(&stream, "users").is_empty()
    })
    .await;
    execute(
        &pool,
        &format!("INSERT INTO {users} VALUES (2, 'bob'); INSERT INTO {orders} VALUES (9, 'book')"),
    )
    .await;
    wait_for("both changes", WAIT, || async {
        bus.messages(&stream, "users").len() >= 3
    })
    .await;
    runtime.shutdown().await;
    let tables: Vec<String> = bus
        .messages(&stream, "users")
        .iter()
        .map(|message| {
            let payload: Value = serde_json::from_slice(&message.payload).unwrap();
            format!(
                "{} {}",
                payload["table_name"].as_str().unwrap(),
                payload["operation_type"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        tables,
        [
            format!("{users} SELECT"),
            format!("{users} INSERT"),
            format!("{orders} INSERT")
        ]
    );
    drop_slot(&pool, &slot_of(&key)).await;
}

/// The process died after the batch's state was saved and before `commit`
/// advanced the slot: the restart skips what the state says was delivered.
#[tokio::test]
async fn a_batch_saved_but_not_acknowledged_to_the_slot_is_not_produced_again() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_unacked");
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY)"),
    )
    .await;
    let slot = unique("cdc_unacked_slot");
    let config = json!({
        "connection_string": database_url(),
        "mode": "cdc",
        "tables": [table],
        "replication_slot": slot,
        "snapshot": "never",
        "poll_interval": "20ms",
    });
    let mut source = build("postgres", config.clone());
    source.open(None).await.unwrap();
    let start = confirmed_flush(&pool, &slot).await.unwrap();
    execute(
        &pool,
        &format!("INSERT INTO {table} SELECT generate_series(1, 10); INSERT INTO {table} SELECT generate_series(11, 15)"),
    )
    .await;
    let batch = source.poll().await.unwrap();
    assert_eq!(batch.records.len(), 15);
    let saved = batch.state.unwrap();
    source.close().await.unwrap();
    assert_eq!(
        confirmed_flush(&pool, &slot).await,
        Some(start),
        "no commit, no advance"
    );

    let mut source = build("postgres", config);
    source.open(Some(&saved)).await.unwrap();
    execute(
        &pool,
        &format!("INSERT INTO {table} SELECT generate_series(16, 18)"),
    )
    .await;
    let mut again = Vec::new();
    drain(source.as_ref(), &mut again, WAIT, |payloads| {
        payloads.len() >= 3
    })
    .await;
    source.close().await.unwrap();
    let ids: Vec<i64> = again
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [16, 17, 18]);
    drop_slot(&pool, &slot).await;
}

/// Changes to tables outside the publication hold the slot back; an idle
/// source writes a heartbeat so its slot moves on and the WAL is released.
#[tokio::test]
async fn an_idle_source_lets_its_slot_move_past_other_tables_wal() {
    let pool = connect(&database_url()).await;
    let (table, other) = (unique("cdc_idle"), unique("cdc_busy"));
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY); CREATE TABLE {other} (id BIGINT, body TEXT)"),
    )
    .await;
    let key = unique("cdc_idle");
    let slot = slot_of(&key);
    let pipeline = Pipeline::start_streaming(
        &pool,
        &key,
        &[&table],
        "slot_lag_warning = 2097152",
        MemoryBus::new(),
    )
    .await;
    execute(
        &pool,
        &format!(
            "INSERT INTO {other} SELECT n, repeat('x', 200) FROM generate_series(1, 20000) AS n"
        ),
    )
    .await;
    let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    let written = iggy_connect::connectors::postgres::source::parse_lsn(&written).unwrap();
    wait_for("the slot to pass the other table's WAL", WAIT, || async {
        confirmed_flush(&pool, &slot)
            .await
            .is_some_and(|lsn| lsn >= written)
    })
    .await;
    pipeline.runtime.shutdown().await;
    assert!(
        pipeline.payloads().is_empty(),
        "nothing of the other table is produced"
    );
    drop_slot(&pool, &slot).await;
}

/// The replication connection stays open while nothing changes: it answers
/// the walsender's keepalives, so a `wal_sender_timeout` of one second does
/// not end it, and the idle polls do not reconnect. What it reports is only
/// what was committed: WAL written meanwhile to a table outside the
/// publication (which the keepalives' `wal_end` moves past) does not take
/// `confirmed_flush_lsn` beyond the LSN in the saved state (which a heartbeat
/// may move, once the slot retains enough WAL).
#[tokio::test]
async fn an_idle_stream_outlives_wal_sender_timeout_and_confirms_only_committed_changes() {
    let pool = connect(&database_url()).await;
    let (table, other) = (unique("cdc_keepalive"), unique("cdc_elsewhere"));
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY); CREATE TABLE {other} (id BIGINT)"),
    )
    .await;
    let key = unique("cdc_keepalive");
    let slot = slot_of(&key);
    // Only this connector's sessions (its walsender too) get the short timeout.
    let config = format!(
        "connection_string = \"{}?options=-c%20wal_sender_timeout%3D1s\"\nmode = \"cdc\"\n\
         tables = [\"{table}\"]\npoll_interval = \"20ms\"\nsnapshot = \"never\"",
        database_url()
    );
    let state: Arc<dyn StateStore> = Arc::new(MemoryStateStore::new());
    let pipeline = Pipeline::start_cdc(&key, &config, MemoryBus::new(), state.clone()).await;
    slot_made(&pool, &slot).await;
    let start = confirmed_flush(&pool, &slot).await.unwrap();
    execute(&pool, &format!("INSERT INTO {table} VALUES (1)")).await;
    pipeline.wait_for_count(1).await;
    wait_for("the commit to reach the slot", WAIT, || async {
        confirmed_flush(&pool, &slot)
            .await
            .is_some_and(|lsn| lsn > start)
    })
    .await;
    let committed = confirmed_flush(&pool, &slot).await.unwrap();
    let walsender: i32 = sqlx::query_scalar(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active",
    )
    .bind(&slot)
    .fetch_one(&pool)
    .await
    .unwrap();
    execute(
        &pool,
        &format!("INSERT INTO {other} SELECT generate_series(1, 1000)"),
    )
    .await;
    let idle_from: String = sqlx::query_scalar("SELECT now()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    wait_for(
        "replies three timeouts later on the same connection",
        WAIT,
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT reply_time > $1::timestamptz + interval '3 s' FROM pg_stat_replication WHERE pid = $2",
            )
            .bind(&idle_from)
            .bind(walsender)
            .fetch_optional(&pool)
            .await
            .unwrap()
            .unwrap_or(false)
        },
    )
    .await;
    // Read in this order: the saved LSN only grows.
    let confirmed = confirmed_flush(&pool, &slot).await.unwrap();
    let saved = state.load(&key).await.unwrap().expect("a saved state");
    let saved: CdcState = iggy_connect::connectors::decode_state(&saved.data).unwrap();
    assert!(
        committed <= saved.lsn && confirmed <= saved.lsn,
        "confirmed_flush_lsn {confirmed:X} is past the saved LSN {:X}",
        saved.lsn
    );
    execute(&pool, &format!("INSERT INTO {table} VALUES (2)")).await;
    pipeline.wait_for_count(2).await;
    let active: Option<i32> =
        sqlx::query_scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1")
            .bind(&slot)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(active, Some(walsender), "the stream was reconnected");
    pipeline.runtime.shutdown().await;
    drop_slot(&pool, &slot).await;
}

/// The server ends the replication connection (its walsender is
/// terminated): the poll fails as transient, the next one starts
/// replication again, and every change arrives once.
#[tokio::test]
async fn a_terminated_replication_connection_is_reopened_and_nothing_is_lost_or_repeated() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_terminated");
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY)"),
    )
    .await;
    let key = unique("cdc_terminated");
    let slot = slot_of(&key);
    let pipeline =
        Pipeline::start_streaming(&pool, &key, &[&table], "batch_size = 5", MemoryBus::new()).await;
    let walsender = || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot)
        .fetch_optional(&pool)
        .await
        .unwrap()
        .flatten()
    };
    let mut terminated = Vec::new();
    for round in 0..3 {
        for id in round * 20 + 1..=round * 20 + 20 {
            execute(&pool, &format!("INSERT INTO {table} VALUES ({id})")).await;
        }
        wait_for("a new walsender", WAIT, || async {
            walsender()
                .await
                .is_some_and(|pid| !terminated.contains(&pid))
        })
        .await;
        let pid = walsender().await.unwrap();
        execute(&pool, &format!("SELECT pg_terminate_backend({pid})")).await;
        terminated.push(pid);
    }
    pipeline.wait_for_count(60).await;
    // Nothing more comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    wait_for("replication to start again", WAIT, || async {
        walsender()
            .await
            .is_some_and(|pid| !terminated.contains(&pid))
    })
    .await;
    pipeline.runtime.shutdown().await;
    let ids: Vec<i64> = pipeline
        .payloads()
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        (1..=60).collect::<Vec<_>>(),
        "every row once, in order"
    );
    drop_slot(&pool, &slot).await;
}

/// A transaction larger than `batch_size` goes out in several batches; the
/// slot stays before it until its last batch is committed, and a restart
/// from the state of a batch inside it produces the rest, nothing twice.
#[tokio::test]
async fn a_transaction_larger_than_a_batch_is_cut_and_resumed_inside_after_a_restart() {
    let pool = connect(&database_url()).await;
    let table = named_rows(&pool, "cdc_cut").await;
    let slot = unique("cdc_cut_slot");
    let config = json!({
        "connection_string": database_url(),
        "mode": "cdc",
        "tables": [table],
        "replication_slot": slot,
        "snapshot": "never",
        "poll_interval": "20ms",
        "batch_size": 10,
    });
    let mut source = build("postgres", config.clone());
    source.open(None).await.unwrap();
    let start = confirmed_flush(&pool, &slot).await.unwrap();
    execute(
        &pool,
        &format!(
            "INSERT INTO {table} SELECT n, 'row ' || n FROM generate_series(1, 25) AS n; \
             INSERT INTO {table} VALUES (26, 'after')"
        ),
    )
    .await;
    let ids = |records: &[iggy_connect::message::SourceRecord]| -> Vec<i64> {
        records
            .iter()
            .map(|record| {
                let payload: Value = serde_json::from_slice(&record.payload.to_bytes()).unwrap();
                payload["data"]["id"].as_i64().unwrap()
            })
            .collect()
    };
    let first = source.poll().await.unwrap();
    assert_eq!(ids(&first.records), (1..=10).collect::<Vec<_>>());
    let saved = first.state.unwrap();
    let state: CdcState = iggy_connect::connectors::decode_state(&saved).unwrap();
    assert_eq!(
        state.partial.as_ref().map(|partial| partial.delivered),
        Some(10),
        "the state names the cut transaction"
    );
    source.commit().await.unwrap();
    let second = source.poll().await.unwrap();
    assert_eq!(ids(&second.records), (11..=20).collect::<Vec<_>>());
    source.commit().await.unwrap();
    // Ids: the transaction's commit LSN, positions going on across batches.
    let (last, next) = (first.records[9].id.unwrap(), second.records[0].id.unwrap());
    assert_eq!(last >> 64, next >> 64);
    assert_eq!((last as u32, next as u32), (9, 10));
    // The third batch (21..25 and the next transaction) is polled, not
    // committed: the process dies with it in flight.
    let third = source.poll().await.unwrap();
    assert_eq!(ids(&third.records), (21..=26).collect::<Vec<_>>());
    let after_second = second.state.unwrap();
    source.close().await.unwrap();
    assert_eq!(
        confirmed_flush(&pool, &slot).await,
        Some(start),
        "the slot does not pass a transaction whose last batch is not committed"
    );

    let mut source = build("postgres", config);
    source.open(Some(&after_second)).await.unwrap();
    let mut again = Vec::new();
    drain(source.as_ref(), &mut again, WAIT, |payloads| {
        payloads.len() >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let more = source.poll().await.unwrap();
    source.commit().await.unwrap();
    assert!(more.records.is_empty(), "nothing more after the rest");
    wait_for("the slot to pass the transactions", WAIT, || async {
        confirmed_flush(&pool, &slot)
            .await
            .is_some_and(|lsn| lsn > start)
    })
    .await;
    source.close().await.unwrap();
    let ids: Vec<i64> = again
        .iter()
        .map(|payload| payload["data"]["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, (21..=26).collect::<Vec<_>>(), "the rest, once");
    drop_slot(&pool, &slot).await;
}

/// Streamed rows are written by the source itself for common types and by
/// PostgreSQL for the others; either way `data` is what `row_to_json` gives
/// for the row (as the polling mode and the snapshot render it).
#[tokio::test]
async fn streamed_rows_of_every_common_type_equal_row_to_json_of_the_same_row() {
    let pool = connect(&database_url()).await;
    let table = unique("cdc_types");
    execute(
        &pool,
        &format!(
            "CREATE TABLE {table} (id BIGINT PRIMARY KEY, small SMALLINT, whole INT, \
               amount NUMERIC(20,4), real_value REAL, double_value DOUBLE PRECISION, flag BOOLEAN, \
               name TEXT, code CHAR(4), label VARCHAR(20), uid UUID, doc JSON, docb JSONB, \
               day DATE, at TIMESTAMP, at_tz TIMESTAMPTZ, tags TEXT[], span INTERVAL, raw BYTEA, \
               \"Mixed \"\"Name\" TEXT)"
        ),
    )
    .await;
    let key = unique("cdc_types");
    let pipeline = Pipeline::start_streaming(&pool, &key, &[&table], "", MemoryBus::new()).await;
    execute(
        &pool,
        &format!(
            "INSERT INTO {table} VALUES \
             (1, -32768, 2147483647, -12345678.1234, 1.5e10, 0.1, true, E'quote \" back \\\\ nl \\n tab \\t ctl \\x01 é 😀', \
              'ab', 'x', 'ae8faaf6-7877-4895-ae4e-f2b230d55023', '{{\"a\" : [1, 2]}}', '{{\"b\": {{\"c\": null}}}}', \
              '2024-02-29', '2024-01-02 03:04:05.5', '2024-01-02 03:04:05.123456+05:30', NULL, NULL, NULL, 'mixed'), \
             (2, NULL, 0, 'NaN', '-Infinity', 'Infinity', false, '', NULL, NULL, NULL, 'null', '[]', \
              'infinity', '-infinity', 'infinity', NULL, NULL, NULL, NULL), \
             (3, 1, -1, 0.0001, -0.0, 1e-300, NULL, 'x', NULL, NULL, NULL, NULL, NULL, \
              '2024-01-01', '10000-01-01 00:00:00', '2024-06-30 23:59:59+00', NULL, NULL, NULL, NULL), \
             (4, 1, 1, 1, 1, 1, true, 'left to PostgreSQL', 'c', 'v', NULL, '{{}}', '{{}}', \
              '0044-03-15 BC', '2024-01-01 00:00:00', '2024-01-01 00:00:00+00', '{{a,\"b c\"}}', \
              '1 day 2 hours', '\\x00ff', 'arrays, intervals, bytea, BC dates')"
        ),
    )
    .await;
    pipeline.wait_for_count(4).await;
    pipeline.runtime.shutdown().await;
    let expected: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT row_to_json(t)::text FROM {table} AS t ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    let payloads = pipeline.payloads();
    assert_eq!(payloads.len(), 4);
    for (payload, expected) in payloads.iter().zip(&expected) {
        let expected: Value = serde_json::from_str(expected).unwrap();
        assert_eq!(payload["data"], expected);
    }
    drop_slot(&pool, &slot_of(&key)).await;
}
