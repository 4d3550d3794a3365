//! Throughput of the mongodb sink (Iggy -> sink -> MongoDB) and source
//! (MongoDB -> source, polling by `_id` -> Iggy), against the nx-27017
//! emulator of `tests/support/mongodb.rs`, a Python server on SQLite, so its
//! figures measure the emulator as much as the sink; a real mongod with
//! `IGGY_CONNECT_TEST_MONGODB_URL`):
//!
//!     cargo bench --features mongodb-sink,mongodb-source --bench backends -- mongodb
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! the case prints one `bench:` line. `BENCH_SCALE` (default 1.0) multiplies
//! the case's size (a debug check: `BENCH_SCALE=0.01`).
#![cfg(all(feature = "mongodb-sink", feature = "mongodb-source"))]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::mongodb::{MongoServer, unique_database};

const CASES: &[&str] = &["iggy_to_mongodb_sink", "mongodb_source_to_iggy"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "mongodb",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    match case.as_str() {
        "iggy_to_mongodb_sink" => {
            sink_case(&case, &iggy, &stream, common::scaled(20_000, 500)).await
        }
        _ => source_case(&case, &iggy, &stream, common::scaled(20_000, 500)).await,
    }
}

/// Documents already in the collection, read by `_id` in batches of 1000.
async fn source_case(case: &str, iggy: &Iggy, stream: &str, documents: u64) {
    let server = MongoServer::start();
    let database = unique_database("bench");
    let collection = server
        .client()
        .await
        .database(&database)
        .collection::<mongodb::bson::Document>("bench");
    for first in (0..documents).step_by(1000) {
        let chunk: Vec<mongodb::bson::Document> = (first..documents.min(first + 1000))
            .map(|n| mongodb::bson::doc! { "_id": n as i64, "name": "bench", "text": "x".repeat(100) })
            .collect();
        collection.insert_many(chunk).await.expect("seed documents");
    }
    let client = raw::topic(iggy, stream, TOPIC).await;
    let stages = Stages::install();
    let uri = server.uri();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "source"
                key = "mongodb_source"
                path = "mongodb"
                [[streams]]
                stream = "{stream}"
                topic = "{TOPIC}"
                schema = "json"
                [plugin_config]
                connection_uri = "{uri}"
                database = "{database}"
                collection = "bench"
                batch_size = 1000
                poll_interval = "10ms"
                "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "mongodb_source", documents)
        .await;
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages: documents,
        elapsed,
        latencies: stages.latencies("mongodb_source"),
        extra: vec![
            (
                "backend",
                if server.real { "mongod" } else { "nx-27017" }.into(),
            ),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let server = MongoServer::start();
    let database = unique_database("bench");
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let uri = server.uri();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "mongodb_sink"
                path = "mongodb"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                connection_uri = "{uri}"
                database = "{database}"
                collection = "bench"
                payload_format = "json"
                batch_size = 1000
                "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Sink, "mongodb_sink", messages)
        .await;
    let stored = server.documents(&database, "bench").await.len() as u64;
    assert_eq!(stored, messages, "every message is one document");
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("mongodb_sink"),
        extra: vec![
            (
                "backend",
                if server.real { "mongod" } else { "nx-27017" }.into(),
            ),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
