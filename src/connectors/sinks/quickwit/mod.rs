//! `quickwit` sink: ingests messages as NDJSON documents into a Quickwit 0.8
//! index (`POST /api/v1/{index_id}/ingest?commit=...`).
//!
//! Delivery: `write` returns `Ok` once every ingest request of the batch was
//! answered 2xx: with `commit = "auto"` (the default) the documents are in
//! Quickwit's durable ingest queue, searchable after the index's
//! `commit_timeout_secs`; `wait_for` and `force` answer once they are
//! searchable. Quickwit has no document ids, so nothing makes a replay
//! idempotent: a batch sent again after a crash, or after a request whose
//! answer was lost, is stored twice (`id_field` lets queries find such
//! duplicates). Inside one process the requests of a batch already
//! acknowledged are not sent again when the engine retries it.
//!
//! Quickwit 0.8 acknowledges documents it later drops (a field a strict doc
//! mapping does not declare, a value of the wrong type), so those are checked
//! here first and rejected by index for `on_error`, as are payloads that are
//! not JSON objects. 429, 5xx and connection errors are retried; a request
//! refused as a whole (400, 413) rejects its documents; a missing index that
//! may not be created is fatal.

mod config;

use crate::sync::lock;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde_json::{Map, Value};
use tracing::{info, warn};

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::kit::batch::{Body, Framing, Limits, Push};
use crate::connectors::kit::http::{
    self, ClientOptions, HttpClient, StatusClass, classify, error_chain,
};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

pub use config::{CommitMode, QuickwitSinkConfig};
use config::IndexConfig;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "quickwit",
    feature: "quickwit-sink",
    description: "ingests JSON documents into a Quickwit index (NDJSON ingest API; no document ids: replays duplicate)",
    secret_fields: &[],
    sample_config: "url = \"http://localhost:7280\"\nindex = \"\"\"\nversion: 0.8\nindex_id: events\ndoc_mapping:\n  mode: dynamic\n\"\"\"\n",
    config_schema: schema_of::<QuickwitSinkConfig>,
    build: |config| {
        Ok(Box::new(QuickwitSink::new(parse_plugin_config(config)?)?))
    },
};

/// How much of an error body goes into a reason.
const REASON_CHARS: usize = 300;

pub struct QuickwitSink {
    config: QuickwitSinkConfig,
    index: IndexConfig,
    base: reqwest::Url,
    ingest_url: reqwest::Url,
    client_options: ClientOptions,
    retry: Backoff,
    client: Option<HttpClient>,
    /// Per topic: (partition, offset) of the messages of a batch that failed
    /// but were acknowledged: skipped when the engine writes it again.
    written: Mutex<HashMap<TopicRef, HashSet<(u32, u64)>>>,
    /// No request goes out before this (a `Retry-After` outliving `write`).
    not_before: Mutex<Option<Instant>>,
    key: String,
}

enum Failure {
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The request is refused for good (4xx).
    Refused(u16, String),
    Fatal(String),
}

impl QuickwitSink {
    pub fn new(config: QuickwitSinkConfig) -> Result<Self, PluginConfigError> {
        let (base, index) = config.validate()?;
        let mut ingest_url = base
            .join(&format!("api/v1/{}/ingest", index.index_id))
            .map_err(|error| PluginConfigError::new("url", error.to_string()))?;
        ingest_url
            .query_pairs_mut()
            .append_pair("commit", config.commit.as_str());
        let client_options = ClientOptions {
            timeout: config.timeout,
            ca_file: config.tls_ca_file.clone(),
            accept_invalid_certs: config.tls_danger_accept_invalid_certs,
            ..ClientOptions::default()
        };
        let retry = Backoff {
            initial: config.retry_delay,
            max: config.max_retry_delay,
            multiplier: 2.0,
        };
        Ok(Self {
            index,
            base,
            ingest_url,
            client_options,
            retry,
            client: None,
            written: Mutex::new(HashMap::new()),
            not_before: Mutex::new(None),
            key: "quickwit".into(),
            config,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, Failure> {
        self.base
            .join(path)
            .map_err(|error| Failure::Fatal(format!("{path}: {error}")))
    }

    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Bytes, Failure> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                let error = error.without_url();
                let reason = if error.is_timeout() {
                    format!(
                        "{what}: no answer within timeout ({}); the documents may be stored anyway",
                        crate::config::duration::format(self.config.timeout)
                    )
                } else {
                    format!("{what}: {}", error_chain(&error))
                };
                return Err(Failure::Transient {
                    reason,
                    retry_after: None,
                });
            }
        };
        let status = response.status().as_u16();
        let retry_after = http::retry_after(response.headers(), SystemTime::now());
        let body = response.bytes().await.unwrap_or_default();
        if (200..300).contains(&status) {
            return Ok(body);
        }
        let reason = format!("{what}: answered {status} {}", error_text(&body));
        Err(match status {
            401 | 403 => Failure::Fatal(format!(
                "{reason}; Quickwit itself has no auth: check what is in front of url ({})",
                self.base
            )),
            _ => match classify(status) {
                StatusClass::Transient => Failure::Transient {
                    reason,
                    retry_after,
                },
                StatusClass::Permanent => Failure::Refused(status, reason),
            },
        })
    }

