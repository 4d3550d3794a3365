//! Throughput of the analytics connectors through Iggy: Iggy -> sink -> a
//! real local server (Debian's clickhouse-server 18.16 and influxdb 1.6,
//! started by the case from `tests/support`, installed by
//! `scripts/ensure-debian-packages`) or the Stream Load protocol test server
//! (doris, in this process: its memory is in `rss_mb`), and influxdb 1.6 ->
//! the influxdb source -> Iggy:
//!
//!     cargo bench --features clickhouse-sink,influxdb-sink,influxdb-source,doris-sink --bench backends -- analytics
//!     cargo bench --features clickhouse-sink,influxdb-sink,influxdb-source,doris-sink --bench backends -- analytics doris
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. A
//! database server is a separate process: its memory is not in `rss_mb`.
//! Latencies are read after the runtime's shutdown, which finishes the last
//! batch: read as soon as every message was written, the last batch's
//! duration was not recorded yet (with one batch: `batches=0`).
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size.
#![cfg(all(
    feature = "clickhouse-sink",
    feature = "influxdb-sink",
    feature = "influxdb-source",
    feature = "doris-sink"
))]

use std::time::Duration;

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::clickhouse::ClickHouse;
use crate::support::doris::{Doris, Kind, column};
use crate::support::influxdb::InfluxDb;

const CASES: &[&str] = &[
    "iggy_to_clickhouse_json_each_row",
    "iggy_to_clickhouse_row_binary",
    "iggy_to_influxdb_v1",
    "iggy_to_doris_json",
    "influxdb_v1_to_iggy",
];
/// 2024-03-01T00:00:00Z in µs.
const T0_MICROS: u64 = 1_709_251_200_000_000;
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "analytics",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let messages = common::scaled(200_000, 1000);
    match case {
        "iggy_to_clickhouse_json_each_row" | "iggy_to_clickhouse_row_binary" => {
            let server = ClickHouse::start();
            server
                .query("CREATE TABLE events (id UInt64, name String, text String) ENGINE = MergeTree ORDER BY id")
                .await;
            let format = case.trim_start_matches("iggy_to_clickhouse_");
            let plugin = format!(
                "url = \"{}\"\ntable = \"events\"\ninsert_format = \"{format}\"\n",
                server.url()
            );
            sink_case(case, &iggy, &stream, messages, "clickhouse", &plugin).await;
            let stored = server.query("SELECT count() FROM events").await;
            assert_eq!(stored.trim(), messages.to_string(), "rows in ClickHouse");
        }
        "iggy_to_influxdb_v1" => {
            let server = InfluxDb::start();
            server.query("", "CREATE DATABASE bench").await;
            // The offset in the points' nanoseconds: one series for the
            // partition, so influxd's max-values-per-tag (100,000) is no
            // limit (with the offset as a tag it refused offset 100,000 on).
            let plugin = format!(
                "version = \"v1\"\nurl = \"{}\"\ndb = \"bench\"\nbatch_size = 5000\n\
                 precision = \"ns\"\noffset_placement = \"timestamp\"\n",
                server.url()
            );
            sink_case(case, &iggy, &stream, messages, "influxdb", &plugin).await;
            let answer = server
                .query("bench", "SELECT COUNT(payload_json) FROM iggy_messages")
                .await;
            assert_eq!(
                answer["results"][0]["series"][0]["values"][0][1].as_u64(),
                Some(messages),
                "points in InfluxDB"
            );
        }
        "iggy_to_doris_json" => {
            let server = Doris::start("root", "bench").await;
            server.create_table(
                "bench",
                "events",
                vec![
                    column("id", Kind::Int, false),
                    column("name", Kind::Text, true),
                    column("text", Kind::Text, true),
                ],
            );
            let plugin = format!(
                "fe_url = \"{}\"\ndatabase = \"bench\"\ntable = \"events\"\nusername = \"root\"\npassword = \"bench\"\nbatch_size = 5000\n",
                server.fe_url
            );
            sink_case(case, &iggy, &stream, messages, "doris", &plugin).await;
            assert_eq!(
                server.rows("bench", "events").len() as u64,
                messages,
                "rows in Doris"
            );
        }
        "influxdb_v1_to_iggy" => {
            let server = InfluxDb::start();
            server.query("", "CREATE DATABASE bench").await;
            // Two points per microsecond (two hosts): ties on every time.
            for first in (0..messages).step_by(10_000) {
                let lines: Vec<String> = (first..(first + 10_000).min(messages))
                    .map(|n| {
                        format!(
                            "events,host=h{} id={n}i,name=\"bench\",text=\"{}\" {}",
                            n % 2,
                            "x".repeat(100),
                            T0_MICROS + n / 2
                        )
                    })
                    .collect();
                server.write("bench", &lines.join("\n")).await;
            }
            let plugin = format!(
                "version = \"v1\"\nurl = \"{}\"\ndb = \"bench\"\nbatch_size = 5000\npoll_interval = \"10ms\"\n\
                 query = \"SELECT * FROM events WHERE time > '$cursor' ORDER BY time LIMIT $limit\"\n",
                server.url()
            );
            source_case(case, &iggy, &stream, messages, &plugin).await;
        }
        other => panic!("unknown case {other}"),
    }
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64, path: &str, plugin: &str) {
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "bench_sink"
                path = "{path}"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 5000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                {plugin}
                "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Sink, "bench_sink", messages)
        .await;
    // Shut down first: it finishes the last batch, whose duration is
    // recorded only once its offsets are committed.
    pipeline.runtime.shutdown().await;
    let latencies = stages.latencies("bench_sink");
    assert!(latencies.batches() > 0, "no batch duration was recorded");
    Report {
        name: case,
        messages,
        elapsed,
        latencies,
        extra: [
            stages.breakdown("bench_sink"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    raw::drop_stream(&client, stream).await;
}

async fn source_case(case: &str, iggy: &Iggy, stream: &str, messages: u64, plugin: &str) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    let stages = Stages::install();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "source"
                key = "bench_source"
                path = "influxdb"
                [[streams]]
                stream = "{stream}"
                topic = "{TOPIC}"
                schema = "json"
                batch_length = 5000
                linger_time = "5ms"
                [plugin_config]
                {plugin}
                "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "bench_source", messages)
        .await;
    // Once caught up, more polls find nothing new: still every row once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = pipeline
        .runtime
        .view(ConnectorKind::Source, "bench_source")
        .expect("view")
        .metrics
        .sent
        .get();
    assert_eq!(sent, messages, "every row once");
    pipeline.runtime.shutdown().await;
    let latencies = stages.latencies("bench_source");
    assert!(latencies.batches() > 0, "no batch duration was recorded");
    Report {
        name: case,
        messages,
        elapsed,
        latencies,
        extra: [
            stages.breakdown("bench_source"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
