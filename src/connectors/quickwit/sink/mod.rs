//! `quickwit` sink: ingests messages as NDJSON documents into a Quickwit 0.8
//! index (`POST /api/v1/{index_id}/ingest?commit=...`).
//!
//! Delivery: `write` sends the batch in ingest requests (split by
//! `batch_size` and `max_request_bytes`); the documents of a request answered
//! 2xx are durable: with `commit = "auto"` (the default) they are in
//! Quickwit's durable ingest queue, searchable after the index's
//! `commit_timeout_secs`; `wait_for` and `force` answer once they are
//! searchable. A request answered 429/5xx, or not answered, ends the write
//! there: the engine writes what is not durable again (only that: the
//! acknowledged requests are named durable) after its backoff or the
//! `Retry-After`. Quickwit has no document ids, so nothing makes a replay
//! idempotent: a batch sent again after a crash, or a request whose answer
//! was lost, is stored twice (`id_field` lets queries find such duplicates).
//!
//! Quickwit 0.8 acknowledges documents it later drops (a field a strict doc
//! mapping does not declare, a value of the wrong type), so those are checked
//! here first and rejected by index for `on_error`, as are payloads that are
//! not JSON objects. A request refused as a whole (400, 413) rejects its
//! documents; a missing index that may not be created, or one deleted while
//! the sink runs, is fatal.

mod config;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde_json::{Map, Value};
use tracing::{info, warn};

use crate::connectors::kit::batch::{Body, Framing, Limits, Push};
use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{
    self, Answer, ClientOptions, HttpClient, StatusClass, classify,
};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, RetrySettings, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

