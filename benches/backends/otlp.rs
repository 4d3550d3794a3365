//! Throughput of the otlp source (OTLP exporters -> source -> Iggy, each
//! export answered once durable) and of the otlp sink (Iggy -> sink -> a
//! local OTLP/gRPC collector answering success):
//!
//!     cargo bench --features otlp-source,otlp-sink --bench backends -- otlp
//!     cargo bench --features otlp-source,otlp-sink --bench backends -- otlp sink
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line, with
//! `records=N records_per_s=R` added (log records; `messages` counts Iggy
//! messages, so the two `split` choices compare by `records_per_s`). The
//! exporters (16 concurrent clients, 100 log records per export) and the
//! collector run in the case's process, so their memory is in its `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size; a debug check:
//! `BENCH_SCALE=0.01 cargo bench --features full,faulty-sink --bench backends -- otlp`
//! (or `cargo test --benches` style runs with the same variable).
#![cfg(all(feature = "otlp-source", feature = "otlp-sink"))]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::IggyBus;
use iggy_connect::state::FileStateStore;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;

use crate::common;
use crate::common::{Iggy, Report, Stages, raw};

const CASES: &[&str] = &[
    "otlp_grpc_to_iggy_split_scope",
    "otlp_grpc_to_iggy_split_record",
    "otlp_http_json_to_iggy_split_scope",
    "iggy_to_otlp_sink_grpc",
];
const CLIENTS: u64 = 16;
const RECORDS_PER_EXPORT: usize = 100;

inventory::submit! {
    crate::Bench {
        name: "otlp",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let exports = common::scaled(2_000, CLIENTS);
    match case {
        "otlp_grpc_to_iggy_split_scope" => {
            source_case(case, &iggy, &stream, exports, "grpc", "scope").await
        }
        "otlp_grpc_to_iggy_split_record" => {
            source_case(case, &iggy, &stream, exports, "grpc", "record").await
        }
        "otlp_http_json_to_iggy_split_scope" => {
            source_case(case, &iggy, &stream, exports, "http", "scope").await
        }
        "iggy_to_otlp_sink_grpc" => {
            sink_case(case, &iggy, &stream, common::scaled(200_000, 1000)).await
        }
        other => panic!("unknown case {other}"),
    }
}

fn export(records: usize) -> ExportLogsServiceRequest {
    let text = |value: &str| AnyValue {
        value: Some(any_value::Value::StringValue(value.to_owned())),
    };
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(text("bench")),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "bench".into(),
                    ..Default::default()
                }),
                log_records: (0..records)
                    .map(|n| LogRecord {
                        time_unix_nano: 1_700_000_000_000_000_000 + n as u64,
                        severity_number: 9,
                        body: Some(text(&format!("request {n} served {}", "x".repeat(80)))),
                        ..Default::default()
                    })
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// `exports` log exports of `RECORDS_PER_EXPORT` records from `CLIENTS`
/// concurrent exporters, every one answered only once durable.
async fn source_case(
    case: &str,
    iggy: &Iggy,
    stream: &str,
    exports: u64,
    protocol: &str,
    split: &str,
) {
    let (grpc, http) = (free_address(), free_address());
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    runtime
        .add(connector(&format!(
            r#"
            type = "source"
            key = "otlp_source"
            path = "otlp"
            [[streams]]
            stream = "{stream}"
            topic = "logs"
            schema = "json"
            batch_length = 1000
            linger_time = "1ms"
            [plugin_config]
            grpc_address = "{grpc}"
            http_address = "{http}"
            split = "{split}"
            batch_length = 5000
            linger_time = "1ms"
            "#
        )))
        .expect("add source");
    runtime.start_enabled().await;
    wait_until_listening(grpc).await;
    wait_until_listening(http).await;
    let request = export(RECORDS_PER_EXPORT);
    let json = serde_json::to_vec(&request).expect("json");
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|index| {
            let count = exports / CLIENTS + u64::from(index < exports % CLIENTS);
            let (request, json) = (request.clone(), json.clone());
            let protocol = protocol.to_owned();
            tokio::spawn(async move {
                if protocol == "grpc" {
                    let mut client = connect(grpc).await;
                    for _ in 0..count {
                        client
                            .export(request.clone())
                            .await
                            .expect("durable answer");
                    }
                } else {
                    let client = reqwest::Client::new();
                    for _ in 0..count {
                        let response = client
                            .post(format!("http://{http}/v1/logs"))
                            .header("content-type", "application/json")
                            .body(json.clone())
                            .send()
                            .await
                            .expect("request");
                        assert_eq!(response.status(), 200, "durable answer");
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("exporter task");
    }
    let elapsed = started.elapsed();
    let records = exports * RECORDS_PER_EXPORT as u64;
    let messages = if split == "record" { records } else { exports };
    let view = runtime
        .view(ConnectorKind::Source, "otlp_source")
        .expect("view");
    assert_eq!(
        view.metrics.sent.get(),
        messages,
        "every answered export is in Iggy"
    );
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("otlp_source"),
        extra: vec![
            ("records", records.to_string()),
            (
                "records_per_s",
                format!("{:.0}", records as f64 / elapsed.as_secs_f64()),
            ),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    runtime.shutdown().await;
    let client = iggy.settings().connect().await.expect("connect");
    raw::drop_stream(&client, stream).await;
}

async fn wait_until_listening(address: SocketAddr) {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(address).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the source never listened on {address}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn connect(address: SocketAddr) -> LogsServiceClient<tonic::transport::Channel> {
    let started = Instant::now();
    loop {
        match LogsServiceClient::connect(format!("http://{address}")).await {
            Ok(client) => return client,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(error) => panic!("the source never listened: {error}"),
        }
    }
}

/// A collector that counts what it is sent.
#[derive(Clone, Default)]
struct Collector {
    records: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl LogsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let records: usize = request
            .get_ref()
            .resource_logs
            .iter()
            .flat_map(|resource| &resource.scope_logs)
            .map(|scope| scope.log_records.len())
            .sum();
        self.records.fetch_add(records as u64, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

/// `messages` protobuf log exports (10 records each) already in the topic,
/// drained by the sink to the counting collector.
async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LogsServiceServer::new(collector.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let payload: bytes::Bytes = export(10).encode_to_vec().into();
    let client = raw::topic(iggy, stream, "logs").await;
    raw::send(&client, stream, "logs", messages, 1000, |_| payload.clone()).await;
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = runtime(iggy, state.path());
    let poll_interval = humantime::format_duration(common::poll_interval());
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "otlp_sink"
            path = "otlp"
            [[streams]]
            stream = "{stream}"
            topics = ["logs"]
            schema = "raw"
            batch_length = 1000
            poll_interval = "{poll_interval}"
            consumer_group = "bench"
            [plugin_config]
            endpoint = "http://{address}"
            protocol = "grpc"
            signal = "logs"
            "#
        )))
        .expect("add sink");
    let started = Instant::now();
    runtime.start_enabled().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime
            .view(ConnectorKind::Sink, "otlp_sink")
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
    let records = collector.records.load(Ordering::Relaxed);
    assert_eq!(records, messages * 10, "every record exported");
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("otlp_sink"),
        extra: vec![
            ("records", records.to_string()),
            (
                "records_per_s",
                format!("{:.0}", records as f64 / elapsed.as_secs_f64()),
            ),
            (
                "requests",
                collector.requests.load(Ordering::Relaxed).to_string(),
            ),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    runtime.shutdown().await;
    raw::drop_stream(&client, stream).await;
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
