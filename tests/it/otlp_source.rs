//! The otlp source end to end: the real OpenTelemetry SDK exporters
//! (`opentelemetry-otlp`, gRPC and HTTP) and raw clients (reqwest for
//! OTLP/HTTP, the generated tonic clients for OTLP/gRPC) against its
//! receivers, run by the `Runtime` over a `MemoryBus`.
//!
//! Upstream iggy-connectors has no OTLP connector (and so no example file):
//! nothing here is compared with upstream.
#![cfg(feature = "otlp-source")]

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::codec::Schema;
use iggy_connect::config::{ConnectorConfig, KindConfig, SourceStream};
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{ConsumedMessage, HeaderValue};
use iggy_connect::state::MemoryStateStore;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::{Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use prost::Message as _;
use serde_json::{Value, json};
use tonic_types::StatusExt;

use crate::support::wait::eventually;

const DEADLINE: Duration = Duration::from_secs(20);

struct Harness {
    bus: MemoryBus,
    runtime: Arc<Runtime>,
    grpc: SocketAddr,
    http: SocketAddr,
    client: reqwest::Client,
    stream: String,
}

impl Harness {
    /// A source receiving logs, traces and metrics into `{stream}/t0..t2`.
    async fn start(name: &str, mut plugin_config: Value, schema: Schema) -> Self {
        let (grpc, http) = (free_address(), free_address());
        plugin_config["grpc_address"] = json!(grpc.to_string());
        plugin_config["http_address"] = json!(http.to_string());
        let stream = format!("otlp-source-{name}");
        let bus = MemoryBus::new();
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            Duration::from_secs(5),
        );
        runtime
            .add(source_config(name, &stream, schema, plugin_config))
            .unwrap();
        runtime.start_enabled().await;
        let harness = Self {
            bus,
            runtime,
            grpc,
            http,
            client: reqwest::Client::new(),
            stream,
        };
        eventually("both receivers accept connections", DEADLINE, async || {
            std::net::TcpStream::connect(harness.grpc).is_ok()
                && harness
                    .client
                    .get(harness.url("/health"))
                    .send()
                    .await
                    .is_ok()
        })
        .await;
        harness
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    fn messages(&self, topic: usize) -> Vec<ConsumedMessage> {
        self.bus.messages(&self.stream, &format!("t{topic}"))
    }

    fn json(&self, topic: usize) -> Vec<Value> {
        self.messages(topic)
            .iter()
            .map(|message| serde_json::from_slice(&message.payload).unwrap())
            .collect()
    }

    async fn wait_for(&self, topic: usize, count: usize) {
        eventually(
            &format!("{count} message(s) in t{topic}"),
            DEADLINE,
            async || self.messages(topic).len() >= count,
        )
        .await;
    }

    async fn post_logs(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/logs"))
            .json(body)
            .send()
            .await
            .unwrap()
    }
}

fn source_config(key: &str, stream: &str, schema: Schema, plugin_config: Value) -> ConnectorConfig {
    ConnectorConfig {
        kind: ConnectorKind::Source,
        key: key.into(),
        enabled: true,
        version: 0,
        name: key.into(),
        path: "otlp".into(),
        connector: "otlp".into(),
        plugin_config_format: None,
        plugin_config,
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config: KindConfig::Source {
            streams: (0..3)
                .map(|index| SourceStream {
                    stream: stream.into(),
                    topic: format!("t{index}"),
                    schema: schema.clone(),
                    batch_length: 1000,
                    linger_time: Duration::from_millis(5),
                    partitions: 1,
                })
                .collect(),
            max_consecutive_nacks: None,
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

/// One OTLP/JSON log request: `bodies` log records under one resource and scope.
fn json_logs(bodies: &[&str]) -> Value {
    json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout"}}]},
        "scopeLogs": [{
            "scope": {"name": "raw-client"},
            "logRecords": bodies.iter().map(|body| json!({
                "timeUnixNano": "1700000000000000000",
                "severityNumber": 9,
                "body": {"stringValue": body},
            })).collect::<Vec<_>>(),
        }],
    }]})
}

