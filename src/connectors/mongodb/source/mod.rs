//! `mongodb` source: polls a collection and produces one record per document
//! (its relaxed Extended JSON as the JSON payload).
//!
//! At-least-once: `poll` reads and stages; only `commit` (the batch is in Iggy
//! and its state is saved) moves the in-memory cursor and deletes or marks the
//! delivered documents. A NACK retries the same batch without a new poll; a
//! crash re-reads from the last saved cursor, or from the documents still
//! there (delete and mark mode), so nothing is skipped.
//!
//! The cursor is `(tracking value, _id)`: with a non-unique tracking field
//! (`updated_at`) `_id` breaks ties, so documents sharing a tracking value
//! across a batch boundary are all read. In cursor mode documents without the
//! tracking field are not read (they would sort first forever).
//!
//! `mode = "change_stream"` reads the collection's change stream instead:
//! one record per change event (MongoDB's event document: `operationType`,
//! `documentKey`, `fullDocument` looked up for updates, `updateDescription`,
//! ...), the resume token of the last delivered event as the state, moved on
//! commit; a restart or a failed read resumes after the committed token.
//! Its lag is the age of the last committed change's cluster time (see
//! [`lag`]).

mod config;
mod lag;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::ResumeToken;
use mongodb::error::Error as DriverError;
use mongodb::options::FullDocumentType;
use mongodb::{Client, Collection};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use config::{MongoDbSourceConfig, MongoDbSourceMode, parse_value};

use crate::connectors::mongodb::{client, describe, is_auth_error, is_transient, ping};
use crate::connectors::{
    ConnectorError, LagProbe, Source, SourceBatch, SourceEntry, decode_state, encode_state,
    parse_plugin_config, schema_of,
};
use crate::message::{Payload, SourceRecord};

/// How long `open` waits for the server before leaving the checks to `poll`.
const OPEN_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

pub const ENTRY: SourceEntry = SourceEntry {
    name: "mongodb",
    feature: "mongodb-source",
    description: "reads documents of a MongoDB collection by polling a tracking field (cursor, delete or mark) or its change stream (resume token as state), at-least-once",
    secret_fields: &["connection_uri"],
    sample_config: "connection_uri = \"mongodb://app:secret@localhost:27017\"\ndatabase = \"app\"\ncollection = \"orders\"\ntracking_field = \"updated_at\"\npoll_interval = \"1s\"\n",
    config_schema: schema_of::<MongoDbSourceConfig>,
    build: |config| {
        let config: MongoDbSourceConfig = parse_plugin_config(config)?;
        config.validate()?;
        Ok(Box::new(MongoDbSource::new(config)?))
    },
};
inventory::submit!(ENTRY);

/// What the source persists after each batch: the cursor of the last
/// delivered document, as canonical Extended JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MongoDbState {
    /// The tracking value of the last delivered document.
    pub tracking_value: Option<String>,
    /// Its `_id`, which breaks ties.
    pub tracking_id: Option<String>,
    #[serde(default)]
    pub processed_documents: u64,
    /// `mode = "change_stream"`: the resume token of the last delivered change.
    #[serde(default)]
    pub resume_token: Option<String>,
}

pub struct MongoDbSource {
    config: MongoDbSourceConfig,
    filter: Document,
    initial_offset: Option<Bson>,
    client: Option<Client>,
    /// The state of the last committed batch: where the next poll starts.
    committed: Mutex<MongoDbState>,
    /// What each polled batch applies on commit, oldest first.
    staged: Mutex<VecDeque<Staged>>,
    /// `mode = "change_stream"`: the open stream, positioned after the last
    /// polled change (dropped on an error: reopened at the committed token).
    changes: tokio::sync::Mutex<Option<ChangeStream<Document>>>,
    /// `mode = "change_stream"`: the committed position its lag probe reads.
    position: lag::SharedPosition,
}

#[derive(Debug)]
struct Staged {
    state: MongoDbState,
    /// `_id`s of the delivered documents (delete and mark mode).
    ids: Vec<Bson>,
    /// Change stream: the cluster time of the batch's last change, in Unix
    /// milliseconds, and whether the poll read the stream to its end.
    cluster_time_ms: Option<u64>,
    at_end: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum MongoDbSourceError {
    #[error("invalid connection_uri: {}", describe(.0))]
    ConnectionUri(#[source] DriverError),
    #[error(
        "MongoDB refused the credentials of connection_uri for database {database}: {}; fix the user, password or authSource",
        describe(.source)
    )]
    Credentials {
        database: String,
        #[source]
        source: DriverError,
    },
    #[error("reading collection {collection} failed: {}", describe(.source))]
    Poll {
        collection: String,
        #[source]
        source: DriverError,
    },
    #[error("applying the committed batch to collection {collection} failed: {}", describe(.source))]
    Consume {
        collection: String,
        #[source]
        source: DriverError,
    },
    #[error("the saved cursor is not Extended JSON: {0}")]
    State(String),
    #[error("the source is not open")]
    NotOpen,
}

