//! `otlp` source: an OpenTelemetry (OTLP) receiver. Exporters (SDKs, the
//! OpenTelemetry Collector) send logs, traces and metrics over OTLP/gRPC and
//! OTLP/HTTP (protobuf or JSON, gzip or not); each signal goes to its own
//! `[[streams]]` entry, every message a complete export request (OTLP/JSON or
//! the protobuf, see `format` and `split`).
//!
//! With the default `ack = "durable"` an exporter hears success only once the
//! batch holding its records is committed in Iggy; until then, and when the
//! broker does not take it within `request_timeout`, it gets the answers the
//! OTLP spec makes retryable (HTTP 503 / 429 with `Retry-After`, gRPC
//! UNAVAILABLE / RESOURCE_EXHAUSTED with `RetryInfo`), so it sends again:
//! at-least-once. Message ids are derived from each message's content and
//! position, so a retried request carries the same ids (Iggy's deduplication,
//! where enabled, drops the repeat). Records that cannot be stored (one larger
//! than `max_message_bytes`) are counted in the answer's partial success.
//!
//! The source keeps no state: what it accepted lives in its exporters until
//! they hear success.

mod config;
mod grpc;
mod http;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::ExposeSecret;
use subtle::ConstantTimeEq;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::connectors::kit::inbox::{Delivery, Inbox, Limits, SubmitError};
use crate::connectors::otlp::{Encoding, SIGNAL_HEADER, Signal, encode};
use crate::connectors::{
    BatchPolicy, ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch,
    parse_plugin_config,
};
use crate::connectors::{SourceEntry, schema_of};
use crate::message::{HeaderValue, Payload, SourceRecord};

pub use config::{AckMode, Format, OtlpSourceConfig, Protocol, Split};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "otlp",
    feature: "otlp-source",
    description: "an OpenTelemetry (OTLP gRPC and HTTP) receiver for logs, traces and metrics, answering once durable",
    secret_fields: &["token"],
    sample_config: "grpc_address = \"127.0.0.1:4317\"\nhttp_address = \"127.0.0.1:4318\"\nformat = \"json\"\ntoken = \"secret-token\"\n",
    config_schema: schema_of::<OtlpSourceConfig>,
    build: |config| Ok(Box::new(OtlpSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// How long `close` waits for the listeners to finish open requests.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct OtlpSource {
    config: Arc<OtlpSourceConfig>,
    inbox: Arc<Inbox>,
    key: String,
    streams: Option<usize>,
    listeners: Vec<Listener>,
    stop: CancellationToken,
}

struct Listener {
    protocol: Protocol,
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl OtlpSource {
    pub fn new(config: OtlpSourceConfig) -> Result<Self, PluginConfigError> {
        config.validate()?;
        config.signal_streams(None)?;
        let inbox = Arc::new(Inbox::new(Limits {
            batch_length: config.batch_length,
            linger_time: config.linger_time,
            max_waiting_messages: config.max_waiting_messages,
            unhealthy_after: config.unhealthy_after,
        }));
        Ok(Self {
            config: Arc::new(config),
            inbox,
            key: String::new(),
            streams: None,
            listeners: Vec::new(),
            stop: CancellationToken::new(),
        })
    }

    /// The address a receiver is bound to, once open.
    pub fn local_addr(&self, protocol: Protocol) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|listener| listener.protocol == protocol)
            .map(|listener| listener.address)
    }
}

