//! `elasticsearch` source: documents of an Elasticsearch (8/9) or OpenSearch (2)
//! index into Iggy, in `timestamp_field` order.
//!
//! Reading: a point in time (PIT) is opened on the index and paged with
//! `search_after` on (`timestamp_field`, a tie-breaker: `_shard_doc` on
//! Elasticsearch, `_id` on OpenSearch), `batch_size` hits per poll; a PIT
//! does not expire mid-read the way a scroll does (an expired one is opened
//! again from the cursor). Once a page comes back short the source is caught
//! up: the PIT is closed and the next poll, `polling_interval` later, opens a
//! new one to see new documents.
//!
//! The cursor is the last timestamp emitted plus the ids already emitted at
//! that timestamp (so documents sharing it are neither lost nor repeated across
//! restarts). It lives only in the engine's state, returned with each batch and
//! saved before `commit`; there is no file of the source's own (upstream's
//! `state` table is accepted and ignored, fixing upstream #3899). Each record's
//! Iggy id is a hash of (index, `_id`), the same on every replay.
//!
//! Limit: a document indexed later with a timestamp older than the cursor is
//! never read (the cursor only moves forward).

use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{debug, info};

use crate::connectors::kit::http::{ClientOptions, HttpClient, StatusClass, classify, error_chain};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch, SourceEntry,
    decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "elasticsearch",
    feature: "elasticsearch-source",
    description: "reads an Elasticsearch or OpenSearch index in timestamp order (PIT + search_after)",
    secret_fields: &["password", "api_key"],
    sample_config: "url = \"http://localhost:9200\"\nindex = \"logs\"\ntimestamp_field = \"@timestamp\"\npolling_interval = \"10s\"\nbatch_size = 100\n# api_key wins when both are set\napi_key = \"secret-encoded-key\"\nusername = \"elastic\"\npassword = \"secret-password\"\n",
    config_schema: schema_of::<ElasticsearchSourceConfig>,
    build: |config| {
        Ok(Box::new(ElasticsearchSource::new(parse_plugin_config(
            config,
        )?)?))
    },
};
inventory::submit!(ENTRY);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ElasticsearchSourceConfig {
    /// Base URL of the cluster (http or https).
    pub url: String,
    /// The index (or alias, or pattern) to read.
    pub index: String,
    /// Basic auth user (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic auth password.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub password: Option<SecretString>,
    /// An API key in its encoded form, sent as `Authorization: ApiKey ...`;
    /// when set, `username`/`password` are not sent.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub api_key: Option<SecretString>,
    /// A query DSL object restricting the documents read (default: all).
    #[serde(default)]
    pub query: Option<Value>,
    /// Wait between polls once caught up.
    #[serde(default = "default_polling_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub polling_interval: Duration,
    /// Documents per poll (one search request).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// The field documents are read in order of (a date or a number).
    #[serde(default = "default_timestamp_field")]
    pub timestamp_field: String,
    /// How long the cluster keeps a point in time between two polls.
    #[serde(default = "default_pit_keep_alive", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub pit_keep_alive: Duration,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Upstream's scroll timeout: accepted, unused (a point in time replaces scrolls).
    #[serde(default)]
    pub scroll_timeout: Option<String>,
    /// Upstream's plugin-side state file settings: accepted and ignored (the
    /// cursor lives in the engine's state only).
    #[serde(default)]
    pub state: Option<Value>,
    /// PEM file of CA certificates trusted besides the built-in roots.
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Accept any TLS certificate (development only).
    #[serde(default)]
    pub tls_danger_accept_invalid_certs: bool,
}

fn default_polling_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_batch_size() -> usize {
    100
}

fn default_timestamp_field() -> String {
    "@timestamp".into()
}

fn default_pit_keep_alive() -> Duration {
    Duration::from_secs(60)
}

fn default_timeout_seconds() -> u64 {
    30
}

/// Where reading resumes: after `timestamp` (the sort value, epoch ms for a
/// date), skipping the `ids` already emitted at exactly that timestamp.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    pub timestamp: Option<Value>,
    pub ids: Vec<String>,
}

/// An open point in time and where the last page of it ended.
struct Session {
    pit: String,
    /// The cursor this session continues from (its pages follow it).
    cursor: Cursor,
    after: Option<Vec<Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    Elasticsearch,
    OpenSearch,
}

