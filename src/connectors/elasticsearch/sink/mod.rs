//! `elasticsearch` sink: indexes messages into Elasticsearch (8/9) or
//! OpenSearch (2) through the `_bulk` API.
//!
//! Delivery: every document's `_id` is the Iggy message id and the bulk action
//! is `index`, so a replayed batch overwrites what it wrote before instead of
//! duplicating it. `write` sends the batch in `_bulk` requests (split by
//! `batch_size` and `max_bulk_bytes`) and reads each item of the answer: 2xx
//! (or 409 on a `create` of our id: it is there already) is durable, 429 and
//! 5xx are written again by the engine, other 4xx (`mapper_parsing_exception`
//! and the like) are rejected by index for `on_error`, as are messages that
//! cannot be documents (a non-object JSON payload, an index template field
//! they lack). A request answered 429/5xx, or not answered, ends the write
//! there: the engine writes what is not durable again after its backoff or
//! the `Retry-After`. 401/403 and a missing index the cluster will not create
//! are fatal, naming the fields to fix. At open an unreachable or starting
//! cluster is transient (the engine opens a fresh sink again).

mod config;
mod document;
mod template;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
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
use crate::message::{SinkMessage, TopicRef};
use crate::sync::lock;

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
inventory::submit!(ENTRY);

/// How much of an error body goes into a reason.
const REASON_CHARS: usize = 300;

/// The most of an answer read: a bulk answer is a few hundred bytes per item.
const ANSWER_LIMIT: usize = 64 * 1024 * 1024;

pub struct ElasticsearchSink {
    config: ElasticsearchSinkConfig,
    base: reqwest::Url,
    bulk_url: reqwest::Url,
    template: IndexTemplate,
    client_options: ClientOptions,
    client: Option<HttpClient>,
    /// Indices known to exist (checked or created).
    known_indices: Mutex<HashSet<String>>,
    key: String,
}

