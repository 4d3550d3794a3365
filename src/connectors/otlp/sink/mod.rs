//! `otlp` sink: exports OTLP records stored in Iggy (complete export
//! requests, OTLP/JSON or protobuf, as the otlp source stores them) to an
//! OpenTelemetry collector over OTLP/gRPC or OTLP/HTTP (protobuf or JSON).
//!
//! Delivery: messages of one signal are merged into export requests (up to
//! `max_batch_messages` and `max_batch_bytes`), each sent once; `write`
//! returns `Ok` only once the collector answered success for every one, so
//! the engine commits offsets only then. The answers the OTLP spec makes
//! retryable (HTTP 429, 502, 503, 504; gRPC UNAVAILABLE, DEADLINE_EXCEEDED,
//! ABORTED, CANCELLED, OUT_OF_RANGE, DATA_LOSS, and RESOURCE_EXHAUSTED with
//! `RetryInfo`), connection errors and timeouts end the write as transient,
//! with the `Retry-After` / `RetryInfo` the collector asked for, naming the
//! messages earlier exports delivered: the engine exports only the rest
//! again, after that wait or its backoff. Bad credentials (401/403,
//! UNAUTHENTICATED/PERMISSION_DENIED) and a wrong endpoint (404,
//! UNIMPLEMENTED) are fatal. Any other refusal of a merged request is
//! narrowed down by sending its messages one at a time: the ones refused alone
//! are rejected by index (`on_error`). A message that is not an OTLP export
//! request is rejected before anything is sent. A partial success
//! (`rejected_*` > 0) is final by the spec and names no records: it is logged
//! and counted (`iggy_connector_otlp_sink_partially_rejected_total`), not
//! retried. OTLP has no idempotent writes: a retried batch may export
//! records twice.

mod config;

use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use secrecy::ExposeSecret;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_types::StatusExt;
use tracing::{debug, info, warn};

use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, Auth, ClientOptions, HttpClient};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::otlp::{self as otlp, Encoding, SIGNAL_HEADER, Signal};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, RetrySettings, Sink, SinkError,
    parse_plugin_config,
};
use crate::connectors::{SinkEntry, schema_of};
use crate::message::{HeaderValue as UserHeader, Payload, SinkMessage, TopicRef};