pub struct ElasticsearchSource {
    config: ElasticsearchSourceConfig,
    base: reqwest::Url,
    client_options: ClientOptions,
    client: Option<HttpClient>,
    flavor: Flavor,
    committed: Mutex<Cursor>,
    /// The cursor after each batch polled and not yet committed, oldest first.
    staged: Mutex<VecDeque<Cursor>>,
    session: tokio::sync::Mutex<Option<Session>>,
    key: String,
}

impl ElasticsearchSource {
    pub fn new(config: ElasticsearchSourceConfig) -> Result<Self, PluginConfigError> {
        let base = crate::connectors::elasticsearch::base_url(&config.url)?;
        if config.index.is_empty() {
            return Err(PluginConfigError::new("index", "expected an index name"));
        }
        if config.batch_size == 0 || config.batch_size > 10_000 {
            return Err(PluginConfigError::new(
                "batch_size",
                "expected 1 to 10000 (the cluster's index.max_result_window)",
            ));
        }
        if config.timestamp_field.is_empty() {
            return Err(PluginConfigError::new(
                "timestamp_field",
                "expected a field name",
            ));
        }
        if config
            .query
            .as_ref()
            .is_some_and(|query| !query.is_object())
        {
            return Err(PluginConfigError::new(
                "query",
                "expected a query DSL object such as {\"match_all\": {}}",
            ));
        }
        if config.pit_keep_alive < Duration::from_secs(1) {
            return Err(PluginConfigError::new(
                "pit_keep_alive",
                "expected at least 1s",
            ));
        }
        let auth = crate::connectors::elasticsearch::auth(
            config.api_key.as_ref(),
            config.username.as_ref(),
            config.password.as_ref(),
        )?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let client_options = ClientOptions {
            timeout: Duration::from_secs(config.timeout_seconds.max(1)),
            ca_file: config.tls_ca_file.clone(),
            accept_invalid_certs: config.tls_danger_accept_invalid_certs,
            auth,
            headers,
            ..ClientOptions::default()
        };
        Ok(Self {
            config,
            base,
            client_options,
            client: None,
            flavor: Flavor::Elasticsearch,
            committed: Mutex::new(Cursor::default()),
            staged: Mutex::new(VecDeque::new()),
            session: tokio::sync::Mutex::new(None),
            key: "elasticsearch".into(),
        })
    }

    fn client(&self) -> Result<&HttpClient, ConnectorError> {
        self.client
            .as_ref()
            .ok_or_else(|| ConnectorError::fatal("the elasticsearch source was not opened"))
    }

    /// One request; its JSON answer, or an error classified for the engine.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, CallError> {
        let client = self.client().map_err(CallError::Connector)?;
        let url = self
            .base
            .join(path)
            .map_err(|error| CallError::Connector(ConnectorError::fatal(error.to_string())))?;
        let request = match body {
            Some(body) => client.request(method, url, Bytes::from(body.to_string())),
            None => client.empty(method, url),
        };
        let response = request.send().await.map_err(|error| {
            CallError::Connector(ConnectorError::transient(format!(
                "{path}: {}",
                error_chain(&error.without_url())
            )))
        })?;
        let status = response.status().as_u16();
        let answer: Value = response
            .bytes()
            .await
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        if (200..300).contains(&status) {
            return Ok(answer);
        }
        let kind = answer["error"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let reason = format!(
            "{path} answered {status} {kind}: {}",
            answer["error"]["reason"].as_str().unwrap_or_default()
        );
        if kind == "search_context_missing_exception" {
            return Err(CallError::PitGone);
        }
        Err(CallError::Connector(match status {
            401 => ConnectorError::fatal(format!("{reason}; check username/password or api_key")),
            403 => ConnectorError::fatal(format!(
                "{reason}; the credentials need the read privilege on index {}",
                self.config.index
            )),
            404 if kind == "index_not_found_exception" => ConnectorError::transient(format!(
                "{reason}; waiting for index {} to exist",
                self.config.index
            )),
            _ => match classify(status) {
                StatusClass::Transient => ConnectorError::transient(reason),
                StatusClass::Permanent => {
                    ConnectorError::fatal(format!("{reason}; check query and timestamp_field"))
                }
            },
        }))
    }

