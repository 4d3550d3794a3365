//! Throughput of Iggy-to-Iggy replication: messages already in a topic of a
//! "remote" Iggy server -> the iggy source (a consumer group there) -> the
//! same topic on "our" server:
//!
//!     cargo bench --features iggy-source --bench backends -- replication
//!
//! Both servers are test servers in child processes of their own (so
//! `rss_mb` is the connector's alone); `IGGY_ADDRESS` names ours and
//! `IGGY_REMOTE_ADDRESS` the remote one (same credentials) for real servers.
//! One case, `iggy_to_iggy` (1 KB messages in batches of 1000), prints one
//! `bench:` line. `BENCH_SCALE` (default 1.0) multiplies its size.
#![cfg(feature = "iggy-source")]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};

const CASES: &[&str] = &["iggy_to_iggy"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "replication",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let ours = Iggy::start();
    let remote = match std::env::var("IGGY_REMOTE_ADDRESS") {
        Ok(address) => Iggy::external(address),
        Err(_) => Iggy::start_test_server(),
    };
    let stream = common::unique(&case);
    let messages = common::scaled(200_000, 1000);
    let remote_client = raw::topic(&remote, &stream, TOPIC).await;
    raw::send(&remote_client, &stream, TOPIC, messages, 1000, |n| {
        let mut payload = vec![b'x'; 1000];
        payload[..8].copy_from_slice(&n.to_be_bytes());
        payload.into()
    })
    .await;
    let our_client = raw::topic(&ours, &stream, TOPIC).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        &ours,
        &format!(
            r#"
            type = "source"
            key = "replicator"
            path = "iggy"
            [[streams]]
            stream = "{stream}"
            topic = "{TOPIC}"
            schema = "raw"
            batch_length = 1000
            [plugin_config]
            address = "{address}"
            topics = ["{stream}/{TOPIC}"]
            consumer_group = "bench"
            batch_length = 1000
            poll_interval = "{poll_interval}"
            "#,
            address = remote.address
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "replicator", messages)
        .await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: &case,
        messages,
        elapsed,
        latencies: stages.latencies("replicator"),
        extra: vec![("server", ours.kind().into())],
    }
    .print();
    raw::drop_stream(&our_client, &stream).await;
    raw::drop_stream(&remote_client, &stream).await;
}
