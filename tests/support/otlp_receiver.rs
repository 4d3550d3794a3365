//! A minimal OTLP receiver for the runtime's own telemetry: the generated
//! tonic `TraceService` and `LogsService` on one gRPC port, and OTLP/HTTP
//! (`/v1/traces`, `/v1/logs`, protobuf) on another, keeping every export
//! request it gets. It runs on its own Tokio runtime, so sync tests can use it.
#![cfg(all(feature = "telemetry", feature = "otlp-source"))]

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

#[derive(Clone, Default)]
struct Received {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    logs: Arc<Mutex<Vec<ExportLogsServiceRequest>>>,
}

pub struct OtlpReceiver {
    received: Received,
    grpc: String,
    http: String,
    _runtime: tokio::runtime::Runtime,
}

impl OtlpReceiver {
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the receiver");
        let received = Received::default();
        let (grpc, http) = runtime.block_on(async {
            let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let grpc_address = grpc.local_addr().unwrap();
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(received.clone()))
                    .add_service(LogsServiceServer::new(received.clone()))
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc)),
            );
            let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let http_address = http.local_addr().unwrap();
            let app = axum::Router::new()
                .route("/v1/traces", axum::routing::post(http_traces))
                .route("/v1/logs", axum::routing::post(http_logs))
                .with_state(received.clone());
            tokio::spawn(async move { axum::serve(http, app).await });
            (
                format!("http://{grpc_address}"),
                format!("http://{http_address}"),
            )
        });
        Self {
            received,
            grpc,
            http,
            _runtime: runtime,
        }
    }

    /// `http://127.0.0.1:port` of the gRPC receiver.
    pub fn grpc_url(&self) -> &str {
        &self.grpc
    }

    /// `http://127.0.0.1:port` of the HTTP receiver (no path).
    pub fn http_url(&self) -> &str {
        &self.http
    }

    /// Every span received, with its resource's `service.name`.
    pub fn spans(&self) -> Vec<(String, Span)> {
        let requests = self.received.traces.lock().unwrap();
        let mut spans = Vec::new();
        for request in requests.iter() {
            for resource in &request.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|resource| string_attribute(&resource.attributes, "service.name"))
                    .unwrap_or_default();
                for scope in &resource.scope_spans {
                    for span in &scope.spans {
                        spans.push((service.clone(), span.clone()));
                    }
                }
            }
        }
        spans
    }

    /// The bodies of every log record received.
    pub fn log_bodies(&self) -> Vec<String> {
        let requests = self.received.logs.lock().unwrap();
        requests
            .iter()
            .flat_map(|request| &request.resource_logs)
            .flat_map(|resource| &resource.scope_logs)
            .flat_map(|scope| &scope.log_records)
            .filter_map(|record| match record.body.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(text) => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn request_count(&self) -> usize {
        self.received.traces.lock().unwrap().len() + self.received.logs.lock().unwrap().len()
    }
}

pub fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attribute(attributes, key).and_then(|value| match value {
        any_value::Value::StringValue(text) => Some(text),
        _ => None,
    })
}

pub fn int_attribute(attributes: &[KeyValue], key: &str) -> Option<i64> {
    attribute(attributes, key).and_then(|value| match value {
        any_value::Value::IntValue(number) => Some(number),
        _ => None,
    })
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<any_value::Value> {
    attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .and_then(|attribute| attribute.value.clone())
        .and_then(|AnyValue { value }| value)
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.traces.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.logs.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

async fn http_traces(
    axum::extract::State(received): axum::extract::State<Received>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            received.traces.lock().unwrap().push(request);
            axum::http::StatusCode::OK
        }
        Err(_) => axum::http::StatusCode::BAD_REQUEST,
    }
}

async fn http_logs(
    axum::extract::State(received): axum::extract::State<Received>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    match ExportLogsServiceRequest::decode(body) {
        Ok(request) => {
            received.logs.lock().unwrap().push(request);
            axum::http::StatusCode::OK
        }
        Err(_) => axum::http::StatusCode::BAD_REQUEST,
    }
}
