//! `http` sink: delivers messages to an HTTP endpoint (webhooks, REST APIs),
//! one request per message (`individual`, `raw`) or per batch (`ndjson`,
//! `json_array`).
//!
//! Delivery: `write` sends each request once and answers per message. `Ok`
//! means every message of the batch got a success status, so the engine
//! commits offsets only then. No answer, 408, 429 or 5xx ends the write as
//! transient (after the `Retry-After` the endpoint asked for), naming the
//! messages earlier requests of the batch delivered: the engine keeps those
//! durable and writes only the rest again, with the backoff of `retry_delay`,
//! `retry_backoff_multiplier` and `max_retry_delay`. A batch is never
//! dropped, however long the endpoint is down. Any other status refuses the
//! messages of that request (`on_error`: stop, skip or dlq); the batch's
//! other requests still go out.
//!
//! After `circuit_breaker_threshold` consecutive failed requests the breaker
//! opens: for `circuit_breaker_cool_down` `write` fails fast as transient
//! without calling the endpoint, the sink reports itself degraded and the
//! gauge `iggy_connector_circuit_breaker_open{connector_key}` is 1. Then one
//! probe request is let through; its success closes the breaker.

mod body;
mod config;

use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use tracing::{debug, info, warn};

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::kit::breaker::{CircuitBreaker, Transition};
use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, ClientOptions, HttpClient, StatusClass};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, Degraded, PluginConfigError, RetrySettings, Sink, SinkError,
    parse_plugin_config,
};
use crate::connectors::{SinkEntry, schema_of};
use crate::message::{SinkMessage, TopicRef};

pub use config::{BatchMode, HttpMethod, HttpSinkConfig};

use body::{BodyOptions, Part, Planner};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "http",
    feature: "http-sink",
    description: "delivers messages to an HTTP endpoint with a circuit breaker",
    secret_fields: &["headers.*"],
    sample_config: "url = \"http://localhost:8080/ingest\"\nbatch_mode = \"ndjson\"\n\n[headers]\nAuthorization = \"Bearer secret-token\"\n",
    config_schema: schema_of::<HttpSinkConfig>,
    build: |config| Ok(Box::new(HttpSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// Response bodies are read (so the connection can be reused) up to this much.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub struct HttpSink {
    config: HttpSinkConfig,
    url: reqwest::Url,
    /// The URL without credentials or query, for logs and errors.
    display_url: String,
    /// Headers (configured ones marked sensitive, the batch mode's
    /// Content-Type) and the connection pool.
    client_options: ClientOptions,
    body_options: BodyOptions,
    client: Option<HttpClient>,
    breaker: CircuitBreaker,
    key: String,
    degraded: Degraded,
}

impl HttpSink {
    pub fn new(config: HttpSinkConfig) -> Result<Self, PluginConfigError> {
        let (url, mut headers) = config.validate()?;
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static(config.batch_mode.content_type()),
            );
        }
        let body_options = BodyOptions {
            mode: config.batch_mode,
            include_metadata: config.include_metadata,
            include_checksum: config.include_checksum,
            include_origin_timestamp: config.include_origin_timestamp,
            max_body_bytes: match config.max_payload_size_bytes {
                0 => None,
                limit => Some(usize::try_from(limit).unwrap_or(usize::MAX)),
            },
        };
        let client_options = ClientOptions {
            timeout: config.timeout,
            accept_invalid_certs: config.tls_danger_accept_invalid_certs,
            headers,
            max_idle_per_host: config.max_connections,
            ..ClientOptions::default()
        };
        let breaker = CircuitBreaker::new(
            config.circuit_breaker_threshold,
            config.circuit_breaker_cool_down,
        );
        let display_url = format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or_default(),
            url.port()
                .map(|port| format!(":{port}"))
                .unwrap_or_default()
        ) + url.path();
        Ok(Self {
            display_url,
            url,
            client_options,
            body_options,
            client: None,
            breaker,
            key: "http".into(),
            degraded: Degraded::default(),
            config,
        })
    }

    /// Sends one request body once: `Ok` when the endpoint answered one of
    /// `success_status_codes`.
    async fn send(&self, client: &HttpClient, body: Bytes, messages: usize) -> Result<(), Failure> {
        if !self.breaker.allow() {
            return Err(Failure::transient(format!(
                "circuit breaker open: not calling {} for up to {} after {} consecutive failures",
                self.display_url,
                humantime::format_duration(self.config.circuit_breaker_cool_down),
                self.config.circuit_breaker_threshold
            )));
        }
        let started = Instant::now();
        let bytes = body.len();
        let request = client.request(self.config.method.into(), self.url.clone(), body);
        let outcome = http::exchange(request, &self.display_url, MAX_RESPONSE_BYTES)
            .await
            .and_then(|answer| {
                if self.config.is_success(answer.status) {
                    Ok(())
                } else {
                    Err(answer.failure(&self.display_url))
                }
            });
        if self.config.verbose_logging {
            debug!(connector_key = %self.key, url = %self.display_url, messages, bytes, elapsed_ms = started.elapsed().as_millis() as u64, outcome = ?outcome, "request finished");
        }
        match &outcome {
            Err(Failure::Transient { reason, .. }) => self.on_failure(reason),
            // The endpoint answered: it is up, whatever it thinks of this request.
            Ok(()) | Err(_) => self.on_success(),
        }
        outcome
    }

    fn on_success(&self) {
        if self.breaker.record_success() == Some(Transition::Closed) {
            info!(connector_key = %self.key, url = %self.display_url, "circuit breaker closed: the endpoint answers again");
            self.degraded.clear();
            self.breaker_gauge(false);
        }
    }

    fn on_failure(&self, reason: &str) {
        if self.breaker.record_failure() == Some(Transition::Opened) {
            let message = format!(
                "circuit breaker open after {} consecutive failures (cool-down {}); last: {reason}",
                self.config.circuit_breaker_threshold,
                humantime::format_duration(self.config.circuit_breaker_cool_down)
            );
            warn!(connector_key = %self.key, url = %self.display_url, "{message}");
            self.degraded.set(message);
            self.breaker_gauge(true);
        }
    }

    fn breaker_gauge(&self, open: bool) {
        metrics::gauge!("iggy_connector_circuit_breaker_open", "connector_key" => self.key.clone())
            .set(if open { 1.0 } else { 0.0 });
    }

    /// The `open` probe: a success, or why the sink cannot start yet
    /// (transient: the engine opens it again) or at all (fatal).
    async fn health_check(&self, client: &HttpClient) -> Result<(), ConnectorError> {
        let request = client.empty(self.config.health_check_method.into(), self.url.clone());
        let answer = http::exchange(request, &self.display_url, MAX_RESPONSE_BYTES)
            .await
            .map_err(|failure| {
                ConnectorError::transient(format!("health check: {}", failure.reason()))
            })?;
        if answer.is_success() || self.config.is_success(answer.status) {
            return Ok(());
        }
        let reason = format!("health check: {}", answer.reason(&self.display_url));
        Err(match answer.status {
            401 | 403 => ConnectorError::fatal(format!(
                "{reason}; check the credentials in plugin_config.headers"
            )),
            status if http::classify(status) == StatusClass::Transient => {
                ConnectorError::transient(reason)
            }
            _ => ConnectorError::fatal(format!(
                "{reason}; set plugin_config.health_check_method to a method the endpoint answers with success, or health_check_enabled = false"
            )),
        })
    }
}

