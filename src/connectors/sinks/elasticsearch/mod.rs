//! `elasticsearch` sink: indexes messages into Elasticsearch (8/9) or
//! OpenSearch (2) through the `_bulk` API.
//!
//! Delivery: every document's `_id` is the Iggy message id and the bulk action
//! is `index`, so a replayed batch overwrites what it wrote before instead of
//! duplicating it. `write` returns `Ok` only once every item of the batch was
//! answered 2xx (written to the translog). Items answered 429 or 5xx are sent
//! again alone (not the whole batch) up to `max_retries` times with backoff;
//! a whole request answered 429/5xx, or not answered, is sent again after its
//! `Retry-After` or the backoff. Past the retries `write` returns `Transient`
//! and the engine retries the batch; items already written are skipped then.
//! Items refused for good (400 `mapper_parsing_exception` and the like), and
//! messages that cannot be documents (a non-object JSON payload, an index
//! template field they lack), are returned as `Rejected`, by index, for
//! `on_error`. 401/403 and a missing index the cluster will not create are
//! fatal, naming the fields to fix.

mod config;
mod document;
mod template;

use crate::sync::lock;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
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
use crate::message::{SinkMessage, TopicRef};

pub use config::ElasticsearchSinkConfig;
use template::IndexTemplate;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "elasticsearch",
    feature: "elasticsearch-sink",
    description: "indexes messages into Elasticsearch or OpenSearch (bulk API, _id = message id)",
    secret_fields: &["password", "api_key"],
    sample_config: "url = \"http://localhost:9200\"\nindex = \"iggy-%Y.%m.%d\"\n# api_key wins when both are set\napi_key = \"secret-encoded-key\"\nusername = \"elastic\"\npassword = \"secret-password\"\n",
    config_schema: schema_of::<ElasticsearchSinkConfig>,
    build: |config| {
        Ok(Box::new(ElasticsearchSink::new(parse_plugin_config(
            config,
        )?)?))
    },
};

/// How much of an error body goes into a reason.
const REASON_CHARS: usize = 300;

pub struct ElasticsearchSink {
    config: ElasticsearchSinkConfig,
    base: reqwest::Url,
    bulk_url: reqwest::Url,
    template: IndexTemplate,
    client_options: ClientOptions,
    retry: Backoff,
    client: Option<HttpClient>,
    /// Indices known to exist (checked or created).
    known_indices: Mutex<HashSet<String>>,
    /// Per topic: (partition, offset) of the messages of a batch that failed
    /// or had rejections but were written: skipped when the engine writes the
    /// batch (or its rest) again.
    written: Mutex<HashMap<TopicRef, HashSet<(u32, u64)>>>,
    /// No request goes out before this (a `Retry-After` outliving `write`).
    not_before: Mutex<Option<Instant>>,
    key: String,
}

/// A request that did not end in a usable answer.
enum Failure {
    /// Try again later (connection, timeout, 429, 5xx).
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The request is refused for good (4xx): its status and why.
    Refused(u16, String),
    /// Nothing will work until the config changes (401, 403, a wrong URL).
    Fatal(String),
}

/// One document on its way.
struct Item {
    /// Into the `messages` of `write`.
    index: usize,
    target: String,
    /// The action line and the document line, without the final newline.
    lines: Vec<u8>,
}

/// What the cluster said about one item.
enum ItemResult {
    Written,
    Retry(String),
    Rejected(String),
    /// The index does not exist and will not be created.
    Missing(String),
}

#[derive(Deserialize)]
struct BulkResponse {
    #[serde(default)]
    errors: bool,
    #[serde(default)]
    items: Vec<HashMap<String, BulkItem>>,
}

#[derive(Deserialize)]
struct BulkItem {
    status: u16,
    #[serde(default)]
    error: Option<Value>,
}

