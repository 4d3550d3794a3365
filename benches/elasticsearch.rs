//! Throughput of the elasticsearch sink: Iggy -> sink -> the Elasticsearch
//! protocol test server of `tests/support/elasticsearch.rs` (in this process,
//! storing every document in memory, so its cost and memory are part of the
//! figures):
//!
//!     cargo bench --features elasticsearch-sink --bench elasticsearch
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/common/mod.rs`);
//! the case prints one `bench:` line with `bulk_requests=N` added.
//! `BENCH_SCALE` (default 1.0) multiplies the case's size.

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
use support::elasticsearch::{Flavor, SearchServer};

const CASES: &[&str] = &["iggy_to_elasticsearch_sink"];
const TOPIC: &str = "events";

fn main() {
    common::main(CASES, run);
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    sink_case(&case, &iggy, &stream, common::scaled(100_000, 1000)).await;
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    // No refresh copies per bulk: searches are not part of this case.
    server.set_near_real_time(true);
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
    let url = server.url();
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "es_sink"
            path = "elasticsearch"
            [[streams]]
            stream = "{stream}"
            topics = ["{TOPIC}"]
            schema = "json"
            batch_length = 1000
            poll_interval = "{poll_interval}"
            consumer_group = "bench"
            [plugin_config]
            url = "{url}"
            index = "bench"
            "#
        )))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime.view(ConnectorKind::Sink, "es_sink").expect("view");
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
    let stored = server.documents("bench").len() as u64;
    assert_eq!(stored, messages, "every message is one document");
    let bulks = server
        .seen()
        .iter()
        .filter(|seen| seen.path == "/_bulk")
        .count();
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("es_sink"),
        extra: vec![
            ("bulk_requests", bulks.to_string()),
            ("server", iggy.kind().into()),
        ],
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
