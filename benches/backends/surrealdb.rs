//! Throughput of the surrealdb sink: Iggy -> sink -> the SurrealDB protocol
//! test server of `tests/support/surrealdb.rs` (in this process, parsing
//! each statement and keeping every record in memory, so its cost and
//! memory are part of the figures; no real SurrealDB runs here):
//!
//!     cargo bench --features surrealdb-sink --bench backends -- surrealdb
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! the case prints one `bench:` line with `requests=N` (RPC query requests)
//! added. `BENCH_SCALE` (default 1.0) multiplies the case's size (a debug
//! check: `BENCH_SCALE=0.01 cargo bench --profile dev ...`).
#![cfg(feature = "surrealdb-sink")]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::surrealdb::SurrealServer;

const CASES: &[&str] = &["iggy_to_surrealdb_sink"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "surrealdb",
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
    let server = SurrealServer::start().await;
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let endpoint = server.url();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "surrealdb_sink"
                path = "libiggy_connector_surrealdb_sink"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                endpoint = "{endpoint}"
                namespace = "iggy"
                database = "connectors"
                table = "bench"
                username = "root"
                password = "root"
                auto_define_table = true
                batch_size = 1000
                "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Sink, "surrealdb_sink", messages)
        .await;
    let stored = server.records("iggy", "connectors", "bench").len() as u64;
    assert_eq!(stored, messages, "every message is one record");
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("surrealdb_sink"),
        extra: vec![
            ("requests", server.rpc_requests().len().to_string()),
            ("backend", "protocol-test-server".into()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