    async fn ensure_index(&self, client: &HttpClient) -> Result<(), Failure> {
        let id = &self.index.index_id;
        let described = self
            .send(
                client.empty(
                    reqwest::Method::GET,
                    self.url(&format!("api/v1/indexes/{id}"))?,
                ),
                &format!("describing index {id}"),
            )
            .await;
        match described {
            Ok(_) => Ok(()),
            Err(Failure::Refused(404, _)) if self.config.create_index_if_not_exists => {
                let created = self
                    .send(
                        client
                            .request(
                                reqwest::Method::POST,
                                self.url("api/v1/indexes")?,
                                Bytes::from(self.config.index.clone()),
                            )
                            .header(CONTENT_TYPE, HeaderValue::from_static("application/yaml")),
                        &format!("creating index {id}"),
                    )
                    .await;
                match created {
                    Ok(_) => {
                        info!(connector_key = %self.key, index_id = %id, "index created");
                        Ok(())
                    }
                    Err(Failure::Refused(_, reason)) if reason.contains("already exist") => Ok(()),
                    Err(Failure::Refused(_, reason)) => Err(Failure::Fatal(format!(
                        "{reason}; Quickwit refuses the index config: fix index"
                    ))),
                    Err(failure) => Err(failure),
                }
            }
            Err(Failure::Refused(404, reason)) => Err(Failure::Fatal(format!(
                "{reason}; create the index or set create_index_if_not_exists = true"
            ))),
            Err(failure) => Err(failure),
        }
    }

    /// The NDJSON line of `message`, or why Quickwit would drop it.
    fn line(&self, message: &SinkMessage) -> Result<Vec<u8>, String> {
        let value = match &message.payload {
            Payload::Json(value) => value.clone(),
            Payload::JsonBytes(bytes) | Payload::Raw(bytes) => serde_json::from_slice(bytes)
                .map_err(|error| format!("a Quickwit document must be a JSON object; the payload is not JSON: {error}"))?,
            Payload::Text(_) => {
                return Err("a Quickwit document must be a JSON object; the payload is text".into());
            }
        };
        let Value::Object(mut document) = value else {
            return Err(format!(
                "a Quickwit document must be a JSON object, the payload is {}",
                kind(&value)
            ));
        };
        if let Some(field) = &self.config.id_field {
            document.insert(field.clone(), Value::String(format!("{:032x}", message.id)));
        }
        self.check_mapping(&document)?;
        serde_json::to_vec(&document).map_err(|error| error.to_string())
    }

