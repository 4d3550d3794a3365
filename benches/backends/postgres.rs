//! Throughput of the postgres connectors through Iggy with ~1 KB JSON rows,
//! batches of 1000:
//!
//!     scripts/with-postgres.sh cargo bench --features postgres-source,postgres-sink --bench backends -- postgres
//!     scripts/with-postgres.sh cargo bench --features postgres-source,postgres-sink --bench backends -- postgres chain
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line.
//!
//! - `postgres_source_to_iggy`: table -> Iggy (upstream's `DatabaseRecord`);
//! - `iggy_to_postgres_sink_jsonb` / `_bytea`: a filled topic -> table;
//! - `postgres_to_iggy_to_postgres`: both connectors in one runtime, measured
//!   at the sink;
//! - `insert_select_reference`: an in-database `INSERT INTO dst SELECT ...
//!   FROM src` of the chain's source rows, as the source's `DatabaseRecord`
//!   JSON, into the sink's table layout: the reference of
//!   `postgres_to_iggy_to_postgres` (issue 15: the chain at >= 50% of it);
//! - `copy_reference`: plain `COPY` of the same rows into a table, 1000 per
//!   statement: what PostgreSQL itself takes, the sink's upper bound;
//! - `insert_unnest` / `insert_copy_staging`: the sink's UNNEST insert called
//!   directly, against COPY into a staging table plus `INSERT ... SELECT ...
//!   ON CONFLICT` (why the sink uses UNNEST);
//! - `postgres_cdc_snapshot_to_iggy`: `mode = "cdc"`, the initial snapshot of
//!   a filled table -> Iggy;
//! - `postgres_cdc_changes_to_iggy`: `mode = "cdc"`, changes already in the
//!   slot (inserts in 1000-row transactions, then as many updates) -> Iggy:
//!   the decode rate of the replication stream;
//! - `pg_recvlogical_reference`: PostgreSQL's own client, `pg_recvlogical
//!   --start ... -f /dev/null` (pgoutput, protocol 1, `--endpos` the WAL
//!   position after the insert), streaming one transaction of `2 * rows`
//!   inserts from a slot created before it: what decoding the WAL costs
//!   without Iggy, timed from its start to its exit;
//! - `cdc_one_transaction_to_iggy`: the same transaction through a CDC source
//!   (`snapshot = "never"`, its slot created beforehand) -> Iggy. The case
//!   first runs `pg_recvlogical` on a second slot over the same WAL and
//!   prints `reference_msgs_per_s` and `of_reference` (issue 40: >= 60%).
#![cfg(all(feature = "postgres-source", feature = "postgres-sink"))]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::{ConnectorKind, Registry};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::IggyBus;
use iggy_connect::message::{Payload, SinkMessage, TopicRef};
use iggy_connect::state::FileStateStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

use crate::common;
use crate::common::{Iggy, Latencies, Report, Stages, raw};
use crate::support;

const CASES: &[&str] = &[
    "postgres_source_to_iggy",
    "iggy_to_postgres_sink_jsonb",
    "iggy_to_postgres_sink_bytea",
    "postgres_to_iggy_to_postgres",
    "insert_select_reference",
    "copy_reference",
    "insert_unnest",
    "insert_copy_staging",
    "postgres_cdc_snapshot_to_iggy",
    "postgres_cdc_changes_to_iggy",
    "pg_recvlogical_reference",
    "cdc_one_transaction_to_iggy",
];
const BATCH: u64 = 1000;
const TOPIC: &str = "rows";

