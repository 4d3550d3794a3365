//! `meilisearch` sink: adds documents to a Meilisearch 1.x index.
//!
//! Delivery: Meilisearch writes asynchronously: a documents request only
//! enqueues a task. With `wait_for_tasks` (the default) `write` follows each
//! task to its end and names its documents durable only once it
//! `succeeded`. Every document carries a primary key (the payload's own, or
//! upstream's deterministic id derived from the message), so a replayed batch
//! replaces what it wrote before instead of duplicating it.
//!
//! A task fails as a whole (nothing of it is written). A failure caused by the
//! documents (`invalid_document_id`, `missing_document_id`, an invalid `_geo`,
//! ...) splits the chunk in halves sent in its place, down to the single
//! document Meilisearch refuses, which is rejected by index for `on_error`;
//! ids Meilisearch would refuse are rejected before sending. 429, 5xx, no
//! answer, a task failed with an `internal` or `system` error, a canceled task
//! or one not finished within `task_timeout` end the write there: the engine
//! writes what is not durable again after its backoff or the `Retry-After`.
//! 401/403, an index with another primary key and a missing index Meilisearch
//! does not create are fatal, naming the field to fix; at open, an unreachable
//! server is transient (the engine opens a fresh sink again).

mod config;
mod document;

use std::collections::VecDeque;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use tracing::{info, warn};

use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{
    self, Answer, Auth, ClientOptions, HttpClient, StatusClass, classify,
};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, RetrySettings, Sink, SinkEntry, SinkError,
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
inventory::submit!(ENTRY);

/// How much of an error message goes into a reason.
const REASON_CHARS: usize = 300;

/// The most of an answer read (a task, an index: small JSON objects).
const ANSWER_LIMIT: usize = 1024 * 1024;

