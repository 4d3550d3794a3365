//! Micro benchmarks of the engine around the connectors
//! (`cargo bench --bench engine -- 'state_save|random_source_poll|engine_'`):
//!
//! - `state_save`: one `StateStore::save` of a source's state: the file store
//!   (the older of its two copies overwritten, one fdatasync) and the memory store;
//! - `random_source_poll`: the random source generating a poll of 1000
//!   records of about 200 bytes;
//! - `engine_source`: the source pipeline's own cost per message on the
//!   in-memory bus (transform chain check, encode, send, state save in the
//!   memory store, commit), for a source that hands over ready records;
//! - `engine_sink`: the sink pipeline's own cost per message on the in-memory
//!   bus (poll, decode, write to a sink that does nothing, offset commit), with
//!   JSON parsed into values or kept as checked text.
//!
//! Engine cases run batches of 1000 through a real `Runtime`; one iteration is
//! one batch, so `thrpt` is messages per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group};
use iggy_connect::codec::Schema;
use iggy_connect::config::{ConnectorConfig, KindConfig, OnError, SinkStream, SourceStream};
use iggy_connect::connectors::{
    BuildError, ConnectorError, ConnectorKind, Registry, Sink, SinkError, Source, SourceBatch,
};
use iggy_connect::engine::Runtime;
use iggy_connect::engine::runtime::{ConnectorFactory, RuntimeOptions};
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::{OutgoingMessage, Payload, SinkMessage, SourceRecord, TopicRef};
use iggy_connect::state::{FileStateStore, MemoryStateStore, StateStore, StoredState};

const BATCH: u64 = 1000;
const STREAM: &str = "bench";
const TOPIC: &str = "events";
const GROUP: &str = "bench";

fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn state_save(criterion: &mut Criterion) {
    let runtime = tokio();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = FileStateStore::new(dir.path()).expect("file store");
    let memory = MemoryStateStore::new();
    // The random source's state: `{"messages_produced": n}` in MessagePack.
    let state = StoredState {
        connector: "random".into(),
        data: rmp_serde::to_vec_named(&serde_json::json!({"messages_produced": 123_456_789}))
            .expect("state"),
    };
    let mut group = criterion.benchmark_group("state_save");
    group.sample_size(50);
    group.bench_function("file", |bencher| {
        bencher.iter(|| runtime.block_on(file.save("bench", &state)).expect("save"))
    });
    group.bench_function("memory", |bencher| {
        bencher.iter(|| {
            runtime
                .block_on(memory.save("bench", &state))
                .expect("save")
        })
    });
    group.finish();
}

fn random_source_poll(criterion: &mut Criterion) {
    let runtime = tokio();
    let Ok(entry) = Registry::source("random") else {
        eprintln!(
            "random_source_poll: the random source is not compiled in (--features random-source); left out"
        );
        return;
    };
    let mut source = (entry.build)(&serde_json::json!({
        "interval": "0ms",
        "messages_range": [BATCH, BATCH],
        "payload_size": 100,
    }))
    .expect("random source");
    runtime.block_on(source.open(None)).expect("open");
    let mut group = criterion.benchmark_group("random_source_poll");
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function("1000_records_200_bytes", |bencher| {
        bencher.iter(|| {
            let batch = runtime.block_on(source.poll()).expect("poll");
            std::hint::black_box(batch)
        })
    });
    group.finish();
}

fn engine_source(criterion: &mut Criterion) {
    let runtime = tokio();
    let mut group = criterion.benchmark_group("engine_source");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    let text = record_bytes();
    let value: serde_json::Value = serde_json::from_slice(&text).expect("json");
    for (name, payload) in [
        ("json_text_records", Payload::JsonBytes(text)),
        ("json_value_records", Payload::Json(value)),
    ] {
        group.bench_function(name, |bencher| {
            bencher.iter_custom(|batches| runtime.block_on(run_source(batches, payload.clone())))
        });
    }
    group.finish();
}

fn engine_sink(criterion: &mut Criterion) {
    let runtime = tokio();
    let mut group = criterion.benchmark_group("engine_sink");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    for (name, takes_text) in [("json_as_values", false), ("json_as_checked_text", true)] {
        group.bench_function(name, |bencher| {
            bencher.iter_custom(|batches| runtime.block_on(run_sink(batches, takes_text)))
        });
    }
    group.finish();
}

/// A record shaped like the random source's, about 200 bytes.
fn record_bytes() -> Bytes {
    Bytes::from(format!(
        r#"{{"id":"{}","seq":123456,"title":"Hello","name":"World","text":"{}"}}"#,
        uuid::Uuid::from_u128(42),
        "abcdefghij".repeat(10)
    ))
}