pub use config::{Compression, OtherPayloads, OtlpSinkConfig, Protocol, SignalName};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "otlp",
    feature: "otlp-sink",
    description: "exports OTLP logs, traces and metrics stored in Iggy to an OpenTelemetry collector (gRPC or HTTP)",
    secret_fields: &["token", "headers.*"],
    sample_config: "endpoint = \"http://localhost:4317\"\nprotocol = \"grpc\"\ntoken = \"secret-token\"\n\n[headers]\nx-api-key = \"secret-key\"\n",
    config_schema: schema_of::<OtlpSinkConfig>,
    build: |config| Ok(Box::new(OtlpSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub struct OtlpSink {
    config: OtlpSinkConfig,
    url: reqwest::Url,
    http: Option<HttpClient>,
    grpc: Option<Channel>,
    metadata: MetadataMap,
    key: String,
}

/// One export request of any signal.
#[derive(Debug, Clone)]
enum Request {
    Logs(ExportLogsServiceRequest),
    Traces(ExportTraceServiceRequest),
    Metrics(ExportMetricsServiceRequest),
}

macro_rules! each {
    ($request:expr, $value:ident => $body:expr) => {
        match $request {
            Request::Logs($value) => $body,
            Request::Traces($value) => $body,
            Request::Metrics($value) => $body,
        }
    };
}

impl Request {
    fn signal(&self) -> SignalName {
        match self {
            Request::Logs(_) => SignalName::Logs,
            Request::Traces(_) => SignalName::Traces,
            Request::Metrics(_) => SignalName::Metrics,
        }
    }

    fn merge(&mut self, other: Request) {
        match (self, other) {
            (Request::Logs(into), Request::Logs(from)) => into.append(from),
            (Request::Traces(into), Request::Traces(from)) => into.append(from),
            (Request::Metrics(into), Request::Metrics(from)) => into.append(from),
            // Requests are grouped by signal before they are merged.
            _ => {}
        }
    }

    fn encoded_len(&self) -> usize {
        each!(self, request => request.encoded_len())
    }
}

impl OtlpSink {
    pub fn new(config: OtlpSinkConfig) -> Result<Self, PluginConfigError> {
        let url = config.validate()?;
        let mut metadata = MetadataMap::new();
        for (name, value) in &config.headers {
            let key =
                MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| {
                    PluginConfigError::new(
                        format!("headers.{name}"),
                        "not a valid gRPC metadata key",
                    )
                })?;
            let value = MetadataValue::try_from(value.expose_secret()).map_err(|_| {
                PluginConfigError::new(
                    format!("headers.{name}"),
                    "holds characters a header cannot carry",
                )
            })?;
            metadata.insert(key, value);
        }
        if let Some(token) = &config.token {
            let value = MetadataValue::try_from(format!("Bearer {}", token.expose_secret()))
                .map_err(|_| {
                    PluginConfigError::new("token", "holds characters a header cannot carry")
                })?;
            metadata.insert("authorization", value);
        }
        Ok(Self {
            url,
            http: None,
            grpc: None,
            metadata,
            key: "otlp".into(),
            config,
        })
    }

    fn wire_encoding(&self) -> Encoding {
        match self.config.protocol {
            Protocol::HttpJson => Encoding::Json,
            Protocol::Grpc | Protocol::HttpProtobuf => Encoding::Protobuf,
        }
    }

    /// A stored message as an export request; with `other_payloads = "log"`
    /// one that is not becomes a log record.
    fn decode(&self, message: &SinkMessage) -> Result<(Request, usize), String> {
        match (self.decode_otlp(message), self.config.other_payloads) {
            (Ok(decoded), _) => Ok(decoded),
            (Err(reason), OtherPayloads::Reject) => Err(reason),
            (Err(_), OtherPayloads::Log) => {
                let request = Request::Logs(as_log(message, &self.config.service_name));
                let size = match self.wire_encoding() {
                    Encoding::Json => request.encoded_len() * 2,
                    Encoding::Protobuf => request.encoded_len(),
                };
                Ok((request, size))
            }
        }
    }

    /// A stored message as an export request, or why it is not one.
    fn decode_otlp(&self, message: &SinkMessage) -> Result<(Request, usize), String> {
        let signal = match message
            .headers
            .iter()
            .find(|(name, _)| name == SIGNAL_HEADER)
        {
            Some((_, UserHeader::String(name))) => SignalName::parse(name).ok_or_else(|| {
                format!("the {SIGNAL_HEADER} header names no OTLP signal: \"{name}\"")
            })?,
            Some((_, other)) => {
                return Err(format!(
                    "the {SIGNAL_HEADER} header names no OTLP signal: {other}"
                ));
            }
            None => self.config.signal.ok_or_else(|| {
                format!(
                    "the message has no {SIGNAL_HEADER} header and plugin_config.signal is not set"
                )
            })?,
        };
        let bytes: Bytes = match &message.payload {
            Payload::Json(value) => serde_json::to_vec(value).unwrap_or_default().into(),
            Payload::Text(text) => Bytes::copy_from_slice(text.as_bytes()),
            Payload::JsonBytes(bytes) | Payload::Raw(bytes) => bytes.clone(),
        };
        let encoding = Encoding::sniff(&bytes);
        let request = match signal {
            SignalName::Logs => {
                Request::Logs(otlp::decode(encoding, &bytes).map_err(|e| e.to_string())?)
            }
            SignalName::Traces => {
                Request::Traces(otlp::decode(encoding, &bytes).map_err(|e| e.to_string())?)
            }
            SignalName::Metrics => {
                Request::Metrics(otlp::decode(encoding, &bytes).map_err(|e| e.to_string())?)
            }
        };
        // What it weighs on the wire: JSON about twice its protobuf.
        let size = match (self.wire_encoding(), encoding) {
            (Encoding::Json, Encoding::Json) => bytes.len(),
            (Encoding::Json, Encoding::Protobuf) => request.encoded_len() * 2,
            (Encoding::Protobuf, _) => request.encoded_len(),
        };
        Ok((request, size))
    }

    /// Sends one export request once: `Ok` when the collector took it.
    async fn deliver(&self, request: &Request) -> Result<(), Failure> {
        each!(request, request => self.export(request).await)
    }

    async fn export<S: GrpcSignal>(&self, request: &S) -> Result<(), Failure> {
        let partial = match self.config.protocol {
            Protocol::Grpc => self.export_grpc(request).await,
            Protocol::HttpProtobuf | Protocol::HttpJson => self.export_http(request).await,
        }?;
        if let Some((rejected, message)) = partial.filter(|(rejected, _)| *rejected > 0) {
            warn!(connector_key = %self.key, signal = S::NAME, rejected, %message, "the collector accepted the export but rejected some {} (final, by the OTLP spec)", S::ITEM);
            metrics::counter!("iggy_connector_otlp_sink_partially_rejected_total", "connector_key" => self.key.clone(), "signal" => S::NAME).increment(rejected as u64);
        }
        Ok(())
    }

    async fn export_grpc<S: GrpcSignal>(
        &self,
        request: &S,
    ) -> Result<Option<(i64, String)>, Failure> {
        let Some(channel) = self.grpc.clone() else {
            return Err(Failure::Fatal("the sink is not open".into()));
        };
        let mut call = tonic::Request::new(request.clone());
        *call.metadata_mut() = self.metadata.clone();
        call.set_timeout(self.config.timeout);
        let gzip = self.config.compression == Compression::Gzip;
        match S::call(channel, call, gzip).await {
            Ok(response) => Ok(S::rejected(response.get_ref())),
            Err(status) => Err(grpc_failure(&status)),
        }
    }

    async fn export_http<S: Signal>(&self, request: &S) -> Result<Option<(i64, String)>, Failure> {
        let Some(client) = &self.http else {
            return Err(Failure::Fatal("the sink is not open".into()));
        };
        let encoding = self.wire_encoding();
        let mut url = self.url.clone();
        let path = format!("{}/v1/{}", url.path().trim_end_matches('/'), S::NAME);
        url.set_path(&path);
        let body = Bytes::from(otlp::encode(encoding, request));
        let request = client
            .request(reqwest::Method::POST, url.clone(), body)
            .header(CONTENT_TYPE, encoding.content_type());
        let answer = http::exchange(request, url.as_str(), MAX_RESPONSE_BYTES).await?;
        if answer.is_success() {
            let response: Option<S::Response> = match Encoding::sniff(&answer.body) {
                _ if answer.body.is_empty() => None,
                Encoding::Json => serde_json::from_slice(&answer.body).ok(),
                Encoding::Protobuf => S::Response::decode(answer.body).ok(),
            };
            return Ok(response.as_ref().and_then(S::rejected));
        }
        let reason = format!(
            "{url} answered {}: {}",
            answer.status,
            status_message(&answer.text())
        );
        Err(match answer.status {
            429 | 502 | 503 | 504 => Failure::Transient {
                reason,
                retry_after: answer.retry_after,
            },
            401 | 403 => Failure::Fatal(format!(
                "{reason}; check plugin_config.token and plugin_config.headers"
            )),
            404 => Failure::Fatal(format!(
                "{reason}; check plugin_config.endpoint (OTLP/HTTP paths are /v1/logs, /v1/traces, /v1/metrics under it)"
            )),
            _ => Failure::Refused(reason),
        })
    }

    /// Sends the messages of one signal, merged into requests as large as
    /// allowed, and notes each message's answer, until a failure stops the
    /// write.
    async fn send_group(&self, group: Vec<(usize, Request, usize)>, outcome: &mut Outcome) {
        let mut chunks: Vec<Vec<(usize, Request, usize)>> = Vec::new();
        let mut size = 0;
        for item in group {
            let full = chunks.last().is_none_or(|chunk| {
                chunk.len() >= self.config.max_batch_messages
                    || size + item.2 > self.config.max_batch_bytes
            });
            if full {
                chunks.push(Vec::new());
                size = 0;
            }
            size += item.2;
            if let Some(chunk) = chunks.last_mut() {
                chunk.push(item);
            }
        }
        for chunk in chunks {
            let mut items = chunk.into_iter();
            let Some((first_index, first, _)) = items.next() else {
                continue;
            };
            let rest: Vec<(usize, Request)> =
                items.map(|(index, request, _)| (index, request)).collect();
            let mut merged = first.clone();
            for (_, request) in &rest {
                merged.merge(request.clone());
            }
            let indexes = std::iter::once(first_index).chain(rest.iter().map(|(index, _)| *index));
            match self.deliver(&merged).await {
                Ok(()) => outcome.durable(indexes),
                Err(Failure::Refused(reason)) if !rest.is_empty() => {
                    debug!(connector_key = %self.key, messages = rest.len() + 1, %reason, "export refused; sending its messages one at a time");
                    for (index, request) in std::iter::once((first_index, first)).chain(rest) {
                        match self.deliver(&request).await {
                            Ok(()) => outcome.durable([index]),
                            Err(failure) => outcome.fail(failure, [index]),
                        }
                        if outcome.stopped() {
                            return;
                        }
                    }
                }
                Err(failure) => outcome.fail(failure, indexes),
            }
            if outcome.stopped() {
                return;
            }
        }
    }
}

/// A message that is not OTLP, as one log record.
fn as_log(message: &SinkMessage, service_name: &str) -> ExportLogsServiceRequest {
    let text = |value: String| AnyValue {
        value: Some(any_value::Value::StringValue(value)),
    };
    let int = |value: i64| AnyValue {
        value: Some(any_value::Value::IntValue(value)),
    };
    let attribute = |key: &str, value: AnyValue| KeyValue {
        key: key.to_owned(),
        value: Some(value),
        ..Default::default()
    };
    let body = match &message.payload {
        Payload::Json(value) => text(value.to_string()),
        Payload::Text(value) => text(value.clone()),
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => match std::str::from_utf8(bytes) {
            Ok(value) => text(value.to_owned()),
            Err(_) => AnyValue {
                value: Some(any_value::Value::BytesValue(bytes.to_vec())),
            },
        },
    };
    let micros_to_nanos = |micros: u64| micros.saturating_mul(1000);
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![attribute("service.name", text(service_name.to_owned()))],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "iggy-connect".into(),
                    ..Default::default()
                }),
                log_records: vec![LogRecord {
                    time_unix_nano: micros_to_nanos(message.origin_timestamp),
                    observed_time_unix_nano: micros_to_nanos(message.timestamp),
                    body: Some(body),
                    attributes: vec![
                        attribute("iggy.message.id", text(message.id.to_string())),
                        attribute("iggy.offset", int(message.offset as i64)),
                        attribute("iggy.partition", int(i64::from(message.partition_id))),
                    ],
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The message of an error answer's `google.rpc.Status` (JSON or protobuf),
/// else the body as text.
fn status_message(body: &str) -> String {
    let json: Option<serde_json::Value> = serde_json::from_str(body).ok();
    if let Some(message) = json.as_ref().and_then(|value| value["message"].as_str()) {
        return message.to_owned();
    }
    if let Ok(status) = tonic_types::Status::decode(body.as_bytes())
        && !status.message.is_empty()
    {
        return status.message;
    }
    body.chars().take(256).collect()
}

/// What a gRPC error status means for the export, by the OTLP spec.
fn grpc_failure(status: &Status) -> Failure {
    let reason = format!(
        "the collector answered {:?}: {}",
        status.code(),
        status.message()
    );
    let retry_after = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay);
    match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Failure::Transient {
            reason,
            retry_after,
        },
        Code::ResourceExhausted if retry_after.is_some() => Failure::Transient {
            reason,
            retry_after,
        },
        Code::Unauthenticated | Code::PermissionDenied => Failure::Fatal(format!(
            "{reason}; check plugin_config.token and plugin_config.headers"
        )),
        Code::Unimplemented => Failure::Fatal(format!(
            "{reason}; check plugin_config.endpoint and plugin_config.protocol"
        )),
        // A connection failure shows as Unknown with a transport error source.
        Code::Unknown if std::error::Error::source(status).is_some() => Failure::Transient {
            reason,
            retry_after,
        },
        _ => Failure::Refused(reason),
    }
}

