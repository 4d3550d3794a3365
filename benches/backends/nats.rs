//! Throughput of the nats sink, Iggy -> sink -> a real local
//! `nats-server -js` (Debian's 2.9, started by the case from
//! `tests/support/nats_server.rs`, installed by `scripts/ensure-debian-packages`),
//! and of the nats source out of a JetStream stream into Iggy:
//!
//!     cargo bench --features nats-sink,nats-source --bench backends -- nats
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. The NATS
//! server is a separate process: its memory is not in `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size.
#![cfg(all(feature = "nats-source", feature = "nats-sink"))]

use iggy_connect::connectors::ConnectorKind;
use serde_json::json;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::nats_server::{NatsServer, create_stream, stream_messages};

const CASES: &[&str] = &["iggy_to_nats_jetstream", "nats_jetstream_to_iggy"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "nats",
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
        "nats_jetstream_to_iggy" => {
            let server = NatsServer::start();
            source_case(case, &iggy, &stream, messages, &server).await;
        }
        other => panic!("unknown case {other}"),
    }
}

/// Messages already in a JetStream stream -> the nats source (a durable
/// pull consumer, batches of 1000, acked on commit) -> Iggy.
async fn source_case(case: &str, iggy: &Iggy, stream: &str, messages: u64, server: &NatsServer) {
    let jetstream = server.jetstream().await;
    create_stream(&jetstream, "BENCH", &["bench.>"]).await;
    let payload = json!({"name": "bench", "text": "x".repeat(100)}).to_string();
    let mut acks = Vec::with_capacity(1000);
    for _ in 0..messages {
        acks.push(
            jetstream
                .publish("bench.events", payload.clone().into())
                .await
                .expect("publish"),
        );
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await.expect("PubAck");
            }
        }
    }
    for ack in acks {
        ack.await.expect("PubAck");
    }
    let client = raw::topic(iggy, stream, TOPIC).await;
    let stages = Stages::install();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
            type = "source"
            key = "bench_source"
            path = "nats"
            [[streams]]
            stream = "{stream}"
            topic = "{TOPIC}"
            schema = "json"
            batch_length = 1000
            [plugin_config]
            url = "{url}"
            stream = "BENCH"
            durable_name = "bench"
            batch_size = 1000
            "#,
            url = server.url()
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "bench_source", messages)
        .await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("bench_source"),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
    raw::drop_stream(&client, stream).await;
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
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("bench_sink"),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