pub struct MeilisearchSink {
    config: MeilisearchSinkConfig,
    base: reqwest::Url,
    documents_url: reqwest::Url,
    client_options: ClientOptions,
    client: Option<HttpClient>,
    key: String,
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
            auth: config.api_key.clone().map(Auth::Bearer).unwrap_or_default(),
            ..ClientOptions::default()
        };
        Ok(Self {
            base,
            documents_url,
            client_options,
            client: None,
            key: "meilisearch".into(),
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

    /// Sends `request` to `url`; an answer other than 2xx is a [`Failure`].
    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        url: &reqwest::Url,
    ) -> Result<Answer, Failure> {
        let answer = self.exchange(request, url).await?;
        if answer.is_success() {
            Ok(answer)
        } else {
            Err(self.failure(&answer, url))
        }
    }

    /// A non-2xx answer of `url`, naming what to fix when it is fatal.
    fn failure(&self, answer: &Answer, url: &reqwest::Url) -> Failure {
        let (code, text) = error_text(&answer.body);
        let reason = format!("{} answered {} {text}", http::display(url), answer.status);
        match answer.status {
            401 => Failure::Fatal(format!("{reason}; set api_key")),
            403 => Failure::Fatal(format!(
                "{reason}; check api_key (it must allow documents.add, tasks.get and, to create the index, indexes.create)"
            )),
            404 if code == "index_not_found" => Failure::Fatal(format!(
                "{reason}; create the index or set create_index_if_not_exists = true"
            )),
            404 => Failure::Fatal(format!(
                "{reason}; is url ({}) the Meilisearch address?",
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

    /// Writes `chunk` as one documents task: `Ok` once it succeeded (or,
    /// without `wait_for_tasks`, once it is enqueued).
    async fn store(&self, client: &HttpClient, chunk: &[Doc]) -> Result<(), Failure> {
        let mut body =
            Vec::with_capacity(chunk.iter().map(|doc| doc.json.len() + 1).sum::<usize>() + 1);
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
        let answer = self.call(request, &self.documents_url).await?;
        let uid = task_uid(&answer, "documents")?;
        if self.config.wait_for_tasks {
            self.follow(client, uid).await
        } else {
            Ok(())
        }
    }

    /// Waits for task `uid` to end, looking every `task_poll_interval` up to
    /// `task_timeout`: Meilisearch has no request that answers once a task
    /// is done. Any failure to look ends the wait (the engine writes the
    /// documents again: they replace themselves).
    async fn follow(&self, client: &HttpClient, uid: u64) -> Result<(), Failure> {
        let url = self.url(&format!("tasks/{uid}"))?;
        let deadline = Instant::now() + self.config.task_timeout;
        loop {
            let answer = self
                .call(client.empty(reqwest::Method::GET, url.clone()), &url)
                .await?;
            let task: Task = serde_json::from_slice(&answer.body).map_err(|error| {
                Failure::transient(format!("task {uid}: not what Meilisearch answers: {error}"))
            })?;
            let status = match task.status.as_str() {
                "succeeded" => return Ok(()),
                "failed" => return Err(task_failure(uid, task.error)),
                "canceled" => return Err(Failure::transient(format!("task {uid} was canceled"))),
                status => status,
            };
            if Instant::now() >= deadline {
                return Err(Failure::transient(format!(
                    "task {uid} not finished within task_timeout ({}), still {status}",
                    crate::config::duration::format(self.config.task_timeout)
                )));
            }
            tokio::time::sleep(self.config.task_poll_interval).await;
        }
    }

    /// Checks the index at open, creating it when missing and allowed.
    async fn check_index(&self, client: &HttpClient) -> Result<(), Failure> {
        let health = self.url("health")?;
        self.call(client.empty(reqwest::Method::GET, health.clone()), &health)
            .await?;
        let index = &self.config.index;
        let url = self.url(&format!("indexes/{index}"))?;
        let found = self
            .exchange(client.empty(reqwest::Method::GET, url.clone()), &url)
            .await?;
        if found.is_success() {
            let about: Value = serde_json::from_slice(&found.body).unwrap_or_default();
            return match about["primaryKey"].as_str() {
                Some(key) if key != self.config.primary_key => Err(Failure::Fatal(format!(
                    "index {index} has primary key \"{key}\", not \"{}\"; set primary_key = \"{key}\" or use another index",
                    self.config.primary_key
                ))),
                _ => Ok(()),
            };
        }
        if found.status != 404 || error_text(&found.body).0 != "index_not_found" {
            return Err(self.failure(&found, &url));
        }
        if !self.config.create_index_if_not_exists {
            warn!(connector_key = %self.key, index, "the index does not exist; Meilisearch creates it on the first write if the api_key may");
            return Ok(());
        }
        self.create_index(client).await
    }

    async fn create_index(&self, client: &HttpClient) -> Result<(), Failure> {
        let index = &self.config.index;
        let url = self.url("indexes")?;
        let body = serde_json::json!({"uid": index, "primaryKey": self.config.primary_key});
        let request = client
            .request(
                reqwest::Method::POST,
                url.clone(),
                Bytes::from(body.to_string()),
            )
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let answer = self.call(request, &url).await?;
        match self
            .follow(client, task_uid(&answer, "create-index")?)
            .await
        {
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
}

/// The uid of the task an answer says was enqueued.
fn task_uid(answer: &Answer, what: &str) -> Result<u64, Failure> {
    serde_json::from_slice::<Enqueued>(&answer.body)
        .map(|enqueued| enqueued.task_uid)
        .map_err(|error| {
            Failure::transient(format!(
                "the {what} answer is not what Meilisearch sends: {error}"
            ))
        })
}

/// Why task `uid` failed: its documents (refused), the server (transient)
/// or the sink's config (fatal).
fn task_failure(uid: u64, error: Option<TaskError>) -> Failure {
    let Some(error) = error else {
        return Failure::transient(format!("task {uid} failed without an error"));
    };
    let reason = format!(
        "task {uid} failed: {}: {}",
        error.code,
        truncate(&error.message)
    );
    match (error.kind.as_str(), error.code.as_str()) {
        ("internal" | "system", _) => Failure::transient(reason),
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
    let text = if text.is_empty() {
        text
    } else {
        format!("({text})")
    };
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
        self.check_index(&client)
            .await
            .map_err(ConnectorError::from)?;
        info!(connector_key = %self.key, url = %http::display(&self.base), index = %self.config.index, "connected");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the meilisearch sink was not opened"))?;
        let mut outcome = Outcome::default();
        let mut docs = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
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
                Err(reason) => outcome.reject(index, reason),
            }
        }
        let mut chunks = VecDeque::new();
        let mut docs = docs.into_iter().peekable();
        while docs.peek().is_some() {
            chunks.push_back(
                docs.by_ref()
                    .take(self.config.batch_size)
                    .collect::<Vec<_>>(),
            );
        }
        while !outcome.stopped()
            && let Some(mut chunk) = chunks.pop_front()
        {
            let indexes = chunk.iter().map(|doc| doc.index);
            match self.store(client, &chunk).await {
                Ok(()) => outcome.durable(indexes),
                // A task fails whole: its halves, in its place, tell which
                // document Meilisearch refuses.
                Err(Failure::Refused(_)) if chunk.len() > 1 => {
                    let second = chunk.split_off(chunk.len() / 2);
                    chunks.push_front(second);
                    chunks.push_front(chunk);
                }
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
