//! The http source end to end: real HTTP clients (reqwest) against the source's
//! listener, run by the `Runtime` over a `MemoryBus`.
#![cfg(feature = "http-source")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::codec::Schema;
use iggy_connect::config::{ConnectorConfig, KindConfig, SourceStream};
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::connectors::http::source::message_id;
use iggy_connect::engine::{Runtime, Status, StopReason};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::HeaderValue;
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support::wait::eventually;

const DEADLINE: Duration = Duration::from_secs(20);

struct Harness {
    bus: MemoryBus,
    runtime: Arc<Runtime>,
    base: String,
    client: reqwest::Client,
    stream: String,
}

impl Harness {
    /// Starts an http source listening on a free port, feeding `streams` topics
    /// named `{stream}/t0`, `{stream}/t1`, ...
    async fn start(name: &str, plugin_config: Value, streams: usize) -> Self {
        Self::start_with(name, plugin_config, streams, Duration::from_secs(5)).await
    }

    async fn start_with(
        name: &str,
        mut plugin_config: Value,
        streams: usize,
        shutdown_timeout: Duration,
    ) -> Self {
        let address = free_address();
        plugin_config["address"] = json!(address.to_string());
        let stream = format!("http-source-{name}");
        let config = source_config(name, &stream, streams, plugin_config);
        Self::start_config(address, &stream, config, shutdown_timeout).await
    }

    /// Starts `config` (listening on `address`, feeding `stream`).
    async fn start_config(
        address: SocketAddr,
        stream: &str,
        config: ConnectorConfig,
        shutdown_timeout: Duration,
    ) -> Self {
        let bus = MemoryBus::new();
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            shutdown_timeout,
        );
        runtime.add(config).unwrap();
        runtime.start_enabled().await;
        let harness = Self {
            bus,
            runtime,
            base: format!("http://{address}"),
            client: reqwest::Client::new(),
            stream: stream.to_owned(),
        };
        harness.wait_until_listening().await;
        harness
    }

    async fn wait_until_listening(&self) {
        eventually("the listener accepts requests", DEADLINE, async || {
            self.client
                .get(format!("{}/health", self.base))
                .send()
                .await
                .is_ok()
        })
        .await;
    }

    fn messages(&self, topic_index: usize) -> Vec<iggy_connect::message::ConsumedMessage> {
        self.bus.messages(&self.stream, &format!("t{topic_index}"))
    }

    fn payloads(&self, topic_index: usize) -> Vec<Value> {
        self.messages(topic_index)
            .iter()
            .map(|message| serde_json::from_slice(&message.payload).unwrap())
            .collect()
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.post(format!("{}{path}", self.base))
    }

    async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.post(path).json(body).send().await.unwrap()
    }

    async fn health(&self) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}/health", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }
}

fn source_config(key: &str, stream: &str, streams: usize, plugin_config: Value) -> ConnectorConfig {
    ConnectorConfig {
        kind: ConnectorKind::Source,
        key: key.into(),
        enabled: true,
        version: 0,
        name: key.into(),
        path: "http".into(),
        connector: "http".into(),
        plugin_config_format: None,
        plugin_config,
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config: KindConfig::Source {
            streams: (0..streams)
                .map(|index| SourceStream {
                    stream: stream.into(),
                    topic: format!("t{index}"),
                    schema: Schema::Json,
                    batch_length: 1000,
                    linger_time: Duration::from_millis(5),
                    partitions: 1,
                })
                .collect(),
            max_consecutive_nacks: None,
            // These tests follow one batch through an outage.
            max_in_flight: Some(1),
            max_in_flight_bytes: None,
        },
        file: None,
    }
}

fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

