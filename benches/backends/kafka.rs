//! Throughput of the kafka source and sink through Iggy and a real
//! Kafka-protocol broker (tansu 0.6.0 with memory storage, started by each
//! case from `tests/support/kafka.rs`, installed by `scripts/ensure-tansu`),
//! beside a raw rdkafka loop against the same broker in the same run:
//!
//!     cargo bench --no-default-features --features kafka-source,kafka-sink --bench backends -- kafka
//!
//! - `kafka_to_iggy_200b`, `kafka_to_iggy_1kb`: a one-partition Kafka topic
//!   filled beforehand -> source (a consumer group, batches of 1000) -> Iggy.
//!   The ceiling is a raw group consumer reading the same records (storing
//!   its offset every 1000 records, as the source does per batch).
//! - `iggy_to_kafka_200b`, `iggy_to_kafka_1kb`: an Iggy topic filled
//!   beforehand -> sink (idempotent producer, `acks=all`, batches of 5000)
//!   -> a one-partition Kafka topic, read back afterwards. The ceiling is a
//!   raw producer with the sink's settings keeping every record in flight
//!   librdkafka's queue takes.
//! - `iggy_send_shapes_200b`: no Kafka; the Iggy producer alone sending
//!   batches of 1000 records of 200 B in the shapes the sources give it
//!   (plain, with ids, with a partition per record, with the kafka source's
//!   headers, all three), one line each: what a send costs by shape.
//!
//! `BENCH_KAFKA_SOURCE_TOP`, `BENCH_KAFKA_SOURCE_PLUGIN` and
//! `BENCH_KAFKA_SOURCE_CLIENT` put lines into the source's config (its top
//! level, its `[plugin_config]` instead of `batch_size = 1000`, its
//! `client_options`), for trying settings without a rebuild.
//!
//! Each raw loop runs in a child process of its own (so the case's
//! `rss_mb` is the connector's), prints its own `bench: name=raw_kafka_...`
//! line, and the case prints `ceiling_msgs_per_s` and `of_ceiling`. A
//! consumer's rate counts from its first record, so the group join (about
//! 3 s on tansu, `join_s`) is not in it; a producer's counts from its first
//! send. The broker is a separate process: its memory is not in `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies the record count (200,000, at
//! least 1000).
#![cfg(all(feature = "kafka-source", feature = "kafka-sink"))]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use iggy_connect::connectors::ConnectorKind;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};

use crate::common;
use crate::common::{Iggy, Latencies, Pipeline, Report, Stages, raw};
use crate::support::kafka::{KafkaBroker, SESSION_TIMEOUT_MS, create_topic, read_all};

const CASES: &[&str] = &[
    "kafka_to_iggy_200b",
    "kafka_to_iggy_1kb",
    "iggy_to_kafka_200b",
    "iggy_to_kafka_1kb",
    "iggy_send_shapes_200b",
];
/// The Iggy topic.
const TOPIC: &str = "events";
/// The Kafka topic the connector reads or writes.
const KAFKA_TOPIC: &str = "bench";
/// The Kafka topic the raw producer writes when it is the sink's ceiling.
const CEILING_TOPIC: &str = "ceiling";
/// Set in the child process that runs a raw loop: `produce|consume
/// BOOTSTRAP TOPIC COUNT SIZE`.
const RAW_ENV: &str = "IGGY_CONNECT_BENCH_KAFKA_RAW";

inventory::submit! {
    crate::Bench {
        name: "kafka",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    if let Ok(spec) = std::env::var(RAW_ENV) {
        raw_loop(case, &spec).await;
        return;
    }
    let size = if case.ends_with("_1kb") { 1024 } else { 200 };
    let messages = common::scaled(200_000, 1000);
    if case == "iggy_send_shapes_200b" {
        send_shapes(case, size, messages).await;
        return;
    }
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, KAFKA_TOPIC, 1).await;
    let iggy = Iggy::start();
    let stream = common::unique(case);
    match case {
        "kafka_to_iggy_200b" | "kafka_to_iggy_1kb" => {
            // The producer's run fills the topic; the raw consumer's is the
            // source's ceiling.
            raw_in_child(case, "produce", &bootstrap, KAFKA_TOPIC, messages, size);
            let ceiling = raw_in_child(case, "consume", &bootstrap, KAFKA_TOPIC, messages, size);
            source_case(case, &iggy, &stream, &bootstrap, messages, size, ceiling).await;
        }
        "iggy_to_kafka_200b" | "iggy_to_kafka_1kb" => {
            create_topic(&bootstrap, CEILING_TOPIC, 1).await;
            let ceiling = raw_in_child(case, "produce", &bootstrap, CEILING_TOPIC, messages, size);
            sink_case(case, &iggy, &stream, &bootstrap, messages, size, ceiling).await;
        }
        other => panic!("unknown case {other}"),
    }
}

