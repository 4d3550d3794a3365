//! Throughput of the delta sink: Iggy -> sink -> a Delta table on a local
//! temp directory (Parquet files and the commit log on disk, fsync as the
//! filesystem does it):
//!
//!     cargo bench --features delta-sink --bench backends -- delta
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! the case prints one `bench:` line with `commits=N` added. The time runs
//! until every message is in a committed table version (the sink is stopped
//! after it accepted the last one, which commits what it holds). The table is
//! read back with PyPI `deltalake` after the clock stops
//! (`scripts/lake-readers`). `BENCH_SCALE` (default 1.0) multiplies the
//! case's size (a debug check:
//! `BENCH_SCALE=0.01 cargo bench --profile dev --features delta-sink --bench backends -- delta`).
#![cfg(feature = "delta-sink")]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::delta::Table;

const CASES: &[&str] = &["iggy_to_delta_sink"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "delta",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    sink_case(&case, &iggy, &stream, common::scaled(200_000, 1000)).await;
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let table = Table::local(&dir.path().join("events"));
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "delta_sink"
                path = "libiggy_connector_delta_sink"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                table_uri = "{uri}"
                create_table = true
                columns = [
                  {{ name = "id", type = "long", nullable = false }},
                  {{ name = "name", type = "string" }},
                  {{ name = "text", type = "string" }},
                ]
                max_messages_per_file = 50000
                "#,
            uri = table.uri,
        ),
    );
    let started = std::time::Instant::now();
    pipeline
        .run_until_done(ConnectorKind::Sink, "delta_sink", messages)
        .await;
    pipeline.runtime.shutdown().await;
    let elapsed = started.elapsed();
    let (version, _) = table.version_and_columns();
    assert_eq!(
        table.rows().len() as u64,
        messages,
        "every message in the table once"
    );
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("delta_sink"),
        extra: vec![
            // Version 0 is the table's creation.
            ("commits", version.to_string()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