async fn error_code(response: reqwest::Response) -> String {
    let body: Value = response.json().await.unwrap();
    body["error"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_client_that_got_200_finds_its_message_in_the_topic() {
    let harness = Harness::start("durable", json!({"forward_headers": ["X-Request-Id"]}), 1).await;
    let response = harness
        .post("/messages")
        .header("Idempotency-Key", "order-42")
        .header("X-Request-Id", "req-7")
        .json(&json!({"order": 42}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.json::<Value>().await.unwrap(),
        json!({"accepted": 1, "durable": true})
    );
    // No waiting: the 200 itself says the message is in the topic.
    let messages = harness.messages(0);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].id, message_id(b"order-42", 0));
    assert_eq!(
        messages[0].headers,
        vec![("x-request-id".into(), HeaderValue::String("req-7".into()))]
    );
    assert_eq!(harness.payloads(0), vec![json!({"order": 42})]);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn a_requests_w3c_trace_context_is_copied_into_each_of_its_messages() {
    let harness = Harness::start("trace-context", json!({}), 1).await;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let response = harness
        .post("/messages")
        .header("traceparent", traceparent)
        .header("tracestate", "vendor=opaque")
        .json(&json!([{"n": 1}, {"n": 2}]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // An invalid traceparent (all-zero trace id) is not copied.
    let invalid = harness
        .post("/messages")
        .header(
            "traceparent",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        )
        .json(&json!({"n": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 200);
    let headers: Vec<_> = harness
        .messages(0)
        .into_iter()
        .map(|message| message.headers)
        .collect();
    let context = vec![
        (
            "traceparent".into(),
            HeaderValue::String(traceparent.into()),
        ),
        (
            "tracestate".into(),
            HeaderValue::String("vendor=opaque".into()),
        ),
    ];
    assert_eq!(headers, vec![context.clone(), context, Vec::new()]);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn arrays_ndjson_text_and_raw_bodies_become_messages_on_their_endpoints_streams() {
    let harness = Harness::start(
        "bodies",
        json!({"endpoints": [{"path": "/a"}, {"path": "/b", "stream_index": 1}]}),
        2,
    )
    .await;
    let array = harness.post_json("/a", &json!([{"n": 1}, {"n": 2}])).await;
    assert_eq!(array.json::<Value>().await.unwrap()["accepted"], 2);
    let ndjson = harness
        .post("/b")
        .header("content-type", "application/x-ndjson")
        .body("{\"n\":3}\n{\"n\":4}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(ndjson.json::<Value>().await.unwrap()["accepted"], 2);
    let text = harness
        .post("/b")
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(text.status(), 200);
    let raw = harness
        .post("/b")
        .header("content-type", "application/octet-stream")
        .body("{\"raw\":true}")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(harness.payloads(0), vec![json!({"n": 1}), json!({"n": 2})]);
    assert_eq!(
        harness.payloads(1),
        vec![
            json!({"n": 3}),
            json!({"n": 4}),
            json!("hello"),
            json!({"raw": true})
        ]
    );
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn during_a_broker_outage_clients_get_503_with_retry_after_and_nothing_acknowledged_is_lost()
{
    let harness = Harness::start(
        "outage",
        json!({"request_timeout": "1s", "retry_after": "2s", "unhealthy_after": "200ms"}),
        1,
    )
    .await;
    harness.bus.refuse_sends(u32::MAX);

    // Taken into the batch the engine keeps retrying: may still be delivered.
    let in_flight = harness.post_json("/messages", &json!({"n": 1})).await;
    assert_eq!(in_flight.status(), 503);
    assert_eq!(in_flight.headers()["retry-after"], "2");
    let body: Value = in_flight.json().await.unwrap();
    assert_eq!(body["error"], "timeout");
    assert_eq!(body["maybe_delivered"], true);

    // Waiting behind that batch: withdrawn on timeout, never delivered.
    let waiting = harness.post_json("/messages", &json!({"n": 2})).await;
    assert_eq!(waiting.status(), 503);
    assert_eq!(
        waiting.json::<Value>().await.unwrap()["maybe_delivered"],
        false
    );

    let (status, health) = harness.health().await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["in_flight_messages"], 1);

    harness.bus.refuse_sends(0);
    eventually("the retried batch is delivered", DEADLINE, async || {
        !harness.messages(0).is_empty()
    })
    .await;
    let after = harness.post_json("/messages", &json!({"n": 3})).await;
    assert_eq!(after.status(), 200);
    assert_eq!(harness.payloads(0), vec![json!({"n": 1}), json!({"n": 3})]);
    let (status, health) = harness.health().await;
    assert_eq!(status, 200, "{health}");
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn a_message_the_stream_would_drop_gets_422_and_never_a_durable_ack() {
    for ack in ["durable", "accepted"] {
        let harness = Harness::start(
            &format!("unstorable-{ack}"),
            json!({"ack": ack, "endpoints": [{"path": "/m"}]}),
            1,
        )
        .await;
        // Raw bytes that are not JSON, for a `json` stream.
        let response = harness
            .post("/m")
            .header("content-type", "application/octet-stream")
            .body("not json at all")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "ack = {ack}");
        assert_eq!(error_code(response).await, "unstorable_message");
        // The next request is stored, and nothing of the refused one was.
        let stored = harness.post_json("/m", &json!({"n": 1})).await;
        assert!(stored.status().is_success(), "ack = {ack}");
        eventually("the valid message in the topic", DEADLINE, async || {
            !harness.messages(0).is_empty()
        })
        .await;
        assert_eq!(harness.payloads(0), vec![json!({"n": 1})], "ack = {ack}");
        harness.runtime.shutdown().await;
    }
}

#[tokio::test]
async fn with_a_dead_letter_topic_a_message_the_stream_refuses_is_stored_there_before_the_ack() {
    let address = free_address();
    let stream = "http-source-dead-letter".to_owned();
    let mut config = source_config(
        "dead-letter",
        &stream,
        1,
        json!({"address": address.to_string(), "endpoints": [{"path": "/m"}]}),
    );
    config.dead_letter = Some(iggy_connect::config::DeadLetterTarget {
        stream: stream.clone(),
        topic: "dlq".into(),
    });
    let harness = Harness::start_config(address, &stream, config, Duration::from_secs(5)).await;
    let response = harness
        .post("/m")
        .header("content-type", "application/octet-stream")
        .body("not json at all")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let dead = harness.bus.messages(&stream, "dlq");
    assert_eq!(dead.len(), 1, "dead-lettered before the 200");
    assert_eq!(&dead[0].payload[..], b"not json at all");
    assert!(harness.messages(0).is_empty());
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn a_request_without_the_endpoints_token_gets_401_and_produces_nothing() {
    let harness = Harness::start(
        "auth",
        json!({"endpoints": [{"path": "/hook", "token": "s3cret"}]}),
        1,
    )
    .await;
    let missing = harness.post_json("/hook", &json!({"n": 1})).await;
    assert_eq!(missing.status(), 401);
    assert_eq!(missing.headers()["www-authenticate"], "Bearer");
    let wrong = harness
        .post("/hook")
        .bearer_auth("s3cre")
        .json(&json!({"n": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(error_code(wrong).await, "unauthorized");
    let right = harness
        .post("/hook")
        .bearer_auth("s3cret")
        .json(&json!({"n": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    assert_eq!(harness.payloads(0), vec![json!({"n": 3})]);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn malformed_bodies_get_400_naming_the_problem_and_a_wrong_method_a_json_405() {
    let harness = Harness::start("malformed", json!({}), 1).await;
    let json_error = harness
        .post("/messages")
        .header("content-type", "application/json")
        .body("{\"n\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(json_error.status(), 400);
    let body: Value = json_error.json().await.unwrap();
    assert_eq!(body["error"], "malformed_json");
    assert!(
        body["message"].as_str().unwrap().contains("not valid JSON"),
        "{body}"
    );
    let ndjson_error = harness
        .post("/messages")
        .header("content-type", "application/x-ndjson")
        .body("{\"n\":1}\n{oops}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(ndjson_error.status(), 400);
    let body: Value = ndjson_error.json().await.unwrap();
    assert_eq!(body["error"], "malformed_ndjson");
    assert!(
        body["message"].as_str().unwrap().contains("line 2"),
        "{body}"
    );
    let wrong_method = reqwest::get(format!("{}/messages", harness.base))
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(wrong_method.headers()["allow"], "POST");
    let body: Value = wrong_method.json().await.unwrap();
    assert_eq!(body["error"], "method_not_allowed", "{body}");
    assert!(
        harness.messages(0).is_empty(),
        "nothing of a bad request is produced"
    );
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn requests_and_messages_over_the_limits_get_413() {
    let harness = Harness::start(
        "limits",
        json!({"max_request_bytes": 2048, "max_message_bytes": 256}),
        1,
    )
    .await;
    let big_request = harness
        .post("/messages")
        .header("content-type", "text/plain")
        .body("x".repeat(4096))
        .send()
        .await
        .unwrap();
    assert_eq!(big_request.status(), 413);
    assert_eq!(error_code(big_request).await, "request_too_large");
    let big_message = harness
        .post_json("/messages", &json!(["small", "y".repeat(512)]))
        .await;
    assert_eq!(big_message.status(), 413);
    let body: Value = big_message.json().await.unwrap();
    assert_eq!(body["error"], "message_too_large");
    assert!(
        body["message"].as_str().unwrap().contains("message 1"),
        "{body}"
    );
    let fits = harness
        .post_json(
            "/messages",
            &json!(["a".repeat(100), "b".repeat(100), "c".repeat(100)]),
        )
        .await;
    assert_eq!(
        fits.status(),
        200,
        "a body over max_message_bytes of small messages is fine"
    );
    assert_eq!(harness.messages(0).len(), 3);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn concurrent_clients_are_coalesced_into_one_batch() {
    const CLIENTS: usize = 40;
    // The batch is taken when CLIENTS messages wait (batch_length), long before
    // the linger time runs out: one send, whatever the timing.
    let harness = Harness::start(
        "coalesce",
        json!({"batch_length": CLIENTS, "linger_time": "60s", "request_timeout": "120s"}),
        1,
    )
    .await;
    let sends_before = harness.bus.accepted_sends();
    let requests: Vec<_> = (0..CLIENTS)
        .map(|index| {
            let request = harness.post("/messages").json(&json!({"client": index}));
            tokio::spawn(async move { request.send().await.unwrap().status().as_u16() })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(harness.messages(0).len(), CLIENTS);
    assert_eq!(harness.bus.accepted_sends() - sends_before, 1);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn stopping_the_source_answers_waiting_clients_with_503_and_frees_the_port() {
    let harness = Harness::start_with(
        "close",
        json!({"request_timeout": "60s"}),
        1,
        Duration::from_millis(200),
    )
    .await;
    harness.bus.refuse_sends(u32::MAX);
    let request = harness.post("/messages").json(&json!({"n": 1}));
    let client = tokio::spawn(async move { request.send().await.unwrap() });
    eventually("the request's batch is in flight", DEADLINE, async || {
        harness.health().await.1["in_flight_messages"] == 1
    })
    .await;
    harness
        .runtime
        .stop(ConnectorKind::Source, "close")
        .await
        .unwrap();
    let response = client.await.unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "closing");
    assert_eq!(body["maybe_delivered"], true);
    let address = harness.base.trim_start_matches("http://");
    std::net::TcpListener::bind(address).expect("the port is free again");
}

#[tokio::test]
async fn accepted_mode_answers_202_at_once_and_429_when_its_queue_is_full() {
    let harness = Harness::start(
        "accepted",
        json!({"ack": "accepted", "max_waiting_messages": 2, "linger_time": "0ms"}),
        1,
    )
    .await;
    harness.bus.refuse_sends(u32::MAX);
    let first = harness.post_json("/messages", &json!({"n": 1})).await;
    assert_eq!(first.status(), 202);
    assert_eq!(first.json::<Value>().await.unwrap()["durable"], false);
    eventually("the first message is in flight", DEADLINE, async || {
        harness.health().await.1["in_flight_messages"] == 1
    })
    .await;
    for n in [2, 3] {
        assert_eq!(
            harness
                .post_json("/messages", &json!({"n": n}))
                .await
                .status(),
            202
        );
    }
    let full = harness.post_json("/messages", &json!({"n": 4})).await;
    assert_eq!(full.status(), 429);
    assert!(full.headers().contains_key("retry-after"));
    assert_eq!(error_code(full).await, "queue_full");
    harness.bus.refuse_sends(0);
    eventually(
        "every accepted message is delivered",
        DEADLINE,
        async || harness.messages(0).len() == 3,
    )
    .await;
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn a_port_already_in_use_fails_the_start_with_a_clear_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let bus = MemoryBus::new();
    let runtime = Runtime::new(
        Arc::new(bus),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime
        .add(source_config(
            "conflict",
            "http-source-conflict",
            1,
            json!({"address": address.to_string()}),
        ))
        .unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "conflict")
        .await
        .unwrap();
    let status = runtime
        .view(ConnectorKind::Source, "conflict")
        .unwrap()
        .status;
    assert_eq!(status.status, Status::Error);
    assert_eq!(status.stop_reason, Some(StopReason::StartFailed));
    let message = status.last_error.unwrap().message;
    assert!(
        message.contains(&format!("cannot listen on {address}")),
        "{message}"
    );
}

/// Opens a raw connection to the listener.
async fn raw_connection(base: &str) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Waits until the server closes the connection (EOF or reset), at most `DEADLINE`.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 or similar before closing.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_flooded_with_idle_and_trickling_connections_refuses_past_its_limit_and_closes_them()
 {
    use tokio::io::AsyncWriteExt;
    const LIMIT: usize = 20;
    let harness = Harness::start(
        "flood",
        json!({
            "max_connections": LIMIT,
            "header_read_timeout": "1s",
            "request_timeout": "1s",
            "idle_timeout": "2s",
        }),
        1,
    )
    .await;
    // Half the limit idle, half trickling header bytes (one every 100 ms).
    let mut idle = Vec::new();
    for _ in 0..LIMIT / 2 {
        idle.push(raw_connection(&harness.base).await);
    }
    let mut tricklers = tokio::task::JoinSet::new();
    for _ in 0..LIMIT / 2 {
        let mut stream = raw_connection(&harness.base).await;
        tricklers.spawn(async move {
            stream
                .write_all(b"POST /messages HTTP/1.1\r\nhost: x\r\nx-slow: ")
                .await
                .unwrap();
            // Until the server closes it, or for the whole deadline.
            let deadline = tokio::time::Instant::now() + DEADLINE;
            while tokio::time::Instant::now() < deadline {
                if stream.write_all(b"a").await.is_err() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
    }
    // A client arriving now meets the limit: a clear refusal, not a hang.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = format!("{}/messages", harness.base);
    let mut refusal = None;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while refusal.is_none() && tokio::time::Instant::now() < deadline {
        let response = client.post(&url).json(&json!({"n": 0})).send().await;
        match response {
            Ok(response) if response.status() == 503 => refusal = Some(response),
            Ok(response) => assert_eq!(response.status(), 200, "served while below the limit"),
            Err(error) => panic!("no answer at the connection limit: {error:?}"),
        }
    }
    let refusal = refusal.expect("a request past the connection limit is refused");
    assert!(refusal.headers().contains_key("retry-after"));
    assert_eq!(error_code(refusal).await, "too_many_connections");

    // The header-read timeout closes both kinds of flood connection.
    for stream in &mut idle {
        assert!(
            closed_by_server(stream).await,
            "an idle connection stayed open"
        );
    }
    while let Some(closed) = tricklers.join_next().await {
        assert!(closed.unwrap(), "a trickling connection stayed open");
    }
    // Then the listener serves again.
    let response = client
        .post(&url)
        .json(&json!({"n": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    eventually("the message to be in the topic", DEADLINE, async || {
        harness.payloads(0).iter().any(|payload| payload["n"] == 1)
    })
    .await;
}
