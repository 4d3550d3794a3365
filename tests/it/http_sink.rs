//! The http sink end to end: messages in a `MemoryBus` topic, the sink run by
//! the `Runtime`, delivering to a real local HTTP server (the scripted server
//! of `support::http_server`) whose answers each test scripts; and one
//! `write` or `open` of the sink alone, for how it classifies an answer.
#![cfg(feature = "http-sink")]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::codec::Schema;
use iggy_connect::config::{ConnectorConfig, DeadLetterTarget, KindConfig, OnError, SinkStream};
use iggy_connect::connectors::{ConnectorError, ConnectorKind, SinkError};
use iggy_connect::engine::{Runtime, Status, StopReason};
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::{HeaderValue, OutgoingMessage};
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support::http_server::{Reply, ScriptedServer};
use crate::support::sinks;
use crate::support::wait::eventually;

const DEADLINE: Duration = Duration::from_secs(30);
const TOPIC: &str = "events";
const GROUP: &str = "http-sink-test";

struct Pipeline {
    bus: MemoryBus,
    runtime: Arc<Runtime>,
    stream: String,
    key: String,
}

impl Pipeline {
    /// Puts `payloads` in the topic first (so they form one batch), then starts
    /// the sink.
    async fn start(
        name: &str,
        payloads: Vec<Value>,
        plugin_config: Value,
        on_error: OnError,
        dead_letter: bool,
    ) -> Self {
        let stream = format!("http-sink-{name}");
        let bus = MemoryBus::new();
        let producer = bus
            .producer(&ProducerTarget {
                stream: stream.clone(),
                topic: TOPIC.into(),
                partitions: 1,
                batch_length: 1000,
                linger_time: Duration::ZERO,
            })
            .await
            .unwrap();
        let messages: Vec<OutgoingMessage> = payloads
            .iter()
            .enumerate()
            .map(|(index, payload)| OutgoingMessage {
                id: Some(index as u128 + 1),
                headers: vec![("source".into(), HeaderValue::String("test".into()))],
                payload: Bytes::from(serde_json::to_vec(payload).unwrap()),
                partition: None,
                origin_timestamp: None,
            })
            .collect();
        producer.send(&messages).await.unwrap();
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            Duration::from_secs(2),
        );
        let config = ConnectorConfig {
            kind: ConnectorKind::Sink,
            key: name.into(),
            enabled: true,
            version: 0,
            name: name.into(),
            path: "http".into(),
            connector: "http".into(),
            plugin_config_format: None,
            plugin_config,
            verbose: false,
            benchmark: false,
            transforms: Vec::new(),
            dead_letter: dead_letter.then(|| DeadLetterTarget {
                stream: stream.clone(),
                topic: "dead".into(),
            }),
            kind_config: KindConfig::Sink {
                streams: vec![SinkStream {
                    stream: stream.clone(),
                    topics: vec![TOPIC.into()],
                    schema: Schema::Json,
                    batch_length: 1000,
                    poll_interval: Duration::from_millis(5),
                    consumer_group: GROUP.into(),
                }],
                on_error,
            },
            file: None,
        };
        runtime.add(config).unwrap();
        runtime.start_enabled().await;
        Self {
            bus,
            runtime,
            stream,
            key: name.into(),
        }
    }

    fn drained(&self) -> bool {
        self.bus.is_drained(&self.stream, TOPIC, GROUP)
    }

    fn committed(&self) -> Option<u64> {
        self.bus.committed_offset(&self.stream, TOPIC, GROUP, 0)
    }

    fn view(&self) -> iggy_connect::engine::runtime::ConnectorView {
        self.runtime.view(ConnectorKind::Sink, &self.key).unwrap()
    }
}

fn payloads(count: usize) -> Vec<Value> {
    (0..count).map(|index| json!({"n": index})).collect()
}

fn config(url: &str, extra: Value) -> Value {
    let mut config = json!({"url": url, "retry_delay": "10ms", "max_retry_delay": "50ms"});
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    config
}

