//! The otlp sink: OTLP records stored in Iggy exported to a collector. The
//! collector is our own otlp source (Iggy -> otlp sink -> otlp source ->
//! Iggy, through the in-process Iggy test server), a scripted HTTP server and
//! a scripted gRPC server (the generated tonic service) for error answers.
//!
//! Upstream iggy-connectors has no OTLP connector (and so no example file).
#![cfg(all(feature = "otlp-source", feature = "otlp-sink"))]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::{Sink, SinkError};
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::message::{HeaderValue, Payload, SinkMessage};
use iggy_connect::state::FileStateStore;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use prost::Message as _;
use serde_json::{Value, json};
use tonic_types::{ErrorDetails, StatusExt};

use crate::support::http_server::{Reply, ScriptedServer};
use crate::support::iggy_server::IggyTestServer;
use crate::support::sinks;
use crate::support::wait::{Check, try_eventually, wait_for};

const LONG: Duration = Duration::from_secs(30);

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn json_logs(bodies: &[&str]) -> Value {
    json!({"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout"}}]},
        "scopeLogs": [{
            "scope": {"name": "sink-test"},
            "logRecords": bodies.iter().map(|body| json!({
                "timeUnixNano": "1700000000000000000",
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

fn message(index: u64, payload: Payload) -> SinkMessage {
    SinkMessage {
        id: index as u128 + 1,
        offset: index,
        partition_id: 0,
        timestamp: 0,
        origin_timestamp: 0,
        checksum: 0,
        headers: vec![("otlp-signal".into(), HeaderValue::String("logs".into()))],
        payload,
    }
}

fn json_message(index: u64, bodies: &[&str]) -> SinkMessage {
    message(
        index,
        Payload::JsonBytes(json_logs(bodies).to_string().into()),
    )
}

fn protobuf_message(index: u64, bodies: &[&str]) -> SinkMessage {
    let request: ExportLogsServiceRequest = serde_json::from_value(json_logs(bodies)).unwrap();
    message(index, Payload::Raw(request.encode_to_vec().into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_go_from_iggy_through_the_sink_to_an_otlp_receiver_and_back_into_iggy() {
    let server = IggyTestServer::start();
    let state = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(ConnectionSettings::password(
            server.address().to_string(),
            "iggy",
            "iggy",
        ))),
        Arc::new(FileStateStore::new(state.path()).unwrap()),
        Duration::from_secs(5),
    );
    let (in_http, back_grpc, back_http) = (free_address(), free_address(), free_address());
    let streams = |stream: &str, schema: &str| {
        ["logs", "traces", "metrics"]
            .map(|topic| {
                format!("[[streams]]\nstream = \"{stream}\"\ntopic = \"{topic}\"\nschema = \"{schema}\"\n")
            })
            .join("")
    };
    // In: protobuf as received (`raw`), over HTTP only.
    runtime
        .add(connector(&format!(
            "type = \"source\"\nkey = \"otlp-in\"\npath = \"otlp\"\n{}\n[plugin_config]\nprotocols = [\"http\"]\nhttp_address = \"{in_http}\"\nformat = \"raw\"\n",
            streams("otlp-in", "raw")
        )))
        .unwrap();
    // Out: the raw logs and traces topics to the second receiver over gRPC.
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "otlp-out"
            path = "otlp"
            [[streams]]
            stream = "otlp-in"
            topics = ["logs", "traces"]
            schema = "raw"
            poll_interval = "5ms"
            [plugin_config]
            endpoint = "http://{back_grpc}"
            protocol = "grpc"
            compression = "gzip"
            token = "s3cret"
            "#
        )))
        .unwrap();
    // Back: OTLP/JSON into another stream.
    runtime
        .add(connector(&format!(
            "type = \"source\"\nkey = \"otlp-back\"\npath = \"otlp\"\n{}\n[plugin_config]\ngrpc_address = \"{back_grpc}\"\nhttp_address = \"{back_http}\"\ntoken = \"s3cret\"\n",
            streams("otlp-back", "json")
        )))
        .unwrap();
    runtime.start_enabled().await;
    let client = reqwest::Client::new();
    let first = try_eventually("the in source to listen", LONG, || async {
        match client
            .post(format!("http://{in_http}/v1/logs"))
            .json(&json_logs(&["one", "two"]))
            .send()
            .await
        {
            Ok(response) => Check::Ready(response),
            Err(error) => Check::Pending(error.to_string()),
        }
    })
    .await
    .unwrap_or_else(|message| panic!("{message}"));
    assert_eq!(first.status(), 200);
    let traces = client
        .post(format!("http://{in_http}/v1/traces"))
        .json(&json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174",
            "name": "checkout",
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
        }]}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(traces.status(), 200);
    wait_for("logs and traces back in Iggy", LONG, || {
        server.message_count("otlp-back", "logs") == 1
            && server.message_count("otlp-back", "traces") == 1
    })
    .await;
    let payload = |topic: &str| -> Value {
        serde_json::from_slice(&server.messages("otlp-back", topic)[0].payload).unwrap()
    };
    assert_eq!(log_bodies(&payload("logs")), ["one", "two"]);
    let span = &payload("traces")["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(span["traceId"], "5b8efff798038103d269b633813fc60c");
    assert_eq!(span["name"], "checkout");
    wait_for("the sink's offsets to cover its topics", LONG, || {
        server.stored_offset("otlp-in", "logs", "iggy-connect-sink-otlp-out", 0) == Some(0)
            && server.stored_offset("otlp-in", "traces", "iggy-connect-sink-otlp-out", 0) == Some(0)
    })
    .await;
    assert_eq!(server.message_count("otlp-back", "metrics"), 0);
    runtime.shutdown().await;
}

/// An otlp source opened directly, every batch it polls committed at once:
/// what it received is what it was sent.
struct Receiver {
    grpc: SocketAddr,
    http: SocketAddr,
    received: Arc<Mutex<Vec<Value>>>,
}

async fn receiver() -> Receiver {
    let (grpc, http) = (free_address(), free_address());
    let config = json!({"grpc_address": grpc.to_string(), "http_address": http.to_string()});
    let entry = iggy_connect::connectors::Registry::sources()
        .iter()
        .find(|entry| entry.name == "otlp")
        .unwrap();
    let mut source = (entry.build)(&config).unwrap();
    source.open(None).await.unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let recorded = received.clone();
    tokio::spawn(async move {
        loop {
            let batch = source.poll().await.unwrap();
            for record in batch.records {
                recorded
                    .lock()
                    .unwrap()
                    .push(serde_json::from_slice(&record.payload.to_bytes()).unwrap());
            }
            source.commit().await.unwrap();
        }
    });
    Receiver {
        grpc,
        http,
        received,
    }
}

impl Receiver {
    fn bodies(&self) -> Vec<String> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .flat_map(log_bodies)
            .collect()
    }
}

#[tokio::test]
async fn both_stored_encodings_are_exported_merged_over_every_protocol() {
    let receiver = receiver().await;
    for (protocol, endpoint) in [
        ("grpc", format!("http://{}", receiver.grpc)),
        ("http/protobuf", format!("http://{}", receiver.http)),
        ("http/json", format!("http://{}/", receiver.http)),
    ] {
        let sink = sinks::open(
            "otlp",
            &json!({"endpoint": endpoint, "protocol": protocol, "compression": "gzip"}),
        )
        .await;
        let messages = [
            json_message(0, &[&format!("{protocol} a")]),
            protobuf_message(1, &[&format!("{protocol} b")]),
        ];
        sink.write(&sinks::topic(), &messages).await.unwrap();
    }
    assert_eq!(
        receiver.bodies(),
        [
            "grpc a",
            "grpc b",
            "http/protobuf a",
            "http/protobuf b",
            "http/json a",
            "http/json b"
        ]
    );
}

#[tokio::test]
async fn a_message_that_is_not_otlp_is_rejected_by_index_before_anything_is_sent() {
    let server = ScriptedServer::start(vec![]).await;
    let sink = sinks::open("otlp", &json!({"endpoint": server.url("")})).await;
    let mut unsigned = json_message(2, &["no signal"]);
    unsigned.headers.clear();
    let messages = [
        json_message(0, &["fine"]),
        message(1, Payload::Text("not otlp".into())),
        unsigned,
    ];
    let Err(SinkError::Rejected(rejections)) = sink.write(&sinks::topic(), &messages).await else {
        panic!("expected rejections");
    };
    let indexes: Vec<usize> = rejections.iter().map(|rejection| rejection.index).collect();
    assert_eq!(indexes, [1, 2], "{rejections:?}");
    assert!(
        rejections[1].reason.contains("otlp-signal"),
        "{rejections:?}"
    );
    assert_eq!(server.count(), 0);
}

#[tokio::test]
async fn http_retryable_answers_are_transient_with_their_retry_after_and_others_refused_by_index() {
    let server = ScriptedServer::start(vec![Reply::retry_after(503, 7), Reply::status(502)]).await;
    let sink = sinks::open("otlp", &json!({"endpoint": server.url("")})).await;
    for wait in [Some(Duration::from_secs(7)), None] {
        let error = sink
            .write(&sinks::topic(), &[json_message(0, &["x"])])
            .await
            .unwrap_err();
        let SinkError::Transient { retry_after, .. } = error else {
            panic!("expected a transient error, got {error}");
        };
        assert_eq!(retry_after, wait);
    }
    sink.write(&sinks::topic(), &[json_message(0, &["x"])])
        .await
        .unwrap();
    assert_eq!(server.count(), 3, "each write sent its export once");
    assert_eq!(server.received()[0].uri.path(), "/v1/logs");
    assert_eq!(
        server.received()[0].headers["content-type"],
        "application/x-protobuf"
    );

    // A 400 for the merged request: each message is sent alone; the one
    // refused alone is rejected, the others are durable.
    server.script([Reply::status(400), Reply::OK, Reply::status(400), Reply::OK]);
    let messages = [
        json_message(0, &["a"]),
        json_message(1, &["b"]),
        json_message(2, &["c"]),
    ];
    let error = sink.write(&sinks::topic(), &messages).await.unwrap_err();
    let SinkError::Partial(partial) = error else {
        panic!("expected a partial answer, got {error}");
    };
    assert_eq!(partial.durable, [0, 2]);
    assert_eq!(
        partial
            .rejected
            .iter()
            .map(|rejection| rejection.index)
            .collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(
        server.count(),
        3 + 4,
        "one merged request, then one per message"
    );
    let merged = ExportLogsServiceRequest::decode(&server.received()[3].body[..]).unwrap();
    assert_eq!(merged.resource_logs.len(), 3);
    // A 500 is not retryable in OTLP: refused, not retried.
    let before = server.count();
    server.script([Reply::status(500)]);
    let Err(SinkError::Rejected(_)) = sink
        .write(&sinks::topic(), &[json_message(0, &["d"])])
        .await
    else {
        panic!("expected a rejection");
    };
    assert_eq!(server.count(), before + 1);
}

#[tokio::test]
async fn bad_credentials_are_fatal_and_an_endless_outage_is_transient() {
    let server = ScriptedServer::start(vec![Reply::status(401)]).await;
    let sink = sinks::open("otlp", &json!({"endpoint": server.url(""), "token": "t"})).await;
    let Err(SinkError::Fatal(error)) = sink
        .write(&sinks::topic(), &[json_message(0, &["x"])])
        .await
    else {
        panic!("expected a fatal error");
    };
    assert!(error.to_string().contains("plugin_config.token"), "{error}");
    assert_eq!(server.received()[0].headers["authorization"], "Bearer t");
    server.set_default(Reply::status(503));
    let Err(SinkError::Transient { .. }) = sink
        .write(&sinks::topic(), &[json_message(0, &["x"])])
        .await
    else {
        panic!("expected a transient error");
    };
    assert_eq!(server.count(), 1 + 1, "the sink sends each export once");
}

#[tokio::test]
async fn an_outage_after_some_exports_names_the_messages_they_delivered() {
    let server = ScriptedServer::start(vec![Reply::OK, Reply::status(503)]).await;
    let sink = sinks::open(
        "otlp",
        &json!({"endpoint": server.url(""), "max_batch_messages": 1}),
    )
    .await;
    let messages = [
        json_message(0, &["a"]),
        json_message(1, &["b"]),
        json_message(2, &["c"]),
    ];
    let error = sink.write(&sinks::topic(), &messages).await.unwrap_err();
    let SinkError::Partial(partial) = error else {
        panic!("expected a partial answer, got {error}");
    };
    assert_eq!(partial.durable, [0]);
    assert!(partial.rejected.is_empty());
    assert!(partial.rest.is_transient(), "{}", partial.rest);
    assert_eq!(server.count(), 2, "nothing is exported after the outage");
}

/// A gRPC collector answering from a script, then OK.
#[derive(Clone, Default)]
struct ScriptedCollector {
    script: Arc<Mutex<Vec<tonic::Status>>>,
    calls: Arc<Mutex<Vec<Instant>>>,
}

#[tonic::async_trait]
impl LogsService for ScriptedCollector {
    async fn export(
        &self,
        _request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.calls.lock().unwrap().push(Instant::now());
        let next = {
            let mut script = self.script.lock().unwrap();
            (!script.is_empty()).then(|| script.remove(0))
        };
        match next {
            Some(status) => Err(status),
            None => Ok(tonic::Response::new(ExportLogsServiceResponse::default())),
        }
    }
}

async fn scripted_collector(script: Vec<tonic::Status>) -> (ScriptedCollector, String) {
    let collector = ScriptedCollector {
        script: Arc::new(Mutex::new(script)),
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let service = LogsServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (collector, format!("http://{address}"))
}

#[tokio::test]
async fn grpc_retry_info_becomes_the_transient_wait_and_non_retryable_codes_are_refused() {
    let retry_later = tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        "slow down",
        ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))),
    );
    let (collector, endpoint) =
        scripted_collector(vec![tonic::Status::unavailable("restarting"), retry_later]).await;
    let sink = sinks::open("otlp", &json!({"endpoint": endpoint, "protocol": "grpc"})).await;
    for wait in [None, Some(Duration::from_millis(1500))] {
        let error = sink
            .write(&sinks::topic(), &[json_message(0, &["x"])])
            .await
            .unwrap_err();
        let SinkError::Transient { retry_after, .. } = error else {
            panic!("expected a transient error, got {error}");
        };
        assert_eq!(retry_after, wait);
    }
    sink.write(&sinks::topic(), &[json_message(0, &["x"])])
        .await
        .unwrap();
    assert_eq!(collector.calls.lock().unwrap().len(), 3);
    // RESOURCE_EXHAUSTED without RetryInfo and INVALID_ARGUMENT are final.
    collector.script.lock().unwrap().extend([
        tonic::Status::resource_exhausted("full"),
        tonic::Status::invalid_argument("bad"),
    ]);
    for _ in 0..2 {
        let Err(SinkError::Rejected(rejections)) = sink
            .write(&sinks::topic(), &[json_message(0, &["y"])])
            .await
        else {
            panic!("expected a rejection");
        };
        assert_eq!(rejections[0].index, 0);
    }
    assert_eq!(collector.calls.lock().unwrap().len(), 5);
    collector
        .script
        .lock()
        .unwrap()
        .push(tonic::Status::unauthenticated("who are you"));
    let Err(SinkError::Fatal(_)) = sink
        .write(&sinks::topic(), &[json_message(0, &["z"])])
        .await
    else {
        panic!("expected a fatal error");
    };
}

#[tokio::test]
async fn an_unreachable_collector_is_transient() {
    let endpoint = format!("http://{}", free_address());
    for protocol in ["grpc", "http/protobuf"] {
        let mut sink: Box<dyn Sink> = sinks::build(
            "otlp",
            &json!({"endpoint": endpoint, "protocol": protocol, "timeout": "2s"}),
        );
        sink.open().await.unwrap();
        let Err(SinkError::Transient { error, .. }) = sink
            .write(&sinks::topic(), &[json_message(0, &["x"])])
            .await
        else {
            panic!("expected a transient error over {protocol}");
        };
        assert!(!error.to_string().is_empty());
    }
}