    async fn open_pit(&self) -> Result<String, ConnectorError> {
        let keep_alive = keep_alive(self.config.pit_keep_alive);
        let index = &self.config.index;
        let (path, field) = match self.flavor {
            Flavor::Elasticsearch => (format!("{index}/_pit?keep_alive={keep_alive}"), "id"),
            Flavor::OpenSearch => (
                format!("{index}/_search/point_in_time?keep_alive={keep_alive}"),
                "pit_id",
            ),
        };
        let answer = self
            .call(reqwest::Method::POST, &path, None)
            .await
            .map_err(CallError::into_connector)?;
        answer[field]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| ConnectorError::transient(format!("{path}: no {field} in the answer")))
    }

    async fn close_pit(&self, pit: String) {
        let closed = match self.flavor {
            Flavor::Elasticsearch => {
                self.call(reqwest::Method::DELETE, "_pit", Some(json!({"id": pit})))
                    .await
            }
            Flavor::OpenSearch => {
                self.call(
                    reqwest::Method::DELETE,
                    "_search/point_in_time",
                    Some(json!({"pit_id": [pit]})),
                )
                .await
            }
        };
        if let Err(error) = closed {
            debug!(connector_key = %self.key, error = %error.into_connector(), "closing the point in time failed; it expires by itself");
        }
    }

    fn search_body(&self, session: &Session) -> Value {
        let field = &self.config.timestamp_field;
        let tie_breaker = match self.flavor {
            Flavor::Elasticsearch => "_shard_doc",
            Flavor::OpenSearch => "_id",
        };
        let mut filters = Vec::new();
        if let Some(query) = &self.config.query {
            filters.push(query.clone());
        }
        if let Some(timestamp) = &session.cursor.timestamp {
            filters.push(json!({"range": {field.as_str(): {"gte": timestamp}}}));
        }
        let mut body = json!({
            "size": self.config.batch_size,
            "query": {"bool": {"filter": filters}},
            "sort": [{field.as_str(): "asc"}, {tie_breaker: "asc"}],
            "pit": {"id": session.pit, "keep_alive": keep_alive(self.config.pit_keep_alive)},
            "track_total_hits": false,
        });
        if let Some(after) = &session.after {
            body["search_after"] = Value::Array(after.clone());
        }
        body
    }

    /// The next page from `cursor`, and the cursor after it.
    async fn page(
        &self,
        cursor: &Cursor,
    ) -> Result<(Vec<SourceRecord>, Cursor, bool), ConnectorError> {
        let mut session = self.session.lock().await;
        if session
            .as_ref()
            .is_some_and(|session| &session.cursor != cursor)
        {
            // Rewound or restarted: the open PIT's position is not this cursor's.
            if let Some(old) = session.take() {
                self.close_pit(old.pit).await;
            }
        }
        loop {
            if session.is_none() {
                *session = Some(Session {
                    pit: self.open_pit().await?,
                    cursor: cursor.clone(),
                    after: None,
                });
            }
            let Some(current) = session.as_mut() else {
                continue;
            };
            let body = self.search_body(current);
            let answer = match self
                .call(reqwest::Method::POST, "_search", Some(body))
                .await
            {
                Ok(answer) => answer,
                Err(CallError::PitGone) => {
                    info!(connector_key = %self.key, "the point in time expired; opening a new one at the cursor");
                    *session = None;
                    // The new PIT starts at this poll's cursor (its
                    // `search_after` belonged to the expired one).
                    continue;
                }
                Err(CallError::Connector(error)) => return Err(error),
            };
            if let Some(pit) = answer["pit_id"].as_str() {
                current.pit = pit.to_owned();
            }
            let hits = answer["hits"]["hits"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let full = hits.len() >= self.config.batch_size;
            let mut next = current.cursor.clone();
            let mut records = Vec::with_capacity(hits.len());
            for hit in &hits {
                let id = hit["_id"].as_str().unwrap_or_default().to_owned();
                let sort = hit["sort"].as_array().cloned().unwrap_or_default();
                let timestamp = sort.first().cloned().unwrap_or(Value::Null);
                current.after = Some(sort);
                if next.timestamp.as_ref() == Some(&timestamp) {
                    if next.ids.contains(&id) {
                        continue;
                    }
                    next.ids.push(id.clone());
                } else {
                    next.timestamp = Some(timestamp);
                    next.ids = vec![id.clone()];
                }
                let index = hit["_index"].as_str().unwrap_or(&self.config.index);
                let source = hit.get("_source").cloned().unwrap_or(Value::Null);
                records
                    .push(SourceRecord::new(Payload::Json(source)).with_id(record_id(index, &id)));
            }
            current.cursor = next.clone();
            if !full && let Some(done) = session.take() {
                self.close_pit(done.pit).await;
            }
            return Ok((records, next, full));
        }
    }

    fn lock_staged(&self) -> MutexGuard<'_, VecDeque<Cursor>> {
        lock(&self.staged)
    }
}

enum CallError {
    PitGone,
    Connector(ConnectorError),
}