/// One document on its way.
struct Item {
    /// Into the `messages` of `write`.
    index: usize,
    target: String,
    /// The action line and the document line, without the final newline.
    lines: Vec<u8>,
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
        Ok(Self {
            base,
            bulk_url,
            template,
            client_options,
            client: None,
            known_indices: Mutex::new(HashSet::new()),
            key: "elasticsearch".into(),
            config,
        })
    }

    /// Sends `request` to `url`; an answer other than 2xx is a [`Failure`].
    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        url: &reqwest::Url,
    ) -> Result<Answer, Failure> {
        let target = http::display(url);
        let answer = http::exchange(request, &target, ANSWER_LIMIT).await?;
        if answer.is_success() {
            Ok(answer)
        } else {
            Err(failure(&answer, &target))
        }
    }

    /// Makes sure `index` exists, creating it (with `index_mapping`) if allowed.
    async fn ensure_index(&self, client: &HttpClient, index: &str) -> Result<(), Failure> {
        if lock(&self.known_indices).contains(index) {
            return Ok(());
        }
        let url = self
            .base
            .join(index)
            .map_err(|error| Failure::Fatal(format!("index {index}: {error}")))?;
        let target = http::display(&url);
        let exists = http::exchange(
            client.empty(reqwest::Method::HEAD, url.clone()),
            &target,
            ANSWER_LIMIT,
        )
        .await?;
        match exists.status {
            200..=299 => {}
            404 => {
                let body = self
                    .config
                    .index_mapping
                    .as_ref()
                    .map(|mapping| Bytes::from(mapping.to_string()))
                    .unwrap_or_default();
                let request = client
                    .request(reqwest::Method::PUT, url.clone(), body)
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                match self.call(request, &url).await {
                    Ok(_) => info!(connector_key = %self.key, index, "index created"),
                    // Created meanwhile by someone else: fine.
                    Err(Failure::Refused(reason))
                        if reason.contains("resource_already_exists_exception") => {}
                    Err(failure) => return Err(failure),
                }
            }
            _ => return Err(failure(&exists, &target)),
        }
        lock(&self.known_indices).insert(index.to_owned());
        Ok(())
    }

    /// Creates the indices a templated batch names, the first time each is
    /// named; the documents of an index refused are rejected with its reason.
    async fn ensure_indices(
        &self,
        client: &HttpClient,
        items: &mut Vec<Item>,
        outcome: &mut Outcome,
    ) {
        let targets: BTreeSet<String> = items.iter().map(|item| item.target.clone()).collect();
        for target in targets {
            match self.ensure_index(client, &target).await {
                Ok(()) => {}
                Err(Failure::Refused(reason)) => items.retain(|item| {
                    let keep = item.target != target;
                    if !keep {
                        outcome.reject(item.index, reason.clone());
                    }
                    keep
                }),
                Err(failure) => return outcome.fail(failure, []),
            }
        }
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
        let action =
            serde_json::json!({"index": {"_index": target, "_id": document::document_id(message)}});
        let mut lines = serde_json::to_vec(&action).map_err(|error| error.to_string())?;
        lines.push(b'\n');
        serde_json::to_writer(&mut lines, &document).map_err(|error| error.to_string())?;
        Ok(Item {
            index,
            target,
            lines,
        })
    }

    /// Sends one bulk request of `chunk` and files each item's answer.
    async fn bulk(
        &self,
        client: &HttpClient,
        chunk: &[Item],
        body: Vec<u8>,
        outcome: &mut Outcome,
    ) {
        let indexes = chunk.iter().map(|item| item.index);
        let request = client
            .request(
                reqwest::Method::POST,
                self.bulk_url.clone(),
                Bytes::from(body),
            )
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
        let target = http::display(&self.bulk_url);
        let answer = match http::exchange(request, &target, ANSWER_LIMIT).await {
            Ok(answer) => answer,
            Err(failure) => return outcome.fail(failure, indexes),
        };
        if !answer.is_success() {
            let failure = match failure(&answer, &target) {
                Failure::Refused(reason) if answer.status == 404 => Failure::Fatal(format!(
                    "{reason}; is url ({}) the cluster's address?",
                    http::display(&self.base)
                )),
                failure => failure,
            };
            return outcome.fail(failure, indexes);
        }
        let response: BulkResponse = match serde_json::from_slice(&answer.body) {
            Ok(response) => response,
            Err(error) => {
                let reason = format!("the bulk answer is not what Elasticsearch sends: {error}");
                return outcome.fail(Failure::transient(reason), indexes);
            }
        };
        if !response.errors {
            return outcome.durable(indexes);
        }
        if response.items.len() != chunk.len() {
            let reason = format!(
                "the bulk answer has {} items for {} documents",
                response.items.len(),
                chunk.len()
            );
            return outcome.fail(Failure::transient(reason), indexes);
        }
        for (answer, item) in response.items.into_iter().zip(chunk) {
            match answer.into_iter().next() {
                Some((action, result)) => match item_failure(&action, &item.target, result) {
                    None => outcome.durable([item.index]),
                    Some(failure) => outcome.fail(failure, [item.index]),
                },
                None => outcome.fail(
                    Failure::transient("an empty item in the bulk answer"),
                    [item.index],
                ),
            }
        }
    }
}

/// What a bulk item's answer says of its document: `None` when it is stored.
fn item_failure(action: &str, target: &str, result: BulkItem) -> Option<Failure> {
    let kind = result
        .error
        .as_ref()
        .and_then(|error| error["type"].as_str())
        .unwrap_or("error");
    // A `create` of an id that exists: a replay of what was stored before.
    if (200..300).contains(&result.status) || (result.status == 409 && action == "create") {
        return None;
    }
    let reason = result
        .error
        .as_ref()
        .and_then(|error| error["reason"].as_str())
        .unwrap_or_default();
    let text = format!("{} {kind}: {}", result.status, truncate(reason));
    Some(match (result.status, kind) {
        (404, "index_not_found_exception") => Failure::Fatal(format!(
            "index {target}: {text}; the cluster does not create it: create it or set create_index_if_not_exists = true"
        )),
        (401 | 403, _) => Failure::Fatal(format!(
            "index {target}: {text}; the credentials lack a privilege this sink needs (index, create_index)"
        )),
        (status, _) => match classify(status) {
            StatusClass::Transient => Failure::transient(text),
            StatusClass::Permanent => Failure::Refused(text),
        },
    })
}

