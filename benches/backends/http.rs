//! Throughput of the http source (clients -> source -> Iggy, each request
//! answered once durable) and of the http sink (Iggy -> sink -> a local HTTP
//! server answering 200):
//!
//!     cargo bench --features http-source,http-sink --bench backends -- http
//!     cargo bench --features http-source,http-sink --bench backends -- http sink
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line, with
//! `requests=N requests_per_s=R` added. The load generator (32 concurrent
//! reqwest clients) and the receiving server run in the case's process, so
//! their memory is part of its `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size.
#![cfg(all(feature = "http-source", feature = "http-sink"))]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::IggyBus;
use iggy_connect::state::FileStateStore;
use serde_json::{Value, json};

use crate::common;
use crate::common::{Iggy, Report, Stages, raw};

const CASES: &[&str] = &[
    "http_source_to_iggy_1_msg_per_request",
    "http_source_to_iggy_100_msgs_per_request",
    "iggy_to_http_sink_ndjson",
    "iggy_to_http_sink_json_array",
    "iggy_to_http_sink_individual",
];
const TOPIC: &str = "events";
/// Concurrent clients posting to the source.
const CLIENTS: u64 = 32;

inventory::submit! {
    crate::Bench {
        name: "http",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    match case {
        "http_source_to_iggy_1_msg_per_request" => {
            source_case(case, &iggy, &stream, common::scaled(20_000, CLIENTS), 1).await
        }
        "http_source_to_iggy_100_msgs_per_request" => {
            source_case(case, &iggy, &stream, common::scaled(2_000, CLIENTS), 100).await
        }
        "iggy_to_http_sink_ndjson" => {
            sink_case(
                case,
                &iggy,
                &stream,
                common::scaled(200_000, 1000),
                "ndjson",
            )
            .await
        }
        "iggy_to_http_sink_json_array" => {
            sink_case(
                case,
                &iggy,
                &stream,
                common::scaled(200_000, 1000),
                "json_array",
            )
            .await
        }
        "iggy_to_http_sink_individual" => {
            sink_case(
                case,
                &iggy,
                &stream,
                common::scaled(10_000, 1000),
                "individual",
            )
            .await
        }
        other => panic!("unknown case {other}"),
    }
}

/// `requests` POSTs of `per_request` messages each, from `CLIENTS` concurrent
/// clients, every one answered only once durable.
async fn source_case(case: &str, iggy: &Iggy, stream: &str, requests: u64, per_request: usize) {
    let address = free_address();
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    runtime
        .add(connector(&format!(
            r#"
            type = "source"
            key = "http_source"
            path = "http"
            [[streams]]
            stream = "{stream}"
            topic = "{TOPIC}"
            schema = "json"
            batch_length = 1000
            linger_time = "1ms"
            [plugin_config]
            address = "{address}"
            batch_length = 5000
            linger_time = "1ms"
            "#
        )))
        .expect("add source");
    runtime.start_enabled().await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS as usize)
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
            let count = requests / CLIENTS + u64::from(index < requests % CLIENTS);
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
    let elapsed = started.elapsed();
    let messages = requests * per_request as u64;
    let view = runtime
        .view(ConnectorKind::Source, "http_source")
        .expect("view");
    assert_eq!(
        view.metrics.sent.get(),
        messages,
        "every acked message is in Iggy"
    );
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("http_source"),
        extra: vec![
            ("requests", requests.to_string()),
            (
                "requests_per_s",
                format!("{:.0}", requests as f64 / elapsed.as_secs_f64()),
            ),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    runtime.shutdown().await;
    let client = iggy.settings().connect().await.expect("connect");
    raw::drop_stream(&client, stream).await;
}

/// `messages` already in the topic, drained by the sink to a local server that
/// answers 200.
async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64, batch_mode: &str) {
    let received = Arc::new(AtomicU64::new(0));
    let url = start_receiver(received.clone()).await;
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, 1000, |n| {
        serde_json::to_vec(&sample(n as usize))
            .expect("json")
            .into()
    })
    .await;
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    let poll_interval = humantime::format_duration(common::poll_interval());
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "http_sink"
            path = "http"
            [[streams]]
            stream = "{stream}"
            topics = ["{TOPIC}"]
            schema = "json"
            batch_length = 1000
            poll_interval = "{poll_interval}"
            consumer_group = "bench"
            [plugin_config]
            url = "{url}"
            batch_mode = "{batch_mode}"
            "#
        )))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime
            .view(ConnectorKind::Sink, "http_sink")
            .expect("view");
        if view.metrics.processed.get() >= messages {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sink did not drain: {:?}",
            view.status
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let requests = received.load(Ordering::Relaxed);
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("http_sink"),
        extra: vec![
            ("requests", requests.to_string()),
            (
                "requests_per_s",
                format!("{:.0}", requests as f64 / elapsed.as_secs_f64()),
            ),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    runtime.shutdown().await;
    raw::drop_stream(&client, stream).await;
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

fn runtime(iggy: &Iggy, state_dir: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(iggy.settings())),
        Arc::new(FileStateStore::new(state_dir).expect("state store")),
        Duration::from_secs(10),
    )
}

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("bench.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad bench config: {issues}"))
        .0
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
}
