//! The postgres source against a real PostgreSQL (start it with
//! `scripts/with-postgres.sh`), driven by the real runtime over the in-memory bus.
#![cfg(feature = "postgres-source")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::engine::Status;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::{MemoryStateStore, StateStore};
use serde_json::Value;
use sqlx::PgPool;

use crate::support::postgres::{Pipeline, connect, count, database_url, execute, unique, wait_for};
use crate::support::proxy::Proxy;

const WAIT: Duration = Duration::from_secs(30);

impl Pipeline {
    async fn start(plugin_config: &str, bus: MemoryBus, state: Arc<dyn StateStore>) -> Self {
        let key = unique("pg_source");
        Self::start_with_key(key, "json", plugin_config, bus, state).await
    }

    async fn start_with_key(
        key: String,
        schema: &str,
        plugin_config: &str,
        bus: MemoryBus,
        state: Arc<dyn StateStore>,
    ) -> Self {
        Self::launch(key, "rows", schema, plugin_config, bus, state).await
    }

    /// `data.id` of every delivered row, in delivery order.
    fn ids(&self) -> Vec<i64> {
        self.payloads()
            .iter()
            .map(|payload| payload["data"]["id"].as_i64().unwrap())
            .collect()
    }

    fn status(&self) -> iggy_connect::engine::StatusSnapshot {
        self.view().status
    }

    fn nacks(&self) -> u64 {
        self.view().metrics.nacks.get()
    }
}

fn plugin_config(table: &str, extra: &str) -> String {
    format!(
        "connection_string = \"{}\"\nmode = \"polling\"\ntables = [\"{table}\"]\npoll_interval = \"20ms\"\n{extra}",
        database_url()
    )
}

async fn create_rows(pool: &PgPool, table: &str, extra_columns: &str, rows: i64) {
    execute(
        pool,
        &format!(
            "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, amount NUMERIC(10,2), \
             created_at TIMESTAMPTZ NOT NULL DEFAULT now(){extra_columns})"
        ),
    )
    .await;
    insert_rows(pool, table, rows).await;
}

