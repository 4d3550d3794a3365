//! Throughput of the postgres connectors with ~1 KB JSON rows, batch 1000.
//!
//!     scripts/with-postgres.sh cargo bench --features postgres-source,postgres-sink --bench postgres
//!
//! Prints one `bench: name=... messages=N seconds=S msgs_per_s=R` line per
//! pipeline. The bus is the in-memory one (the Iggy test server will replace
//! it), so the figures measure the connectors, the engine and PostgreSQL.
//! `insert_copy_staging` times the alternative write path (COPY into a
//! temporary table, then INSERT ... SELECT ... ON CONFLICT) against the sink's
//! UNNEST path, on the same rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::parse_connector_file;
use iggy_connect::connectors::Registry;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::{OutgoingMessage, Payload, SinkMessage, TopicRef};
use iggy_connect::state::MemoryStateStore;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

const ROWS: usize = 100_000;
const BATCH: usize = 1000;

#[tokio::main]
async fn main() {
    let url = std::env::var("IGGY_CONNECT_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("IGGY_CONNECT_TEST_POSTGRES_URL is not set: run this bench through scripts/with-postgres.sh")
    });
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("connect");
    source_to_bus(&url, &pool).await;
    for (format, schema, batch_size) in [
        ("json", "json", 1000),
        ("bytea", "raw", 1000),
        ("json", "json", 100),
    ] {
        bus_to_sink(&url, &pool, format, schema, batch_size).await;
    }
    insert_strategies(&url, &pool).await;
}

fn report(name: &str, messages: usize, elapsed: Duration) {
    let seconds = elapsed.as_secs_f64();
    println!(
        "bench: name={name} messages={messages} seconds={seconds:.3} msgs_per_s={:.0}",
        messages as f64 / seconds
    );
}

fn text_1k(n: usize) -> String {
    let filler: String = std::iter::repeat_n("lorem ipsum dolor sit amet ", 36).collect();
    format!("{n}:{}", &filler[..940])
}

async fn execute(pool: &PgPool, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(pool)
        .await
        .expect("bench SQL");
}

fn connector(text: &str) -> iggy_connect::config::ConnectorConfig {
    parse_connector_file(
        std::path::Path::new("bench.toml"),
        text,
        &EnvVars::from_pairs(Vec::new()),
    )
    .map(|(config, _)| config)
    .expect("bench connector config")
}

async fn source_to_bus(url: &str, pool: &PgPool) {
    let table = format!("bench_source_{}", std::process::id());
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    execute(
        pool,
        format!(
            "CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, kind TEXT, amount NUMERIC(12,2), \
             created_at TIMESTAMPTZ DEFAULT now(), body TEXT); \
             INSERT INTO {table} (kind, amount, body) SELECT 'order', n * 1.25, \
             repeat(md5(n::text), 29) FROM generate_series(1, {ROWS}) AS n; ANALYZE {table}"
        ),
    )
    .await;
    let bus = MemoryBus::new();
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(10),
    );
    runtime
        .add(connector(&format!(
            "type = \"source\"\nkey = \"bench_source\"\npath = \"postgres\"\n\n\
             [[streams]]\nstream = \"bench\"\ntopic = \"rows\"\nschema = \"json\"\nbatch_length = {BATCH}\n\n\
             [plugin_config]\nconnection_string = \"{url}\"\ntables = [\"{table}\"]\nbatch_size = {BATCH}\n"
        )))
        .expect("add source");
    let started = Instant::now();
    runtime.start_enabled().await;
    while bus.messages("bench", "rows").len() < ROWS {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    let size = bus.messages("bench", "rows")[0].payload.len();
    eprintln!("source record size: {size} bytes");
    report("postgres_source_to_bus", ROWS, elapsed);
    execute(pool, format!("DROP TABLE {table}")).await;
}