/// A non-2xx answer of `target`, naming what to fix for 401/403.
fn failure(answer: &Answer, target: &str) -> Failure {
    let reason = format!(
        "{target} answered {} {}",
        answer.status,
        error_text(&answer.body)
    );
    match answer.status {
        401 => Failure::Fatal(format!("{reason}; check username/password or api_key")),
        403 => Failure::Fatal(format!(
            "{reason}; the credentials lack a privilege this sink needs (index, create_index)"
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
    if text.is_empty() {
        text
    } else {
        format!("({text})")
    }
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
        let answer = self
            .call(
                client.empty(reqwest::Method::GET, self.base.clone()),
                &self.base,
            )
            .await
            .map_err(|failure| match failure {
                Failure::Refused(reason) => {
                    ConnectorError::fatal(format!("{reason}; is url the cluster's address?"))
                }
                failure => ConnectorError::from(failure),
            })?;
        let about: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        let distribution = about["version"]["distribution"]
            .as_str()
            .unwrap_or("elasticsearch");
        let version = about["version"]["number"].as_str().unwrap_or("unknown");
        info!(connector_key = %self.key, url = %http::display(&self.base), distribution, version, "connected");
        if self.config.create_index_if_not_exists
            && let Some(index) = self.template.fixed()
        {
            self.ensure_index(&client, index)
                .await
                .map_err(|failure| match failure {
                    Failure::Refused(reason) => {
                        ConnectorError::fatal(format!("{reason}; check index and index_mapping"))
                    }
                    failure => ConnectorError::from(failure),
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
        let mut outcome = Outcome::default();
        let mut items = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            match self.item(topic, index, message) {
                Ok(item) => items.push(item),
                Err(reason) => outcome.reject(index, reason),
            }
        }
        if self.config.create_index_if_not_exists && self.template.fixed().is_none() {
            self.ensure_indices(client, &mut items, &mut outcome).await;
        }
        let limits = Limits {
            max_items: Some(self.config.batch_size),
            max_bytes: Some(self.config.max_bulk_bytes),
        };
        let mut items = items.into_iter().peekable();
        while items.peek().is_some() && !outcome.stopped() {
            let mut body = Body::new(Framing::NDJSON, limits);
            let mut chunk = Vec::new();
            while let Some(item) = items.peek() {
                match body.push(&item.lines) {
                    Push::Added => chunk.extend(items.next()),
                    Push::Full => break,
                    Push::TooLarge { size } => {
                        outcome.reject(item.index, format!(
                            "the document makes a {size}-byte bulk request, more than max_bulk_bytes ({})",
                            self.config.max_bulk_bytes
                        ));
                        items.next();
                    }
                }
            }
            if !chunk.is_empty() {
                self.bulk(client, &chunk, body.finish(), &mut outcome).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn item(status: u16, kind: &str) -> BulkItem {
        BulkItem {
            status,
            error: Some(serde_json::json!({"type": kind, "reason": "why"})),
        }
    }

    #[test]
    fn given_bulk_item_answers_when_read_should_say_durable_transient_refused_or_fatal() {
        assert_eq!(item_failure("index", "i", item(201, "")), None);
        assert_eq!(
            item_failure(
                "create",
                "i",
                item(409, "version_conflict_engine_exception")
            ),
            None,
            "our id exists already: stored by an earlier attempt"
        );
        assert!(matches!(
            item_failure("index", "i", item(409, "version_conflict_engine_exception")),
            Some(Failure::Refused(_))
        ));
        for status in [429, 500, 503] {
            assert!(matches!(
                item_failure(
                    "index",
                    "i",
                    item(status, "es_rejected_execution_exception")
                ),
                Some(Failure::Transient { .. })
            ));
        }
        assert!(matches!(
            item_failure("index", "i", item(400, "mapper_parsing_exception")),
            Some(Failure::Refused(reason)) if reason.contains("mapper_parsing_exception")
        ));
        assert!(matches!(
            item_failure("index", "i", item(404, "index_not_found_exception")),
            Some(Failure::Fatal(reason)) if reason.contains("create_index_if_not_exists")
        ));
        assert!(matches!(
            item_failure("index", "i", item(403, "security_exception")),
            Some(Failure::Fatal(_))
        ));
    }
}