inventory::submit! {
    crate::Bench {
        name: "postgres",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let url = std::env::var("IGGY_CONNECT_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("IGGY_CONNECT_TEST_POSTGRES_URL is not set: run this bench through scripts/with-postgres.sh")
    });
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("connect");
    let rows = common::scaled(100_000, BATCH);
    let name = common::unique(case).replace('-', "_");
    // Each case sets up its tables before the clock starts; flushing what
    // earlier cases left keeps their checkpoints out of this case's time.
    execute(&pool, "CHECKPOINT".into()).await;
    match case {
        "postgres_source_to_iggy" => source_to_iggy(case, &url, &pool, &name, rows).await,
        "iggy_to_postgres_sink_jsonb" => {
            iggy_to_sink(case, &url, &pool, &name, rows, "jsonb", "json").await
        }
        "iggy_to_postgres_sink_bytea" => {
            iggy_to_sink(case, &url, &pool, &name, rows, "bytea", "raw").await
        }
        "postgres_to_iggy_to_postgres" => chain(case, &url, &pool, &name, rows).await,
        "insert_select_reference" => insert_select_reference(case, &pool, &name, rows).await,
        "copy_reference" => copy_reference(case, &pool, &name, rows).await,
        "insert_unnest" => insert_unnest(case, &url, &pool, &name, rows).await,
        "insert_copy_staging" => insert_copy_staging(case, &pool, &name, rows).await,
        "postgres_cdc_snapshot_to_iggy" => cdc_snapshot(case, &url, &pool, &name, rows).await,
        "postgres_cdc_changes_to_iggy" => cdc_changes(case, &url, &pool, &name, rows).await,
        "pg_recvlogical_reference" => recvlogical_reference(case, &url, &pool, &name, rows).await,
        "cdc_one_transaction_to_iggy" => cdc_one_transaction(case, &url, &pool, &name, rows).await,
        other => panic!("unknown case {other}"),
    }
}

/// ~1 KB of text for row `n`.
fn text_1k(n: u64) -> String {
    let filler: String = std::iter::repeat_n("lorem ipsum dolor sit amet ", 36).collect();
    format!("{n}:{}", &filler[..940])
}

/// The JSON message the sink cases read: ~1 KB.
fn message_json(n: u64) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({"n": n, "kind": "order", "body": text_1k(n)}))
            .expect("json"),
    )
}

async fn execute(pool: &PgPool, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(pool)
        .await
        .expect("bench SQL");
}

async fn count(pool: &PgPool, table: &str) -> u64 {
    let stored: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("count");
    stored as u64
}

/// A source table of `rows` rows of ~1 KB as `row_to_json`.
async fn create_source_table(pool: &PgPool, table: &str, rows: u64) {
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    execute(
        pool,
        format!(
            "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, kind TEXT, amount NUMERIC(12,2), \
             created_at TIMESTAMPTZ DEFAULT now(), body TEXT); \
             INSERT INTO {table} (kind, amount, body) SELECT 'order', n * 1.25, \
             repeat(md5(n::text), 29) FROM generate_series(1, {rows}) AS n; ANALYZE {table}; \
             CHECKPOINT"
        ),
    )
    .await;
}

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("bench.toml"), text, &EnvVars::default())
        .map(|(config, _)| config)
        .expect("bench connector config")
}

fn source_config(url: &str, stream: &str, table: &str) -> ConnectorConfig {
    connector(&format!(
        "type = \"source\"\nkey = \"pg_source\"\npath = \"postgres\"\n{in_flight}\n\
         [[streams]]\nstream = \"{stream}\"\ntopic = \"{TOPIC}\"\nschema = \"json\"\n\
         batch_length = {BATCH}\nlinger_time = \"5ms\"\n\n\
         [plugin_config]\nconnection_string = \"{url}\"\ntables = [\"{table}\"]\n\
         batch_size = {BATCH}\npoll_interval = \"10ms\"\n",
        in_flight = common::max_in_flight_bytes_line(),
    ))
}

fn cdc_config(url: &str, stream: &str, table: &str, snapshot: &str) -> ConnectorConfig {
    connector(&format!(
        "type = \"source\"\nkey = \"{stream}\"\npath = \"postgres\"\n\n\
         [[streams]]\nstream = \"{stream}\"\ntopic = \"{TOPIC}\"\nschema = \"json\"\n\
         batch_length = {BATCH}\nlinger_time = \"5ms\"\n\n\
         [plugin_config]\nconnection_string = \"{url}\"\nmode = \"cdc\"\ntables = [\"{table}\"]\n\
         snapshot = \"{snapshot}\"\nbatch_size = {BATCH}\npoll_interval = \"10ms\"\n"
    ))
}