async fn insert_rows(pool: &PgPool, table: &str, rows: i64) {
    execute(
        pool,
        &format!(
            "INSERT INTO {table} (name, amount) SELECT 'row ' || n, n * 1.5 FROM generate_series(1, {rows}) AS n"
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
async fn cursor_mode_delivers_every_row_once_in_upstream_record_shape_and_follows_new_rows() {
    let pool = connect(&database_url()).await;
    let table = unique("src_cursor");
    create_rows(&pool, &table, "", 2500).await;
    let pipeline = Pipeline::start(
        &plugin_config(&table, "batch_size = 1000"),
        MemoryBus::new(),
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    pipeline.wait_for_count(2500).await;
    insert_rows(&pool, &table, 10).await;
    pipeline.wait_for_count(2510).await;
    pipeline.runtime.shutdown().await;

    assert_each_once(&pipeline.ids(), 1..=2510);
    let first = &pipeline.payloads()[0];
    assert_eq!(first["table_name"], table.as_str());
    assert_eq!(first["operation_type"], "SELECT");
    assert!(first["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(first["old_data"], Value::Null);
    assert_eq!(first["data"]["name"], "row 1");
    assert_eq!(first["data"]["amount"], serde_json::json!(1.5));
    let messages = pipeline.bus.messages(&pipeline.stream, "rows");
    assert_eq!(messages[0].id as u64, 1, "the key is the id's low 64 bits");
}

/// Rule O1: the database cannot be reached when the runtime starts (a relay
/// in front of it refuses every connection). The source keeps trying, and
/// once the database can be reached it delivers every row once, with no
/// restart and no API call.
#[tokio::test]
async fn a_database_unreachable_at_start_delivers_every_row_once_it_is_reachable() {
    let pool = connect(&database_url()).await;
    let table = unique("src_down_at_start");
    create_rows(&pool, &table, "", 300).await;
    let mut url = reqwest::Url::parse(&database_url()).unwrap();
    let host = match url.host_str() {
        Some("localhost") | None => "127.0.0.1".to_owned(),
        Some(host) => host.to_owned(),
    };
    let proxy = Proxy::start(
        format!("{host}:{}", url.port().unwrap_or(5432))
            .parse()
            .unwrap(),
    )
    .await;
    proxy.set_down(true);
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(proxy.addr.port())).unwrap();
    let config = plugin_config(&table, "batch_size = 100").replace(&database_url(), url.as_str());
    let pipeline =
        Pipeline::start(&config, MemoryBus::new(), Arc::new(MemoryStateStore::new())).await;
    wait_for(
        "the source to report the unreachable database",
        WAIT,
        || async { pipeline.status().last_error.is_some() },
    )
    .await;
    assert!(pipeline.ids().is_empty());
    proxy.set_down(false);
    pipeline.wait_for_count(300).await;
    pipeline.runtime.shutdown().await;
    assert_each_once(&pipeline.ids(), 1..=300);
}

#[tokio::test]
async fn cursor_mode_redelivers_a_refused_batch_and_skips_nothing() {
    let pool = connect(&database_url()).await;
    let table = unique("src_nack");
    create_rows(&pool, &table, "", 300).await;
    let bus = MemoryBus::new();
    bus.refuse_sends(3);
    let pipeline = Pipeline::start(
        &plugin_config(&table, "batch_size = 100"),
        bus,
        Arc::new(MemoryStateStore::new()),
    )
    .await;
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
    let pool = connect(&database_url()).await;
    let table = unique("src_destructive");
    create_rows(&pool, &table, extra_columns, 300).await;
    let bus = MemoryBus::new();
    bus.refuse_sends(4);
    let pipeline = Pipeline::start(
        &plugin_config(&table, &format!("batch_size = 100\n{settings}")),
        bus,
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    wait_for("two NACKs", WAIT, || async { pipeline.nacks() >= 2 }).await;
    let remaining = remaining_sql.replace("$table", &table);
    assert!(pipeline.bus.messages(&pipeline.stream, "rows").is_empty());
    assert_eq!(
        count(&pool, &remaining).await,
        300,
        "no row may be consumed before its batch is delivered"
    );
    pipeline.wait_for_count(300).await;
    wait_for("every row consumed", WAIT, || async {
        count(&pool, &remaining).await == 0
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
        "SELECT count(*) FROM $table",
    )
    .await;
}

#[tokio::test]
async fn processed_column_marks_rows_only_after_their_batch_is_committed() {
    destructive_mode_consumes_rows_only_after_commit(
        ", done BOOLEAN NOT NULL DEFAULT FALSE",
        "processed_column = \"done\"",
        "SELECT count(*) FROM $table WHERE NOT done",
    )
    .await;
}

#[tokio::test]
async fn custom_query_reads_through_its_placeholders_at_least_once_under_refused_sends() {
    let pool = connect(&database_url()).await;
    let table = unique("src_custom");
    create_rows(&pool, &table, "", 300).await;
    let bus = MemoryBus::new();
    bus.refuse_sends(2);
    let query = "SELECT * FROM $table WHERE id > $offset AND id % 3 <> 0 \
                 AND created_at <= '$now'::timestamptz AND $now_unix > 0 ORDER BY id LIMIT $limit";
    let pipeline = Pipeline::start(
        &plugin_config(
            &table,
            &format!("batch_size = 50\ninitial_offset = 0\ncustom_query = \"{query}\""),
        ),
        bus,
        Arc::new(MemoryStateStore::new()),
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
    let pool = connect(&database_url()).await;
    let table = unique("src_ties");
    execute(
        &pool,
        &format!(
            "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, name TEXT, updated_at TIMESTAMPTZ NOT NULL); \
             INSERT INTO {table} (name, updated_at) \
             SELECT 'row ' || n, TIMESTAMPTZ '2024-01-01' + ((n - 1) / 30) * INTERVAL '1 second' \
             FROM generate_series(1, 250) AS n"
        ),
    )
    .await;
    let pipeline = Pipeline::start(
        &plugin_config(&table, "batch_size = 100\ntracking_column = \"updated_at\""),
        MemoryBus::new(),
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    pipeline.wait_for_count(250).await;
    // One more poll round must not bring anything back.
    tokio::time::sleep(Duration::from_millis(200)).await;
    pipeline.runtime.shutdown().await;
    assert_each_once(&pipeline.ids(), 1..=250);
}

#[tokio::test]
async fn every_configured_table_is_read_with_its_own_cursor() {
    let pool = connect(&database_url()).await;
    let (left, right) = (unique("src_left"), unique("src_right"));
    create_rows(&pool, &left, "", 120).await;
    create_rows(&pool, &right, "", 80).await;
    let config = format!(
        "connection_string = \"{}\"\ntables = [\"{left}\", \"{right}\"]\npoll_interval = \"20ms\"\nbatch_size = 50",
        database_url()
    );
    let pipeline =
        Pipeline::start(&config, MemoryBus::new(), Arc::new(MemoryStateStore::new())).await;
    pipeline.wait_for_count(200).await;
    insert_rows(&pool, &right, 5).await;
    pipeline.wait_for_count(205).await;
    pipeline.runtime.shutdown().await;
    let mut per_table: HashMap<String, Vec<i64>> = HashMap::new();
    for payload in pipeline.payloads() {
        per_table
            .entry(payload["table_name"].as_str().unwrap().to_owned())
            .or_default()
            .push(payload["data"]["id"].as_i64().unwrap());
    }
    assert_each_once(&per_table[&left], 1..=120);
    assert_each_once(&per_table[&right], 1..=85);
}

#[tokio::test]
async fn payload_column_formats_produce_the_column_as_the_payload() {
    let pool = connect(&database_url()).await;
    let table = unique("src_payload");
    execute(
        &pool,
        &format!(
            "CREATE TABLE {table} (id SERIAL PRIMARY KEY, body BYTEA, note TEXT, doc JSONB); \
             INSERT INTO {table} (body, note, doc) VALUES \
             ('\\x00ff'::bytea, 'hello', '{{\"a\": 1}}'), (NULL, 'second', '[1, 2]')"
        ),
    )
    .await;
    for (schema, settings, expected) in [
        (
            "raw",
            "payload_column = \"body\"\npayload_format = \"bytea\"",
            vec![vec![0x00u8, 0xff], vec![]],
        ),
        (
            "text",
            "payload_column = \"note\"\npayload_format = \"text\"",
            vec![b"hello".to_vec(), b"second".to_vec()],
        ),
        (
            "json",
            "payload_column = \"doc\"\npayload_format = \"jsonb\"",
            vec![b"{\"a\":1}".to_vec(), b"[1,2]".to_vec()],
        ),
    ] {
        let pipeline = Pipeline::start_with_key(
            unique("pg_payload"),
            schema,
            &plugin_config(&table, settings),
            MemoryBus::new(),
            Arc::new(MemoryStateStore::new()),
        )
        .await;
        wait_for("two messages", WAIT, || async {
            pipeline.bus.messages(&pipeline.stream, "rows").len() >= 2
        })
        .await;
        pipeline.runtime.shutdown().await;
        let payloads: Vec<Vec<u8>> = pipeline
            .bus
            .messages(&pipeline.stream, "rows")
            .iter()
            .map(|message| message.payload.to_vec())
            .collect();
        assert_eq!(payloads, expected, "{settings}");
    }
}

#[tokio::test]
async fn a_missing_table_stops_the_source_with_an_error_naming_it() {
    let table = unique("src_missing");
    let pipeline = Pipeline::start(
        &plugin_config(&table, ""),
        MemoryBus::new(),
        Arc::new(MemoryStateStore::new()),
    )
    .await;
    wait_for("the source to stop", WAIT, || async {
        pipeline.status().status == Status::Error
    })
    .await;
    let message = pipeline.status().last_error.unwrap().message;
    assert!(
        message.contains(&table) && message.contains("does not exist"),
        "{message}"
    );
    pipeline.runtime.shutdown().await;
}

/// Runs the real binary's `pipe` until it exits (killed after `WAIT`):
/// (exit code, stdout lines, stderr).
fn pipe(args: &[String]) -> (Option<i32>, Vec<String>, String) {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .arg("pipe")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = out.join().unwrap().unwrap();
    let err = err.join().unwrap().unwrap();
    (status.code(), out.lines().map(str::to_owned).collect(), err)
}

#[tokio::test]
async fn pipe_with_stop_when_caught_up_exports_every_row_and_ends_by_itself() {
    let pool = connect(&database_url()).await;
    // Cursor mode keeps several batches in flight; delete and mark mode one.
    for mode in ["", "delete_after_read=true", "processed_column=done"] {
        let table = unique("src_export");
        create_rows(
            &pool,
            &table,
            ", done BOOLEAN NOT NULL DEFAULT FALSE",
            2_500,
        )
        .await;
        let mut args: Vec<String> = [
            "--source",
            "postgres",
            "--sink",
            "stdout",
            "--set",
            "sink.print_payload=true",
            "--set",
            "source.stop_when_caught_up=true",
            "--set",
            "source.batch_size=300",
            // A long interval: only the end of the export can end the run in time.
            "--set",
            "source.poll_interval=1h",
        ]
        .map(str::to_owned)
        .into();
        args.push("--set".into());
        args.push(format!("source.connection_string={}", database_url()));
        args.push("--set".into());
        args.push(format!("source.tables=[\"{table}\"]"));
        if !mode.is_empty() {
            args.push("--set".into());
            args.push(format!("source.{mode}"));
        }
        let (code, lines, report) = pipe(&args);
        assert_eq!(code, Some(0), "{mode}: {report}");
        let ids: Vec<i64> = lines
            .iter()
            .map(|line| {
                let record: Value = serde_json::from_str(line).unwrap();
                record["data"]["id"].as_i64().unwrap()
            })
            .collect();
        assert_each_once(&ids, 1..=2_500);
        let left = match mode {
            "" => 2_500,
            _ => 0,
        };
        let remaining = count(
            &pool,
            &format!("SELECT count(*) FROM {table} WHERE NOT done"),
        )
        .await;
        assert_eq!(remaining, left, "{mode}");
    }
}

/// A polling source built and opened directly, as the engine does.
async fn open_source(config: &str) -> Box<dyn iggy_connect::connectors::Source> {
    let entry = iggy_connect::connectors::Registry::sources()
        .iter()
        .find(|entry| entry.name == "postgres")
        .expect("the postgres source is compiled in");
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
    let pool = connect(&database_url()).await;
    let table = unique("pg_lag");
    create_rows(&pool, &table, "", 10).await;
    let source = open_source(&plugin_config(&table, "batch_size = 3\n")).await;
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
    insert_rows(&pool, &table, 5).await;
    assert_eq!(pending(probe.as_ref()).await, Some(12));

    let deleting = open_source(&plugin_config(
        &table,
        "batch_size = 4\ndelete_after_read = true\n",
    ))
    .await;
    let probe = deleting
        .lag_probe()
        .expect("a delete-mode source measures too");
    assert_eq!(deleting.poll().await.unwrap().records.len(), 4);
    deleting.commit().await.unwrap();
    assert_eq!(pending(probe.as_ref()).await, Some(11));

    let custom = open_source(&plugin_config(
        &table,
        "initial_offset = 0\ncustom_query = \"SELECT * FROM $table WHERE id > $offset ORDER BY id LIMIT $limit\"\n",
    ))
    .await;
    assert!(custom.lag_probe().is_none());
}