impl ElasticsearchSink {
    pub fn new(config: ElasticsearchSinkConfig) -> Result<Self, PluginConfigError> {
        let (base, template, auth) = config.validate()?;
        let mut bulk_url = base
            .join("_bulk")
            .map_err(|error| PluginConfigError::new("url", error.to_string()))?;
        if let Some(pipeline) = &config.pipeline {
            bulk_url.query_pairs_mut().append_pair("pipeline", pipeline);
        }
        let client_options = ClientOptions {
            timeout: Duration::from_secs(config.timeout_seconds),
            ca_file: config.tls_ca_file.clone(),
            accept_invalid_certs: config.tls_danger_accept_invalid_certs,
            auth,
            ..ClientOptions::default()
        };
        let retry = Backoff {
            initial: config.retry_delay,
            max: config.max_retry_delay,
            multiplier: 2.0,
        };
        Ok(Self {
            base,
            bulk_url,
            template,
            client_options,
            retry,
            client: None,
            known_indices: Mutex::new(HashSet::new()),
            written: Mutex::new(HashMap::new()),
            not_before: Mutex::new(None),
            key: "elasticsearch".into(),
            config,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, Failure> {
        self.base
            .join(path)
            .map_err(|error| Failure::Fatal(format!("{path}: {error}")))
    }

    /// Sends a request; a status other than 2xx becomes a `Failure` naming
    /// what to fix for 401/403.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<(u16, Bytes), Failure> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                let error = error.without_url();
                let reason = if error.is_timeout() {
                    format!(
                        "{what}: no answer within timeout_seconds ({} s)",
                        self.config.timeout_seconds
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
            return Ok((status, body));
        }
        let reason = format!("{what}: answered {status} {}", error_text(&body));
        Err(match status {
            401 => Failure::Fatal(format!(
                "{reason}; check username/password or api_key"
            )),
            403 => Failure::Fatal(format!(
                "{reason}; the credentials lack a privilege this sink needs (index, create_index)"
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

    /// Makes sure `index` exists, creating it (with `index_mapping`) if allowed.
    async fn ensure_index(&self, client: &HttpClient, index: &str) -> Result<(), Failure> {
        if lock(&self.known_indices).contains(index) {
            return Ok(());
        }
        let url = self.url(index)?;
        let exists = self
            .send(
                client.empty(reqwest::Method::HEAD, url.clone()),
                &format!("checking index {index}"),
            )
            .await;
        match exists {
            Ok(_) => {}
            Err(Failure::Refused(404, _)) => {
                let body = self
                    .config
                    .index_mapping
                    .as_ref()
                    .map(|mapping| Bytes::from(mapping.to_string()))
                    .unwrap_or_default();
                let created = self
                    .send(
                        client
                            .request(reqwest::Method::PUT, url, body)
                            .header(CONTENT_TYPE, HeaderValue::from_static("application/json")),
                        &format!("creating index {index}"),
                    )
                    .await;
                match created {
                    Ok(_) => info!(connector_key = %self.key, index, "index created"),
                    // Created meanwhile by someone else: fine.
                    Err(Failure::Refused(_, reason))
                        if reason.contains("resource_already_exists_exception") => {}
                    Err(failure) => return Err(failure),
                }
            }
            Err(failure) => return Err(failure),
        }
        lock(&self.known_indices).insert(index.to_owned());
        Ok(())
    }

    fn item(&self, topic: &TopicRef, index: usize, message: &SinkMessage) -> Result<Item, String> {
        let document = Value::Object(document::document(
            message,
            topic,
            self.config.include_metadata,
        )?);
        let target = match self.template.fixed() {
            Some(name) => name.to_owned(),
            None => self.template.render(&document, message.timestamp)?,
        };
        let action = serde_json::json!({"index": {"_index": target, "_id": document::document_id(message)}});
        let mut lines = serde_json::to_vec(&action).map_err(|error| error.to_string())?;
        lines.push(b'\n');
        serde_json::to_writer(&mut lines, &document).map_err(|error| error.to_string())?;
        Ok(Item {
            index,
            target,
            lines,
        })
    }

    /// Sends one bulk request of `items`; per item, what became of it.
    async fn bulk(&self, client: &HttpClient, items: &[Item], body: Vec<u8>) -> Result<Vec<ItemResult>, Failure> {
        let not_before = *lock(&self.not_before);
        if let Some(instant) = not_before {
            tokio::time::sleep_until(instant.into()).await;
        }
        let request = client
            .request(reqwest::Method::POST, self.bulk_url.clone(), Bytes::from(body))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
        let (_, answer) = self.send(request, "bulk request").await.map_err(|failure| match failure {
            Failure::Refused(404, reason) => Failure::Fatal(format!(
                "{reason}; is url ({}) the cluster's address?",
                self.base
            )),
            other => other,
        })?;
        let response: BulkResponse = serde_json::from_slice(&answer).map_err(|error| Failure::Transient {
            reason: format!("the bulk answer is not what Elasticsearch sends: {error}"),
            retry_after: None,
        })?;
        if !response.errors {
            return Ok(items.iter().map(|_| ItemResult::Written).collect());
        }
        if response.items.len() != items.len() {
            return Err(Failure::Transient {
                reason: format!(
                    "the bulk answer has {} items for {} documents",
                    response.items.len(),
                    items.len()
                ),
                retry_after: None,
            });
        }
        Ok(response
            .items
            .into_iter()
            .zip(items)
            .map(|(mut answer, item)| {
                let Some(result) = answer.drain().map(|(_, result)| result).next() else {
                    return ItemResult::Retry("an empty item in the bulk answer".into());
                };
                item_result(&item.target, result)
            })
            .collect())
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

fn item_result(target: &str, result: BulkItem) -> ItemResult {
    if (200..300).contains(&result.status) {
        return ItemResult::Written;
    }
    let kind = result
        .error
        .as_ref()
        .and_then(|error| error["type"].as_str())
        .unwrap_or("error")
        .to_owned();
    let reason = result
        .error
        .as_ref()
        .and_then(|error| error["reason"].as_str())
        .unwrap_or_default();
    let text = format!("{} {kind}: {}", result.status, truncate(reason));
    if result.status == 404 && kind == "index_not_found_exception" {
        return ItemResult::Missing(format!("index {target}: {text}"));
    }
    match classify(result.status) {
        StatusClass::Transient => ItemResult::Retry(text),
        StatusClass::Permanent => ItemResult::Rejected(text),
    }
}

/// `type: reason` of an Elasticsearch error body, or the start of the body.
fn error_text(body: &[u8]) -> String {
    if let Ok(value) = serde_json::from_slice::<Value>(body)
        && let Some(kind) = value["error"]["type"].as_str()
    {
        return format!(
            "({kind}: {})",
            truncate(value["error"]["reason"].as_str().unwrap_or_default())
        );
    }
    let text = truncate(&String::from_utf8_lossy(body));
    if text.is_empty() { text } else { format!("({text})") }
}

fn truncate(text: &str) -> String {
    text.chars()
        .take(REASON_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

#[async_trait]
impl Sink for ElasticsearchSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.config.tls_danger_accept_invalid_certs {
            warn!(connector_key = %self.key, "tls_danger_accept_invalid_certs is on: TLS certificates are NOT verified");
        }
        let client = HttpClient::new(&self.client_options)
            .map_err(|error| ConnectorError::fatal(error.to_string()))?;
        let into_error = |failure: Failure| match failure {
            Failure::Transient { reason, .. } => ConnectorError::transient(reason),
            Failure::Refused(_, reason) | Failure::Fatal(reason) => ConnectorError::fatal(reason),
        };
        let (_, answer) = self
            .send(
                client.empty(reqwest::Method::GET, self.base.clone()),
                &format!("connecting to {}", self.base),
            )
            .await
            .map_err(into_error)?;
        let about: Value = serde_json::from_slice(&answer).unwrap_or_default();
        let distribution = about["version"]["distribution"]
            .as_str()
            .unwrap_or("elasticsearch");
        let version = about["version"]["number"].as_str().unwrap_or("unknown");
        info!(connector_key = %self.key, url = %self.base, distribution, version, "connected");
        if self.config.create_index_if_not_exists
            && let Some(index) = self.template.fixed()
        {
            self.ensure_index(&client, index)
                .await
                .map_err(|failure| match failure {
                    Failure::Refused(_, reason) => ConnectorError::fatal(format!(
                        "{reason}; check index and index_mapping"
                    )),
                    other => into_error(other),
                })?;
        }
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the elasticsearch sink was not opened"))?;
        let already = lock(&self.written).get(topic).cloned().unwrap_or_default();
        let mut rejections = Vec::new();
        let mut queue = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            if already.contains(&(message.partition_id, message.offset)) {
                continue;
            }
            match self.item(topic, index, message) {
                Ok(item) => queue.push(item),
                Err(reason) => rejections.push(Rejection { index, reason }),
            }
        }
        let mut written = Vec::new();
        if self.config.create_index_if_not_exists && self.template.fixed().is_none() {
            let targets: HashSet<&str> = queue.iter().map(|item| item.target.as_str()).collect();
            let mut refused = HashMap::new();
            for target in targets {
                match self.ensure_index(client, target).await {
                    Ok(()) => {}
                    Err(Failure::Refused(_, reason)) => {
                        refused.insert(target.to_owned(), reason);
                    }
                    Err(Failure::Transient { reason, .. }) => {
                        return Err(SinkError::transient(reason));
                    }
                    Err(Failure::Fatal(reason)) => return Err(SinkError::fatal(reason)),
                }
            }
            queue.retain(|item| match refused.get(&item.target) {
                Some(reason) => {
                    rejections.push(Rejection {
                        index: item.index,
                        reason: reason.clone(),
                    });
                    false
                }
                None => true,
            });
        }
        let limits = Limits {
            max_items: Some(self.config.batch_size),
            max_bytes: Some(self.config.max_bulk_bytes),
        };
        let mut attempt = 0;
        while !queue.is_empty() {
            let mut retry: Vec<Item> = Vec::new();
            let mut last_reason = String::new();
            let mut wait: Option<Duration> = None;
            let mut items = std::mem::take(&mut queue).into_iter().peekable();
            while items.peek().is_some() {
                let mut body = Body::new(Framing::NDJSON, limits);
                let mut chunk = Vec::new();
                while let Some(item) = items.peek() {
                    match body.push(&item.lines) {
                        Push::Added => chunk.extend(items.next()),
                        Push::Full => break,
                        Push::TooLarge { size } => {
                            rejections.push(Rejection {
                                index: item.index,
                                reason: format!(
                                    "the document makes a {size}-byte bulk request, more than max_bulk_bytes ({})",
                                    self.config.max_bulk_bytes
                                ),
                            });
                            items.next();
                        }
                    }
                }
                if chunk.is_empty() {
                    continue;
                }
                match self.bulk(client, &chunk, body.finish()).await {
                    Ok(results) => {
                        for (item, result) in chunk.into_iter().zip(results) {
                            match result {
                                ItemResult::Written => {
                                    let message = &messages[item.index];
                                    written.push((message.partition_id, message.offset));
                                }
                                ItemResult::Retry(reason) => {
                                    last_reason = reason;
                                    retry.push(item);
                                }
                                ItemResult::Rejected(reason) => rejections.push(Rejection {
                                    index: item.index,
                                    reason,
                                }),
                                ItemResult::Missing(reason) => {
                                    self.remember(topic, &written);
                                    return Err(SinkError::fatal(format!(
                                        "{reason}; the cluster does not create it: create it or set create_index_if_not_exists = true"
                                    )));
                                }
                            }
                        }
                    }
                    Err(Failure::Transient {
                        reason,
                        retry_after,
                    }) => {
                        last_reason = reason;
                        wait = wait.max(retry_after);
                        retry.extend(chunk);
                    }
                    Err(Failure::Refused(_, reason)) => {
                        rejections.extend(chunk.iter().map(|item| Rejection {
                            index: item.index,
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
                    "{} document(s) not written after {attempt} attempts, last: {last_reason}",
                    retry.len()
                )));
            }
            let delay = wait.unwrap_or_else(|| self.retry.delay(attempt));
            warn!(connector_key = %self.key, documents = retry.len(), retry = attempt, retry_in_ms = delay.as_millis() as u64, error = %last_reason, "documents not written, retrying them");
            tokio::time::sleep(delay).await;
            queue = retry;
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