async fn bus_to_sink(url: &str, pool: &PgPool, format: &str, schema: &str, batch_size: usize) {
    let table = format!("bench_sink_{format}_{batch_size}_{}", std::process::id());
    execute(pool, format!("DROP TABLE IF EXISTS {table}")).await;
    let bus = MemoryBus::new();
    let producer = bus
        .producer(&ProducerTarget {
            stream: "bench".into(),
            topic: "events".into(),
            partitions: 1,
            batch_length: BATCH as u32,
            linger_time: Duration::ZERO,
        })
        .await
        .expect("producer");
    for chunk in 0..ROWS / BATCH {
        let messages: Vec<OutgoingMessage> = (0..BATCH)
            .map(|index| {
                let n = chunk * BATCH + index;
                let payload = serde_json::json!({"n": n, "kind": "order", "body": text_1k(n)});
                OutgoingMessage {
                    id: Some(n as u128 + 1),
                    headers: Vec::new(),
                    payload: Bytes::from(serde_json::to_vec(&payload).expect("json")),
                }
            })
            .collect();
        producer.send(&messages).await.expect("send");
    }
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(10),
    );
    runtime
        .add(connector(&format!(
            "type = \"sink\"\nkey = \"bench_sink\"\npath = \"postgres\"\n\n\
             [[streams]]\nstream = \"bench\"\ntopics = [\"events\"]\nschema = \"{schema}\"\nbatch_length = {BATCH}\n\n\
             [plugin_config]\nconnection_string = \"{url}\"\ntarget_table = \"{table}\"\n\
             auto_create_table = true\npayload_format = \"{format}\"\nbatch_size = {batch_size}\n"
        )))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    while !bus.is_drained("bench", "events", "iggy-connect-sink-bench_sink") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    let stored: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("count");
    assert_eq!(stored as usize, ROWS, "every message stored");
    report(
        &format!("bus_to_postgres_sink_{format}_batch_size_{batch_size}"),
        ROWS,
        elapsed,
    );
    execute(pool, format!("DROP TABLE {table}")).await;
}

/// The sink's UNNEST path (called directly) against COPY into a staging table
/// followed by INSERT ... SELECT ... ON CONFLICT, both 1000 rows per round.
async fn insert_strategies(url: &str, pool: &PgPool) {
    let messages: Vec<SinkMessage> = (0..ROWS)
        .map(|n| SinkMessage {
            id: n as u128 + 1,
            offset: n as u64,
            partition_id: 0,
            timestamp: 1_700_000_000_000_000,
            origin_timestamp: 1_700_000_000_000_000,
            checksum: 1,
            headers: Vec::new(),
            payload: Payload::Text(text_1k(n)),
        })
        .collect();
    let topic = TopicRef {
        stream: "bench".into(),
        topic: "events".into(),
    };
    let unnest_table = format!("bench_unnest_{}", std::process::id());
    execute(pool, format!("DROP TABLE IF EXISTS {unnest_table}")).await;
    let mut sink = (Registry::sink("postgres").expect("sink").build)(&serde_json::json!({
        "connection_string": url,
        "target_table": unnest_table,
        "auto_create_table": true,
        "payload_format": "text",
        "batch_size": BATCH,
    }))
    .expect("build sink");
    sink.open().await.expect("open sink");
    let started = Instant::now();
    for chunk in messages.chunks(BATCH) {
        sink.write(&topic, chunk).await.expect("write");
    }
    report("insert_unnest", ROWS, started.elapsed());
    sink.close().await.expect("close");

    let copy_table = format!("bench_copy_{}", std::process::id());
    execute(pool, format!("DROP TABLE IF EXISTS {copy_table}")).await;
    execute(
        pool,
        format!(
            "CREATE TABLE {copy_table} (id DECIMAL(39,0) PRIMARY KEY, iggy_offset BIGINT, \
             iggy_timestamp TIMESTAMPTZ, iggy_stream TEXT, iggy_topic TEXT, iggy_partition_id INTEGER, \
             iggy_checksum BIGINT, iggy_origin_timestamp TIMESTAMPTZ, payload TEXT, \
             created_at TIMESTAMPTZ DEFAULT NOW())"
        ),
    )
    .await;
    let mut connection = pool.acquire().await.expect("acquire");
    let started = Instant::now();
    for chunk in messages.chunks(BATCH) {
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
            "INSERT INTO {copy_table} (id, iggy_offset, iggy_timestamp, iggy_stream, iggy_topic, \
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
    }
    report("insert_copy_staging", ROWS, started.elapsed());
    drop(connection);
    execute(pool, format!("DROP TABLE {copy_table}")).await;
    execute(pool, format!("DROP TABLE {unnest_table}")).await;
}
