//! Throughput of the http source (clients -> source -> bus, durable acks) and of
//! the http sink (bus -> sink -> a local HTTP server), through the real
//! `Runtime` over a `MemoryBus`. Prints one line per case:
//!
//! `bench: name=... messages=N seconds=S msgs_per_s=R [requests=N requests_per_s=R]`
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy_connect::config::{ConnectorConfig, KindConfig, OnError, SinkStream, SourceStream};
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::engine::codec::Schema;
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::OutgoingMessage;
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

const STREAM: &str = "bench";
const TOPIC: &str = "bench";
const GROUP: &str = "bench";
/// Concurrent clients posting to the source.
const CLIENTS: usize = 32;

#[tokio::main]
async fn main() {
    let scale: f64 = std::env::var("BENCH_SCALE")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1.0);
    let size = |base: usize| ((base as f64 * scale) as usize).max(CLIENTS);
    source_case("http_source_durable_1_msg_per_request", size(20_000), 1).await;
    source_case("http_source_durable_100_msgs_per_request", size(2_000), 100).await;
    sink_case("http_sink_ndjson", size(200_000), "ndjson").await;
    sink_case("http_sink_json_array", size(200_000), "json_array").await;
    sink_case("http_sink_individual", size(10_000), "individual").await;
}

/// `requests` POSTs of `per_request` messages each, from `CLIENTS` concurrent
/// clients, every one answered only once durable.
async fn source_case(name: &str, requests: usize, per_request: usize) {
    let address = free_address();
    let bus = MemoryBus::new();
    let runtime = runtime(&bus);
    runtime
        .add(connector(
            ConnectorKind::Source,
            "bench-source",
            json!({"address": address.to_string(), "batch_length": 5000, "linger_time": "1ms"}),
            KindConfig::Source {
                streams: vec![SourceStream {
                    stream: STREAM.into(),
                    topic: TOPIC.into(),
                    schema: Schema::Json,
                    batch_length: 5000,
                    linger_time: Duration::from_millis(1),
                    partitions: 1,
                }],
                max_consecutive_nacks: None,
            },
        ))
        .expect("add source");
    runtime.start_enabled().await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .expect("client");
    let url = format!("http://{address}/messages");
    wait_until_listening(&client, &address).await;
    let body: Bytes = if per_request == 1 {
        serde_json::to_vec(&sample(0)).expect("json").into()
    } else {
        let batch: Vec<Value> = (0..per_request).map(sample).collect();
        serde_json::to_vec(&batch).expect("json").into()
    };
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            let count = requests / CLIENTS + usize::from(index < requests % CLIENTS);
            tokio::spawn(async move {
                for _ in 0..count {
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .expect("request");
                    assert_eq!(response.status(), 200, "durable ack");
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("client task");
    }
    let seconds = started.elapsed().as_secs_f64();
    let messages = requests * per_request;
    assert_eq!(
        bus.messages(STREAM, TOPIC).len(),
        messages,
        "every acked message is stored"
    );
    println!(
        "bench: name={name} messages={messages} seconds={seconds:.3} msgs_per_s={:.0} requests={requests} requests_per_s={:.0} batches={}",
        messages as f64 / seconds,
        requests as f64 / seconds,
        bus.accepted_sends()
    );
    runtime.shutdown().await;
}

/// `messages` already in the topic, drained by the sink to a local server that
/// answers 200.
async fn sink_case(name: &str, messages: usize, batch_mode: &str) {
    let received = Arc::new(AtomicU64::new(0));
    let url = start_receiver(received.clone()).await;
    let bus = MemoryBus::new();
    let producer = bus
        .producer(&ProducerTarget {
            stream: STREAM.into(),
            topic: TOPIC.into(),
            partitions: 1,
            batch_length: 1000,
            linger_time: Duration::ZERO,
        })
        .await
        .expect("producer");
    let outgoing: Vec<OutgoingMessage> = (0..messages)
        .map(|index| OutgoingMessage {
            id: Some(index as u128 + 1),
            headers: Vec::new(),
            payload: serde_json::to_vec(&sample(index)).expect("json").into(),
        })
        .collect();
    for chunk in outgoing.chunks(10_000) {
        producer.send(chunk).await.expect("send");
    }
    let runtime = runtime(&bus);
    runtime
        .add(connector(
            ConnectorKind::Sink,
            "bench-sink",
            json!({"url": url, "batch_mode": batch_mode}),
            KindConfig::Sink {
                streams: vec![SinkStream {
                    stream: STREAM.into(),
                    topics: vec![TOPIC.into()],
                    schema: Schema::Json,
                    batch_length: 1000,
                    poll_interval: Duration::from_millis(1),
                    consumer_group: GROUP.into(),
                }],
                on_error: OnError::Stop,
            },
        ))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    while !bus.is_drained(STREAM, TOPIC, GROUP) {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "sink did not drain"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let requests = received.load(Ordering::Relaxed);
    println!(
        "bench: name={name} messages={messages} seconds={seconds:.3} msgs_per_s={:.0} requests={requests} requests_per_s={:.0}",
        messages as f64 / seconds,
        requests as f64 / seconds
    );
    runtime.shutdown().await;
}

fn sample(index: usize) -> Value {
    json!({"id": index, "name": "bench", "text": "x".repeat(100)})
}

async fn start_receiver(requests: Arc<AtomicU64>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let app = axum::Router::new().fallback(move |body: Bytes| {
        let requests = requests.clone();
        async move {
            std::hint::black_box(body);
            requests.fetch_add(1, Ordering::Relaxed);
            "ok"
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/ingest")
}

async fn wait_until_listening(client: &reqwest::Client, address: &SocketAddr) {
    let started = Instant::now();
    while client
        .get(format!("http://{address}/health"))
        .send()
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "source never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn runtime(bus: &MemoryBus) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    )
}

fn connector(
    kind: ConnectorKind,
    key: &str,
    plugin_config: Value,
    kind_config: KindConfig,
) -> ConnectorConfig {
    ConnectorConfig {
        kind,
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
        kind_config,
        file: None,
    }
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
}
