//! Throughput of the mysql connectors through Iggy with ~1 KB rows, batches
//! of 1000, against the real MariaDB of `tests/support/mariadb.rs` (row
//! binlog on, one server per case process):
//!
//!     cargo bench --features mysql-source,mysql-sink --bench backends -- mysql
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line.
//! `BENCH_SCALE` (default 1.0) multiplies the sizes.
//!
//! - `mysql_source_to_iggy`: polling mode, a filled table -> Iggy
//!   (upstream's `DatabaseRecord`), cursor on the key;
//! - `mysql_cdc_snapshot_to_iggy`: `mode = "cdc"`, the initial snapshot of a
//!   filled table -> Iggy;
//! - `mysql_cdc_changes_to_iggy`: `mode = "cdc"`, changes already in the
//!   binlog after the saved position (inserts in 1000-row transactions, then
//!   as many updates) -> Iggy;
//! - `iggy_to_mysql_sink`: a filled topic of ~1 KB JSON messages -> table
//!   (`payload_format = "json"`).
#![cfg(all(feature = "mysql-source", feature = "mysql-sink"))]

use std::time::Duration;

use bytes::Bytes;
use iggy_connect::connectors::ConnectorKind;
use sqlx::MySqlPool;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::mariadb::{connect, count, create_database, execute};

const CASES: &[&str] = &[
    "mysql_source_to_iggy",
    "mysql_cdc_snapshot_to_iggy",
    "mysql_cdc_changes_to_iggy",
    "iggy_to_mysql_sink",
];
const BATCH: u64 = 1000;
const TOPIC: &str = "rows";
const TABLE: &str = "bench";

inventory::submit! {
    crate::Bench {
        name: "mysql",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let url = create_database("bench").await;
    let pool = connect(&url).await;
    let rows = common::scaled(100_000, BATCH);
    // Before any pipeline exists, so the engine's stage timings reach it.
    let stages = Stages::install();
    let client = match case {
        "mysql_source_to_iggy" | "mysql_cdc_snapshot_to_iggy" => {
            fill(&pool, rows).await;
            let client = raw::topic(&iggy, &stream, TOPIC).await;
            let mode = if case == "mysql_source_to_iggy" {
                "tracking_column = \"id\""
            } else {
                "mode = \"cdc\"\nsnapshot = \"initial\""
            };
            let file = source_file(&url, &stream, mode);
            measure(
                case,
                &iggy,
                &stages,
                Pipeline::new(&iggy, &file),
                ConnectorKind::Source,
                rows,
            )
            .await;
            client
        }
        "mysql_cdc_changes_to_iggy" => {
            create_table(&pool).await;
            let client = raw::topic(&iggy, &stream, TOPIC).await;
            let file = source_file(&url, &stream, "mode = \"cdc\"\nsnapshot = \"never\"");
            // A first run saves the binlog position the changes come after.
            let first = Pipeline::new(&iggy, &file);
            first.runtime.start_enabled().await;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !first.has_state(KEY).await {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the cdc source saved no position"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            first.runtime.shutdown().await;
            let state = first.into_state();
            fill(&pool, rows).await;
            for start in (0..rows).step_by(BATCH as usize) {
                execute(
                    &pool,
                    &format!(
                        "UPDATE {TABLE} SET amount = amount + 1 WHERE id > {start} AND id <= {}",
                        start + BATCH
                    ),
                )
                .await;
            }
            let pipeline = Pipeline::with_state(&iggy, &file, state);
            measure(
                case,
                &iggy,
                &stages,
                pipeline,
                ConnectorKind::Source,
                2 * rows,
            )
            .await;
            client
        }
        "iggy_to_mysql_sink" => {
            let client = raw::topic(&iggy, &stream, TOPIC).await;
            raw::send(&client, &stream, TOPIC, rows, BATCH, message_json).await;
            let poll_interval = humantime::format_duration(common::poll_interval());
            let file = format!(
                "type = \"sink\"\nkey = \"{KEY}\"\npath = \"mysql\"\n\n\
                 [[streams]]\nstream = \"{stream}\"\ntopics = [\"{TOPIC}\"]\nschema = \"json\"\n\
                 batch_length = {BATCH}\npoll_interval = \"{poll_interval}\"\nconsumer_group = \"bench\"\n\n\
                 [plugin_config]\nconnection_string = \"{url}\"\ntarget_table = \"{TABLE}\"\n\
                 auto_create_table = true\npayload_format = \"json\"\nbatch_size = {BATCH}\n"
            );
            measure(
                case,
                &iggy,
                &stages,
                Pipeline::new(&iggy, &file),
                ConnectorKind::Sink,
                rows,
            )
            .await;
            let stored = count(&pool, &format!("SELECT COUNT(*) FROM {TABLE}")).await;
            assert_eq!(stored as u64, rows, "every message is one row");
            client
        }
        other => panic!("unknown case {other}"),
    };
    raw::drop_stream(&client, &stream).await;
}

const KEY: &str = "mysql_bench";

fn source_file(url: &str, stream: &str, mode: &str) -> String {
    format!(
        "type = \"source\"\nkey = \"{KEY}\"\npath = \"mysql\"\n\n\
         [[streams]]\nstream = \"{stream}\"\ntopic = \"{TOPIC}\"\nschema = \"json\"\n\n\
         [plugin_config]\nconnection_string = \"{url}\"\ntables = [\"{TABLE}\"]\n\
         batch_size = {BATCH}\npoll_interval = \"10ms\"\n{mode}\n"
    )
}

async fn create_table(pool: &MySqlPool) {
    execute(
        pool,
        &format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (id BIGINT AUTO_INCREMENT PRIMARY KEY, kind VARCHAR(16), \
             amount DECIMAL(12,2), body TEXT, created_at TIMESTAMP(6) DEFAULT CURRENT_TIMESTAMP(6))"
        ),
    )
    .await;
}

/// Rows 1 to `rows` of ~1 KB (a 928-character body), 1000 per transaction,
/// into the bench table (created when missing). The ids are given: an
/// `INSERT ... SELECT` leaves gaps in AUTO_INCREMENT values.
async fn fill(pool: &MySqlPool, rows: u64) {
    create_table(pool).await;
    for start in (0..rows).step_by(BATCH as usize) {
        let last = (start + BATCH).min(rows);
        execute(
            pool,
            &format!(
                "INSERT INTO {TABLE} (id, kind, amount, body) SELECT seq, 'order', seq * 1.25, \
                 REPEAT(MD5(seq), 29) FROM seq_{}_to_{last}",
                start + 1
            ),
        )
        .await;
    }
}

/// The sink case's message `n`: ~1 KB of JSON.
fn message_json(n: u64) -> Bytes {
    serde_json::to_vec(&serde_json::json!({"n": n, "kind": "order", "body": "x".repeat(940)}))
        .expect("json")
        .into()
}

/// Runs `pipeline` until its connector is done with `messages` and prints
/// the report.
async fn measure(
    case: &str,
    iggy: &Iggy,
    stages: &Stages,
    pipeline: Pipeline,
    kind: ConnectorKind,
    messages: u64,
) {
    let elapsed = pipeline.run_until_done(kind, KEY, messages).await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies(KEY),
        extra: [
            stages.breakdown(KEY),
            vec![
                ("backend", "mariadb 10.11".into()),
                ("server", iggy.kind().into()),
            ],
        ]
        .concat(),
    }
    .print();
}