/// Record `n`'s payload: its number, then `x` up to `size` bytes.
fn payload(n: u64, size: usize) -> Vec<u8> {
    let mut payload = format!("{n:020}").into_bytes();
    payload.resize(size, b'x');
    payload
}

/// Runs a raw loop in a child process (this executable, case `case`, with
/// [`RAW_ENV`]), passes its report line on, and returns its msgs/s.
fn raw_in_child(
    case: &str,
    mode: &str,
    bootstrap: &str,
    topic: &str,
    count: u64,
    size: usize,
) -> f64 {
    let mut child = Command::new(std::env::current_exe().expect("executable"))
        .env(crate::CASE_ENV, case)
        .env(
            RAW_ENV,
            format!("{mode} {bootstrap} {topic} {count} {size}"),
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the raw loop");
    let mut rate = None;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.expect("the raw loop's output");
        println!("{line}");
        rate = rate.or_else(|| {
            line.split_whitespace()
                .find_map(|field| field.strip_prefix("msgs_per_s="))
                .and_then(|value| value.parse().ok())
        });
    }
    assert!(
        child.wait().expect("the raw loop ends").success(),
        "the raw {mode} loop failed"
    );
    rate.expect("the raw loop reports msgs_per_s")
}

/// Child-process mode: one raw rdkafka loop, reported as `raw_kafka_MODE_SIZE`.
async fn raw_loop(case: &str, spec: &str) {
    let fields: Vec<&str> = spec.split(' ').collect();
    let [mode, bootstrap, topic, count, size] = fields[..] else {
        panic!("bad {RAW_ENV}: {spec}");
    };
    let count: u64 = count.parse().expect("count");
    let size: usize = size.parse().expect("size");
    let suffix = case.rsplit('_').next().unwrap_or_default();
    let name = format!("raw_kafka_{mode}_{suffix}");
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    let (elapsed, extra) = match mode {
        "produce" => (produce(&bootstrap, &topic, count, size).await, Vec::new()),
        "consume" => {
            let (join, elapsed) =
                tokio::task::spawn_blocking(move || consume(&bootstrap, &topic, count))
                    .await
                    .expect("the consumer loop");
            (
                elapsed,
                vec![("join_s", format!("{:.1}", join.as_secs_f64()))],
            )
        }
        other => panic!("unknown raw mode {other}"),
    };
    Report {
        name: &name,
        messages: count,
        elapsed,
        latencies: Latencies::new(Vec::new()),
        extra,
    }
    .print();
}

/// Produces `count` records of `size` bytes with the sink's producer
/// settings (idempotent, `acks=all`, 5 ms linger, 1 MB batches; key and an
/// `iggy_id` header as the sink writes them), as many in flight as
/// librdkafka's queue takes; the time from the first send to the last
/// delivery report.
async fn produce(bootstrap: &str, topic: &str, count: u64, size: usize) -> Duration {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .create()
        .expect("producer");
    let started = Instant::now();
    let mut pending = VecDeque::new();
    for n in 0..count {
        let (key, payload) = (n.to_string(), payload(n, size));
        loop {
            let headers = OwnedHeaders::new().insert(Header {
                key: "iggy_id",
                value: Some(key.as_bytes()),
            });
            let record = FutureRecord::to(topic)
                .key(&key)
                .payload(&payload)
                .headers(headers);
            match producer.send_result(record) {
                Ok(delivery) => {
                    pending.push_back(delivery);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    let oldest = pending.pop_front().expect("a full queue holds a record");
                    delivered(oldest.await);
                }
                Err((error, _)) => panic!("produce: {error}"),
            }
        }
    }
    for delivery in pending {
        delivered(delivery.await);
    }
    started.elapsed()
}

fn delivered<E: std::fmt::Debug>(
    report: Result<rdkafka::producer::future_producer::OwnedDeliveryResult, E>,
) {
    report
        .expect("a delivery report")
        .map_err(|(error, _)| error)
        .expect("delivered");
}

