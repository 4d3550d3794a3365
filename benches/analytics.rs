//! Throughput of the analytics sinks, Iggy -> sink -> a real local server
//! (Debian's clickhouse-server 18.16 and influxdb 1.6, started by the case
//! from `tests/support`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features clickhouse-sink,influxdb-sink --bench analytics
//!     cargo bench --features clickhouse-sink,influxdb-sink --bench analytics -- clickhouse
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. The
//! database server is a separate process: its memory is not in `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Iggy, Report, Stages, raw};
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::IggyBus;
use iggy_connect::state::FileStateStore;
use serde_json::json;
use support::clickhouse::ClickHouse;
use support::influxdb::InfluxDb;

const CASES: &[&str] = &[
    "iggy_to_clickhouse_json_each_row",
    "iggy_to_clickhouse_row_binary",
    "iggy_to_influxdb_v1",
];
const TOPIC: &str = "events";

fn main() {
    common::main(CASES, run);
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
            let plugin = format!(
                "version = \"v1\"\nurl = \"{}\"\ndb = \"bench\"\nbatch_size = 5000\n",
                server.url()
            );
            sink_case(case, &iggy, &stream, messages, "influxdb", &plugin).await;
        }
        other => panic!("unknown case {other}"),
    }
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64, path: &str, plugin: &str) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, 1000, |n| {
        serde_json::to_vec(&json!({"id": n, "name": "bench", "text": "x".repeat(100)}))
            .expect("json")
            .into()
    })
    .await;
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(iggy.settings())),
        Arc::new(FileStateStore::new(state.path()).expect("state store")),
        Duration::from_secs(10),
    );
    let poll_interval = humantime::format_duration(common::poll_interval());
    runtime
        .add(connector(&format!(
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
        )))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime
            .view(ConnectorKind::Sink, "bench_sink")
            .expect("view");
        if view.metrics.processed.get() >= messages {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sink did not drain: {:?}",
            view.status
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("bench_sink"),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
    runtime.shutdown().await;
    raw::drop_stream(&client, stream).await;
}

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("bench.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad bench config: {issues}"))
        .0
}