    /// What Quickwit 0.8 would drop after acknowledging it.
    fn check_mapping(&self, document: &Map<String, Value>) -> Result<(), String> {
        for (name, value) in document {
            let declared = self.index.fields.iter().find(|(field, _)| field == name);
            match declared {
                None if self.index.strict => {
                    return Err(format!(
                        "the doc mapping of {} is strict and does not declare field {name}",
                        self.index.index_id
                    ));
                }
                Some((_, kind)) if !fits(kind, value) => {
                    return Err(format!(
                        "field {name} is {} where the doc mapping of {} says {kind}",
                        self::kind(value),
                        self.index.index_id
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn remember(&self, topic: &TopicRef, written: &[(u32, u64)]) {
        if written.is_empty() {
            return;
        }
        lock(&self.written)
            .entry(topic.clone())
            .or_default()
            .extend(written.iter().copied());
    }
}

/// Whether `value` fits a field mapping type (`array<...>` element-wise).
fn fits(kind: &str, value: &Value) -> bool {
    if let Some(inner) = kind.strip_prefix("array<").and_then(|rest| rest.strip_suffix('>')) {
        return match value {
            Value::Array(items) => items.iter().all(|item| fits(inner, item)),
            other => fits(inner, other),
        };
    }
    match kind {
        "text" | "ip" | "bytes" => value.is_string(),
        "i64" => value.is_i64(),
        "u64" => value.is_u64(),
        "f64" => value.is_number(),
        "bool" => value.is_boolean(),
        "datetime" => value.is_string() || value.is_number(),
        "object" | "json" => value.is_object(),
        _ => true,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Quickwit's `{"message": ...}`, or the start of the body.
fn error_text(body: &[u8]) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| value["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text: String = text
        .chars()
        .take(REASON_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    if text.is_empty() { text } else { format!("({text})") }
}

#[async_trait]
impl Sink for QuickwitSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.config.tls_danger_accept_invalid_certs {
            warn!(connector_key = %self.key, "tls_danger_accept_invalid_certs is on: TLS certificates are NOT verified");
        }
        let client = HttpClient::new(&self.client_options)
            .map_err(|error| ConnectorError::fatal(error.to_string()))?;
        self.ensure_index(&client)
            .await
            .map_err(|failure| match failure {
                Failure::Transient { reason, .. } => ConnectorError::transient(reason),
                Failure::Refused(_, reason) | Failure::Fatal(reason) => {
                    ConnectorError::fatal(reason)
                }
            })?;
        info!(connector_key = %self.key, url = %self.base, index_id = %self.index.index_id, commit = self.config.commit.as_str(), "connected");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the quickwit sink was not opened"))?;
        let already = lock(&self.written).get(topic).cloned().unwrap_or_default();
        let mut rejections = Vec::new();
        let mut lines = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            if already.contains(&(message.partition_id, message.offset)) {
                continue;
            }
            match self.line(message) {
                Ok(line) => lines.push((index, line)),
                Err(reason) => rejections.push(Rejection { index, reason }),
            }
        }
        // Requests of (message indexes, body), split by count and bytes.
        let limits = Limits {
            max_items: Some(self.config.batch_size),
            max_bytes: Some(self.config.max_request_bytes),
        };
        let mut requests = Vec::new();
        let mut lines = lines.into_iter().peekable();
        while lines.peek().is_some() {
            let mut body = Body::new(Framing::NDJSON, limits);
            let mut indexes = Vec::new();
            while let Some((index, line)) = lines.peek() {
                match body.push(line) {
                    Push::Added => {
                        indexes.push(*index);
                        lines.next();
                    }
                    Push::Full => break,
                    Push::TooLarge { size } => {
                        rejections.push(Rejection {
                            index: *index,
                            reason: format!(
                                "the document makes a {size}-byte ingest request, more than max_request_bytes ({})",
                                self.config.max_request_bytes
                            ),
                        });
                        lines.next();
                    }
                }
            }
            if !indexes.is_empty() {
                requests.push((indexes, Bytes::from(body.finish())));
            }
        }
        let mut written = Vec::new();
        let mut attempt = 0;
        while !requests.is_empty() {
            let mut retry = Vec::new();
            let mut last_reason = String::new();
            let mut wait: Option<Duration> = None;
            for (indexes, body) in std::mem::take(&mut requests) {
                let not_before = *lock(&self.not_before);
                if let Some(instant) = not_before {
                    tokio::time::sleep_until(instant.into()).await;
                }
                let request = client
                    .request(reqwest::Method::POST, self.ingest_url.clone(), body.clone())
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
                match self.send(request, "ingest request").await {
                    Ok(_) => written.extend(
                        indexes
                            .iter()
                            .map(|&index| (messages[index].partition_id, messages[index].offset)),
                    ),
                    Err(Failure::Transient {
                        reason,
                        retry_after,
                    }) => {
                        last_reason = reason;
                        wait = wait.max(retry_after);
                        retry.push((indexes, body));
                    }
                    Err(Failure::Refused(404, reason)) => {
                        self.remember(topic, &written);
                        return Err(SinkError::fatal(format!(
                            "{reason}; the index {} is gone: recreate it or restart the sink with create_index_if_not_exists = true",
                            self.index.index_id
                        )));
                    }
                    Err(Failure::Refused(_, reason)) => {
                        rejections.extend(indexes.iter().map(|&index| Rejection {
                            index,
                            reason: reason.clone(),
                        }));
                    }
                    Err(Failure::Fatal(reason)) => {
                        self.remember(topic, &written);
                        return Err(SinkError::fatal(reason));
                    }
                }
            }
            if retry.is_empty() {
                break;
            }
            attempt += 1;
            if attempt > self.config.max_retries {
                if let Some(wait) = wait {
                    *lock(&self.not_before) = Some(Instant::now() + wait);
                }
                self.remember(topic, &written);
                return Err(SinkError::transient(format!(
                    "{} ingest request(s) not acknowledged after {attempt} attempts, last: {last_reason}",
                    retry.len()
                )));
            }
            let delay = wait.unwrap_or_else(|| self.retry.delay(attempt));
            warn!(connector_key = %self.key, requests = retry.len(), retry = attempt, retry_in_ms = delay.as_millis() as u64, error = %last_reason, "ingest failed, retrying");
            tokio::time::sleep(delay).await;
            requests = retry;
        }
        if !rejections.is_empty() {
            self.remember(topic, &written);
            return Err(SinkError::Rejected(rejections));
        }
        lock(&self.written).remove(topic);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        Ok(())
    }
}