impl From<MongoDbSourceError> for ConnectorError {
    fn from(error: MongoDbSourceError) -> Self {
        let transient = match &error {
            MongoDbSourceError::Poll { source, .. }
            | MongoDbSourceError::Consume { source, .. } => is_transient(source),
            _ => false,
        };
        if transient {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

impl MongoDbSource {
    pub fn new(config: MongoDbSourceConfig) -> Result<Self, crate::connectors::PluginConfigError> {
        Ok(Self {
            filter: config.filter()?,
            initial_offset: config.initial_offset()?,
            config,
            client: None,
            committed: Mutex::new(MongoDbState::default()),
            staged: Mutex::new(VecDeque::new()),
            changes: tokio::sync::Mutex::new(None),
            position: lag::SharedPosition::default(),
        })
    }

    fn collection(&self) -> Result<Collection<Document>, MongoDbSourceError> {
        let client = self.client.as_ref().ok_or(MongoDbSourceError::NotOpen)?;
        Ok(client
            .database(&self.config.database)
            .collection(&self.config.collection))
    }

    /// Whether commits delete or mark documents (then polls start from what
    /// is left, not from the cursor).
    fn consumes(&self) -> bool {
        self.config.delete_after_read || self.config.processed_field.is_some()
    }

    fn failed(&self, source: DriverError) -> MongoDbSourceError {
        if is_auth_error(&source) {
            MongoDbSourceError::Credentials {
                database: self.config.database.clone(),
                source,
            }
        } else {
            MongoDbSourceError::Poll {
                collection: self.config.collection.clone(),
                source,
            }
        }
    }

    /// The query of the next poll from `base`: the filter, the processed
    /// flag, and (in cursor mode) past the cursor.
    fn query(&self, base: &MongoDbState) -> Result<Document, MongoDbSourceError> {
        let mut clauses = Vec::new();
        if !self.filter.is_empty() {
            clauses.push(self.filter.clone());
        }
        if let Some(field) = &self.config.processed_field {
            clauses.push(doc! { field: { "$ne": true } });
        }
        let field = self.config.tracking_field.as_str();
        if !self.consumes() {
            let value = base
                .tracking_value
                .as_deref()
                .map(parse_state)
                .transpose()?;
            let id = base.tracking_id.as_deref().map(parse_state).transpose()?;
            match (value.or_else(|| self.initial_offset.clone()), id) {
                (Some(value), _) if field == "_id" => {
                    clauses.push(doc! { "_id": { "$gt": value } })
                }
                (Some(value), Some(id)) => clauses.push(doc! { "$or": [
                    { field: { "$gt": value.clone() } },
                    { field: value, "_id": { "$gt": id } },
                ] }),
                (Some(value), None) => clauses.push(doc! { field: { "$gt": value } }),
                (None, _) => clauses.push(doc! { field: { "$exists": true } }),
            }
        }
        Ok(match clauses.len() {
            0 => Document::new(),
            1 => clauses.remove(0),
            _ => doc! { "$and": clauses },
        })
    }

    fn sort(&self) -> Document {
        match self.config.tracking_field.as_str() {
            "_id" => doc! { "_id": 1 },
            field => doc! { field: 1, "_id": 1 },
        }
    }

    fn lock_committed(&self) -> MutexGuard<'_, MongoDbState> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_staged(&self) -> MutexGuard<'_, VecDeque<Staged>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn apply(&self, ids: &[Bson]) -> Result<(), MongoDbSourceError> {
        if ids.is_empty() {
            return Ok(());
        }
        let collection = self.collection()?;
        let selected = doc! { "_id": { "$in": ids } };
        let applied = match &self.config.processed_field {
            Some(field) => collection
                .update_many(selected, doc! { "$set": { field: true } })
                .await
                .map(drop),
            None => collection.delete_many(selected).await.map(drop),
        };
        applied.map_err(|source| MongoDbSourceError::Consume {
            collection: self.config.collection.clone(),
            source,
        })
    }
}

impl MongoDbSource {
    /// Up to `batch_size` changes from the change stream, opened after the
    /// committed resume token when none is open.
    async fn poll_changes(&self, started: Instant) -> Result<SourceBatch, ConnectorError> {
        let base = self.lock_committed().clone();
        let mut changes = self.changes.lock().await;
        let stream = match changes.as_mut() {
            Some(stream) => stream,
            None => {
                let token = base.resume_token.as_deref().map(parse_token).transpose()?;
                let opened = self
                    .collection()?
                    .watch()
                    .full_document(FullDocumentType::UpdateLookup)
                    .max_await_time(self.config.poll_interval)
                    .batch_size(self.config.batch_size)
                    .resume_after(token)
                    .await
                    .map_err(|error| self.failed(error))?;
                changes.insert(opened.with_type::<Document>())
            }
        };
        let mut events = Vec::new();
        while events.len() < self.config.batch_size as usize {
            match stream.next_if_any().await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => break,
                Err(error) => {
                    // What it read of this batch is read again from the
                    // committed token.
                    *changes = None;
                    return Err(self.failed(error).into());
                }
            }
        }
        drop(changes);
        let at_end = events.len() < self.config.batch_size as usize;
        let cluster_time_ms = events
            .last()
            .and_then(|event| event.get("clusterTime"))
            .and_then(lag::cluster_time_ms);
        let mut next = base;
        if let Some(token) = events.last().and_then(|event| event.get("_id")) {
            next.resume_token = Some(state_text(token.clone()));
        }
        next.processed_documents += events.len() as u64;
        let records: Vec<SourceRecord> = events
            .into_iter()
            .map(|event| {
                SourceRecord::new(Payload::Json(Bson::Document(event).into_relaxed_extjson()))
            })
            .collect();
        let state = (!records.is_empty())
            .then(|| encode_state(&next))
            .transpose()?;
        debug!(
            changes = records.len(),
            "mongodb source polled a batch of changes"
        );
        self.lock_staged().push_back(Staged {
            state: next,
            ids: Vec::new(),
            cluster_time_ms,
            at_end,
        });
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            next_poll: at_end.then(|| started + self.config.poll_interval),
        })
    }
}