fn sink_config(
    url: &str,
    stream: &str,
    table: &str,
    format: &str,
    schema: &str,
) -> ConnectorConfig {
    let poll_interval = humantime::format_duration(common::poll_interval());
    connector(&format!(
        "type = \"sink\"\nkey = \"pg_sink\"\npath = \"postgres\"\n\n\
         [[streams]]\nstream = \"{stream}\"\ntopics = [\"{TOPIC}\"]\nschema = \"{schema}\"\n\
         batch_length = {BATCH}\npoll_interval = \"{poll_interval}\"\nconsumer_group = \"bench\"\n\n\
         [plugin_config]\nconnection_string = \"{url}\"\ntarget_table = \"{table}\"\n\
         auto_create_table = true\npayload_format = \"{format}\"\nbatch_size = {BATCH}\n"
    ))
}

fn runtime(iggy: &Iggy, state_dir: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(iggy.settings())),
        Arc::new(FileStateStore::new(state_dir).expect("state store")),
        Duration::from_secs(10),
    )
}

async fn wait_until(what: &str, done: impl FnMut() -> bool) {
    support::wait::wait_for(what, Duration::from_secs(900), done).await;
}

async fn source_to_iggy(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let iggy = Iggy::start();
    let table = format!("{name}_src");
    create_source_table(pool, &table, rows).await;
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(source_config(url, name, &table))
        .expect("add source");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_until("the source to send every row", || {
        let view = runtime.view(ConnectorKind::Source, "pg_source");
        view.is_ok_and(|view| view.metrics.sent.get() >= rows)
    })
    .await;
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    let client = raw::topic(&iggy, name, TOPIC).await;
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: stages.latencies("pg_source"),
        extra: [
            stages.breakdown("pg_source"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    raw::drop_stream(&client, name).await;
    execute(pool, format!("DROP TABLE {table}")).await;
}

async fn iggy_to_sink(
    case: &str,
    url: &str,
    pool: &PgPool,
    name: &str,
    rows: u64,
    format: &str,
    schema: &str,
) {
    let iggy = Iggy::start();
    let table = format!("{name}_dst");
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    let client = raw::topic(&iggy, name, TOPIC).await;
    raw::send(&client, name, TOPIC, rows, BATCH, message_json).await;
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(sink_config(url, name, &table, format, schema))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_until("the sink to write every message", || {
        let view = runtime.view(ConnectorKind::Sink, "pg_sink");
        view.is_ok_and(|view| view.metrics.processed.get() >= rows)
    })
    .await;
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    assert_eq!(count(pool, &table).await, rows, "every message stored");
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: stages.latencies("pg_sink"),
        extra: [
            stages.breakdown("pg_sink"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    raw::drop_stream(&client, name).await;
    execute(pool, format!("DROP TABLE {table}")).await;
}

async fn chain(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let iggy = Iggy::start();
    let (source_table, sink_table) = (format!("{name}_src"), format!("{name}_dst"));
    create_source_table(pool, &source_table, rows).await;
    execute(pool, format!("DROP TABLE IF EXISTS {sink_table}")).await;
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(source_config(url, name, &source_table))
        .expect("add source");
    runtime
        .add(sink_config(url, name, &sink_table, "jsonb", "json"))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_until("the sink to write every row", || {
        let view = runtime.view(ConnectorKind::Sink, "pg_sink");
        view.is_ok_and(|view| view.metrics.processed.get() >= rows)
    })
    .await;
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    assert_eq!(count(pool, &sink_table).await, rows, "every row stored");
    let source = stages.latencies("pg_source");
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: stages.latencies("pg_sink"),
        extra: vec![
            ("source_p50_ms", format!("{:.2}", source.ms(0.5))),
            ("source_p99_ms", format!("{:.2}", source.ms(0.99))),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    let client = iggy.settings().connect().await.expect("connect");
    raw::drop_stream(&client, name).await;
    execute(pool, format!("DROP TABLE {source_table}")).await;
    execute(pool, format!("DROP TABLE {sink_table}")).await;
}

/// The chain's work done inside PostgreSQL: the same source rows, turned into
/// the source's `DatabaseRecord` document, inserted into the table the sink
/// creates (upstream's layout, `payload_format = "json"`, every optional
/// column, as `Layout::create_sql`) by one `INSERT ... SELECT` per 1000 rows,
/// each its own transaction as a sink batch is. No Iggy, no client: the
/// chain's upper bound on this machine.
async fn insert_select_reference(case: &str, pool: &PgPool, name: &str, rows: u64) {
    let (source_table, sink_table) = (format!("{name}_src"), format!("{name}_dst"));
    create_source_table(pool, &source_table, rows).await;
    execute(pool, format!("DROP TABLE IF EXISTS {sink_table}")).await;
    execute(
        pool,
        format!(
            "CREATE TABLE {sink_table} (id DECIMAL(39, 0) PRIMARY KEY, iggy_offset BIGINT, \
             iggy_timestamp TIMESTAMP WITH TIME ZONE, iggy_stream TEXT, iggy_topic TEXT, \
             iggy_partition_id INTEGER, iggy_checksum BIGINT, \
             iggy_origin_timestamp TIMESTAMP WITH TIME ZONE, payload JSONB, \
             created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW())"
        ),
    )
    .await;
    let mut durations = Vec::new();
    let started = Instant::now();
    for start in (0..rows).step_by(BATCH as usize) {
        let batch_started = Instant::now();
        execute(
            pool,
            format!(
                "INSERT INTO {sink_table} (id, iggy_offset, iggy_timestamp, iggy_stream, iggy_topic, \
                 iggy_partition_id, iggy_checksum, iggy_origin_timestamp, payload) \
                 SELECT src.id, src.id - 1, now(), '{name}', '{TOPIC}', 0, 0, now(), \
                 ('{{\"table_name\":\"{source_table}\",\"operation_type\":\"SELECT\",\"timestamp\":' \
                 || to_json(now()::text)::text || ',\"data\":' || row_to_json(src)::text \
                 || ',\"old_data\":null}}')::jsonb \
                 FROM {source_table} AS src WHERE src.id > {start} AND src.id <= {end} \
                 ON CONFLICT (id) DO NOTHING",
                end = start + BATCH
            ),
        )
        .await;
        durations.push(batch_started.elapsed());
    }
    let elapsed = started.elapsed();
    assert_eq!(count(pool, &sink_table).await, rows, "every row copied");
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: Latencies::from_durations(&durations),
        extra: Vec::new(),
    }
    .print();
    execute(pool, format!("DROP TABLE {source_table}")).await;
    execute(pool, format!("DROP TABLE {sink_table}")).await;
}

/// Plain COPY of the sink's rows (id, offset, payload as jsonb), 1000 per
/// statement, one transaction each: PostgreSQL's own write rate.
async fn copy_reference(case: &str, pool: &PgPool, name: &str, rows: u64) {
    let table = format!("{name}_copy");
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    execute(
        pool,
        format!(
            "CREATE TABLE {table} (id DECIMAL(39,0) PRIMARY KEY, iggy_offset BIGINT, payload JSONB)"
        ),
    )
    .await;
    let mut connection = pool.acquire().await.expect("acquire");
    let mut durations = Vec::new();
    let started = Instant::now();
    for start in (0..rows).step_by(BATCH as usize) {
        let batch_started = Instant::now();
        let mut data = Vec::with_capacity(BATCH as usize * 1100);
        for n in start..(start + BATCH).min(rows) {
            data.extend_from_slice(format!("{}\t{n}\t", n + 1).as_bytes());
            // COPY's text format: backslashes in the JSON must be doubled.
            for &byte in message_json(n).iter() {
                if byte == b'\\' {
                    data.push(b'\\');
                }
                data.push(byte);
            }
            data.push(b'\n');
        }
        let mut copy = connection
            .copy_in_raw(&format!("COPY {table} FROM STDIN"))
            .await
            .expect("copy in");
        copy.send(data).await.expect("copy send");
        copy.finish().await.expect("copy finish");
        durations.push(batch_started.elapsed());
    }
    let elapsed = started.elapsed();
    drop(connection);
    assert_eq!(count(pool, &table).await, rows);
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: Latencies::from_durations(&durations),
        extra: Vec::new(),
    }
    .print();
    execute(pool, format!("DROP TABLE {table}")).await;
}

fn sink_messages(rows: u64) -> Vec<SinkMessage> {
    (0..rows)
        .map(|n| SinkMessage {
            id: u128::from(n) + 1,
            offset: n,
            partition_id: 0,
            timestamp: 1_700_000_000_000_000,
            origin_timestamp: 1_700_000_000_000_000,
            checksum: 1,
            headers: Vec::new(),
            payload: Payload::Text(text_1k(n)),
        })
        .collect()
}

/// The sink's UNNEST path, called directly (no Iggy, no engine).
async fn insert_unnest(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let messages = sink_messages(rows);
    let topic = TopicRef {
        stream: "bench".into(),
        topic: "events".into(),
    };
    let table = format!("{name}_unnest");
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    let mut sink = (Registry::sink("postgres").expect("sink").build)(&serde_json::json!({
        "connection_string": url,
        "target_table": table,
        "auto_create_table": true,
        "payload_format": "text",
        "batch_size": BATCH,
    }))
    .expect("build sink");
    sink.open().await.expect("open sink");
    let mut durations = Vec::new();
    let started = Instant::now();
    for chunk in messages.chunks(BATCH as usize) {
        let batch_started = Instant::now();
        sink.write(&topic, chunk).await.expect("write");
        durations.push(batch_started.elapsed());
    }
    let elapsed = started.elapsed();
    sink.close().await.expect("close");
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: Latencies::from_durations(&durations),
        extra: Vec::new(),
    }
    .print();
    execute(pool, format!("DROP TABLE {table}")).await;
}

/// COPY into a staging table, then `INSERT ... SELECT ... ON CONFLICT`, 1000
/// rows per transaction: the alternative to the sink's UNNEST insert.
async fn insert_copy_staging(case: &str, pool: &PgPool, name: &str, rows: u64) {
    let messages = sink_messages(rows);
    let table = format!("{name}_staged");
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    execute(
        pool,
        format!(
            "CREATE TABLE {table} (id DECIMAL(39,0) PRIMARY KEY, iggy_offset BIGINT, \
             iggy_timestamp TIMESTAMPTZ, iggy_stream TEXT, iggy_topic TEXT, iggy_partition_id INTEGER, \
             iggy_checksum BIGINT, iggy_origin_timestamp TIMESTAMPTZ, payload TEXT, \
             created_at TIMESTAMPTZ DEFAULT NOW())"
        ),
    )
    .await;
    let mut connection = pool.acquire().await.expect("acquire");
    let mut durations = Vec::new();
    let started = Instant::now();
    for chunk in messages.chunks(BATCH as usize) {
        let batch_started = Instant::now();
        let mut transaction = sqlx::Connection::begin(&mut *connection)
            .await
            .expect("begin");
        sqlx::query(
            "CREATE TEMP TABLE IF NOT EXISTS staging (id NUMERIC, iggy_offset BIGINT, iggy_timestamp BIGINT, \
             iggy_partition_id INTEGER, iggy_checksum BIGINT, iggy_origin_timestamp BIGINT, payload TEXT) \
             ON COMMIT DELETE ROWS",
        )
        .execute(&mut *transaction)
        .await
        .expect("staging");
        let mut data = Vec::with_capacity(chunk.len() * 1100);
        for message in chunk {
            let Payload::Text(text) = &message.payload else {
                continue;
            };
            data.extend_from_slice(
                format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    message.id,
                    message.offset,
                    message.timestamp,
                    message.partition_id,
                    message.checksum,
                    message.origin_timestamp,
                    text
                )
                .as_bytes(),
            );
        }
        let mut copy = transaction
            .copy_in_raw("COPY staging FROM STDIN")
            .await
            .expect("copy in");
        copy.send(data).await.expect("copy send");
        copy.finish().await.expect("copy finish");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (id, iggy_offset, iggy_timestamp, iggy_stream, iggy_topic, \
             iggy_partition_id, iggy_checksum, iggy_origin_timestamp, payload) \
             SELECT id, iggy_offset, TIMESTAMPTZ 'epoch' + iggy_timestamp * INTERVAL '1 microsecond', \
             'bench', 'events', iggy_partition_id, iggy_checksum, \
             TIMESTAMPTZ 'epoch' + iggy_origin_timestamp * INTERVAL '1 microsecond', payload \
             FROM staging ON CONFLICT (id) DO NOTHING"
        )))
        .execute(&mut *transaction)
        .await
        .expect("insert from staging");
        transaction.commit().await.expect("commit");
        durations.push(batch_started.elapsed());
    }
    let elapsed = started.elapsed();
    drop(connection);
    Report {
        name: case,
        messages: rows,
        elapsed,
        latencies: Latencies::from_durations(&durations),
        extra: Vec::new(),
    }
    .print();
    execute(pool, format!("DROP TABLE {table}")).await;
}

