//! Throughput of the search connectors: Iggy -> sink -> the protocol test
//! server of `tests/support/` (`elasticsearch.rs`, `meilisearch.rs`,
//! `quickwit.rs`), and the elasticsearch source out of it into Iggy. The
//! servers run in this process, storing every document in memory, so their
//! cost and memory are part of the figures:
//!
//!     cargo bench --features elasticsearch-sink,elasticsearch-source,meilisearch-sink,quickwit-sink --bench backends -- elasticsearch
//!
//! One case per connector (`iggy_to_elasticsearch_sink`, `iggy_to_meilisearch_sink`,
//! `iggy_to_quickwit_sink`, `elasticsearch_source_to_iggy`; name one to run
//! only it). Iggy is `IGGY_ADDRESS` or the test server (see
//! `benches/backends/common/mod.rs`); each case prints one `bench:` line with
//! `requests=N` (bulk, documents or ingest requests; searches for the source)
//! added. `BENCH_SCALE` (default 1.0) multiplies the cases' size; a debug
//! check: `BENCH_SCALE=0.01 cargo bench --profile dev ...`.
#![cfg(all(
    feature = "elasticsearch-sink",
    feature = "elasticsearch-source",
    feature = "meilisearch-sink",
    feature = "quickwit-sink"
))]

use iggy_connect::connectors::ConnectorKind;
use serde_json::json;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::elasticsearch::{Flavor, SearchServer};
use crate::support::meilisearch::MeiliServer;
use crate::support::quickwit::QuickwitServer;

const CASES: &[&str] = &[
    "iggy_to_elasticsearch_sink",
    "iggy_to_meilisearch_sink",
    "iggy_to_quickwit_sink",
    "elasticsearch_source_to_iggy",
];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "elasticsearch",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    let messages = common::scaled(100_000, 1000);
    if case == "elasticsearch_source_to_iggy" {
        source_case(&case, &iggy, &stream, messages).await;
    } else {
        sink_case(&case, &iggy, &stream, messages).await;
    }
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
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        iggy,
        &format!(
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
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Sink, "search_sink", messages)
        .await;
    let (stored, requests) = backend.stored();
    assert_eq!(stored, messages, "every message is one document");
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
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
    raw::drop_stream(&client, stream).await;
}

/// Documents already in the index -> the elasticsearch source (pages of
/// 1000 under a point in time) -> Iggy. Ten documents share each timestamp,
/// so every page boundary falls inside a tie.
async fn source_case(case: &str, iggy: &Iggy, stream: &str, documents: u64) {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    server.create_index(
        "bench",
        json!({"properties": {"@timestamp": {"type": "date"}}}),
    );
    server.put_documents(
        "bench",
        (0..documents).map(|n| {
            let second = n / 10;
            let timestamp = format!(
                "2024-03-{:02}T{:02}:{:02}:{:02}Z",
                1 + second / 86_400,
                second / 3600 % 24,
                second / 60 % 60,
                second % 60
            );
            let source = json!({"n": n, "@timestamp": timestamp, "text": "x".repeat(100)});
            (format!("d{n}"), source)
        }),
    );
    let client = raw::topic(iggy, stream, TOPIC).await;
    let stages = Stages::install();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
            type = "source"
            key = "search_source"
            path = "elasticsearch"
            [[streams]]
            stream = "{stream}"
            topic = "{TOPIC}"
            schema = "json"
            batch_length = 1000
            [plugin_config]
            url = "{url}"
            index = "bench"
            timestamp_field = "@timestamp"
            batch_size = 1000
            polling_interval = "1ms"
            "#,
            url = server.url()
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "search_source", documents)
        .await;
    let searches = server
        .seen()
        .iter()
        .filter(|seen| seen.path == "/_search")
        .count();
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages: documents,
        elapsed,
        latencies: stages.latencies("search_source"),
        extra: vec![
            ("requests", searches.to_string()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
