//! `meilisearch` sink: adds documents to a Meilisearch 1.x index.
//!
//! Delivery: Meilisearch writes asynchronously: a documents request only
//! enqueues a task. With `wait_for_tasks` (the default) `write` follows every
//! task to its end and returns `Ok` only once each one `succeeded`. Every
//! document carries a primary key (the payload's own, or upstream's
//! deterministic id derived from the message), so a replayed batch replaces
//! what it wrote before instead of duplicating it.
//!
//! A task fails as a whole (nothing of it is written). A failure caused by the
//! documents (`invalid_document_id`, `missing_document_id`, an invalid `_geo`,
//! ...) splits the chunk in halves sent again, down to the single document
//! Meilisearch refuses, which is returned as `Rejected` by index for
//! `on_error`; ids Meilisearch would refuse are rejected before sending.
//! 429, 5xx, connection errors, timeouts, tasks failed with an `internal` or
//! `system` error, canceled tasks and tasks not finished within
//! `task_timeout` are retried (`max_retries`, then the engine retries the
//! batch; what was written is not sent again). 401/403, an index with another
//! primary key and a missing index Meilisearch does not create are fatal,
//! naming the field to fix.

mod config;
mod document;

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
use crate::connectors::kit::http::{
    self, Auth, ClientOptions, HttpClient, StatusClass, classify, error_chain,
};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

pub use config::{DocumentAction, MeilisearchSinkConfig};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "meilisearch",
    feature: "meilisearch-sink",
    description: "adds documents to a Meilisearch index (waits for each task; deterministic primary keys)",
    secret_fields: &["api_key"],
    sample_config: "url = \"http://localhost:7700\"\nindex = \"iggy_messages\"\napi_key = \"secret-key\"\nprimary_key = \"iggy_id\"\n",
    config_schema: schema_of::<MeilisearchSinkConfig>,
    build: |config| {
        Ok(Box::new(MeilisearchSink::new(parse_plugin_config(
            config,
        )?)?))
    },
};

/// How much of an error message goes into a reason.
const REASON_CHARS: usize = 300;

pub struct MeilisearchSink {
    config: MeilisearchSinkConfig,
    base: reqwest::Url,
    documents_url: reqwest::Url,
    client_options: ClientOptions,
    retry: Backoff,
    client: Option<HttpClient>,
    /// Per topic: (partition, offset) of the messages of a batch that failed
    /// or had rejections but were written: skipped when the engine writes the
    /// batch (or its rest) again.
    written: Mutex<HashMap<TopicRef, HashSet<(u32, u64)>>>,
    /// No request goes out before this (a `Retry-After` outliving `write`).
    not_before: Mutex<Option<Instant>>,
    key: String,
}

