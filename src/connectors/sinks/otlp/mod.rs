//! `otlp` sink: exports OTLP records stored in Iggy (complete export
//! requests, OTLP/JSON or protobuf, as the otlp source stores them) to an
//! OpenTelemetry collector over OTLP/gRPC or OTLP/HTTP (protobuf or JSON).
//!
//! Delivery: messages of one signal are merged into export requests (up to
//! `max_batch_messages` and `max_batch_bytes`); `write` returns `Ok` only
//! once the collector answered success for every one, so the engine commits
//! offsets only then. The answers the OTLP spec makes retryable (HTTP 429,
//! 502, 503, 504; gRPC UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED,
//! OUT_OF_RANGE, DATA_LOSS, and RESOURCE_EXHAUSTED with `RetryInfo`),
//! connection errors and timeouts are retried inside `write` up to
//! `max_retries` times, after the `Retry-After` / `RetryInfo` the collector
//! asked for or with capped backoff; then `write` returns `Transient` and the
//! engine retries the batch later. Bad credentials (401/403,
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

use std::time::Duration;

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

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::kit::http::{self, Auth, ClientOptions, HttpClient, MAX_RETRY_AFTER, error_chain};
use crate::connectors::otlp::{self as otlp, Encoding, SIGNAL_HEADER, Signal};
use crate::connectors::{SinkEntry, schema_of};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, Sink, SinkError,
    parse_plugin_config,
};
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

