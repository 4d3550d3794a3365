//! End-to-end throughput of the random source and the stdout sink through a
//! real Iggy server, next to the iggy client's own limits on the same server.
//!
//!     cargo bench --bench backends -- pipeline                  # every case
//!     cargo bench --bench backends -- pipeline random        # cases whose name contains "random"
//!     IGGY_ADDRESS=127.0.0.1:8090 cargo bench --bench backends -- pipeline   # a real server
//!
//! Each case runs in its own process and prints one line
//! `bench: name=... messages=N seconds=S msgs_per_s=R p50_ms=... p99_ms=... rss_mb=...`
//! (see `benches/backends/common/mod.rs`). Latencies are per batch: poll to commit for
//! a source, poll to offset commit for a sink, as the engine times them.
//! The stdout sink prints every payload (`print_payload = true`) to the
//! process's standard output, which the case points at /dev/null.
//!
//! - `raw_send`: `send_messages` alone, batches of 1000 payloads of 200 B;
//! - `raw_consume`: a group consumer alone, storing offsets after each batch;
//! - `random_to_iggy`: the random source (200 B records, polls of 1000);
//! - `random_to_iggy_polls_of_10000`: the same, 10 sends per state save;
//! - `random_to_iggy_in_flight_N`: `random_to_iggy` with `max_in_flight = N`
//!   (the default is chosen from these);
//! - `random_to_iggy_remap`: `random_to_iggy` through a 3-line `remap` (feature
//!   `vrl`: rename a field, parse a timestamp, set the message key);
//! - `random_to_iggy_builtins`: `random_to_iggy` through `add_fields` +
//!   `delete_fields` (the built-ins' nearest work, without the key);
//! - `random_to_iggy_tapped`: `random_to_iggy` with a tap subscriber on its
//!   `in` and `out` stages reading every frame (what `iggy-connect tap` costs;
//!   untapped, a batch costs one atomic load);
//! - `iggy_to_stdout`: the stdout sink draining a filled topic;
//! - `random_iggy_stdout`: both connectors in one runtime, measured at the sink.
//!
//! `BENCH_SCALE` scales the message counts (default 1: 1,000,000).
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::engine::tap::TapStage;
use iggy_connect::iggy::IggyBus;
use iggy_connect::state::FileStateStore;

use crate::common;
use crate::common::{Iggy, Latencies, Report, Stages, raw};

const CASES: &[&str] = &[
    "raw_send",
    "raw_consume",
    "random_to_iggy",
    "random_to_iggy_polls_of_10000",
    "random_to_iggy_in_flight_1",
    "random_to_iggy_in_flight_2",
    "random_to_iggy_in_flight_4",
    "random_to_iggy_in_flight_8",
    "random_to_iggy_in_flight_16",
    "random_to_iggy_in_flight_32",
    "random_to_iggy_in_flight_64",
    #[cfg(feature = "vrl")]
    "random_to_iggy_remap",
    "random_to_iggy_builtins",
    "random_to_iggy_tapped",
    "iggy_to_stdout",
    "random_iggy_stdout",
];
const BATCH: u64 = 1000;
/// The random source's `text` length that makes its records about 200 bytes.
const TEXT_LENGTH: usize = 100;
const TOPIC: &str = "events";
/// The transforms of `random_to_iggy_remap`, as written in a connector file.
const REMAP: &str = r#"
        [transforms.remap]
        source = '''
        .who = del(.name)
        .at = parse_timestamp!("2026-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
        %key = .id
        '''
"#;
/// Not a transform: `random_to_iggy` subscribes to the tap when given this.
const TAPPED: &str = "# tapped";
/// The transforms of `random_to_iggy_builtins`.
const BUILTINS: &str = r#"
        [transforms.add_fields]
        enabled = true
        [[transforms.add_fields.fields]]
        key = "who"
        value.static = "World"
        [transforms.delete_fields]
        enabled = true
        fields = ["name"]
"#;