/// A request or task that did not end well.
enum Failure {
    /// Try again later.
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The documents are refused (a task failed because of them, or the
    /// request was refused): split the chunk to find which.
    Refused(String),
    /// Nothing will work until the config changes.
    Fatal(String),
}

/// One document on its way.
struct Doc {
    /// Into the `messages` of `write`.
    index: usize,
    json: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Enqueued {
    task_uid: u64,
}

#[derive(Deserialize)]
struct Task {
    status: String,
    #[serde(default)]
    error: Option<TaskError>,
}

#[derive(Deserialize)]
struct TaskError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    code: String,
    #[serde(default, rename = "type")]
    kind: String,
}

impl MeilisearchSink {
    pub fn new(config: MeilisearchSinkConfig) -> Result<Self, PluginConfigError> {
        let base = config.validate()?;
        let mut documents_url = base
            .join(&format!("indexes/{}/documents", config.index))
            .map_err(|error| PluginConfigError::new("url", error.to_string()))?;
        documents_url
            .query_pairs_mut()
            .append_pair("primaryKey", &config.primary_key);
        let client_options = ClientOptions {
            timeout: config.timeout,
            ca_file: config.tls_ca_file.clone(),
            accept_invalid_certs: config.tls_danger_accept_invalid_certs,
            auth: config
                .api_key
                .clone()
                .map(Auth::Bearer)
                .unwrap_or_default(),
            ..ClientOptions::default()
        };
        let retry = Backoff {
            initial: config.retry_delay,
            max: config.max_retry_delay,
            multiplier: 2.0,
        };
        Ok(Self {
            base,
            documents_url,
            client_options,
            retry,
            client: None,
            written: Mutex::new(HashMap::new()),
            not_before: Mutex::new(None),
            key: "meilisearch".into(),
            config,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, Failure> {
        self.base
            .join(path)
            .map_err(|error| Failure::Fatal(format!("{path}: {error}")))
    }

    /// Sends a request; a status other than 2xx becomes a `Failure`.
    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Bytes, Failure> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                let error = error.without_url();
                let reason = if error.is_timeout() {
                    format!(
                        "{what}: no answer within timeout ({})",
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
        let (code, text) = error_text(&body);
        let reason = format!("{what}: answered {status} {text}");
        Err(match status {
            401 => Failure::Fatal(format!("{reason}; set api_key")),
            403 => Failure::Fatal(format!(
                "{reason}; check api_key (it must allow documents.add, tasks.get and, to create the index, indexes.create)"
            )),
            404 if code == "index_not_found" => Failure::Fatal(format!(
                "{reason}; create the index or set create_index_if_not_exists = true"
            )),
            404 => Failure::Fatal(format!(
                "{reason}; is url ({}) the Meilisearch address?",
                self.base
            )),
            _ => match classify(status) {
                StatusClass::Transient => Failure::Transient {
                    reason,
                    retry_after,
                },
                StatusClass::Permanent => Failure::Refused(reason),
            },
        })
    }

    /// Follows task `uid` to its end (or `task_timeout`).
    async fn follow(&self, client: &HttpClient, uid: u64) -> Result<(), Failure> {
        let url = self.url(&format!("tasks/{uid}"))?;
        let deadline = Instant::now() + self.config.task_timeout;
        let mut last: String;
        loop {
            match self
                .send(client.empty(reqwest::Method::GET, url.clone()), &format!("task {uid}"))
                .await
            {
                Ok(body) => {
                    let task: Task = serde_json::from_slice(&body).map_err(|error| {
                        Failure::Transient {
                            reason: format!("task {uid}: not what Meilisearch answers: {error}"),
                            retry_after: None,
                        }
                    })?;
                    match task.status.as_str() {
                        "succeeded" => return Ok(()),
                        "failed" => return Err(self.task_failure(uid, task.error)),
                        "canceled" => {
                            return Err(Failure::Transient {
                                reason: format!("task {uid} was canceled"),
                                retry_after: None,
                            });
                        }
                        status => last = status.to_owned(),
                    }
                }
                Err(Failure::Transient { reason, .. }) => last = reason,
                Err(failure) => return Err(failure),
            }
            if Instant::now() >= deadline {
                return Err(Failure::Transient {
                    reason: format!(
                        "task {uid} not finished within task_timeout ({}), last: {last}",
                        crate::config::duration::format(self.config.task_timeout)
                    ),
                    retry_after: None,
                });
            }
            tokio::time::sleep(self.config.task_poll_interval).await;
        }
    }

    fn task_failure(&self, uid: u64, error: Option<TaskError>) -> Failure {
        let Some(error) = error else {
            return Failure::Transient {
                reason: format!("task {uid} failed without an error"),
                retry_after: None,
            };
        };
        let reason = format!("task {uid} failed: {}: {}", error.code, truncate(&error.message));
        match (error.kind.as_str(), error.code.as_str()) {
            ("internal" | "system", _) => Failure::Transient {
                reason,
                retry_after: None,
            },
            ("auth", _) => Failure::Fatal(format!("{reason}; check api_key")),
            (_, "index_not_found") => Failure::Fatal(format!(
                "{reason}; create the index or set create_index_if_not_exists = true"
            )),
            (_, code) if code.starts_with("index_primary_key") => Failure::Fatal(format!(
                "{reason}; set primary_key to the index's primary key"
            )),
            _ => Failure::Refused(reason),
        }
    }

    /// Enqueues one documents task for `chunk`; its uid.
    async fn enqueue(&self, client: &HttpClient, chunk: &[Doc]) -> Result<u64, Failure> {
        let not_before = *lock(&self.not_before);
        if let Some(instant) = not_before {
            tokio::time::sleep_until(instant.into()).await;
        }
        let mut body = Vec::with_capacity(chunk.iter().map(|doc| doc.json.len() + 1).sum::<usize>() + 1);
        body.push(b'[');
        for (n, doc) in chunk.iter().enumerate() {
            if n > 0 {
                body.push(b',');
            }
            body.extend_from_slice(&doc.json);
        }
        body.push(b']');
        let method = match self.config.document_action {
            DocumentAction::Replace => reqwest::Method::POST,
            DocumentAction::Update => reqwest::Method::PUT,
        };
        let request = client
            .request(method, self.documents_url.clone(), Bytes::from(body))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let answer = self.send(request, "documents request").await?;
        let enqueued: Enqueued = serde_json::from_slice(&answer).map_err(|error| Failure::Transient {
            reason: format!("the documents answer is not what Meilisearch sends: {error}"),
            retry_after: None,
        })?;
        Ok(enqueued.task_uid)
    }

    /// Checks the index at open, creating it when missing and allowed.
    async fn check_index(&self, client: &HttpClient) -> Result<(), Failure> {
        self.send(
            client.empty(reqwest::Method::GET, self.url("health")?),
            &format!("connecting to {}", self.base),
        )
        .await?;
        let index = &self.config.index;
        let found = self
            .send(
                client.empty(reqwest::Method::GET, self.url(&format!("indexes/{index}"))?),
                &format!("checking index {index}"),
            )
            .await;
        match found {
            Ok(body) => {
                let about: Value = serde_json::from_slice(&body).unwrap_or_default();
                match about["primaryKey"].as_str() {
                    Some(key) if key != self.config.primary_key => Err(Failure::Fatal(format!(
                        "index {index} has primary key \"{key}\", not \"{}\"; set primary_key = \"{key}\" or use another index",
                        self.config.primary_key
                    ))),
                    _ => Ok(()),
                }
            }
            Err(Failure::Fatal(reason)) if reason.contains("index_not_found") => {
                if !self.config.create_index_if_not_exists {
                    warn!(connector_key = %self.key, index, "the index does not exist; Meilisearch creates it on the first write if the api_key may");
                    return Ok(());
                }
                let body = serde_json::json!({"uid": index, "primaryKey": self.config.primary_key});
                let answer = self
                    .send(
                        client
                            .request(reqwest::Method::POST, self.url("indexes")?, Bytes::from(body.to_string()))
                            .header(CONTENT_TYPE, HeaderValue::from_static("application/json")),
                        &format!("creating index {index}"),
                    )
                    .await?;
                let enqueued: Enqueued = serde_json::from_slice(&answer).map_err(|error| Failure::Transient {
                    reason: format!("the create-index answer is not what Meilisearch sends: {error}"),
                    retry_after: None,
                })?;
                match self.follow(client, enqueued.task_uid).await {
                    Ok(()) => {
                        info!(connector_key = %self.key, index, "index created");
                        Ok(())
                    }
                    // Created meanwhile by someone else: fine.
                    Err(Failure::Refused(reason)) if reason.contains("index_already_exists") => Ok(()),
                    Err(Failure::Refused(reason)) => Err(Failure::Fatal(format!("{reason}; check index"))),
                    Err(failure) => Err(failure),
                }
            }
            Err(failure) => Err(failure),
        }
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

/// `(code, "(code: message)")` of a Meilisearch error body, or the start of
/// the body.
fn error_text(body: &[u8]) -> (String, String) {
    if let Ok(value) = serde_json::from_slice::<Value>(body)
        && let Some(code) = value["code"].as_str()
    {
        let message = truncate(value["message"].as_str().unwrap_or_default());
        return (code.to_owned(), format!("({code}: {message})"));
    }
    let text = truncate(&String::from_utf8_lossy(body));
    let text = if text.is_empty() { text } else { format!("({text})") };
    (String::new(), text)
}

fn truncate(text: &str) -> String {
    text.chars()
        .take(REASON_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// What a write does with a chunk that failed.
struct Outcome<'a> {
    /// Chunks to send again in this round (halves of refused ones).
    work: Vec<Vec<Doc>>,
    /// Chunks to send again after a backoff.
    retry: Vec<Vec<Doc>>,
    rejections: Vec<Rejection>,
    last_reason: String,
    wait: Option<Duration>,
    written: Vec<(u32, u64)>,
    messages: &'a [SinkMessage],
}

impl Outcome<'_> {
    fn written(&mut self, chunk: Vec<Doc>) {
        for doc in chunk {
            let message = &self.messages[doc.index];
            self.written.push((message.partition_id, message.offset));
        }
    }

    /// Files a failed chunk; `Err` (the fatal reason) when the write must stop.
    fn failed(&mut self, mut chunk: Vec<Doc>, failure: Failure) -> Result<(), String> {
        match failure {
            Failure::Transient {
                reason,
                retry_after,
            } => {
                self.last_reason = reason;
                self.wait = self.wait.max(retry_after);
                self.retry.push(chunk);
            }
            Failure::Refused(reason) if chunk.len() == 1 => {
                self.rejections.extend(chunk.iter().map(|doc| Rejection {
                    index: doc.index,
                    reason: reason.clone(),
                }));
            }
            Failure::Refused(_) => {
                let rest = chunk.split_off(chunk.len() / 2);
                self.work.push(chunk);
                self.work.push(rest);
            }
            Failure::Fatal(reason) => return Err(reason),
        }
        Ok(())
    }
}

#[async_trait]
impl Sink for MeilisearchSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.config.tls_danger_accept_invalid_certs {
            warn!(connector_key = %self.key, "tls_danger_accept_invalid_certs is on: TLS certificates are NOT verified");
        }
        if !self.config.wait_for_tasks {
            warn!(connector_key = %self.key, "wait_for_tasks = false: offsets move once Meilisearch enqueued a task; a task failing later loses its documents unseen");
        }
        let client = HttpClient::new(&self.client_options)
            .map_err(|error| ConnectorError::fatal(error.to_string()))?;
        let mut attempt = 0;
        loop {
            match self.check_index(&client).await {
                Ok(()) => break,
                Err(Failure::Transient { reason, retry_after }) => {
                    attempt += 1;
                    if attempt > self.config.max_open_retries {
                        return Err(ConnectorError::transient(reason));
                    }
                    let delay = retry_after.unwrap_or_else(|| self.retry.delay(attempt));
                    warn!(connector_key = %self.key, retry = attempt, retry_in_ms = delay.as_millis() as u64, error = %reason, "open failed, retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(Failure::Refused(reason) | Failure::Fatal(reason)) => {
                    return Err(ConnectorError::fatal(reason));
                }
            }
        }
        info!(connector_key = %self.key, url = %self.base, index = %self.config.index, "connected");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the meilisearch sink was not opened"))?;
        let already = lock(&self.written).get(topic).cloned().unwrap_or_default();
        let mut outcome = Outcome {
            work: Vec::new(),
            retry: Vec::new(),
            rejections: Vec::new(),
            last_reason: String::new(),
            wait: None,
            written: Vec::new(),
            messages,
        };
        let mut docs = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            if already.contains(&(message.partition_id, message.offset)) {
                continue;
            }
            let document = document::document(
                message,
                topic,
                &self.config.primary_key,
                self.config.include_metadata,
            )
            .and_then(|object| {
                serde_json::to_vec(&Value::Object(object)).map_err(|error| error.to_string())
            });
            match document {
                Ok(json) => docs.push(Doc { index, json }),
                Err(reason) => outcome.rejections.push(Rejection { index, reason }),
            }
        }
        let mut docs = docs.into_iter().peekable();
        while docs.peek().is_some() {
            outcome
                .work
                .push(docs.by_ref().take(self.config.batch_size).collect());
        }
        let mut attempt = 0;
        loop {
            while !outcome.work.is_empty() {
                let round = std::mem::take(&mut outcome.work);
                let mut pending = Vec::new();
                for chunk in round {
                    let result = match self.enqueue(client, &chunk).await {
                        Ok(uid) if self.config.wait_for_tasks => {
                            pending.push((chunk, uid));
                            continue;
                        }
                        Ok(_) => {
                            outcome.written(chunk);
                            continue;
                        }
                        Err(failure) => outcome.failed(chunk, failure),
                    };
                    if let Err(reason) = result {
                        self.remember(topic, &outcome.written);
                        return Err(SinkError::fatal(reason));
                    }
                }
                for (chunk, uid) in pending {
                    let result = match self.follow(client, uid).await {
                        Ok(()) => {
                            outcome.written(chunk);
                            continue;
                        }
                        Err(failure) => outcome.failed(chunk, failure),
                    };
                    if let Err(reason) = result {
                        self.remember(topic, &outcome.written);
                        return Err(SinkError::fatal(reason));
                    }
                }
            }
            if outcome.retry.is_empty() {
                break;
            }
            attempt += 1;
            let documents: usize = outcome.retry.iter().map(Vec::len).sum();
            if attempt > self.config.max_retries {
                if let Some(wait) = outcome.wait {
                    *lock(&self.not_before) = Some(Instant::now() + wait);
                }
                self.remember(topic, &outcome.written);
                return Err(SinkError::transient(format!(
                    "{documents} document(s) not written after {attempt} attempts, last: {}",
                    outcome.last_reason
                )));
            }
            let delay = outcome.wait.take().unwrap_or_else(|| self.retry.delay(attempt));
            warn!(connector_key = %self.key, documents, retry = attempt, retry_in_ms = delay.as_millis() as u64, error = %outcome.last_reason, "documents not written, retrying them");
            tokio::time::sleep(delay).await;
            outcome.work = std::mem::take(&mut outcome.retry);
        }
        if !outcome.rejections.is_empty() {
            self.remember(topic, &outcome.written);
            return Err(SinkError::Rejected(outcome.rejections));
        }
        lock(&self.written).remove(topic);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        Ok(())
    }
}