#[async_trait]
impl Source for MongoDbSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            let restored: MongoDbState = decode_state(bytes)?;
            for text in [&restored.tracking_value, &restored.tracking_id]
                .into_iter()
                .flatten()
            {
                parse_state(text)?;
            }
            if let Some(token) = &restored.resume_token {
                parse_token(token)?;
                self.position.lock().committed_ms = lag::token_time_ms(&parse_state(token)?);
            }
            info!(tracking_value = ?restored.tracking_value, tracking_id = ?restored.tracking_id, "mongodb source restored its cursor");
            *self.lock_committed() = restored;
        }
        self.client = Some(
            client(
                &self.config.connection_uri,
                self.config.max_pool_size,
                self.config.server_selection_timeout,
                "iggy-connect",
            )
            .await
            .map_err(MongoDbSourceError::ConnectionUri)?,
        );
        let client = self.client.as_ref().ok_or(MongoDbSourceError::NotOpen)?;
        match tokio::time::timeout(OPEN_CHECK_TIMEOUT, ping(client, &self.config.database)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) if is_auth_error(&error) => {
                return Err(self.failed(error).into());
            }
            Ok(Err(error)) => {
                warn!(error = %describe(&error), "mongodb source cannot reach the server yet; polls will retry")
            }
            Err(_) => warn!(
                "mongodb source: the server did not answer within {OPEN_CHECK_TIMEOUT:?}; polls will retry"
            ),
        }
        info!(database = %self.config.database, collection = %self.config.collection, tracking_field = %self.config.tracking_field, "mongodb source open");
        Ok(())
    }

    /// Up to a batch after the committed cursor (or from the change
    /// stream); less than a batch (caught up) asks the engine to poll again
    /// `poll_interval` after this poll began.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let started = Instant::now();
        if self.config.mode == MongoDbSourceMode::ChangeStream {
            return self.poll_changes(started).await;
        }
        let base = self.lock_committed().clone();
        let query = self.query(&base)?;
        let documents: Vec<Document> = self
            .collection()?
            .find(query)
            .sort(self.sort())
            .limit(i64::from(self.config.batch_size))
            .await
            .map_err(|error| self.failed(error))?
            .try_collect()
            .await
            .map_err(|error| self.failed(error))?;
        let next_poll = (documents.len() < self.config.batch_size as usize)
            .then(|| started + self.config.poll_interval);
        let mut next = base;
        if let Some(last) = documents.last() {
            next.tracking_value =
                field_of(last, &self.config.tracking_field).map(|value| state_text(value.clone()));
            next.tracking_id = last.get("_id").map(|id| state_text(id.clone()));
        }
        next.processed_documents += documents.len() as u64;
        let ids = if self.consumes() {
            documents
                .iter()
                .filter_map(|document| document.get("_id").cloned())
                .collect()
        } else {
            Vec::new()
        };
        let records: Vec<SourceRecord> = documents
            .into_iter()
            .map(|document| {
                SourceRecord::new(Payload::Json(
                    Bson::Document(document).into_relaxed_extjson(),
                ))
            })
            .collect();
        // Staged even when empty: each poll's batch is committed by one
        // `commit`, in order.
        let state = (!records.is_empty())
            .then(|| encode_state(&next))
            .transpose()?;
        if self.config.verbose_logging {
            info!(documents = records.len(), "mongodb source polled a batch");
        } else {
            debug!(documents = records.len(), "mongodb source polled a batch");
        }
        self.lock_staged().push_back(Staged {
            state: next,
            ids,
            cluster_time_ms: None,
            at_end: false,
        });
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            next_poll,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        // The batch stays staged while it is applied; a failure leaves it for
        // the engine's retry.
        let Some(ids) = self.lock_staged().front().map(|oldest| oldest.ids.clone()) else {
            return Ok(());
        };
        self.apply(&ids).await?;
        let mut staged = self.lock_staged();
        if let Some(oldest) = staged.pop_front() {
            *self.lock_committed() = oldest.state;
            let mut position = self.position.lock();
            position.committed_ms = oldest.cluster_time_ms.or(position.committed_ms);
            position.at_end = oldest.at_end && staged.is_empty();
        }
        Ok(())
    }

    fn lag_probe(&self) -> Option<Arc<dyn LagProbe>> {
        let client = self.client.as_ref()?;
        (self.config.mode == MongoDbSourceMode::ChangeStream).then(|| {
            Arc::new(lag::ChangeStreamLag {
                client: client.clone(),
                position: self.position.clone(),
            }) as Arc<dyn LagProbe>
        })
    }

    fn destructive(&self) -> bool {
        self.config.delete_after_read
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        *self.changes.get_mut() = None;
        if let Some(client) = self.client.take() {
            client.shutdown().await;
        }
        Ok(())
    }
}