inventory::submit! {
    crate::Bench {
        name: "pipeline",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let messages = common::scaled(1_000_000, BATCH);
    let iggy = Iggy::start();
    let stream = common::unique(case);
    match case {
        "raw_send" => raw_send(case, &iggy, &stream, messages).await,
        "raw_consume" => raw_consume(case, &iggy, &stream, messages).await,
        "random_to_iggy" => random_to_iggy(case, &iggy, &stream, messages, BATCH, None, "").await,
        "random_to_iggy_polls_of_10000" => {
            random_to_iggy(case, &iggy, &stream, messages, 10 * BATCH, None, "").await
        }
        "random_to_iggy_remap" => {
            random_to_iggy(case, &iggy, &stream, messages, BATCH, None, REMAP).await
        }
        "random_to_iggy_builtins" => {
            random_to_iggy(case, &iggy, &stream, messages, BATCH, None, BUILTINS).await
        }
        "random_to_iggy_tapped" => {
            random_to_iggy(case, &iggy, &stream, messages, BATCH, None, TAPPED).await
        }
        in_flight if in_flight.starts_with("random_to_iggy_in_flight_") => {
            let count = in_flight
                .trim_start_matches("random_to_iggy_in_flight_")
                .parse()
                .expect("in-flight count");
            random_to_iggy(case, &iggy, &stream, messages, BATCH, Some(count), "").await
        }
        "iggy_to_stdout" => iggy_to_stdout(case, &iggy, &stream, messages).await,
        "random_iggy_stdout" => random_iggy_stdout(case, &iggy, &stream, messages).await,
        other => panic!("unknown case {other}"),
    }
}

/// A record shaped like the random source's, about 200 bytes.
fn record(seq: u64) -> Bytes {
    let text: String = "abcdefghij".repeat(TEXT_LENGTH / 10);
    Bytes::from(format!(
        r#"{{"id":"{}","seq":{seq},"title":"Hello","name":"World","text":"{text}"}}"#,
        uuid::Uuid::from_u128(u128::from(seq) + 1)
    ))
}

async fn raw_send(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    let payload = record(123_456);
    let started = Instant::now();
    let durations = raw::send(&client, stream, TOPIC, messages, BATCH, |_| payload.clone()).await;
    let elapsed = started.elapsed();
    Report {
        name: case,
        messages,
        elapsed,
        latencies: Latencies::from_durations(&durations),
        extra: vec![
            ("payload_bytes", payload.len().to_string()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}

async fn raw_consume(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, BATCH, record).await;
    let started = Instant::now();
    let (durations, bytes) =
        raw::consume(&client, stream, TOPIC, "bench", messages, BATCH as u32).await;
    let elapsed = started.elapsed();
    Report {
        name: case,
        messages,
        elapsed,
        latencies: Latencies::from_durations(&durations),
        extra: vec![
            ("payload_bytes", (bytes / messages).to_string()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}

async fn random_to_iggy(
    case: &str,
    iggy: &Iggy,
    stream: &str,
    messages: u64,
    per_poll: u64,
    max_in_flight: Option<u32>,
    transforms: &str,
) {
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    runtime
        .add(random_source(
            stream,
            messages,
            per_poll,
            max_in_flight,
            transforms,
        ))
        .expect("add source");
    let taps = (transforms == TAPPED).then(|| tap_every_frame(&runtime));
    let started = Instant::now();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "random")
        .await
        .expect("source");
    let elapsed = started.elapsed();
    let view = runtime
        .view(ConnectorKind::Source, "random")
        .expect("source view");
    assert_eq!(view.metrics.sent.get(), messages, "{:?}", view.status);
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("random"),
        extra: [
            vec![
                ("records_per_poll", per_poll.to_string()),
                (
                    "max_in_flight",
                    max_in_flight.map_or("default".into(), |count| count.to_string()),
                ),
            ],
            stages.breakdown("random"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    if let Some(taps) = taps {
        taps.abort();
    }
    runtime.shutdown().await;
    let client = iggy.settings().connect().await.expect("connect");
    raw::drop_stream(&client, stream).await;
}

/// Subscribes to the source's `in` and `out` taps and reads every frame
/// until aborted.
fn tap_every_frame(runtime: &Runtime) -> tokio::task::JoinHandle<()> {
    let tap = runtime
        .view(ConnectorKind::Source, "random")
        .expect("source view")
        .tap;
    let mut subscriptions = [TapStage::In, TapStage::Out].map(|stage| tap.subscribe(stage));
    tokio::spawn(async move {
        let [first, second] = &mut subscriptions;
        loop {
            tokio::select! {
                event = first.receiver.recv() => drop(event),
                event = second.receiver.recv() => drop(event),
            }
        }
    })
}

async fn iggy_to_stdout(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, BATCH, record).await;
    common::stdout_to_dev_null();
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    runtime.add(stdout_sink(stream)).expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_processed(&runtime, messages).await;
    let elapsed = started.elapsed();
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("stdout"),
        extra: [
            stages.breakdown("stdout"),
            vec![("server", iggy.kind().into())],
        ]
        .concat(),
    }
    .print();
    runtime.shutdown().await;
    raw::drop_stream(&client, stream).await;
}

async fn random_iggy_stdout(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    common::stdout_to_dev_null();
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    runtime
        .add(random_source(stream, messages, BATCH, None, ""))
        .expect("add source");
    runtime.add(stdout_sink(stream)).expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    wait_processed(&runtime, messages).await;
    let elapsed = started.elapsed();
    let source = stages.latencies("random");
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("stdout"),
        extra: vec![
            ("source_p50_ms", format!("{:.2}", source.ms(0.5))),
            ("source_p99_ms", format!("{:.2}", source.ms(0.99))),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    runtime.shutdown().await;
    let client = iggy.settings().connect().await.expect("connect");
    raw::drop_stream(&client, stream).await;
}

/// The runtime as `iggy-connect run` builds it: the Iggy bus and the file
/// state store (a state save is an fsynced file and directory).
fn runtime(iggy: &Iggy, state_dir: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(iggy.settings())),
        Arc::new(FileStateStore::new(state_dir).expect("state store")),
        Duration::from_secs(10),
    )
}

fn random_source(
    stream: &str,
    messages: u64,
    per_poll: u64,
    max_in_flight: Option<u32>,
    transforms: &str,
) -> ConnectorConfig {
    let in_flight = max_in_flight.map_or(String::new(), |count| format!("max_in_flight = {count}"));
    connector(&format!(
        r#"
        type = "source"
        key = "random"
        path = "random"
        {in_flight}
        [[streams]]
        stream = "{stream}"
        topic = "{TOPIC}"
        schema = "json"
        batch_length = {BATCH}
        linger_time = "5ms"
        [plugin_config]
        interval = "0ms"
        max_count = {messages}
        messages_range = [{per_poll}, {per_poll}]
        payload_size = {TEXT_LENGTH}
        {transforms}
        "#
    ))
}

fn stdout_sink(stream: &str) -> ConnectorConfig {
    let poll_interval = humantime::format_duration(common::poll_interval());
    connector(&format!(
        r#"
        type = "sink"
        key = "stdout"
        path = "stdout"
        [[streams]]
        stream = "{stream}"
        topics = ["{TOPIC}"]
        schema = "json"
        batch_length = {BATCH}
        poll_interval = "{poll_interval}"
        consumer_group = "bench"
        [plugin_config]
        print_payload = true
        "#
    ))
}

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("bench.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad bench config: {issues}"))
        .0
}

async fn wait_processed(runtime: &Runtime, messages: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime
            .view(ConnectorKind::Sink, "stdout")
            .expect("sink view");
        if view.metrics.processed.get() >= messages {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the sink processed {} of {messages}: {:?}",
            view.metrics.processed.get(),
            view.status
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