fn log_bodies(request: &Value) -> Vec<String> {
    request["resourceLogs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|resource| {
            resource["scopeLogs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|scope| scope["logRecords"].as_array().cloned().unwrap_or_default())
        .map(|record| {
            record["body"]["stringValue"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Emits one log, one span and one counter through the SDK with these
/// exporters. The SDK's simple processors block on their export, so they run
/// on a blocking thread inside the runtime (the exporters' clients need it).
async fn emit_with_sdk(
    logs: opentelemetry_otlp::LogExporter,
    spans: opentelemetry_otlp::SpanExporter,
    metrics: Option<opentelemetry_otlp::MetricExporter>,
    tag: &'static str,
) {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let _entered = runtime.enter();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("otlp-source-test")
            .build();
        let loggers = opentelemetry_sdk::logs::SdkLoggerProvider::builder()
            .with_resource(resource.clone())
            .with_simple_exporter(logs)
            .build();
        let logger = loggers.logger("sdk-scope");
        let mut record = logger.create_log_record();
        record.set_body(AnyValue::from(format!("log via {tag}")));
        logger.emit(record);
        let tracers = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_simple_exporter(spans)
            .build();
        tracers
            .tracer("sdk-scope")
            .in_span(format!("span via {tag}"), |_| {});
        if let Some(metrics) = metrics {
            let meters = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
                .with_resource(resource)
                .with_periodic_exporter(metrics)
                .build();
            let counter = meters.meter("sdk-scope").u64_counter("orders").build();
            counter.add(3, &[]);
            meters.force_flush().expect("the metrics export succeeds");
            meters.shutdown().ok();
        }
        loggers.shutdown().ok();
        tracers.shutdown().ok();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_grpc_exporters_deliver_logs_traces_and_metrics_each_to_its_stream() {
    let harness = Harness::start("sdk-grpc", json!({"token": "s3cret"}), Schema::Json).await;
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert("authorization", "Bearer s3cret".parse().unwrap());
    let logs = opentelemetry_otlp::LogExporter::builder()
        .with_tonic()
        .with_endpoint(harness.grpc_url())
        .with_metadata(metadata.clone())
        .build()
        .unwrap();
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(harness.grpc_url())
        .with_metadata(metadata.clone())
        .build()
        .unwrap();
    let metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(harness.grpc_url())
        .with_metadata(metadata)
        .build()
        .unwrap();
    emit_with_sdk(logs, spans, Some(metrics), "grpc").await;
    for topic in 0..3 {
        harness.wait_for(topic, 1).await;
    }
    let log = &harness.json(0)[0];
    assert_eq!(log_bodies(log), ["log via grpc"]);
    assert_eq!(
        log["resourceLogs"][0]["scopeLogs"][0]["scope"]["name"],
        "sdk-scope"
    );
    let span = &harness.json(1)[0];
    let span = &span["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(span["name"], "span via grpc");
    assert_eq!(span["traceId"].as_str().unwrap().len(), 32, "hex trace id");
    let metric = &harness.json(2)[0];
    assert_eq!(
        metric["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["name"],
        "orders"
    );
    for (topic, signal) in [(0, "logs"), (1, "traces"), (2, "metrics")] {
        assert_eq!(
            harness.messages(topic)[0].headers,
            vec![("otlp-signal".into(), HeaderValue::String(signal.into()))]
        );
    }
    harness.runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_http_protobuf_and_json_exporters_deliver_logs_and_traces() {
    let harness = Harness::start("sdk-http", json!({"token": "s3cret"}), Schema::Json).await;
    let headers = HashMap::from([("authorization".to_owned(), "Bearer s3cret".to_owned())]);
    for (protocol, tag) in [
        (opentelemetry_otlp::Protocol::HttpBinary, "http/protobuf"),
        (opentelemetry_otlp::Protocol::HttpJson, "http/json"),
    ] {
        let logs = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .with_endpoint(harness.url("/v1/logs"))
            .with_headers(headers.clone())
            .with_compression(opentelemetry_otlp::Compression::Gzip)
            .build()
            .unwrap();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .with_endpoint(harness.url("/v1/traces"))
            .with_headers(headers.clone())
            .build()
            .unwrap();
        emit_with_sdk(logs, spans, None, tag).await;
    }
    harness.wait_for(0, 2).await;
    harness.wait_for(1, 2).await;
    let bodies: Vec<String> = harness.json(0).iter().flat_map(log_bodies).collect();
    assert_eq!(bodies, ["log via http/protobuf", "log via http/json"]);
    let names: Vec<Value> = harness
        .json(1)
        .iter()
        .map(|request| request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"].clone())
        .collect();
    assert_eq!(
        names,
        [json!("span via http/protobuf"), json!("span via http/json")]
    );
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn an_http_json_export_is_answered_in_json_once_stored_and_a_retry_keeps_its_ids() {
    let harness = Harness::start("json", json!({}), Schema::Json).await;
    let request = json_logs(&["first", "second"]);
    let response = harness.post_logs(&request).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.json::<Value>().await.unwrap(), json!({}));
    // Answered only once durable: no waiting needed.
    let stored = harness.json(0);
    assert_eq!(stored.len(), 1, "one message per resource and scope");
    assert_eq!(log_bodies(&stored[0]), ["first", "second"]);
    assert_eq!(
        stored[0]["resourceLogs"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "checkout"
    );
    // The exporter's retry of the same request carries the same id.
    let gzipped = {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(request.to_string().as_bytes()).unwrap();
        encoder.finish().unwrap()
    };
    let retry = harness
        .client
        .post(harness.url("/v1/logs"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gzipped)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 200);
    let messages = harness.messages(0);
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].id, messages[1].id);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn split_record_stores_one_message_per_log_record() {
    let harness = Harness::start("split", json!({"split": "record"}), Schema::Json).await;
    let response = harness.post_logs(&json_logs(&["a", "b", "c"])).await;
    assert_eq!(response.status(), 200);
    let stored: Vec<Vec<String>> = harness.json(0).iter().map(log_bodies).collect();
    assert_eq!(stored, [["a"], ["b"], ["c"]]);
    let ids: std::collections::HashSet<u128> = harness
        .messages(0)
        .iter()
        .map(|message| message.id)
        .collect();
    assert_eq!(ids.len(), 3, "distinct ids");
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn format_raw_stores_the_protobuf_request_and_answers_protobuf_in_protobuf() {
    let harness = Harness::start("raw", json!({"format": "raw"}), Schema::Raw).await;
    let request: ExportLogsServiceRequest = serde_json::from_value(json_logs(&["binary"])).unwrap();
    let response = harness
        .client
        .post(harness.url("/v1/logs"))
        .header("content-type", "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-protobuf");
    let answer = ExportLogsServiceResponse::decode(response.bytes().await.unwrap()).unwrap();
    assert_eq!(answer.partial_success, None);
    let stored = ExportLogsServiceRequest::decode(&harness.messages(0)[0].payload[..]).unwrap();
    assert_eq!(stored, request);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn during_a_broker_outage_exporters_get_the_retryable_answers_and_nothing_is_lost() {
    let harness = Harness::start(
        "outage",
        json!({"request_timeout": "1s", "retry_after": "2s"}),
        Schema::Json,
    )
    .await;
    harness.bus.refuse_sends(u32::MAX);
    // HTTP: 503 with Retry-After and a google.rpc.Status body.
    let refused = harness.post_logs(&json_logs(&["during outage"])).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "2");
    let status: Value = refused.json().await.unwrap();
    assert_eq!(status["code"], 14, "UNAVAILABLE: {status}");
    // gRPC: UNAVAILABLE with RetryInfo.
    let mut client = LogsServiceClient::connect(harness.grpc_url())
        .await
        .unwrap();
    let request: ExportLogsServiceRequest =
        serde_json::from_value(json_logs(&["grpc during outage"])).unwrap();
    let status = client.export(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(2)));

    harness.bus.refuse_sends(0);
    // The batch the engine kept retrying (taken while the first request
    // waited) lands; the exporters' retries are then answered with success.
    harness.wait_for(0, 1).await;
    assert!(client.export(request).await.is_ok());
    let after = harness.post_logs(&json_logs(&["after"])).await;
    assert_eq!(after.status(), 200);
    let bodies: Vec<String> = harness.json(0).iter().flat_map(log_bodies).collect();
    assert_eq!(bodies, ["during outage", "grpc during outage", "after"]);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn without_the_token_exports_are_refused_over_both_protocols_and_store_nothing() {
    let harness = Harness::start("auth", json!({"token": "s3cret"}), Schema::Json).await;
    let missing = harness.post_logs(&json_logs(&["x"])).await;
    assert_eq!(missing.status(), 401);
    assert_eq!(missing.headers()["www-authenticate"], "Bearer");
    let wrong = harness
        .client
        .post(harness.url("/v1/logs"))
        .bearer_auth("s3cre")
        .json(&json_logs(&["x"]))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let mut client = LogsServiceClient::connect(harness.grpc_url())
        .await
        .unwrap();
    let request: ExportLogsServiceRequest = serde_json::from_value(json_logs(&["x"])).unwrap();
    let status = client.export(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let mut authorized = tonic::Request::new(request);
    authorized
        .metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    assert!(client.export(authorized).await.is_ok());
    assert_eq!(harness.messages(0).len(), 1, "only the authorized export");
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn oversized_requests_are_refused_and_an_oversized_record_is_a_partial_success() {
    let harness = Harness::start(
        "limits",
        json!({"max_request_bytes": 4096, "max_message_bytes": 600}),
        Schema::Json,
    )
    .await;
    let big = "x".repeat(5000);
    let too_large = harness.post_logs(&json_logs(&[&big])).await;
    assert_eq!(too_large.status(), 413);
    // Small once compressed, too large once inflated.
    let bomb = {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder
            .write_all(json_logs(&[&big]).to_string().as_bytes())
            .unwrap();
        encoder.finish().unwrap()
    };
    assert!(bomb.len() < 4096);
    let inflated = harness
        .client
        .post(harness.url("/v1/logs"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(bomb)
        .send()
        .await
        .unwrap();
    assert_eq!(inflated.status(), 413);
    // Two records fit one by one, the third alone is over max_message_bytes.
    let response = harness
        .post_logs(&json_logs(&["small", "also small", &"y".repeat(700)]))
        .await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["partialSuccess"]["rejectedLogRecords"], "1",
        "{answer}"
    );
    let bodies: Vec<String> = harness.json(0).iter().flat_map(log_bodies).collect();
    assert_eq!(bodies, ["small", "also small"]);
    // Not OTLP at all: 400, nothing stored.
    let garbage = harness.post_logs(&json!({"resourceLogs": "nope"})).await;
    assert_eq!(garbage.status(), 400);
    let unsupported = harness
        .client
        .post(harness.url("/v1/logs"))
        .header("content-type", "text/plain")
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(unsupported.status(), 415);
    assert_eq!(harness.messages(0).len(), 2);
    harness.runtime.shutdown().await;
}

#[tokio::test]
async fn a_signal_without_a_stream_is_not_received() {
    let harness = Harness::start("signals", json!({"traces_stream": 1}), Schema::Json).await;
    let logs = harness.post_logs(&json_logs(&["x"])).await;
    assert_eq!(logs.status(), 404);
    let traces = harness
        .client
        .post(harness.url("/v1/traces"))
        .json(&json!({"resourceSpans": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(traces.status(), 200);
    assert!(harness.messages(0).is_empty());
    harness.runtime.shutdown().await;
}
