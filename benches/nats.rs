//! Throughput of the nats sink, Iggy -> sink -> a real local
//! `nats-server -js` (Debian's 2.9, started by the case from
//! `tests/support/nats_server.rs`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features nats-sink,nats-source --bench nats
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. The NATS
//! server is a separate process: its memory is not in `rss_mb`.
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
use support::nats_server::{NatsServer, stream_messages};

const CASES: &[&str] = &["iggy_to_nats_jetstream"];
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
        "iggy_to_nats_jetstream" => {
            let server = NatsServer::start();
            let plugin = format!(
                "url = \"{}\"\nsubject = \"bench.events\"\nstream = \"BENCH\"\nstream_subjects = [\"bench.>\"]\n",
                server.url()
            );
            sink_case(case, &iggy, &stream, messages, "nats", &plugin).await;
            let stored = stream_messages(&server.jetstream().await, "BENCH").await;
            assert_eq!(stored, messages, "messages in the JetStream stream");
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
