//! Throughput of the mqtt sink and source through Iggy, against a real local
//! `mosquitto` (Debian's 2.0, started by the case from
//! `tests/support/mosquitto.rs`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features mqtt-sink,mqtt-source --bench backends -- mqtt
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. The broker
//! is a separate process: its memory is not in `rss_mb`. The broker's default
//! window of 20 unacknowledged messages towards a subscriber bounds the
//! source's batches (`max_inflight_messages`; the case raises it to 1000, as
//! a deployment that wants throughput would). `BENCH_SCALE` (default 1.0)
//! multiplies every case's size. The `mqtt5` cases are the same over MQTT 5
//! (`protocol_version = "5"`; the source then bounds the broker's window
//! itself, Receive Maximum 2 x `batch_size`).
#![cfg(all(feature = "mqtt-source", feature = "mqtt-sink"))]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::mosquitto::{Collector, Mosquitto, create_session, publish};

const CASES: &[&str] = &[
    "iggy_to_mqtt",
    "mqtt_to_iggy",
    "iggy_to_mqtt5",
    "mqtt5_to_iggy",
];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "mqtt",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let messages = common::scaled(100_000, 1000);
    let broker = Mosquitto::start_with("max_inflight_messages 1000");
    match case {
        "iggy_to_mqtt" => sink_case(case, &iggy, &broker, &stream, messages, "3.1.1").await,
        "mqtt_to_iggy" => source_case(case, &iggy, &broker, &stream, messages, "3.1.1").await,
        "iggy_to_mqtt5" => sink_case(case, &iggy, &broker, &stream, messages, "5").await,
        "mqtt5_to_iggy" => source_case(case, &iggy, &broker, &stream, messages, "5").await,
        other => panic!("unknown case {other}"),
    }
}

async fn sink_case(
    case: &str,
    iggy: &Iggy,
    broker: &Mosquitto,
    stream: &str,
    messages: u64,
    version: &str,
) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, 1000, raw::document).await;
    let collector = Collector::start(broker.port, "bench/#", "bench/events").await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "bench_sink"
                path = "mqtt"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 5000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                url = "{url}"
                topic = "bench/events"
                protocol_version = "{version}"
                "#,
            url = broker.url()
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Sink, "bench_sink", messages)
        .await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("bench_sink"),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
    collector.settled().await.expect("the collector settles");
    assert!(
        collector.received().len() as u64 >= messages,
        "messages the subscriber received"
    );
    raw::drop_stream(&client, stream).await;
}

async fn source_case(
    case: &str,
    iggy: &Iggy,
    broker: &Mosquitto,
    stream: &str,
    messages: u64,
    version: &str,
) {
    let client_id = "iggy-connect-source-bench_source";
    create_session(broker.port, client_id, "bench/#").await;
    for first in (0..messages).step_by(10_000) {
        let last = (first + 10_000).min(messages);
        publish(
            broker.port,
            "bench/events",
            (first..last).map(raw::document).collect(),
        )
        .await;
    }
    let stages = Stages::install();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "source"
                key = "bench_source"
                path = "mqtt"
                [[streams]]
                stream = "{stream}"
                topic = "{TOPIC}"
                schema = "raw"
                [plugin_config]
                url = "{url}"
                topics = ["bench/#"]
                batch_size = 1000
                protocol_version = "{version}"
                "#,
            url = broker.url()
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "bench_source", messages)
        .await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    let client = raw::topic(iggy, stream, TOPIC).await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("bench_source"),
        extra: [
            stages.breakdown("bench_source"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