impl CallError {
    fn into_connector(self) -> ConnectorError {
        match self {
            CallError::PitGone => ConnectorError::transient("the point in time expired"),
            CallError::Connector(error) => error,
        }
    }
}

fn keep_alive(duration: Duration) -> String {
    format!("{}s", duration.as_secs().max(1))
}

/// A stable id for a document: FNV-1a (128 bit) of its index and `_id`.
fn record_id(index: &str, id: &str) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut hash = OFFSET;
    for byte in index.bytes().chain([0]).chain(id.bytes()) {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash.max(1)
}

#[async_trait]
impl Source for ElasticsearchSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            *lock(&self.committed) = decode_state::<Cursor>(bytes)?;
        }
        self.client = Some(
            HttpClient::new(&self.client_options)
                .map_err(|error| ConnectorError::fatal(error.to_string()))?,
        );
        let about = self
            .call(reqwest::Method::GET, "", None)
            .await
            .map_err(CallError::into_connector)?;
        self.flavor = if about["version"]["distribution"] == "opensearch" {
            Flavor::OpenSearch
        } else {
            Flavor::Elasticsearch
        };
        info!(connector_key = %self.key, url = %self.base, flavor = ?self.flavor, version = about["version"]["number"].as_str().unwrap_or("unknown"), "connected");
        Ok(())
    }

    /// The next page after the newest cursor that holds new documents (a
    /// full page of documents already read, after a point in time was
    /// opened again, is followed by the next one). A short page (the source
    /// is caught up) asks the engine to search again `polling_interval`
    /// after this poll began.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let started = tokio::time::Instant::now();
        let cursor = self
            .lock_staged()
            .back()
            .cloned()
            .unwrap_or_else(|| lock(&self.committed).clone());
        let (records, next, full) = loop {
            let (records, next, full) = self.page(&cursor).await?;
            if !records.is_empty() || !full {
                break (records, next, full);
            }
        };
        let next_poll = (!full).then(|| started + self.config.polling_interval);
        // Staged even when empty: each poll's batch is committed by one
        // `commit`, in order.
        let state = (!records.is_empty())
            .then(|| encode_state(&next))
            .transpose()?;
        self.lock_staged().push_back(next);
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            next_poll,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        if let Some(cursor) = self.lock_staged().pop_front() {
            *lock(&self.committed) = cursor;
        }
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        crate::config::connector::MAX_IN_FLIGHT as usize
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.lock_staged().clear();
        if let Some(session) = self.session.lock().await.take() {
            self.close_pit(session.pit).await;
        }
        self.client = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_upstreams_fields_when_parsed_should_accept_them_with_upstream_defaults() {
        let config: ElasticsearchSourceConfig = parse_plugin_config(&json!({
            "url": "http://localhost:9200",
            "index": "test_documents",
            "polling_interval": "100ms",
            "batch_size": 100,
            "timestamp_field": "timestamp",
            "scroll_timeout": "1m",
            "query": {"match_all": {}},
            "state": {"enabled": true, "storage_type": "file", "storage_config": {"base_path": "./s"}},
        }))
        .unwrap();
        ElasticsearchSource::new(config).unwrap();
        let defaults: ElasticsearchSourceConfig =
            parse_plugin_config(&json!({"url": "http://h:9200", "index": "i"})).unwrap();
        assert_eq!(defaults.polling_interval, Duration::from_secs(10));
        assert_eq!(defaults.batch_size, 100);
        assert_eq!(defaults.timestamp_field, "@timestamp");
    }

    #[test]
    fn given_bad_values_when_built_should_name_the_field() {
        for (config, field) in [
            (json!({"url": "ftp://h", "index": "i"}), "url"),
            (
                json!({"url": "http://h", "index": "i", "batch_size": 0}),
                "batch_size",
            ),
            (
                json!({"url": "http://h", "index": "i", "query": "x"}),
                "query",
            ),
            (
                json!({"url": "http://h", "index": "i", "username": "u"}),
                "password",
            ),
        ] {
            let parsed: ElasticsearchSourceConfig = parse_plugin_config(&config).unwrap();
            let error = ElasticsearchSource::new(parsed).err().unwrap();
            assert_eq!(error.field, field);
        }
    }

    #[test]
    fn given_documents_when_hashed_should_give_stable_distinct_ids() {
        assert_eq!(record_id("i", "a"), record_id("i", "a"));
        assert_ne!(record_id("i", "a"), record_id("i", "b"));
        assert_ne!(record_id("ia", ""), record_id("i", "a"));
    }
}
