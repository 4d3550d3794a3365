//! Throughput of the iceberg sink: Iggy -> sink -> an Iceberg table of the
//! `iceberg` crate's memory catalog over a temp directory (Parquet files and
//! one fast-append snapshot per commit; nothing but the local disk behind it):
//!
//!     cargo bench --features iceberg-sink --bench backends -- iceberg
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! the case prints one `bench:` line with `snapshots=N` added. The time runs
//! until every message is in a committed snapshot (the sink is stopped after
//! it accepted the last one, which commits what it holds). The row count is
//! checked from the snapshots' summaries, not with a reader.
//! `BENCH_SCALE` (default 1.0) multiplies the case's size (a debug check:
//! `BENCH_SCALE=0.01 cargo bench --profile dev --features iceberg-sink --bench backends -- iceberg`).
#![cfg(feature = "iceberg-sink")]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};

const CASES: &[&str] = &["iggy_to_iceberg_sink"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "iceberg",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    sink_case(&case, &iggy, &stream, common::scaled(100_000, 1000)).await;
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let warehouse = tempfile::tempdir().expect("a temp dir");
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "iceberg_sink"
                path = "libiggy_connector_iceberg_sink"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                tables = ["bench.events"]
                catalog_type = "memory"
                warehouse = "{}"
                create_table = true
                columns = [
                  {{ name = "id", type = "long", nullable = false }},
                  {{ name = "name", type = "string" }},
                  {{ name = "text", type = "string" }},
                ]
                max_messages_per_file = 10000
                flush_interval = "0s"
                "#,
            warehouse.path().display()
        ),
    );
    let started = std::time::Instant::now();
    pipeline
        .run_until_done(ConnectorKind::Sink, "iceberg_sink", messages)
        .await;
    pipeline.runtime.shutdown().await;
    let elapsed = started.elapsed();
    let (snapshots, rows) = committed(&warehouse.path().join("bench/events/metadata"));
    assert_eq!(rows, messages, "every message in one snapshot");
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("iceberg_sink"),
        extra: vec![
            ("snapshots", snapshots.to_string()),
            ("backend", "local-fs".into()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}

/// The snapshots of the newest metadata file and their rows (the summaries'
/// `total-records` of the current snapshot).
fn committed(metadata: &std::path::Path) -> (usize, u64) {
    let newest = std::fs::read_dir(metadata)
        .expect("the table's metadata directory")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.to_string_lossy().ends_with(".metadata.json"))
        .max_by_key(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.split('-')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .expect("a metadata file");
    let text = std::fs::read_to_string(newest).expect("the metadata file");
    let value: serde_json::Value = serde_json::from_str(&text).expect("metadata JSON");
    let snapshots = value["snapshots"].as_array().map_or(0, Vec::len);
    let current = value["current-snapshot-id"].as_i64();
    let rows = value["snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|snapshot| snapshot["snapshot-id"].as_i64() == current)
        .and_then(|snapshot| snapshot["summary"]["total-records"].as_str())
        .and_then(|total| total.parse().ok())
        .unwrap_or(0);
    (snapshots, rows)
}