/// Reads `count` records of `topic` with a fresh consumer group, from the
/// beginning, storing the offset every 1000 records (committed every 5 s,
/// as the source does); the time to the first record (the group join), and
/// from the first record to the last.
fn consume(bootstrap: &str, topic: &str, count: u64) -> (Duration, Duration) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "raw-ceiling")
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "5000")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", SESSION_TIMEOUT_MS)
        .set("heartbeat.interval.ms", "1000")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let subscribed = Instant::now();
    let mut first = None;
    let (mut read, mut bytes) = (0u64, 0usize);
    let deadline = subscribed + Duration::from_secs(600);
    while read < count {
        assert!(Instant::now() < deadline, "read {read} of {count}");
        let Some(message) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = message.expect("consume");
        first.get_or_insert_with(Instant::now);
        bytes += message.payload().map_or(0, <[u8]>::len);
        read += 1;
        if read % 1000 == 0 || read == count {
            consumer
                .store_offset_from_message(&message)
                .expect("store the offset");
        }
    }
    assert!(bytes > 0, "the records have payloads");
    let first = first.expect("a record was read");
    (first - subscribed, first.elapsed())
}

/// The Kafka topic filled beforehand -> the source -> Iggy; the rate from
/// the first batch Iggy acknowledged to the last (the group join is
/// `join_s`).
async fn source_case(
    case: &str,
    iggy: &Iggy,
    stream: &str,
    bootstrap: &str,
    messages: u64,
    size: usize,
    ceiling: f64,
) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    let stages = Stages::install();
    // Diagnostics: `BENCH_KAFKA_SOURCE_TOP` adds lines to the connector's
    // top level (`max_in_flight = 1`), `BENCH_KAFKA_SOURCE_PLUGIN` replaces
    // the lines of its `[plugin_config]` (`batch_size = 5000`).
    let top = std::env::var("BENCH_KAFKA_SOURCE_TOP").unwrap_or_default();
    let plugin =
        std::env::var("BENCH_KAFKA_SOURCE_PLUGIN").unwrap_or_else(|_| "batch_size = 1000".into());
    // And `BENCH_KAFKA_SOURCE_CLIENT` to its `client_options`.
    let client_options = std::env::var("BENCH_KAFKA_SOURCE_CLIENT").unwrap_or_default();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
            type = "source"
            key = "bench_source"
            path = "kafka"
            {top}
            [[streams]]
            stream = "{stream}"
            topic = "{TOPIC}"
            schema = "raw"
            [plugin_config]
            bootstrap_servers = "{bootstrap}"
            topics = ["{KAFKA_TOPIC}"]
            group_id = "bench"
            {plugin}
            [plugin_config.client_options]
            "session.timeout.ms" = "{SESSION_TIMEOUT_MS}"
            "heartbeat.interval.ms" = "1000"
            {client_options}
            "#
        ),
    );
    let started = Instant::now();
    pipeline.runtime.start_enabled().await;
    let sent = || {
        pipeline
            .runtime
            .view(ConnectorKind::Source, "bench_source")
            .expect("view")
            .metrics
            .sent
            .get()
    };
    let deadline = started + Duration::from_secs(600);
    let (mut first, mut before) = (None, 0);
    loop {
        let done = sent();
        if done > 0 && first.is_none() {
            first = Some(Instant::now());
            before = done;
        }
        if done >= messages {
            break;
        }
        assert!(Instant::now() < deadline, "sent {done} of {messages}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let first = first.expect("a batch was sent");
    let elapsed = first.elapsed();
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    let counted = messages - before;
    let rate = counted as f64 / elapsed.as_secs_f64();
    let mut extra = vec![
        ("record_bytes", size.to_string()),
        ("join_s", format!("{:.1}", (first - started).as_secs_f64())),
        ("ceiling_msgs_per_s", format!("{ceiling:.0}")),
        ("of_ceiling", format!("{:.2}", rate / ceiling)),
        ("server", iggy.kind().into()),
    ];
    extra.extend(stages.breakdown("bench_source"));
    Report {
        name: case,
        messages: counted,
        elapsed,
        latencies: stages.latencies("bench_source"),
        extra,
    }
    .print();
    raw::drop_stream(&client, stream).await;
}

/// An Iggy topic filled beforehand -> the sink -> the Kafka topic, read
/// back afterwards with a raw consumer.
async fn sink_case(
    case: &str,
    iggy: &Iggy,
    stream: &str,
    bootstrap: &str,
    messages: u64,
    size: usize,
    ceiling: f64,
) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, 1000, |n| {
        payload(n, size).into()
    })
    .await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
            type = "sink"
            key = "bench_sink"
            path = "kafka"
            [[streams]]
            stream = "{stream}"
            topics = ["{TOPIC}"]
            schema = "raw"
            batch_length = 5000
            poll_interval = "{poll_interval}"
            consumer_group = "bench"
            [plugin_config]
            bootstrap_servers = "{bootstrap}"
            topic = "{KAFKA_TOPIC}"
            "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Sink, "bench_sink", messages)
        .await;
    pipeline.runtime.shutdown().await;
    let report = Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("bench_sink"),
        extra: Vec::new(),
    };
    let rate = report.rate();
    let mut extra = vec![
        ("record_bytes", size.to_string()),
        ("ceiling_msgs_per_s", format!("{ceiling:.0}")),
        ("of_ceiling", format!("{:.2}", rate / ceiling)),
        ("server", iggy.kind().into()),
    ];
    extra.extend(stages.breakdown("bench_sink"));
    Report { extra, ..report }.print();
    let count = usize::try_from(messages).expect("count");
    let written = read_all(bootstrap, KAFKA_TOPIC, 1, count, Duration::from_secs(120)).await;
    assert!(
        written.len() >= count,
        "{} of {messages} records in Kafka",
        written.len()
    );
    raw::drop_stream(&client, stream).await;
}

