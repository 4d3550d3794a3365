//! `http` sink: delivers messages to an HTTP endpoint (webhooks, REST APIs),
//! one request per message (`individual`, `raw`) or per batch (`ndjson`,
//! `json_array`).
//!
//! Delivery: `write` returns `Ok` only once every message of the batch got a
//! success status, so the engine commits offsets only then. Network errors,
//! 408, 429 and 5xx are retried inside `write` up to `max_retries` times per
//! request with capped exponential backoff and jitter, or after the
//! `Retry-After` the endpoint asked for. Past that, `write` returns `Transient`
//! and the engine backs off and calls `write` again with the same batch: a
//! batch is never dropped, however long the endpoint is down. Messages a failed
//! `write` had already delivered are skipped on that retry, so an outage costs
//! as few duplicates as possible. Any other status is a refusal: `Rejected`
//! with every message of the refused request, handled by the sink's
//! `on_error` (stop, skip or dlq).
//!
//! After `circuit_breaker_threshold` consecutive failed attempts the breaker
//! opens: for `circuit_breaker_cool_down` `write` fails fast without calling
//! the endpoint, the sink reports itself degraded and the gauge
//! `iggy_connector_circuit_breaker_open{connector_key}` is 1. Then one probe
//! request is let through; its success closes the breaker.

mod body;
mod config;

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use tracing::{debug, info, warn};

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::kit::breaker::{CircuitBreaker, Transition};
use crate::connectors::kit::http::{
    self, ClientOptions, HttpClient, StatusClass, classify, error_chain,
};
use crate::connectors::{SinkEntry, schema_of};
use crate::connectors::{
    ConnectorContext, ConnectorError, Degraded, PluginConfigError, Rejection, Sink, SinkError,
    parse_plugin_config,
};
use crate::message::{SinkMessage, TopicRef};

pub use config::{BatchMode, HttpMethod, HttpSinkConfig};

use body::{BodyOptions, Part, Planner};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "http",
    feature: "http-sink",
    description: "delivers messages to an HTTP endpoint with retries and a circuit breaker",
    secret_fields: &["headers.*"],
    sample_config: "url = \"http://localhost:8080/ingest\"\nbatch_mode = \"ndjson\"\n\n[headers]\nAuthorization = \"Bearer secret-token\"\n",
    config_schema: schema_of::<HttpSinkConfig>,
    build: |config| Ok(Box::new(HttpSink::new(parse_plugin_config(config)?)?)),
};

/// How much of a refusal's body goes into the rejection reason.
const REASON_BODY_CHARS: usize = 256;
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
    retry: Backoff,
    client: Option<HttpClient>,
    breaker: CircuitBreaker,
    /// No request goes out before this (a `Retry-After` outliving `write`).
    not_before: Mutex<Option<Instant>>,
    /// Per (topic, partition): the last offset a failed `write` had delivered,
    /// skipped when the engine retries that batch.
    resume: Mutex<HashMap<(TopicRef, u32), u64>>,
    key: String,
    degraded: Degraded,
    is_degraded: AtomicBool,
}

/// How one request ended, after its retries.
enum Delivery {
    Delivered,
    Refused(String),
    Failed(String),
}

