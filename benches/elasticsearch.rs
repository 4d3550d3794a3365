//! Throughput of the search sinks: Iggy -> sink -> the protocol test server
//! of `tests/support/` (`elasticsearch.rs`, `meilisearch.rs`, `quickwit.rs`;
//! in this process, storing every document in memory, so its cost and memory
//! are part of the figures):
//!
//!     cargo bench --features elasticsearch-sink,meilisearch-sink,quickwit-sink --bench elasticsearch
//!
//! One case per sink (`iggy_to_elasticsearch_sink`, `iggy_to_meilisearch_sink`,
//! `iggy_to_quickwit_sink`; name one to run only it). Iggy is `IGGY_ADDRESS`
//! or the test server (see `benches/common/mod.rs`); each case prints one
//! `bench:` line with `requests=N` (bulk, documents or ingest requests)
//! added. `BENCH_SCALE` (default 1.0) multiplies the cases' size; a debug
//! check: `BENCH_SCALE=0.01 cargo bench --profile dev ...`.

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
use support::meilisearch::MeiliServer;
use support::quickwit::QuickwitServer;

const CASES: &[&str] = &[
    "iggy_to_elasticsearch_sink",
    "iggy_to_meilisearch_sink",
    "iggy_to_quickwit_sink",
];
const TOPIC: &str = "events";

fn main() {
    common::main(CASES, run);
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    sink_case(&case, &iggy, &stream, common::scaled(100_000, 1000)).await;
}

/// The backend a case writes to.
enum Backend {
    Elasticsearch(SearchServer),
    Meilisearch(MeiliServer),
    Quickwit(QuickwitServer),
}

impl Backend {
    async fn start(case: &str) -> Self {
        match case {
            "iggy_to_meilisearch_sink" => Backend::Meilisearch(MeiliServer::start().await),
            "iggy_to_quickwit_sink" => Backend::Quickwit(QuickwitServer::start().await),
            _ => {
                let server = SearchServer::start(Flavor::Elasticsearch8).await;
                // No refresh copies per bulk: searches are not part of this case.
                server.set_near_real_time(true);
                Backend::Elasticsearch(server)
            }
        }
    }

    /// `path` and `[plugin_config]` of the sink's connector file.
    fn connector(&self) -> (&'static str, String) {
        match self {
            Backend::Elasticsearch(server) => (
                "elasticsearch",
                format!("url = \"{}\"\nindex = \"bench\"", server.url()),
            ),
            Backend::Meilisearch(server) => (
                "meilisearch",
                format!(
                    "url = \"{}\"\nindex = \"bench\"\ntask_poll_interval = \"1ms\"",
                    server.url()
                ),
            ),
            Backend::Quickwit(server) => (
                "quickwit",
                format!(
                    "url = \"{}\"\nindex = \"version: 0.8\\nindex_id: bench\\ndoc_mapping:\\n  mode: dynamic\\n\"",
                    server.url()
                ),
            ),
        }
    }

    /// (documents stored, write requests).
    fn stored(&self) -> (u64, usize) {
        match self {
            Backend::Elasticsearch(server) => (
                server.documents("bench").len() as u64,
                server
                    .seen()
                    .iter()
                    .filter(|seen| seen.path == "/_bulk")
                    .count(),
            ),
            Backend::Meilisearch(server) => (
                server.documents("bench").len() as u64,
                server.document_requests().len(),
            ),
            Backend::Quickwit(server) => (
                server.documents("bench").len() as u64,
                server.ingest_requests().len(),
            ),
        }
    }
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let backend = Backend::start(case).await;
    let (path, plugin_config) = backend.connector();
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
            key = "search_sink"
            path = "{path}"
            [[streams]]
            stream = "{stream}"
            topics = ["{TOPIC}"]
            schema = "json"
            batch_length = 1000
            poll_interval = "{poll_interval}"
            consumer_group = "bench"
            [plugin_config]
            {plugin_config}
            "#
        )))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime
            .view(ConnectorKind::Sink, "search_sink")
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
    let (stored, requests) = backend.stored();
    assert_eq!(stored, messages, "every message is one document");
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("search_sink"),
        extra: vec![
            ("requests", requests.to_string()),
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