/// The producer's send of batches of 1000 records of `size` bytes in the
/// shapes the random and the kafka source give it, to the same test server:
/// `plain` (no id, no header, balanced), `ids` (the kafka source's ids),
/// `keyed` (a partition per record, as `partitioning = "key"`), `headers`
/// (the source's `kafka_*` headers plus the bench records' key and
/// `iggy_id`), `kafka` (all three). One line per shape, `p50_ms` per send.
async fn send_shapes(case: &str, size: usize, messages: u64) {
    use iggy_connect::iggy::{Bus, IggyBus, ProducerTarget};
    use iggy_connect::message::{HeaderValue, OutgoingMessage};
    let iggy = Iggy::start();
    let bus = IggyBus::new(iggy.settings());
    for shape in ["plain", "ids", "keyed", "headers", "kafka", "plain"] {
        let stream = common::unique(&format!("{case}_{shape}"));
        let producer = bus
            .producer(&ProducerTarget {
                stream: stream.clone(),
                topic: TOPIC.into(),
                partitions: 1,
                batch_length: 1000,
                linger_time: Duration::from_millis(5),
            })
            .await
            .expect("producer");
        let (ids, keyed, headers) = match shape {
            "ids" => (true, false, false),
            "keyed" => (false, true, false),
            "headers" => (false, false, true),
            "kafka" => (true, true, true),
            _ => (false, false, false),
        };
        let record = |n: u64| {
            let key = n.to_string();
            let mut message = OutgoingMessage::new(
                ids.then(|| u128::from(n) << 64 | 0xabcd),
                Vec::new(),
                payload(n, size).into(),
            );
            if keyed {
                message.partition = Some(crc32fast::hash(key.as_bytes()));
            }
            if headers {
                message.headers = vec![
                    (
                        "kafka_topic".into(),
                        HeaderValue::String(KAFKA_TOPIC.into()),
                    ),
                    ("kafka_partition".into(), HeaderValue::Int(0)),
                    ("kafka_offset".into(), HeaderValue::Int(n as i64)),
                    (
                        "kafka_timestamp".into(),
                        HeaderValue::Int(1_765_000_000_000),
                    ),
                    ("kafka_key".into(), HeaderValue::String(key.as_str().into())),
                    ("iggy_id".into(), HeaderValue::String(key.into())),
                ];
            }
            message
        };
        let mut samples = Vec::new();
        let started = Instant::now();
        for first in (0..messages).step_by(1000) {
            let batch: Vec<OutgoingMessage> = (first..first + 1000).map(record).collect();
            let sent = Instant::now();
            producer.send(&batch).await.expect("send");
            samples.push(sent.elapsed());
        }
        Report {
            name: &format!("{case}_{shape}"),
            messages,
            elapsed: started.elapsed(),
            latencies: Latencies::from_durations(&samples),
            extra: vec![("server", iggy.kind().into())],
        }
        .print();
        drop(producer);
        let client = iggy.settings().connect().await.expect("connect");
        raw::drop_stream(&client, &stream).await;
    }
}