#[async_trait]
impl Source for OtlpSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if state.is_some() {
            debug!(connector_key = %self.key, "the otlp source keeps no state; ignoring the stored one");
        }
        let streams = self
            .config
            .signal_streams(self.streams)
            .map_err(|error| ConnectorError::fatal(format!("plugin_config.{error}")))?;
        let shared = Arc::new(Shared {
            config: self.config.clone(),
            inbox: self.inbox.clone(),
            key: self.key.clone(),
            streams,
            token_digest: self
                .config
                .token
                .as_ref()
                .map(|token| *blake3::hash(token.expose_secret().as_bytes()).as_bytes()),
        });
        for protocol in self.config.protocols.clone() {
            let address = match protocol {
                Protocol::Grpc => &self.config.grpc_address,
                Protocol::Http => &self.config.http_address,
            };
            let listener = tokio::net::TcpListener::bind(address.as_str())
                .await
                .map_err(|error| {
                    ConnectorError::fatal(format!("cannot listen on {address}: {error}"))
                })?;
            let address = listener.local_addr().map_err(|error| {
                ConnectorError::fatal(format!("cannot read the listener's address: {error}"))
            })?;
            let stop = self.stop.clone();
            let shared = shared.clone();
            let serving: Pin<Box<dyn Future<Output = Result<(), String>> + Send>> = match protocol {
                Protocol::Grpc => Box::pin(async move {
                    grpc::serve(shared, listener, stop)
                        .await
                        .map_err(|error| error.to_string())
                }),
                Protocol::Http => Box::pin(async move {
                    http::serve(shared, listener, stop)
                        .await
                        .map_err(|error| error.to_string())
                }),
            };
            let key = self.key.clone();
            let task = tokio::spawn(async move {
                if let Err(error) = serving.await {
                    warn!(connector_key = %key, ?protocol, %error, "an otlp source listener failed");
                }
            });
            info!(connector_key = %self.key, ?protocol, %address, ack = ?self.config.ack, "otlp source listening");
            self.listeners.push(Listener {
                protocol,
                address,
                task,
            });
        }
        let served: Vec<&str> = ["logs", "traces", "metrics"]
            .into_iter()
            .zip(streams)
            .filter_map(|(signal, stream)| stream.map(|_| signal))
            .collect();
        info!(connector_key = %self.key, signals = ?served, "otlp source receiving");
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let records = self.inbox.next_batch().await;
        Ok(SourceBatch {
            records,
            state: None,
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let answered = self.inbox.commit();
        debug!(connector_key = %self.key, answered, "batch committed, exporters answered");
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        crate::config::connector::MAX_IN_FLIGHT as usize
    }

    /// What it accepted lives in its exporters (durable acks): stopping on a
    /// broker outage would only turn the outage into refused exports.
    fn batch_policy(&self) -> BatchPolicy {
        BatchPolicy::never_stop()
    }

    fn destructive(&self) -> bool {
        self.config.ack == AckMode::Durable
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
        if !context.streams.is_empty() {
            self.streams = Some(context.streams.len());
        }
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        let (answered, dropped) = self.inbox.close();
        if dropped > 0 {
            warn!(connector_key = %self.key, messages = dropped, "closing with messages already acknowledged (ack = \"accepted\") and not yet in Iggy: they are lost");
        }
        self.stop.cancel();
        for mut listener in std::mem::take(&mut self.listeners) {
            if tokio::time::timeout(CLOSE_TIMEOUT, &mut listener.task)
                .await
                .is_err()
            {
                warn!(connector_key = %self.key, protocol = ?listener.protocol, "open requests did not finish in time; closing them");
                listener.task.abort();
            }
        }
        info!(connector_key = %self.key, answered, "otlp source closed");
        Ok(())
    }
}

impl Drop for OtlpSource {
    /// A source dropped without `close` must still answer its exporters and
    /// free its ports.
    fn drop(&mut self) {
        if !self.listeners.is_empty() {
            self.inbox.close();
            self.stop.cancel();
            for listener in &self.listeners {
                listener.task.abort();
            }
        }
    }
}

/// What both receivers share.
pub(super) struct Shared {
    config: Arc<OtlpSourceConfig>,
    inbox: Arc<Inbox>,
    key: String,
    /// The `[[streams]]` entry of logs, traces and metrics.
    streams: [Option<usize>; 3],
    /// BLAKE3 of the token: fixed-size digests compare in constant time.
    token_digest: Option<[u8; 32]>,
}

/// Why an export was not (wholly) taken, as both protocols tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    Unauthorized,
    /// Not decodable or not allowed: sending it again changes nothing.
    BadRequest(String),
    TooLarge(String),
    /// This signal has no `[[streams]]` entry.
    NotReceived(&'static str),
    /// The broker did not take it in time, or the source is stopping: retry.
    Unavailable(String),
    /// Too much is waiting already: retry later.
    Exhausted(String),
}

impl Shared {
    fn stream_of<S: Signal>(&self) -> Option<usize> {
        match S::NAME {
            "logs" => self.streams[0],
            "traces" => self.streams[1],
            _ => self.streams[2],
        }
    }

    /// Whether `authorization` (an `Authorization` header's value) carries the
    /// token, when one is required.
    fn authorized(&self, authorization: Option<&[u8]>) -> bool {
        let Some(expected) = &self.token_digest else {
            return true;
        };
        let Some(value) = authorization.and_then(|value| std::str::from_utf8(value).ok()) else {
            return false;
        };
        let Some((scheme, token)) = value.split_once(' ') else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        blake3::hash(token.trim().as_bytes())
            .as_bytes()
            .ct_eq(expected)
            .into()
    }