/// The value at a dotted `path` of `document`.
fn field_of<'a>(document: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut value = document.get(parts.next()?)?;
    for part in parts {
        value = value.as_document()?.get(part)?;
    }
    Some(value)
}

fn state_text(value: Bson) -> String {
    value.into_canonical_extjson().to_string()
}

/// A saved resume token (its canonical Extended JSON).
fn parse_token(text: &str) -> Result<ResumeToken, MongoDbSourceError> {
    let value = parse_state(text)?;
    mongodb::bson::from_bson(value)
        .map_err(|error| MongoDbSourceError::State(format!("resume token: {error}")))
}

fn parse_state(text: &str) -> Result<Bson, MongoDbSourceError> {
    serde_json::from_str::<serde_json::Value>(text)
        .map_err(|error| MongoDbSourceError::State(error.to_string()))
        .and_then(|json| {
            Bson::try_from(json).map_err(|error| MongoDbSourceError::State(error.to_string()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_cursor_values_when_saved_should_read_back_the_same_bson() {
        for value in [
            Bson::Int64(1 << 40),
            Bson::Int32(3),
            Bson::String("x".into()),
            Bson::DateTime(mongodb::bson::DateTime::from_millis(1_700_000_000_123)),
            Bson::ObjectId(mongodb::bson::oid::ObjectId::new()),
        ] {
            assert_eq!(parse_state(&state_text(value.clone())).unwrap(), value);
        }
    }

    #[test]
    fn given_dotted_paths_when_read_should_walk_subdocuments() {
        let document = doc! { "a": { "b": 5 }, "c": 1 };
        assert_eq!(field_of(&document, "a.b"), Some(&Bson::Int32(5)));
        assert_eq!(field_of(&document, "c"), Some(&Bson::Int32(1)));
        assert_eq!(field_of(&document, "a.x"), None);
    }
}
