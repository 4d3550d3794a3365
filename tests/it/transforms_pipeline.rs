//! Schemas and transforms end to end: connector files parsed as users write
//! them, run by the runtime over the in-memory bus.

#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::{ConnectorConfig, parse_connector_file};
use iggy_connect::connectors::{
    BuildError, ConnectorError, ConnectorKind, Sink, SinkError, Source,
};
use iggy_connect::engine::runtime::{ConnectorFactory, RegistryFactory, RuntimeOptions};
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::{OutgoingMessage, Payload, SinkMessage, TopicRef};
use iggy_connect::state::MemoryStateStore;
use serde_json::Value;

use crate::support::wait;

const RANDOM_EXAMPLE: &str = include_str!("../fixtures/upstream/random.toml");
const STDOUT_EXAMPLE: &str = include_str!("../fixtures/upstream/stdout.toml");

#[tokio::test]
async fn a_message_filter_on_a_source_drops_whole_messages_counts_them_as_filtered_and_keeps_them_out_of_the_topic()
 {
    let config = parse(
        "filtering_source.toml",
        r#"
type = "source"
key = "filtering_source"
path = "random"
[[streams]]
stream = "filter_src"
topic = "records"
schema = "json"
[plugin_config]
interval = "0ms"
max_count = 300
messages_range = [100, 100]
[transforms.filter_messages]
enabled = true
include_matching = false
[[transforms.filter_messages.patterns]]
key_pattern = { exact = "text" }
value_pattern = { regex = "^[a-z]" }
"#,
    );
    let bus = MemoryBus::new();
    let runtime = runtime(&bus);
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "filtering_source")
        .await
        .unwrap();

    let view = runtime
        .view(ConnectorKind::Source, "filtering_source")
        .unwrap();
    let stored = bus.messages("filter_src", "records");
    let filtered = view.metrics.filtered.get();
    // Random text starts with a lowercase letter 26 times in 62.
    assert!(
        filtered > 0 && !stored.is_empty(),
        "filtered {filtered}, stored {}",
        stored.len()
    );
    assert_eq!(filtered + stored.len() as u64, 300);
    assert_eq!(view.metrics.sent.get(), stored.len() as u64);
    assert_eq!(view.metrics.errors.get(), 0);
    for message in &stored {
        let text = json_of(&message.payload)["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            !text.starts_with(|c: char| c.is_ascii_lowercase()),
            "{text}"
        );
    }
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_message_filter_on_a_sink_counts_drops_as_filtered_and_still_moves_the_offsets_past_them()
{
    let bus = MemoryBus::new();
    put(
        &bus,
        "filter_sink",
        "logs",
        &[
            br#"{"level":"info","n":1}"#,
            br#"{"level":"debug","n":2}"#,
            br#"{"level":"debug","n":3}"#,
            br#"{"level":"error","n":4}"#,
        ],
    )
    .await;
    let config = parse(
        "filtering_sink.toml",
        r#"
type = "sink"
key = "filtering_sink"
path = "stdout"
[[streams]]
stream = "filter_sink"
topics = ["logs"]
schema = "json"
consumer_group = "filtering"
[plugin_config]
[transforms.filter_messages]
enabled = true
include_matching = false
[[transforms.filter_messages.patterns]]
key_pattern = { exact = "level" }
value_pattern = { equals = "debug" }
"#,
    );
    let runtime = runtime(&bus);
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("the sink to commit every offset", || {
        bus.is_drained("filter_sink", "logs", "filtering")
    })
    .await;
    let view = runtime.view(ConnectorKind::Sink, "filtering_sink").unwrap();
    assert_eq!(view.metrics.filtered.get(), 2);
    assert_eq!(view.metrics.processed.get(), 2);
    assert_eq!(view.metrics.errors.get(), 0);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_payload_that_is_not_json_is_counted_and_skipped_while_the_rest_of_its_batch_reaches_the_sink()
 {
    let bus = MemoryBus::new();
    put(
        &bus,
        "malformed",
        "events",
        &[br#"{"n":1}"#, b"{not json", br#"{"n":3}"#, br#"[4]"#],
    )
    .await;
    let config = parse(
        "malformed_sink.toml",
        r#"
type = "sink"
key = "malformed_sink"
path = "stdout"
[[streams]]
stream = "malformed"
topics = ["events"]
schema = "json"
consumer_group = "malformed"
[plugin_config]
"#,
    );
    let runtime = runtime(&bus);
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("the sink to commit every offset", || {
        bus.is_drained("malformed", "events", "malformed")
    })
    .await;
    let view = runtime.view(ConnectorKind::Sink, "malformed_sink").unwrap();
    assert_eq!(view.metrics.consumed.get(), 4);
    assert_eq!(view.metrics.processed.get(), 3);
    assert_eq!(view.metrics.errors.get(), 1);
    assert_eq!(view.metrics.skipped.get(), 1);
    assert_eq!(view.status.status, Status::Running);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_payload_that_is_not_json_goes_to_the_dead_letter_topic_with_its_bytes_when_configured() {
    let bus = MemoryBus::new();
    put(
        &bus,
        "malformed_dlq",
        "events",
        &[br#"{"n":1}"#, b"\xff\xfe not json", br#"{"n":3}"#],
    )
    .await;
    let config = parse(
        "dlq_sink.toml",
        r#"
type = "sink"
key = "dlq_sink"
path = "stdout"
on_error = "dlq"
[[streams]]
stream = "malformed_dlq"
topics = ["events"]
schema = "json"
consumer_group = "dlq"
[dead_letter]
stream = "malformed_dlq"
topic = "dead"
[plugin_config]
"#,
    );
    let runtime = runtime(&bus);
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("the sink to commit every offset", || {
        bus.is_drained("malformed_dlq", "events", "dlq")
    })
    .await;
    let view = runtime.view(ConnectorKind::Sink, "dlq_sink").unwrap();
    assert_eq!(view.metrics.processed.get(), 2);
    assert_eq!(view.metrics.errors.get(), 1);
    assert_eq!(view.metrics.dead_lettered.get(), 1);
    let dead = bus.messages("malformed_dlq", "dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].payload[..], b"\xff\xfe not json");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_connector_given_an_invalid_transform_fails_to_start_naming_the_file_transform_and_field()
{
    // Configs that skip the file checks (built in code, or sent to the API)
    // are checked again when the connector starts.
    let mut config = parse("bad_transform.toml", STDOUT_EXAMPLE);
    config.transforms.push((
        "unwrap_envelope".into(),
        serde_json::json!({"enabled": true, "field": ""}),
    ));
    let bus = MemoryBus::new();
    let runtime = runtime(&bus);
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    eventually("the sink to stop", || {
        runtime
            .view(ConnectorKind::Sink, "stdout")
            .unwrap()
            .status
            .status
            == Status::Error
    })
    .await;
    let status = runtime.view(ConnectorKind::Sink, "stdout").unwrap().status;
    assert_eq!(status.status, Status::Error);
    let message = status.last_error.unwrap().message;
    assert!(
        message.starts_with("bad_transform.toml: transforms.unwrap_envelope.field: "),
        "{message}"
    );
}

#[tokio::test]
async fn upstream_example_connector_files_load_and_run_unchanged_with_their_added_fields() {
    let source = parse("random.toml", RANDOM_EXAMPLE);
    let sink = parse("stdout.toml", STDOUT_EXAMPLE);
    assert_eq!(
        (source.connector.as_str(), sink.connector.as_str()),
        ("random", "stdout")
    );
    let bus = MemoryBus::new();
    // The real connectors from the registry; the stdout sink is tapped so the
    // test sees what it was handed after the sink-side transforms.
    let received = Arc::new(Mutex::new(Vec::new()));
    let runtime = Runtime::with_options(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        RuntimeOptions {
            shutdown_timeout: Duration::from_secs(5),
            factory: Arc::new(TappingFactory(received.clone())),
            ..RuntimeOptions::default()
        },
    );
    runtime.add(source).unwrap();
    runtime.add(sink).unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "random")
        .await
        .unwrap();
    eventually("the stdout sink to commit every offset", || {
        bus.is_drained("example_stream", "example_topic", "stdout_sink_connector")
    })
    .await;

    let stored = bus.messages("example_stream", "example_topic");
    assert_eq!(stored.len(), 1000);
    for message in &stored {
        let record = json_of(&message.payload);
        assert_eq!(record["test_field"], "hello!", "{record}");
        assert!(record.get("message").is_none(), "{record}");
    }
    let received = std::mem::take(&mut *received.lock().unwrap());
    assert_eq!(received.len(), 1000);
    for message in &received {
        let Payload::Json(record) = &message.payload else {
            panic!("expected JSON, found {:?}", message.payload);
        };
        assert_eq!(record["test_field"], "hello!", "{record}");
        assert_eq!(record["message"], "hello", "{record}");
    }
    let source = runtime.view(ConnectorKind::Source, "random").unwrap();
    let sink = runtime.view(ConnectorKind::Sink, "stdout").unwrap();
    assert_eq!(source.metrics.errors.get(), 0);
    assert_eq!(sink.metrics.processed.get(), 1000);
    assert_eq!(sink.metrics.errors.get(), 0);
    runtime.shutdown().await;
}

/// Builds the registry's connectors, wrapping every sink in a [`Tap`].
struct TappingFactory(Arc<Mutex<Vec<SinkMessage>>>);

impl ConnectorFactory for TappingFactory {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        RegistryFactory.source(config)
    }

    fn sink(&self, config: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError> {
        Ok(Box::new(Tap {
            inner: RegistryFactory.sink(config)?,
            received: self.0.clone(),
        }))
    }
}

/// Hands every batch to the real sink and keeps a copy of what it wrote.
struct Tap {
    inner: Box<dyn Sink>,
    received: Arc<Mutex<Vec<SinkMessage>>>,
}

#[async_trait]
impl Sink for Tap {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.inner.open().await
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        self.inner.write(topic, messages).await?;
        self.received.lock().unwrap().extend_from_slice(messages);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.inner.close().await
    }
}

fn parse(name: &str, text: &str) -> ConnectorConfig {
    match parse_connector_file(Path::new(name), text, &EnvVars::default()) {
        Ok((config, warnings)) => {
            assert!(warnings.is_empty(), "{warnings:?}");
            config
        }
        Err(issues) => panic!("{issues}"),
    }
}

fn runtime(bus: &MemoryBus) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    )
}

async fn put(bus: &MemoryBus, stream: &str, topic: &str, payloads: &[&[u8]]) {
    let producer = bus
        .producer(&ProducerTarget {
            stream: stream.into(),
            topic: topic.into(),
            partitions: 1,
            batch_length: 100,
            linger_time: Duration::ZERO,
        })
        .await
        .unwrap();
    let messages: Vec<OutgoingMessage> = payloads
        .iter()
        .map(|payload| OutgoingMessage {
            id: None,
            headers: Vec::new(),
            payload: Bytes::copy_from_slice(payload),
            partition: None,
            origin_timestamp: None,
        })
        .collect();
    producer.send(&messages).await.unwrap();
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

async fn eventually(what: &str, condition: impl FnMut() -> bool) {
    wait::wait_for(what, Duration::from_secs(30), condition).await;
}

#[test]
#[cfg_attr(
    not(feature = "schema-avro"),
    ignore = "the docs' examples convert Avro: run with --features schema-avro (in full)"
)]
fn the_transform_examples_in_the_docs_are_valid_connector_tables() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas-and-transforms.md"),
    )
    .unwrap();
    let blocks: Vec<&str> = page
        .split("```toml")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .filter(|block| block.contains("[transforms."))
        .collect();
    assert!(blocks.len() >= 5, "found {} blocks", blocks.len());
    for block in blocks {
        let file = format!(
            "type = \"sink\"\nkey = \"readme\"\npath = \"stdout\"\n\
             [[streams]]\nstream = \"s\"\ntopics = [\"t\"]\nschema = \"json\"\n\
             [plugin_config]\n{block}"
        );
        let config = parse("docs/schemas-and-transforms.md", &file);
        assert!(!config.transforms.is_empty(), "{block}");
    }
}