    fn retry_after(&self) -> Duration {
        Duration::from_secs(self.config.retry_after_secs())
    }

    /// Stores one export request: split into messages, queued, and (with
    /// `ack = "durable"`) answered once they are in Iggy.
    async fn export<S: Signal>(&self, request: S) -> Result<S::Response, Refusal> {
        let Some(stream_index) = self.stream_of::<S>() else {
            return Err(Refusal::NotReceived(S::NAME));
        };
        let (records, rejected) = self.records(request, stream_index);
        let message = if rejected > 0 {
            format!(
                "{rejected} {} are each larger than max_message_bytes ({}) once encoded",
                S::ITEM,
                self.config.max_message_bytes
            )
        } else {
            String::new()
        };
        count(&self.key, S::NAME, "rejected", rejected);
        if records.is_empty() {
            return Ok(S::response(rejected as i64, message));
        }
        let messages = records.len();
        match self.config.ack {
            AckMode::Accepted => match self.inbox.submit(records, None) {
                Ok(_) => {}
                Err(refusal) => return Err(self.refused(refusal)),
            },
            AckMode::Durable => self.wait_for_commit(records).await?,
        }
        count(&self.key, S::NAME, "stored", messages);
        Ok(S::response(rejected as i64, message))
    }

    /// The request as messages, and how many of its items were refused.
    fn records<S: Signal>(&self, request: S, stream_index: usize) -> (Vec<SourceRecord>, usize) {
        let encoding = match self.config.format {
            Format::Json => Encoding::Json,
            Format::Raw => Encoding::Protobuf,
        };
        let limit = self.config.max_message_bytes;
        let mut rejected = 0;
        let mut encoded = Vec::new();
        for part in request.split(self.config.split == Split::Record) {
            let bytes = encode(encoding, &part);
            if bytes.len() <= limit {
                encoded.push(bytes);
                continue;
            }
            // A scope batch too large as one message is stored record by record.
            for record in part.split(true) {
                let bytes = encode(encoding, &record);
                if bytes.len() <= limit {
                    encoded.push(bytes);
                } else {
                    rejected += record.items();
                }
            }
        }
        let records = encoded
            .into_iter()
            .enumerate()
            .map(|(index, bytes)| SourceRecord {
                id: Some(message_id(S::NAME, &bytes, index)),
                stream_index,
                headers: vec![(SIGNAL_HEADER.into(), HeaderValue::from(S::NAME))],
                payload: match encoding {
                    Encoding::Json => Payload::JsonBytes(bytes.into()),
                    Encoding::Protobuf => Payload::Raw(bytes.into()),
                },
                partition: None,
                origin_timestamp: None,
            })
            .collect();
        (records, rejected)
    }

    async fn wait_for_commit(&self, records: Vec<SourceRecord>) -> Result<(), Refusal> {
        match self
            .inbox
            .deliver(records, self.config.request_timeout)
            .await
        {
            Delivery::Committed => Ok(()),
            Delivery::Refused(refusal) => Err(self.refused(refusal)),
            Delivery::NotCommitted { closing: true, .. } => {
                Err(Refusal::Unavailable("the receiver is stopping".into()))
            }
            Delivery::NotCommitted {
                maybe_delivered, ..
            } => Err(Refusal::Unavailable(if maybe_delivered {
                "the records were in a batch the broker has not acknowledged yet; a retry may duplicate them".into()
            } else {
                "the broker did not take the records in time; they were not stored".into()
            })),
        }
    }

    fn refused(&self, refusal: SubmitError) -> Refusal {
        match refusal {
            SubmitError::Closed => Refusal::Unavailable("the receiver is stopping".into()),
            SubmitError::Full { .. } => Refusal::Exhausted(refusal.to_string()),
        }
    }
}

/// The id of the `index`th message of a request: the same request sent again
/// (an exporter's retry) gets the same ids.
pub fn message_id(signal: &str, bytes: &[u8], index: usize) -> u128 {
    let mut hasher = blake3::Hasher::new_derive_key("iggy-connect otlp source message id v1");
    hasher.update(signal.as_bytes());
    hasher.update(&(index as u64).to_le_bytes());
    hasher.update(bytes);
    let digest = hasher.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest.as_bytes()[..16]);
    u128::from_le_bytes(id)
}

fn count(key: &str, signal: &'static str, outcome: &'static str, value: usize) {
    if value > 0 {
        metrics::counter!(
            "iggy_connector_otlp_source_items_total",
            "connector_key" => key.to_owned(),
            "signal" => signal,
            "outcome" => outcome
        )
        .increment(value as u64);
    }
}