const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub struct OtlpSink {
    config: OtlpSinkConfig,
    url: reqwest::Url,
    retry: Backoff,
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

/// How one export ended.
enum Answer {
    Success,
    /// Refused for good (the request itself).
    Refused(String),
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Nothing will go through (credentials, endpoint).
    Fatal(String),
}

/// How one export ended after its retries.
enum Delivery {
    Delivered,
    Refused(String),
    Failed(String),
    Fatal(String),
}

impl OtlpSink {
    pub fn new(config: OtlpSinkConfig) -> Result<Self, PluginConfigError> {
        let url = config.validate()?;
        let mut metadata = MetadataMap::new();
        for (name, value) in &config.headers {
            let key = MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| {
                PluginConfigError::new(format!("headers.{name}"), "not a valid gRPC metadata key")
            })?;
            let value = MetadataValue::try_from(value.expose_secret()).map_err(|_| {
                PluginConfigError::new(format!("headers.{name}"), "holds characters a header cannot carry")
            })?;
            metadata.insert(key, value);
        }
        if let Some(token) = &config.token {
            let value = MetadataValue::try_from(format!("Bearer {}", token.expose_secret()))
                .map_err(|_| PluginConfigError::new("token", "holds characters a header cannot carry"))?;
            metadata.insert("authorization", value);
        }
        Ok(Self {
            retry: Backoff {
                initial: config.retry_delay,
                max: config.max_retry_delay,
                multiplier: 2.0,
            },
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
        let signal = match message.headers.iter().find(|(name, _)| name == SIGNAL_HEADER) {
            Some((_, UserHeader::String(name))) => SignalName::parse(name)
                .ok_or_else(|| format!("the {SIGNAL_HEADER} header names no OTLP signal: \"{name}\""))?,
            Some((_, other)) => {
                return Err(format!("the {SIGNAL_HEADER} header names no OTLP signal: {other}"));
            }
            None => self.config.signal.ok_or_else(|| {
                format!("the message has no {SIGNAL_HEADER} header and plugin_config.signal is not set")
            })?,
        };
        let bytes: Bytes = match &message.payload {
            Payload::Json(value) => serde_json::to_vec(value).unwrap_or_default().into(),
            Payload::Text(text) => Bytes::copy_from_slice(text.as_bytes()),
            Payload::JsonBytes(bytes) | Payload::Raw(bytes) => bytes.clone(),
        };
        let encoding = Encoding::sniff(&bytes);
        let request = match signal {
            SignalName::Logs => Request::Logs(otlp::decode(encoding, &bytes).map_err(|e| e.to_string())?),
            SignalName::Traces => Request::Traces(otlp::decode(encoding, &bytes).map_err(|e| e.to_string())?),
            SignalName::Metrics => Request::Metrics(otlp::decode(encoding, &bytes).map_err(|e| e.to_string())?),
        };
        // What it weighs on the wire: JSON about twice its protobuf.
        let size = match (self.wire_encoding(), encoding) {
            (Encoding::Json, Encoding::Json) => bytes.len(),
            (Encoding::Json, Encoding::Protobuf) => request.encoded_len() * 2,
            (Encoding::Protobuf, _) => request.encoded_len(),
        };
        Ok((request, size))
    }

    /// Sends one export request, retrying retryable answers.
    async fn deliver(&self, request: &Request) -> Delivery {
        let mut retries = 0;
        loop {
            let answer = each!(request, request => self.export(request).await);
            let (reason, retry_after) = match answer {
                Answer::Success => return Delivery::Delivered,
                Answer::Refused(reason) => return Delivery::Refused(reason),
                Answer::Fatal(reason) => return Delivery::Fatal(reason),
                Answer::Retryable { reason, retry_after } => (reason, retry_after),
            };
            if retries >= self.config.max_retries {
                return Delivery::Failed(format!("{reason} (after {retries} retries)"));
            }
            let wait = retry_after
                .map(|wait| wait.min(MAX_RETRY_AFTER))
                .unwrap_or_else(|| self.retry.delay(retries));
            debug!(connector_key = %self.key, %reason, wait_ms = wait.as_millis() as u64, "export failed; retrying");
            metrics::counter!("iggy_connector_otlp_sink_retries_total", "connector_key" => self.key.clone()).increment(1);
            tokio::time::sleep(wait).await;
            retries += 1;
        }
    }

    async fn export<S: GrpcSignal>(&self, request: &S) -> Answer {
        let answer = match self.config.protocol {
            Protocol::Grpc => self.export_grpc(request).await,
            Protocol::HttpProtobuf | Protocol::HttpJson => self.export_http(request).await,
        };
        match answer {
            Ok(Some((rejected, message))) if rejected > 0 => {
                warn!(connector_key = %self.key, signal = S::NAME, rejected, %message, "the collector accepted the export but rejected some {} (final, by the OTLP spec)", S::ITEM);
                metrics::counter!("iggy_connector_otlp_sink_partially_rejected_total", "connector_key" => self.key.clone(), "signal" => S::NAME).increment(rejected as u64);
                Answer::Success
            }
            Ok(_) => Answer::Success,
            Err(answer) => answer,
        }
    }

    async fn export_grpc<S: GrpcSignal>(&self, request: &S) -> Result<Option<(i64, String)>, Answer> {
        let Some(channel) = self.grpc.clone() else {
            return Err(Answer::Fatal("the sink is not open".into()));
        };
        let mut call = tonic::Request::new(request.clone());
        *call.metadata_mut() = self.metadata.clone();
        call.set_timeout(self.config.timeout);
        let gzip = self.config.compression == Compression::Gzip;
        match S::call(channel, call, gzip).await {
            Ok(response) => Ok(S::rejected(response.get_ref())),
            Err(status) => Err(grpc_answer(&status)),
        }
    }

    async fn export_http<S: Signal>(&self, request: &S) -> Result<Option<(i64, String)>, Answer> {
        let Some(client) = &self.http else {
            return Err(Answer::Fatal("the sink is not open".into()));
        };
        let encoding = self.wire_encoding();
        let mut url = self.url.clone();
        let path = format!("{}/v1/{}", url.path().trim_end_matches('/'), S::NAME);
        url.set_path(&path);
        let body = Bytes::from(otlp::encode(encoding, request));
        let response = client
            .request(reqwest::Method::POST, url.clone(), body)
            .header(CONTENT_TYPE, encoding.content_type())
            .send()
            .await
            .map_err(|error| Answer::Retryable {
                reason: format!("cannot export to {url}: {}", error_chain(&error)),
                retry_after: None,
            })?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            let body = response.bytes().await.unwrap_or_default();
            let answer: Option<S::Response> = match Encoding::sniff(&body) {
                _ if body.is_empty() => None,
                Encoding::Json => serde_json::from_slice(&body).ok(),
                Encoding::Protobuf => S::Response::decode(body).ok(),
            };
            return Ok(answer.as_ref().and_then(S::rejected));
        }
        let retry_after = http::retry_after(response.headers(), std::time::SystemTime::now());
        let body = http::read_text(response, MAX_RESPONSE_BYTES).await;
        let reason = format!("{url} answered {status}: {}", status_message(&body));
        Err(match status {
            429 | 502 | 503 | 504 => Answer::Retryable { reason, retry_after },
            401 | 403 => Answer::Fatal(format!("{reason}; check plugin_config.token and plugin_config.headers")),
            404 => Answer::Fatal(format!("{reason}; check plugin_config.endpoint (OTLP/HTTP paths are /v1/logs, /v1/traces, /v1/metrics under it)")),
            _ => Answer::Refused(reason),
        })
    }

    /// Sends the messages of one signal, merged into requests as large as
    /// allowed; returns the indexes refused.
    async fn send_group(&self, group: Vec<(usize, Request, usize)>) -> Result<Vec<Rejection>, SinkError> {
        let mut rejections = Vec::new();
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
            let rest: Vec<(usize, Request)> = items.map(|(index, request, _)| (index, request)).collect();
            let mut merged = first.clone();
            for (_, request) in &rest {
                merged.merge(request.clone());
            }
            match self.deliver(&merged).await {
                Delivery::Delivered => {}
                Delivery::Failed(reason) => return Err(SinkError::transient(reason)),
                Delivery::Fatal(reason) => return Err(SinkError::fatal(reason)),
                Delivery::Refused(reason) if rest.is_empty() => rejections.push(Rejection { index: first_index, reason }),
                Delivery::Refused(reason) => {
                    debug!(connector_key = %self.key, messages = rest.len() + 1, %reason, "export refused; sending its messages one at a time");
                    for (index, request) in std::iter::once((first_index, first)).chain(rest) {
                        match self.deliver(&request).await {
                            Delivery::Delivered => {}
                            Delivery::Refused(reason) => rejections.push(Rejection { index, reason }),
                            Delivery::Failed(reason) => return Err(SinkError::transient(reason)),
                            Delivery::Fatal(reason) => return Err(SinkError::fatal(reason)),
                        }
                    }
                }
            }
        }
        Ok(rejections)
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
fn grpc_answer(status: &Status) -> Answer {
    let reason = format!("the collector answered {:?}: {}", status.code(), status.message());
    let retry_after = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay);
    match status.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Answer::Retryable { reason, retry_after },
        Code::ResourceExhausted if retry_after.is_some() => Answer::Retryable { reason, retry_after },
        Code::Unauthenticated | Code::PermissionDenied => {
            Answer::Fatal(format!("{reason}; check plugin_config.token and plugin_config.headers"))
        }
        Code::Unimplemented => Answer::Fatal(format!(
            "{reason}; check plugin_config.endpoint and plugin_config.protocol"
        )),
        // A connection failure shows as Unknown with a transport error source.
        Code::Unknown if std::error::Error::source(status).is_some() => Answer::Retryable { reason, retry_after },
        _ => Answer::Refused(reason),
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

    async fn open(&mut self) -> Result<(), ConnectorError> {
        match self.config.protocol {
            Protocol::Grpc => {
                let endpoint = Endpoint::from_shared(self.config.endpoint.clone())
                    .map_err(|error| ConnectorError::fatal(format!("plugin_config.endpoint: {error}")))?
                    .connect_timeout(self.config.timeout)
                    .timeout(self.config.timeout);
                self.grpc = Some(endpoint.connect_lazy());
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                let mut headers = HeaderMap::new();
                for (name, value) in &self.config.headers {
                    let name = HeaderName::try_from(name.as_str()).map_err(|_| ConnectorError::fatal(format!("plugin_config.headers.{name}: not a valid header name")))?;
                    let mut value = HeaderValue::try_from(value.expose_secret()).map_err(|_| ConnectorError::fatal(format!("plugin_config.headers.{name}: holds characters a header cannot carry")))?;
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
                self.http = Some(HttpClient::new(&options).map_err(|error| ConnectorError::fatal(error.to_string()))?);
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
        let mut rejections = Vec::new();
        for group in groups {
            if !group.is_empty() {
                rejections.extend(self.send_group(group).await?);
            }
        }
        if rejections.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejections))
        }
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