/// How one attempt ended.
enum Attempt {
    Success,
    Refused(String),
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
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
        let retry = Backoff {
            initial: config.retry_delay,
            max: config.max_retry_delay,
            multiplier: config.retry_backoff_multiplier,
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
            retry,
            client: None,
            breaker,
            not_before: Mutex::new(None),
            resume: Mutex::new(HashMap::new()),
            key: "http".into(),
            degraded: Degraded::default(),
            is_degraded: AtomicBool::new(false),
            config,
        })
    }

    /// Whether the sink currently considers its endpoint unusable.
    pub fn is_degraded(&self) -> bool {
        self.is_degraded.load(Ordering::Relaxed)
    }

    /// Sends one request body, retrying transient failures.
    async fn deliver(&self, client: &HttpClient, body: Bytes, messages: usize) -> Delivery {
        let mut retries = 0;
        loop {
            self.wait_until_allowed().await;
            if !self.breaker.allow() {
                return Delivery::Failed(format!(
                    "circuit breaker open: not calling {} for up to {} after {} consecutive failures",
                    self.display_url,
                    humantime::format_duration(self.config.circuit_breaker_cool_down),
                    self.config.circuit_breaker_threshold
                ));
            }
            let started = Instant::now();
            let attempt = self.attempt(client, body.clone()).await;
            if self.config.verbose_logging {
                debug!(connector_key = %self.key, url = %self.display_url, messages, bytes = body.len(), elapsed_ms = started.elapsed().as_millis() as u64, retries, "request finished");
            }
            let (reason, retry_after) = match attempt {
                Attempt::Success => {
                    self.on_success();
                    return Delivery::Delivered;
                }
                Attempt::Refused(reason) => {
                    // The endpoint answered: it is up, whatever it thinks of this request.
                    self.on_success();
                    return Delivery::Refused(reason);
                }
                Attempt::Retryable {
                    reason,
                    retry_after,
                } => (reason, retry_after),
            };
            self.on_failure(&reason);
            retries += 1;
            if retries > self.config.max_retries {
                if let Some(wait) = retry_after {
                    *lock(&self.not_before) = Some(Instant::now() + wait);
                }
                return Delivery::Failed(format!(
                    "{reason} (gave up after {retries} attempts; the batch will be retried)"
                ));
            }
            let delay = retry_after.unwrap_or_else(|| self.retry.delay(retries));
            warn!(connector_key = %self.key, url = %self.display_url, retry = retries, max_retries = self.config.max_retries, retry_in_ms = delay.as_millis() as u64, error = %reason, "request failed, retrying");
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(&self, client: &HttpClient, body: Bytes) -> Attempt {
        let sent = client
            .request(self.config.method.into(), self.url.clone(), body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                let error = error.without_url();
                let reason = if error.is_timeout() {
                    format!(
                        "request to {} timed out after {}",
                        self.display_url,
                        humantime::format_duration(self.config.timeout)
                    )
                } else {
                    format!(
                        "request to {} failed: {}",
                        self.display_url,
                        error_chain(&error)
                    )
                };
                return Attempt::Retryable {
                    reason,
                    retry_after: None,
                };
            }
        };
        let status = response.status().as_u16();
        let retry_after = http::retry_after(response.headers(), SystemTime::now());
        let answer = read_some(response).await;
        if self.config.is_success(status) {
            return Attempt::Success;
        }
        let reason = if answer.is_empty() {
            format!("{} answered {status}", self.display_url)
        } else {
            format!("{} answered {status}: {answer}", self.display_url)
        };
        match classify(status) {
            StatusClass::Transient => Attempt::Retryable {
                reason,
                retry_after,
            },
            StatusClass::Permanent => Attempt::Refused(reason),
        }
    }

    async fn wait_until_allowed(&self) {
        let not_before = *lock(&self.not_before);
        if let Some(instant) = not_before {
            tokio::time::sleep_until(instant.into()).await;
        }
    }

    fn on_success(&self) {
        if self.breaker.record_success() == Some(Transition::Closed) {
            info!(connector_key = %self.key, url = %self.display_url, "circuit breaker closed: the endpoint answers again");
        }
        if self.is_degraded.swap(false, Ordering::Relaxed) {
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
            self.mark_degraded(message);
        }
    }

    fn mark_degraded(&self, reason: String) {
        self.degraded.set(reason);
        self.is_degraded.store(true, Ordering::Relaxed);
        self.breaker_gauge(self.breaker.is_open());
    }

    fn breaker_gauge(&self, open: bool) {
        metrics::gauge!("iggy_connector_circuit_breaker_open", "connector_key" => self.key.clone())
            .set(if open { 1.0 } else { 0.0 });
    }

    /// Indexes of the messages a previous failed `write` of this batch had not
    /// delivered yet.
    fn pending(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Vec<usize> {
        let resume = lock(&self.resume);
        (0..messages.len())
            .filter(|index| {
                let message = &messages[*index];
                resume
                    .get(&(topic.clone(), message.partition_id))
                    .is_none_or(|delivered| message.offset > *delivered)
            })
            .collect()
    }

    fn remember(&self, topic: &TopicRef, delivered: &HashMap<u32, u64>) {
        let mut resume = lock(&self.resume);
        for (partition_id, offset) in delivered {
            let last = resume
                .entry((topic.clone(), *partition_id))
                .or_insert(*offset);
            *last = (*last).max(*offset);
        }
    }

    fn forget(&self, topic: &TopicRef, messages: &[SinkMessage]) {
        let mut resume = lock(&self.resume);
        if resume.is_empty() {
            return;
        }
        for message in messages {
            resume.remove(&(topic.clone(), message.partition_id));
        }
    }

    fn build_client(&self) -> Result<HttpClient, ConnectorError> {
        HttpClient::new(&self.client_options)
            .map_err(|error| ConnectorError::fatal(error.to_string()))
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

    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.config.tls_danger_accept_invalid_certs {
            warn!(connector_key = %self.key, "tls_danger_accept_invalid_certs is on: TLS certificates are NOT verified");
        }
        let client = self.build_client()?;
        self.breaker_gauge(false);
        if self.config.health_check_enabled {
            let probe = client
                .empty(self.config.health_check_method.into(), self.url.clone())
                .send()
                .await;
            let problem = match probe {
                Ok(response)
                    if response.status().is_success()
                        || self.config.is_success(response.status().as_u16()) =>
                {
                    None
                }
                Ok(response) => Some(format!("answered {}", response.status().as_u16())),
                Err(error) => Some(error_chain(&error.without_url())),
            };
            if let Some(problem) = problem {
                let message = format!("health check of {} failed: {problem}", self.display_url);
                warn!(connector_key = %self.key, "{message}; starting anyway, writes will retry");
                self.degraded.set(message);
                self.is_degraded.store(true, Ordering::Relaxed);
            }
        }
        info!(connector_key = %self.key, url = %self.display_url, batch_mode = ?self.config.batch_mode, "http sink open");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the http sink was not opened"))?;
        let pending = self.pending(topic, messages);
        let mut delivered: HashMap<u32, u64> = HashMap::new();
        for part in Planner::new(&self.body_options, topic, messages, &pending) {
            let (body, indexes) = match part {
                Part::Request { body, indexes } => (body, indexes),
                Part::TooLarge { index, size } => {
                    self.remember(topic, &delivered);
                    return Err(SinkError::Rejected(vec![Rejection {
                        index,
                        reason: format!(
                            "the message makes a {size}-byte request body, more than max_payload_size_bytes ({})",
                            self.config.max_payload_size_bytes
                        ),
                    }]));
                }
            };
            match self.deliver(client, body, indexes.len()).await {
                Delivery::Delivered => {
                    for index in indexes {
                        let message = &messages[index];
                        let last = delivered
                            .entry(message.partition_id)
                            .or_insert(message.offset);
                        *last = (*last).max(message.offset);
                    }
                }
                Delivery::Refused(reason) => {
                    self.remember(topic, &delivered);
                    return Err(SinkError::Rejected(
                        indexes
                            .into_iter()
                            .map(|index| Rejection {
                                index,
                                reason: reason.clone(),
                            })
                            .collect(),
                    ));
                }
                Delivery::Failed(reason) => {
                    self.remember(topic, &delivered);
                    return Err(SinkError::transient(reason));
                }
            }
        }
        self.forget(topic, messages);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        self.degraded.clear();
        self.breaker_gauge(false);
        Ok(())
    }
}

/// Reads up to `MAX_RESPONSE_BYTES` of a response (letting its connection go
/// back to the pool) and returns the start of it as text for error messages.
async fn read_some(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_RESPONSE_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&body)
        .chars()
        .take(REASON_BODY_CHARS)
        .map(|character| {
            if character.is_control() {
                ' '
            } else {
                character
            }
        })
        .collect::<String>()
        .trim()
        .to_owned()
}