/// Runs a CDC source (key = `name`) until it has sent `messages`, timed from
/// its start; drops its slot and publication afterwards.
async fn run_cdc(case: &str, iggy: &Iggy, state: &Path, config: ConnectorConfig, messages: u64) {
    let key = config.key.clone();
    let stages = Stages::install();
    let runtime = runtime(iggy, state);
    runtime.add(config).expect("add cdc source");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_until("the cdc source to send every change", || {
        let view = runtime.view(ConnectorKind::Source, &key);
        view.is_ok_and(|view| view.metrics.sent.get() >= messages)
    })
    .await;
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies(&key),
        extra: [stages.breakdown(&key), vec![("server", iggy.kind().into())]].concat(),
    }
    .print();
}

async fn slot_count(pool: &PgPool, slot: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1")
        .bind(slot)
        .fetch_one(pool)
        .await
        .expect("slots")
}

async fn wait_for_slot(pool: &PgPool, slot: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while slot_count(pool, slot).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the cdc source created no slot {slot}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Drops what a CDC source named `name` created: its slot (once the last
/// walsender let go of it) and its publication.
async fn drop_cdc(pool: &PgPool, name: &str) {
    let slot = iggy_connect::connectors::postgres::source::derived_slot_name(name).expect("slot");
    let dropped = "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                   WHERE slot_name = $1 AND NOT active";
    for _ in 0..100 {
        sqlx::query(dropped)
            .bind(&slot)
            .execute(pool)
            .await
            .expect("drop slot");
        if slot_count(pool, &slot).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    execute(pool, format!("DROP PUBLICATION IF EXISTS {slot}")).await;
}

async fn cdc_snapshot(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let iggy = Iggy::start();
    let table = format!("{name}_src");
    create_source_table(pool, &table, rows).await;
    let state = tempfile::tempdir().expect("state dir");
    let config = cdc_config(url, name, &table, "initial");
    run_cdc(case, &iggy, state.path(), config, rows).await;
    drop_cdc(pool, name).await;
    let client = raw::topic(&iggy, name, TOPIC).await;
    raw::drop_stream(&client, name).await;
    execute(pool, format!("DROP TABLE {table}")).await;
}

/// Starts the CDC source of `config` once, so it creates its slot (named
/// after `name`), and stops it; returns the slot's name.
async fn create_cdc_slot(
    iggy: &Iggy,
    state_dir: &Path,
    config: &ConnectorConfig,
    pool: &PgPool,
    name: &str,
) -> String {
    let slot = iggy_connect::connectors::postgres::source::derived_slot_name(name).expect("slot");
    let runtime = runtime(iggy, state_dir);
    runtime.add(config.clone()).expect("add cdc source");
    runtime.start_enabled().await;
    wait_for_slot(pool, &slot).await;
    runtime.shutdown().await;
    slot
}

/// `rows` inserts then `rows` updates, committed while the source is stopped
/// (its slot exists), then read by a fresh start: `2 * rows` changes.
async fn cdc_changes(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let iggy = Iggy::start();
    let table = format!("{name}_src");
    create_source_table(pool, &table, 0).await;
    let state = tempfile::tempdir().expect("state dir");
    let config = cdc_config(url, name, &table, "never");
    create_cdc_slot(&iggy, state.path(), &config, pool, name).await;
    for start in (0..rows).step_by(BATCH as usize) {
        execute(
            pool,
            format!(
                "INSERT INTO {table} (kind, amount, body) SELECT 'order', n * 1.25, \
                 repeat(md5(n::text), 29) FROM generate_series({}, {}) AS n",
                start + 1,
                (start + BATCH).min(rows)
            ),
        )
        .await;
    }
    for start in (0..rows).step_by(BATCH as usize) {
        execute(
            pool,
            format!(
                "UPDATE {table} SET amount = amount + 1 WHERE id > {start} AND id <= {}",
                start + BATCH
            ),
        )
        .await;
    }
    execute(pool, "CHECKPOINT".into()).await;
    run_cdc(case, &iggy, state.path(), config, 2 * rows).await;
    drop_cdc(pool, name).await;
    let client = raw::topic(&iggy, name, TOPIC).await;
    raw::drop_stream(&client, name).await;
    execute(pool, format!("DROP TABLE {table}")).await;
}

/// `rows` rows of the source table's shape inserted by one statement: one
/// transaction. The WAL position after its commit (`pg_recvlogical`'s
/// `--endpos`) and how many MB of WAL it wrote.
async fn insert_one_transaction(pool: &PgPool, table: &str, rows: u64) -> (String, f64) {
    let before: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await
        .expect("wal position");
    execute(
        pool,
        format!(
            "INSERT INTO {table} (kind, amount, body) SELECT 'order', n * 1.25, \
             repeat(md5(n::text), 29) FROM generate_series(1, {rows}) AS n"
        ),
    )
    .await;
    let (endpos, bytes): (String, i64) = sqlx::query_as(
        "SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::int8",
    )
    .bind(before)
    .fetch_one(pool)
    .await
    .expect("wal position");
    // Flushed before the clock starts: the decoding is measured, not a
    // checkpoint.
    execute(pool, "CHECKPOINT".into()).await;
    (endpos, bytes as f64 / 1e6)
}

/// Runs Debian's `pg_recvlogical` on `slot` (pgoutput, protocol 1,
/// `publication`) up to `endpos`, writing to /dev/null; the time from its
/// start to its exit and its peak RSS in MB.
fn recvlogical(url: &str, slot: &str, publication: &str, endpos: &str) -> (Duration, f64) {
    let started = Instant::now();
    let status = std::process::Command::new("/usr/bin/pg_recvlogical")
        .args(["-d", url, "--start", "--slot", slot, "--plugin", "pgoutput"])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={publication}"))
        .args(["--endpos", endpos, "--no-loop", "-f", "/dev/null"])
        .status()
        .expect("run /usr/bin/pg_recvlogical (Debian's postgresql-client)");
    let elapsed = started.elapsed();
    assert!(status.success(), "pg_recvlogical failed: {status}");
    // SAFETY: getrusage fills the struct it is given.
    let children_peak_kb = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage.ru_maxrss
    };
    (elapsed, children_peak_kb as f64 / 1024.0)
}

async fn create_slot(pool: &PgPool, slot: &str) {
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(slot)
        .execute(pool)
        .await
        .expect("create slot");
}

async fn drop_slot(pool: &PgPool, slot: &str) {
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(slot)
        .execute(pool)
        .await
        .expect("drop slot");
}

/// `pg_recvlogical` alone: the table, its publication and a fresh slot, then
/// `2 * rows` inserts in one transaction, streamed to /dev/null.
async fn recvlogical_reference(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let changes = 2 * rows;
    let table = format!("{name}_src");
    create_source_table(pool, &table, 0).await;
    let (slot, publication) = (format!("{name}_ref"), format!("{name}_pub"));
    execute(
        pool,
        format!("CREATE PUBLICATION {publication} FOR TABLE {table}"),
    )
    .await;
    create_slot(pool, &slot).await;
    let (endpos, wal_mb) = insert_one_transaction(pool, &table, changes).await;
    let (elapsed, child_rss) = recvlogical(url, &slot, &publication, &endpos);
    Report {
        name: case,
        messages: changes,
        elapsed,
        latencies: Latencies::new(Vec::new()),
        extra: vec![
            ("recvlogical_rss_mb", format!("{child_rss:.1}")),
            ("wal_mb", format!("{wal_mb:.0}")),
        ],
    }
    .print();
    drop_slot(pool, &slot).await;
    execute(pool, format!("DROP PUBLICATION {publication}")).await;
    execute(pool, format!("DROP TABLE {table}")).await;
}

/// `2 * rows` inserts in one transaction, read by a CDC source whose slot
/// was created before; `pg_recvlogical` first reads the same WAL from a slot
/// of its own, created at the same point, as the reference.
async fn cdc_one_transaction(case: &str, url: &str, pool: &PgPool, name: &str, rows: u64) {
    let changes = 2 * rows;
    let iggy = Iggy::start();
    let table = format!("{name}_src");
    create_source_table(pool, &table, 0).await;
    let state = tempfile::tempdir().expect("state dir");
    let config = cdc_config(url, name, &table, "never");
    // The source's slot and publication share its derived name.
    let slot = create_cdc_slot(&iggy, state.path(), &config, pool, name).await;
    let reference_slot = format!("{name}_ref");
    create_slot(pool, &reference_slot).await;
    let (endpos, wal_mb) = insert_one_transaction(pool, &table, changes).await;
    let (reference_elapsed, _) = recvlogical(url, &reference_slot, &slot, &endpos);
    drop_slot(pool, &reference_slot).await;
    let reference = changes as f64 / reference_elapsed.as_secs_f64();
    let key = config.key.clone();
    let stages = Stages::install();
    let runtime = runtime(&iggy, state.path());
    runtime.add(config).expect("add cdc source");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_until("the cdc source to send every change", || {
        let view = runtime.view(ConnectorKind::Source, &key);
        view.is_ok_and(|view| view.metrics.sent.get() >= changes)
    })
    .await;
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    let report = Report {
        name: case,
        messages: changes,
        elapsed,
        latencies: stages.latencies(&key),
        extra: Vec::new(),
    };
    let of_reference = report.rate() / reference;
    Report {
        extra: [
            stages.breakdown(&key),
            vec![
                ("server", iggy.kind().into()),
                ("wal_mb", format!("{wal_mb:.0}")),
                ("reference_msgs_per_s", format!("{reference:.0}")),
                ("of_reference", format!("{:.1}%", of_reference * 100.0)),
            ],
        ]
        .concat(),
        ..report
    }
    .print();
    drop_cdc(pool, name).await;
    let client = raw::topic(&iggy, name, TOPIC).await;
    raw::drop_stream(&client, name).await;
    execute(pool, format!("DROP TABLE {table}")).await;
}