#[tokio::test]
async fn individual_mode_sends_one_enveloped_request_per_message() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "individual",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "individual", "headers": {"Authorization": "Bearer t0k"}}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    let received = endpoint.received();
    assert_eq!(received.len(), 3);
    assert_eq!(received[0].headers["content-type"], "application/json");
    assert_eq!(received[0].headers["authorization"], "Bearer t0k");
    let first = &endpoint.bodies()[0];
    assert_eq!(first["payload"], json!({"n": 0}));
    assert_eq!(first["metadata"]["iggy_offset"], 0);
    assert_eq!(first["metadata"]["iggy_stream"], "http-sink-individual");
    assert_eq!(first["metadata"]["iggy_topic"], TOPIC);
    assert_eq!(
        first["metadata"]["iggy_id"],
        "00000000-0000-0000-0000-000000000001"
    );
    assert_eq!(first["metadata"]["iggy_headers"], json!({"source": "test"}));
    let peers: HashSet<SocketAddr> = received.iter().map(|request| request.peer).collect();
    assert_eq!(
        peers.len(),
        1,
        "sequential requests reuse one pooled connection"
    );
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn ndjson_mode_sends_the_batch_as_one_request_of_lines() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "ndjson",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "ndjson", "include_metadata": false}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    let received = endpoint.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].headers["content-type"], "application/x-ndjson");
    assert_eq!(&received[0].body[..], b"{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n");
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn json_array_mode_sends_the_batch_as_one_array() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "json-array",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "json_array", "include_checksum": true, "include_origin_timestamp": true}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(endpoint.count(), 1);
    let array = endpoint.bodies().remove(0);
    let items = array.as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[2]["payload"], json!({"n": 2}));
    assert_eq!(items[2]["metadata"]["iggy_offset"], 2);
    assert!(items[2]["metadata"].get("iggy_checksum").is_some());
    assert!(items[2]["metadata"].get("iggy_origin_timestamp").is_some());
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn raw_mode_sends_each_payload_as_octet_stream_without_envelope() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "raw",
        payloads(2),
        config(&url, json!({"batch_mode": "raw"})),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    let received = endpoint.received();
    assert_eq!(received.len(), 2);
    assert_eq!(
        received[1].headers["content-type"],
        "application/octet-stream"
    );
    assert_eq!(&received[1].body[..], b"{\"n\":1}");
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_503_is_retried_until_the_endpoint_accepts() {
    let endpoint = ScriptedServer::start(vec![Reply::status(503), Reply::status(503)]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "retry",
        payloads(2),
        config(&url, json!({"batch_mode": "json_array"})),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    let bodies = endpoint.bodies();
    assert_eq!(bodies.len(), 3, "two refusals, then the delivery");
    assert_eq!(bodies[0], bodies[2], "the same batch is sent again");
    assert_eq!(pipeline.committed(), Some(1));
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn retry_after_is_waited_before_the_engine_writes_again() {
    let endpoint = ScriptedServer::start(vec![Reply::retry_after(429, 1)]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "retry-after",
        payloads(1),
        config(&url, json!({})),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    let received = endpoint.received();
    assert_eq!(received.len(), 2);
    let waited = received[1].at - received[0].at;
    assert!(waited >= Duration::from_secs(1), "retried after {waited:?}");
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_400_with_on_error_stop_stops_the_sink_without_committing() {
    let endpoint = ScriptedServer::start(vec![Reply::status(400)]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "reject-stop",
        payloads(2),
        config(
            &url,
            json!({"batch_mode": "ndjson", "headers": {"Authorization": "Bearer hunter2"}}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    pipeline
        .runtime
        .wait_until_stopped(ConnectorKind::Sink, &pipeline.key)
        .await
        .unwrap();
    let status = pipeline.view().status;
    assert_eq!(status.status, Status::Error);
    assert_eq!(status.stop_reason, Some(StopReason::Rejected));
    let message = status.last_error.unwrap().message;
    assert!(message.contains("answered 400"), "{message}");
    assert!(
        !message.contains("hunter2"),
        "a header secret leaked: {message}"
    );
    assert_eq!(pipeline.committed(), None);
}

#[tokio::test]
async fn a_400_with_on_error_skip_skips_that_message_and_delivers_the_rest() {
    let endpoint = ScriptedServer::start(vec![Reply::status(400)]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "reject-skip",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "individual", "include_metadata": false}),
        ),
        OnError::Skip,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(
        endpoint.bodies(),
        vec![json!({"n": 0}), json!({"n": 1}), json!({"n": 2})],
        "each message is sent once: the refused one, then the rest"
    );
    assert_eq!(pipeline.view().metrics.skipped.get(), 1);
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_400_with_on_error_dlq_dead_letters_every_message_of_the_refused_request() {
    let endpoint = ScriptedServer::start(vec![Reply::status(422)]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "reject-dlq",
        payloads(2),
        config(&url, json!({"batch_mode": "json_array"})),
        OnError::Dlq,
        true,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(endpoint.count(), 1, "the refused request is not sent again");
    let dead = pipeline.bus.messages(&pipeline.stream, "dead");
    assert_eq!(dead.len(), 2);
    assert_eq!(pipeline.view().metrics.dead_lettered.get(), 2);
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn offsets_stay_put_while_the_endpoint_is_down_and_move_once_it_is_back() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    let url = endpoint.url("/ingest");
    endpoint.set_default(Reply::status(503));
    let pipeline = Pipeline::start(
        "outage",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "ndjson", "max_retries": 1, "circuit_breaker_threshold": 0}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the engine retried the batch", DEADLINE, async || {
        pipeline.view().metrics.retries.get() >= 2 && endpoint.count() >= 4
    })
    .await;
    assert_eq!(
        pipeline.committed(),
        None,
        "nothing committed while the endpoint is down"
    );
    assert_eq!(pipeline.view().status.status, Status::Running);
    let degraded = pipeline.view().degraded.unwrap_or_default();
    assert!(
        degraded.contains("consecutive failed writes"),
        "past max_retries the engine reports the sink degraded: {degraded:?}"
    );
    endpoint.set_default(Reply::OK);
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(pipeline.committed(), Some(2));
    assert_eq!(pipeline.view().degraded, None);
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn the_circuit_breaker_opens_on_a_dead_endpoint_and_closes_when_it_recovers() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    let url = endpoint.url("/ingest");
    endpoint.set_default(Reply::status(500));
    let pipeline = Pipeline::start(
        "breaker",
        payloads(1),
        config(
            &url,
            json!({"max_retries": 1000, "circuit_breaker_threshold": 2, "circuit_breaker_cool_down": "3s"}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the sink reports itself degraded", DEADLINE, async || {
        pipeline.view().degraded.is_some()
    })
    .await;
    let degraded = pipeline.view().degraded.unwrap();
    assert!(degraded.contains("circuit breaker open"), "{degraded}");
    let requests_when_opened = endpoint.count();
    assert_eq!(requests_when_opened, 2);
    let retries_when_opened = pipeline.view().metrics.retries.get();
    eventually(
        "the engine retried while the breaker is open",
        DEADLINE,
        async || pipeline.view().metrics.retries.get() >= retries_when_opened + 2,
    )
    .await;
    assert!(
        pipeline.view().degraded.is_some(),
        "still inside the cool-down"
    );
    assert_eq!(
        endpoint.count(),
        requests_when_opened,
        "an open breaker sends nothing"
    );
    endpoint.set_default(Reply::OK);
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(
        pipeline.view().degraded,
        None,
        "the probe closed the breaker"
    );
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn credentials_in_the_url_never_show_in_the_status() {
    let endpoint = ScriptedServer::start(vec![Reply::status(403)]).await;
    let url = endpoint.url("/ingest");
    let url = url.replace("http://", "http://user:pa55word@");
    let pipeline = Pipeline::start(
        "url-secret",
        payloads(1),
        config(&url, json!({})),
        OnError::Stop,
        false,
    )
    .await;
    pipeline
        .runtime
        .wait_until_stopped(ConnectorKind::Sink, &pipeline.key)
        .await
        .unwrap();
    let message = pipeline.view().status.last_error.unwrap().message;
    assert!(message.contains("answered 403"), "{message}");
    assert!(!message.contains("pa55word"), "{message}");
}

#[tokio::test]
async fn a_batch_interrupted_by_an_outage_resends_only_what_was_not_delivered() {
    let endpoint = ScriptedServer::start(vec![Reply::OK, Reply::status(503)]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "resume",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "individual", "include_metadata": false}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(
        endpoint.bodies(),
        vec![
            json!({"n": 0}),
            json!({"n": 1}),
            json!({"n": 1}),
            json!({"n": 2})
        ],
        "the write said which messages were durable: the engine wrote only the rest again"
    );
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_connection_dropped_without_an_answer_is_retried_with_the_same_body() {
    let endpoint = ScriptedServer::start(vec![Reply::Drop]).await;
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "dropped",
        payloads(2),
        config(&url, json!({"batch_mode": "ndjson"})),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    let received = endpoint.received();
    assert_eq!(received.len(), 2, "the dropped request, then its retry");
    assert_eq!(received[0].body, received[1].body);
    assert_ne!(received[0].peer, received[1].peer, "on a new connection");
    assert_eq!(pipeline.committed(), Some(1));
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_refusing_endpoint_commits_nothing_until_it_accepts_again() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    endpoint.refuse();
    let url = endpoint.url("/ingest");
    let pipeline = Pipeline::start(
        "refused",
        payloads(3),
        config(
            &url,
            json!({"batch_mode": "json_array", "circuit_breaker_threshold": 0}),
        ),
        OnError::Stop,
        false,
    )
    .await;
    eventually("the engine retried the batch", DEADLINE, async || {
        pipeline.view().metrics.retries.get() >= 2
    })
    .await;
    let status = pipeline.view().status;
    assert_eq!(status.status, Status::Running);
    let message = status.last_error.unwrap().message;
    assert!(message.contains("failed"), "{message}");
    assert_eq!(endpoint.count(), 0, "no connection got through");
    assert_eq!(pipeline.committed(), None);
    endpoint.accept();
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(endpoint.bodies()[0].as_array().unwrap().len(), 3);
    pipeline.runtime.shutdown().await;
}

/// The sink's messages for the tests of one `write`: `{"n": <offset + 1>}`.
fn batch(count: u64) -> Vec<iggy_connect::message::SinkMessage> {
    sinks::ns_messages(0..count)
}

#[tokio::test]
async fn a_503_with_retry_after_is_one_transient_answer_carrying_the_wait() {
    let endpoint = ScriptedServer::start(vec![Reply::retry_after(503, 7)]).await;
    let sink = sinks::open(
        "http",
        &json!({"url": endpoint.url("/ingest"), "batch_mode": "ndjson"}),
    )
    .await;
    let error = sink.write(&sinks::topic(), &batch(3)).await.unwrap_err();
    let SinkError::Transient { retry_after, .. } = &error else {
        panic!("expected Transient, got {error}");
    };
    assert_eq!(*retry_after, Some(Duration::from_secs(7)), "{error}");
    assert_eq!(endpoint.count(), 1, "the sink sent the request once");
}

#[tokio::test]
async fn an_outage_in_the_middle_of_an_individual_batch_names_what_was_delivered() {
    let endpoint = ScriptedServer::start(vec![Reply::OK, Reply::OK, Reply::status(503)]).await;
    let sink = sinks::open(
        "http",
        &json!({"url": endpoint.url("/ingest"), "batch_mode": "individual"}),
    )
    .await;
    let error = sink.write(&sinks::topic(), &batch(4)).await.unwrap_err();
    let SinkError::Partial(partial) = error else {
        panic!("expected Partial, got {error}");
    };
    assert_eq!(partial.durable, [0, 1]);
    assert!(partial.rejected.is_empty());
    assert!(
        matches!(partial.rest, SinkError::Transient { .. }),
        "{}",
        partial.rest
    );
    assert_eq!(endpoint.count(), 3, "nothing is sent after the outage");
}

#[tokio::test]
async fn a_refused_message_in_an_individual_batch_is_rejected_and_the_others_delivered() {
    let endpoint = ScriptedServer::start(vec![Reply::OK, Reply::status(400), Reply::OK]).await;
    let sink = sinks::open(
        "http",
        &json!({"url": endpoint.url("/ingest"), "batch_mode": "individual"}),
    )
    .await;
    let error = sink.write(&sinks::topic(), &batch(3)).await.unwrap_err();
    let SinkError::Partial(partial) = error else {
        panic!("expected Partial, got {error}");
    };
    assert_eq!(partial.durable, [0, 2]);
    let rejected = &partial.rejected;
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].index, 1);
    assert!(rejected[0].reason.contains("answered 400"), "{rejected:?}");
}

#[tokio::test]
async fn an_open_circuit_breaker_fails_a_write_fast_without_calling_the_endpoint() {
    let endpoint = ScriptedServer::start(vec![Reply::status(500)]).await;
    let sink = sinks::open(
        "http",
        &json!({
            "url": endpoint.url("/ingest"),
            "circuit_breaker_threshold": 1,
            "circuit_breaker_cool_down": "1h",
        }),
    )
    .await;
    let first = sink.write(&sinks::topic(), &batch(1)).await.unwrap_err();
    assert!(matches!(first, SinkError::Transient { .. }), "{first}");
    let second = sink.write(&sinks::topic(), &batch(1)).await.unwrap_err();
    let SinkError::Transient { error, .. } = &second else {
        panic!("expected Transient, got {second}");
    };
    assert!(
        error.to_string().contains("circuit breaker open"),
        "{error}"
    );
    assert_eq!(endpoint.count(), 1, "the open breaker called nothing");
}

#[tokio::test]
async fn a_health_check_that_gets_no_answer_at_open_is_transient() {
    let endpoint = ScriptedServer::start(Vec::new()).await;
    endpoint.refuse();
    let mut sink = sinks::build(
        "http",
        &json!({"url": endpoint.url("/ingest"), "health_check_enabled": true}),
    );
    let error = sink.open().await.unwrap_err();
    assert!(
        matches!(error, ConnectorError::Transient(_)),
        "the engine opens it again: {error}"
    );
    assert!(error.to_string().contains("health check"), "{error}");
}

#[tokio::test]
async fn a_health_check_refused_at_open_is_fatal_naming_the_field_to_fix() {
    for (status, field) in [(401, "headers"), (405, "health_check_method")] {
        let endpoint = ScriptedServer::start(vec![Reply::status(status)]).await;
        let mut sink = sinks::build(
            "http",
            &json!({"url": endpoint.url("/ingest"), "health_check_enabled": true}),
        );
        let error = sink.open().await.unwrap_err();
        let ConnectorError::Fatal(error) = error else {
            panic!("{status}: expected Fatal, got {error}");
        };
        assert!(error.to_string().contains(field), "{status}: {error}");
        assert_eq!(endpoint.received()[0].method, "HEAD");
    }
}