/// A signal whose export the generated gRPC clients can call.
trait GrpcSignal: Signal {
    async fn call(
        channel: Channel,
        request: tonic::Request<Self>,
        gzip: bool,
    ) -> Result<tonic::Response<Self::Response>, Status>;
}

macro_rules! grpc_signal {
    ($request:ty, $client:ident) => {
        impl GrpcSignal for $request {
            async fn call(
                channel: Channel,
                request: tonic::Request<Self>,
                gzip: bool,
            ) -> Result<tonic::Response<Self::Response>, Status> {
                let mut client = $client::new(channel)
                    .accept_compressed(CompressionEncoding::Gzip)
                    .max_decoding_message_size(MAX_RESPONSE_BYTES);
                if gzip {
                    client = client.send_compressed(CompressionEncoding::Gzip);
                }
                client.export(request).await
            }
        }
    };
}

grpc_signal!(ExportLogsServiceRequest, LogsServiceClient);
grpc_signal!(ExportTraceServiceRequest, TraceServiceClient);
grpc_signal!(ExportMetricsServiceRequest, MetricsServiceClient);

#[async_trait]
impl Sink for OtlpSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    /// `retry_delay`, doubling up to `max_retry_delay`, as the engine's wait
    /// between writes of what is not exported yet; after `max_retries`
    /// consecutive failed writes the engine reports the sink degraded.
    fn retry(&self) -> Option<RetrySettings> {
        Some(RetrySettings::doubling(
            self.config.retry_delay,
            self.config.max_retry_delay,
            self.config.max_retries,
        ))
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        match self.config.protocol {
            Protocol::Grpc => {
                let endpoint = Endpoint::from_shared(self.config.endpoint.clone())
                    .map_err(|error| {
                        ConnectorError::fatal(format!("plugin_config.endpoint: {error}"))
                    })?
                    .connect_timeout(self.config.timeout)
                    .timeout(self.config.timeout);
                self.grpc = Some(endpoint.connect_lazy());
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                let mut headers = HeaderMap::new();
                for (name, value) in &self.config.headers {
                    let name = HeaderName::try_from(name.as_str()).map_err(|_| {
                        ConnectorError::fatal(format!(
                            "plugin_config.headers.{name}: not a valid header name"
                        ))
                    })?;
                    let mut value = HeaderValue::try_from(value.expose_secret()).map_err(|_| {
                        ConnectorError::fatal(format!(
                            "plugin_config.headers.{name}: holds characters a header cannot carry"
                        ))
                    })?;
                    value.set_sensitive(true);
                    headers.insert(name, value);
                }
                let options = ClientOptions {
                    timeout: self.config.timeout,
                    auth: self.config.token.clone().map_or(Auth::None, Auth::Bearer),
                    headers,
                    gzip: self.config.compression == Compression::Gzip,
                    ..ClientOptions::default()
                };
                self.http = Some(
                    HttpClient::new(&options)
                        .map_err(|error| ConnectorError::fatal(error.to_string()))?,
                );
            }
        }
        info!(connector_key = %self.key, endpoint = %self.url, protocol = ?self.config.protocol, "otlp sink ready");
        Ok(())
    }

    async fn write(&self, _topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let mut groups: [Vec<(usize, Request, usize)>; 3] = Default::default();
        let mut undecodable = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match self.decode(message) {
                Ok((request, size)) => {
                    let group = match request.signal() {
                        SignalName::Logs => 0,
                        SignalName::Traces => 1,
                        SignalName::Metrics => 2,
                    };
                    groups[group].push((index, request, size));
                }
                Err(reason) => undecodable.push(Rejection { index, reason }),
            }
        }
        // Nothing is sent before the engine has set these aside.
        if !undecodable.is_empty() {
            return Err(SinkError::Rejected(undecodable));
        }
        let mut outcome = Outcome::default();
        for group in groups {
            if !group.is_empty() && !outcome.stopped() {
                self.send_group(group, &mut outcome).await;
            }
        }
        outcome.into_result()
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.http = None;
        self.grpc = None;
        Ok(())
    }
}