/// Time for `batches` batches of ready records to go through a source
/// pipeline into the in-memory bus.
async fn run_source(batches: u64, payload: Payload) -> Duration {
    let factory = Arc::new(BenchFactory {
        batches,
        payload,
        takes_text: false,
    });
    let runtime = runtime(factory);
    runtime.add(source_config()).expect("add source");
    let started = Instant::now();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "source")
        .await
        .expect("source");
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    elapsed
}

/// Time for a sink pipeline to drain `batches` batches from the in-memory
/// bus into a sink that does nothing.
async fn run_sink(batches: u64, takes_text: bool) -> Duration {
    let bus = MemoryBus::new();
    let producer = bus
        .producer(&ProducerTarget {
            stream: STREAM.into(),
            topic: TOPIC.into(),
            partitions: 1,
            batch_length: BATCH as u32,
            linger_time: Duration::ZERO,
        })
        .await
        .expect("producer");
    let payload = record_bytes();
    let batch: Vec<OutgoingMessage> = (0..BATCH)
        .map(|_| OutgoingMessage {
            id: None,
            headers: Vec::new(),
            payload: payload.clone(),
            partition: None,
            origin_timestamp: None,
        })
        .collect();
    for _ in 0..batches {
        producer.send(&batch).await.expect("send");
    }
    let factory = Arc::new(BenchFactory {
        batches,
        payload: Payload::JsonBytes(payload),
        takes_text,
    });
    let runtime = Runtime::with_options(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        RuntimeOptions {
            factory,
            ..RuntimeOptions::default()
        },
    );
    runtime.add(sink_config()).expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    while !bus.is_drained(STREAM, TOPIC, GROUP) {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let elapsed = started.elapsed();
    runtime.shutdown().await;
    elapsed
}

fn runtime(factory: Arc<BenchFactory>) -> Arc<Runtime> {
    Runtime::with_options(
        Arc::new(MemoryBus::new()),
        Arc::new(MemoryStateStore::new()),
        RuntimeOptions {
            factory,
            ..RuntimeOptions::default()
        },
    )
}

struct BenchFactory {
    batches: u64,
    payload: Payload,
    takes_text: bool,
}

impl ConnectorFactory for BenchFactory {
    fn source(&self, _: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        let records = (0..BATCH)
            .map(|n| SourceRecord::new(self.payload.clone()).with_id(u128::from(n) + 1))
            .collect();
        Ok(Box::new(ReadySource {
            records,
            left: AtomicU64::new(self.batches),
        }))
    }

    fn sink(&self, _: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError> {
        Ok(Box::new(NullSink {
            takes_text: self.takes_text,
        }))
    }
}

/// Hands over the same ready batch `left` times.
struct ReadySource {
    records: Vec<SourceRecord>,
    left: AtomicU64,
}

#[async_trait]
impl Source for ReadySource {
    async fn open(&mut self, _: Option<&[u8]>) -> Result<(), ConnectorError> {
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let left = self.left.fetch_sub(1, Ordering::Relaxed);
        Ok(SourceBatch {
            records: self.records.clone(),
            state: Some(left.to_le_bytes().to_vec()),
            finished: left <= 1,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

struct NullSink {
    takes_text: bool,
}

#[async_trait]
impl Sink for NullSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }

    fn accepts_json_bytes(&self) -> bool {
        self.takes_text
    }

    async fn write(&self, _: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        std::hint::black_box(messages);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

fn source_config() -> ConnectorConfig {
    config(
        ConnectorKind::Source,
        "source",
        KindConfig::Source {
            streams: vec![SourceStream {
                stream: STREAM.into(),
                topic: TOPIC.into(),
                schema: Schema::Json,
                batch_length: BATCH as u32,
                linger_time: Duration::from_millis(5),
                partitions: 1,
            }],
            max_consecutive_nacks: None,
            max_in_flight: None,
            max_in_flight_bytes: None,
        },
    )
}

fn sink_config() -> ConnectorConfig {
    config(
        ConnectorKind::Sink,
        "sink",
        KindConfig::Sink {
            streams: vec![SinkStream {
                stream: STREAM.into(),
                topics: vec![TOPIC.into()],
                schema: Schema::Json,
                batch_length: BATCH as u32,
                poll_interval: Duration::from_millis(1),
                consumer_group: GROUP.into(),
            }],
            on_error: OnError::Stop,
        },
    )
}

fn config(kind: ConnectorKind, key: &str, kind_config: KindConfig) -> ConnectorConfig {
    ConnectorConfig {
        kind,
        key: key.into(),
        enabled: true,
        version: 0,
        name: key.into(),
        path: "bench".into(),
        connector: "bench".into(),
        plugin_config_format: None,
        plugin_config: serde_json::json!({}),
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config,
        file: None,
    }
}

criterion_group!(
    benches,
    state_save,
    random_source_poll,
    engine_source,
    engine_sink
);