#[async_trait]
impl Sink for HttpSink {
    /// JSON goes into the body as stored: nothing to parse and serialize again.
    fn accepts_json_bytes(&self) -> bool {
        true
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
        self.degraded = context.degraded;
    }

    /// Upstream's retry fields, as the engine's policy: it waits between
    /// writes of what is not delivered yet and reports the sink degraded
    /// after `max_retries` consecutive failed writes (it keeps retrying).
    fn retry(&self) -> Option<RetrySettings> {
        Some(RetrySettings {
            backoff: Backoff {
                initial: self.config.retry_delay,
                max: self.config.max_retry_delay,
                multiplier: self.config.retry_backoff_multiplier,
            },
            degraded_after: Some(self.config.max_retries),
        })
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.config.tls_danger_accept_invalid_certs {
            warn!(connector_key = %self.key, "tls_danger_accept_invalid_certs is on: TLS certificates are NOT verified");
        }
        let client = HttpClient::new(&self.client_options)
            .map_err(|error| ConnectorError::fatal(error.to_string()))?;
        if self.config.health_check_enabled {
            self.health_check(&client).await?;
        }
        self.breaker_gauge(false);
        info!(connector_key = %self.key, url = %self.display_url, batch_mode = ?self.config.batch_mode, "http sink open");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the http sink was not opened"))?;
        let mut outcome = Outcome::default();
        for part in Planner::new(&self.body_options, topic, messages) {
            let (body, indexes) = match part {
                Part::Request { body, indexes } => (body, indexes),
                Part::TooLarge { index, size } => {
                    outcome.reject(index, format!(
                        "the message makes a {size}-byte request body, more than max_payload_size_bytes ({})",
                        self.config.max_payload_size_bytes
                    ));
                    continue;
                }
            };
            match self.send(client, body, indexes.len()).await {
                Ok(()) => outcome.durable(indexes),
                Err(failure) => outcome.fail(failure, indexes),
            }
            if outcome.stopped() {
                break;
            }
        }
        outcome.into_result()
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        self.degraded.clear();
        self.breaker_gauge(false);
        Ok(())
    }
}