use config::IndexConfig;
pub use config::{CommitMode, QuickwitSinkConfig};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "quickwit",
    feature: "quickwit-sink",
    description: "ingests JSON documents into a Quickwit index (NDJSON ingest API; no document ids: replays duplicate)",
    secret_fields: &[],
    sample_config: "url = \"http://localhost:7280\"\nindex = \"\"\"\nversion: 0.8\nindex_id: events\ndoc_mapping:\n  mode: dynamic\n\"\"\"\n",
    config_schema: schema_of::<QuickwitSinkConfig>,
    build: |config| Ok(Box::new(QuickwitSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// How much of an error body goes into a reason.
const REASON_CHARS: usize = 300;

/// The most of an answer read (Quickwit answers with a few small fields).
const ANSWER_LIMIT: usize = 1024 * 1024;

pub struct QuickwitSink {
    config: QuickwitSinkConfig,
    index: IndexConfig,
    base: reqwest::Url,
    ingest_url: reqwest::Url,
    client_options: ClientOptions,
    client: Option<HttpClient>,
    key: String,
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
        Ok(Self {
            index,
            base,
            ingest_url,
            client_options,
            client: None,
            key: "quickwit".into(),
            config,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, Failure> {
        self.base
            .join(path)
            .map_err(|error| Failure::Fatal(format!("{path}: {error}")))
    }

    /// Sends `request` to `url`: its answer, whatever the status.
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        url: &reqwest::Url,
    ) -> Result<Answer, Failure> {
        http::exchange(request, &http::display(url), ANSWER_LIMIT).await
    }

    /// Makes sure the index exists, creating it from `index` if allowed.
    async fn ensure_index(&self, client: &HttpClient) -> Result<(), Failure> {
        let id = &self.index.index_id;
        let url = self.url(&format!("api/v1/indexes/{id}"))?;
        let described = self
            .exchange(client.empty(reqwest::Method::GET, url.clone()), &url)
            .await?;
        match described.status {
            200..=299 => Ok(()),
            404 if self.config.create_index_if_not_exists => {
                let url = self.url("api/v1/indexes")?;
                let request = client
                    .request(
                        reqwest::Method::POST,
                        url.clone(),
                        Bytes::from(self.config.index.clone()),
                    )
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/yaml"));
                let created = self.exchange(request, &url).await?;
                if created.is_success() {
                    info!(connector_key = %self.key, index_id = %id, "index created");
                    return Ok(());
                }
                match self.failure(&created, &url) {
                    // Created meanwhile by someone else: fine.
                    Failure::Refused(reason) if reason.contains("already exist") => Ok(()),
                    Failure::Refused(reason) => Err(Failure::Fatal(format!(
                        "{reason}; Quickwit refuses the index config: fix index"
                    ))),
                    failure => Err(failure),
                }
            }
            404 => Err(Failure::Fatal(format!(
                "{}; create the index or set create_index_if_not_exists = true",
                described.reason(&http::display(&url))
            ))),
            _ => Err(self.failure(&described, &url)),
        }
    }

    /// Sends one ingest request: `Ok` once Quickwit acknowledged it.
    async fn ingest(&self, client: &HttpClient, body: Bytes) -> Result<(), Failure> {
        let request = client
            .request(reqwest::Method::POST, self.ingest_url.clone(), body)
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
        let answer = self.exchange(request, &self.ingest_url).await?;
        if answer.is_success() {
            return Ok(());
        }
        Err(match self.failure(&answer, &self.ingest_url) {
            Failure::Refused(reason) if answer.status == 404 => Failure::Fatal(format!(
                "{reason}; the index {} is gone: recreate it or restart the sink with create_index_if_not_exists = true",
                self.index.index_id
            )),
            failure => failure,
        })
    }

    /// A non-2xx answer of `url`; 401/403 come from what is in front of
    /// Quickwit, which has no auth of its own.
    fn failure(&self, answer: &Answer, url: &reqwest::Url) -> Failure {
        let reason = format!(
            "{} answered {} {}",
            http::display(url),
            answer.status,
            error_text(&answer.body)
        );
        match answer.status {
            401 | 403 => Failure::Fatal(format!(
                "{reason}; Quickwit itself has no auth: check what is in front of url ({})",
                http::display(&self.base)
            )),
            status => match classify(status) {
                StatusClass::Transient => Failure::Transient {
                    reason,
                    retry_after: answer.retry_after,
                },
                StatusClass::Permanent => Failure::Refused(reason),
            },
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
}

/// Whether `value` fits a field mapping type (`array<...>` element-wise).
fn fits(kind: &str, value: &Value) -> bool {
    if let Some(inner) = kind
        .strip_prefix("array<")
        .and_then(|rest| rest.strip_suffix('>'))
    {
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
    if text.is_empty() {
        text
    } else {
        format!("({text})")
    }
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
            .map_err(ConnectorError::from)?;
        info!(connector_key = %self.key, url = %http::display(&self.base), index_id = %self.index.index_id, commit = self.config.commit.as_str(), "connected");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, _topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the quickwit sink was not opened"))?;
        let mut outcome = Outcome::default();
        let mut lines = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            match self.line(message) {
                Ok(line) => lines.push((index, line)),
                Err(reason) => outcome.reject(index, reason),
            }
        }
        let limits = Limits {
            max_items: Some(self.config.batch_size),
            max_bytes: Some(self.config.max_request_bytes),
        };
        let mut lines = lines.into_iter().peekable();
        while lines.peek().is_some() && !outcome.stopped() {
            let mut body = Body::new(Framing::NDJSON, limits);
            let mut indexes = Vec::new();
            while let Some((index, line)) = lines.peek() {
                match body.push(line) {
                    Push::Added => indexes.push(*index),
                    Push::Full => break,
                    Push::TooLarge { size } => outcome.reject(*index, format!(
                        "the document makes a {size}-byte ingest request, more than max_request_bytes ({})",
                        self.config.max_request_bytes
                    )),
                }
                lines.next();
            }
            if indexes.is_empty() {
                continue;
            }
            match self.ingest(client, Bytes::from(body.finish())).await {
                Ok(()) => outcome.durable(indexes),
                Err(failure) => outcome.fail(failure, indexes),
            }
        }
        outcome.into_result()
    }

    fn retry(&self) -> Option<RetrySettings> {
        Some(RetrySettings::doubling(
            self.config.retry_delay,
            self.config.max_retry_delay,
            self.config.max_retries,
        ))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        Ok(())
    }
}
