//! `mongodb` sink: writes messages as upstream's documents, idempotently.
//!
//! Identity: `_id = "{stream}:{topic}:{partition}:{message_id}"` (upstream's).
//! Batches go out as unordered `insert_many` commands of `batch_size`
//! documents. A duplicate key (11000) on `_id` is a replay of a message
//! already stored and counts as written; a duplicate key whose `_id` is not in
//! the collection came from another unique index and the document is rejected
//! by its index (the sink looks the ids up to tell the two apart, which
//! upstream did not: it counted every 11000 as written). Other per-document
//! errors are rejections; write-concern errors, the driver's retry labels,
//! network, pool and server-selection errors are transient; bad credentials
//! are fatal.
//!
//! `write_mode = "upsert" | "replace"` (ours) keeps one document per entity:
//! `_id` is the payload's `key_field`, written by an ordered `update` command
//! with `upsert: true` (`$set` of the sink's fields, or a whole replacement),
//! so the last message of an entity wins and a replay rewrites the same state.

mod config;
mod document;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::{Client, Collection};
use tracing::{debug, info, warn};

pub use config::{MongoDbSinkConfig, PayloadFormat, WriteMode};
pub use document::{Layout, message_id};

use crate::connectors::mongodb::{
    DUPLICATE_KEY, client, describe, is_auth_error, is_transient,
    is_transient_code, ping,
};
use crate::connectors::{
    ConnectorError, Rejection, Sink, SinkEntry, SinkError, parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

/// How long `open` waits for the server before leaving the checks to `write`.
const OPEN_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The server's code for "the collection already exists".
const NAMESPACE_EXISTS: i32 = 48;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "mongodb",
    feature: "mongodb-sink",
    description: "writes messages to a MongoDB collection, idempotently (_id from the message identity), or upserts one document per entity",
    secret_fields: &["connection_uri"],
    sample_config: "connection_uri = \"mongodb://app:secret@localhost:27017\"\ndatabase = \"iggy\"\ncollection = \"messages\"\npayload_format = \"json\"\nauto_create_collection = true\n",
    config_schema: schema_of::<MongoDbSinkConfig>,
    build: |config| {
        let config: MongoDbSinkConfig = parse_plugin_config(config)?;
        config.validate()?;
        Ok(Box::new(MongoDbSink::new(config)))
    },
};

pub struct MongoDbSink {
    config: MongoDbSinkConfig,
    layout: Layout,
    client: Option<Client>,
    /// The collection is known to exist (created or checked).
    ready: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum MongoDbSinkError {
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
    #[error("cannot prepare collection {collection}: {}", describe(.source))]
    Prepare {
        collection: String,
        #[source]
        source: DriverError,
    },
    #[error("writing to collection {collection} failed: {}", describe(.source))]
    Write {
        collection: String,
        #[source]
        source: DriverError,
    },
    #[error("writing to collection {collection} failed: {reason}")]
    WriteTransient { collection: String, reason: String },
    #[error("the sink is not open")]
    NotOpen,
}

impl MongoDbSinkError {
    fn is_transient(&self) -> bool {
        match self {
            Self::Prepare { source, .. } | Self::Write { source, .. } => is_transient(source),
            Self::WriteTransient { .. } => true,
            _ => false,
        }
    }
}

impl From<MongoDbSinkError> for SinkError {
    fn from(error: MongoDbSinkError) -> Self {
        if error.is_transient() {
            SinkError::transient(error)
        } else {
            SinkError::fatal(error)
        }
    }
}

impl From<MongoDbSinkError> for ConnectorError {
    fn from(error: MongoDbSinkError) -> Self {
        if error.is_transient() {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

impl MongoDbSink {
    pub fn new(config: MongoDbSinkConfig) -> Self {
        Self {
            layout: Layout::new(&config),
            config,
            client: None,
            ready: AtomicBool::new(false),
        }
    }

    fn collection(&self) -> Result<Collection<Document>, MongoDbSinkError> {
        let client = self.client.as_ref().ok_or(MongoDbSinkError::NotOpen)?;
        Ok(client
            .database(&self.config.database)
            .collection(&self.config.collection))
    }

    /// A driver error of a write or a check, with bad credentials told apart.
    fn failed(&self, source: DriverError) -> MongoDbSinkError {
        if is_auth_error(&source) {
            MongoDbSinkError::Credentials {
                database: self.config.database.clone(),
                source,
            }
        } else {
            MongoDbSinkError::Write {
                collection: self.config.collection.clone(),
                source,
            }
        }
    }

    /// Checks the server answers with these credentials and creates the
    /// collection when `auto_create_collection` asks for it.
    async fn prepare(&self) -> Result<(), MongoDbSinkError> {
        if self.ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        let client = self.client.as_ref().ok_or(MongoDbSinkError::NotOpen)?;
        let prepare_error = |source: DriverError| {
            if is_auth_error(&source) {
                self.failed(source)
            } else {
                MongoDbSinkError::Prepare {
                    collection: self.config.collection.clone(),
                    source,
                }
            }
        };
        ping(client, &self.config.database)
            .await
            .map_err(prepare_error)?;
        if self.config.auto_create_collection {
            let database = client.database(&self.config.database);
            let existing = database
                .list_collection_names()
                .filter(doc! { "name": &self.config.collection })
                .await
                .map_err(prepare_error)?;
            if !existing.contains(&self.config.collection) {
                match database.create_collection(&self.config.collection).await {
                    Ok(()) => info!(collection = %self.config.collection, "mongodb sink created the collection"),
                    Err(error) if command_code(&error) == Some(NAMESPACE_EXISTS) => {}
                    Err(error) => return Err(prepare_error(error)),
                }
            }
        }
        self.ready.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Inserts every chunk unordered; returns the refused messages' rejections.
    async fn insert(
        &self,
        documents: &[Document],
        positions: &[usize],
    ) -> Result<Vec<Rejection>, MongoDbSinkError> {
        let collection = self.collection()?;
        let chunk = self.config.batch_size as usize;
        let mut duplicates = Vec::new();
        let mut refused = Vec::new();
        for (number, part) in documents.chunks(chunk).enumerate() {
            let base = number * chunk;
            let error = match collection.insert_many(part).ordered(false).await {
                Ok(_) => continue,
                Err(error) => error,
            };
            let ErrorKind::InsertMany(insert) = error.kind.as_ref() else {
                return Err(self.failed(error));
            };
            if let Some(concern) = &insert.write_concern_error {
                return Err(self.transient(format!(
                    "write concern not satisfied: {} (code {})",
                    concern.message, concern.code
                )));
            }
            for write in insert.write_errors.iter().flatten() {
                let index = base + write.index;
                if index >= documents.len() {
                    return Err(self.transient(format!(
                        "the server named document {index} of a batch of {}",
                        documents.len()
                    )));
                }
                if write.code == DUPLICATE_KEY {
                    duplicates.push(index);
                } else if is_transient_code(write.code) {
                    return Err(self.transient(format!("{} (code {})", write.message, write.code)));
                } else {
                    refused.push(Rejection {
                        index: positions[index],
                        reason: format!(
                            "collection {} refused the document: {} (code {})",
                            self.config.collection, write.message, write.code
                        ),
                    });
                }
            }
        }
        if !duplicates.is_empty() {
            refused.extend(self.foreign_duplicates(documents, positions, &duplicates).await?);
        }
        Ok(refused)
    }

    /// Of the documents refused as duplicate keys, those whose `_id` is not in
    /// the collection: they clash on another unique index and are rejected.
    /// The others are copies of messages stored before (a replay).
    async fn foreign_duplicates(
        &self,
        documents: &[Document],
        positions: &[usize],
        duplicates: &[usize],
    ) -> Result<Vec<Rejection>, MongoDbSinkError> {
        let ids: Vec<Bson> = duplicates
            .iter()
            .filter_map(|&index| documents[index].get("_id").cloned())
            .collect();
        let stored: HashSet<String> = self
            .collection()?
            .find(doc! { "_id": { "$in": ids } })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(|error| self.failed(error))?
            .try_collect::<Vec<Document>>()
            .await
            .map_err(|error| self.failed(error))?
            .into_iter()
            .filter_map(|document| document.get("_id").map(Bson::to_string))
            .collect();
        Ok(duplicates
            .iter()
            .filter(|&&index| {
                documents[index]
                    .get("_id")
                    .is_none_or(|id| !stored.contains(&id.to_string()))
            })
            .map(|&index| Rejection {
                index: positions[index],
                reason: format!(
                    "collection {} refused the document: a duplicate key on a unique index other than _id",
                    self.config.collection
                ),
            })
            .collect())
    }

    /// Upserts every document in order, one `update` command per chunk; stops
    /// at the first refused document and returns its rejection (the engine
    /// writes the rest again).
    async fn upsert(
        &self,
        documents: Vec<Document>,
        positions: &[usize],
    ) -> Result<Vec<Rejection>, MongoDbSinkError> {
        let client = self.client.as_ref().ok_or(MongoDbSinkError::NotOpen)?;
        let database = client.database(&self.config.database);
        let chunk = self.config.batch_size as usize;
        let mut documents = documents.into_iter();
        let mut base = 0;
        loop {
            let updates: Vec<Document> = documents
                .by_ref()
                .take(chunk)
                .map(|mut document| {
                    // A replacement keeps its `_id` (the same as the query's,
                    // which the server accepts); `$set` may not name it.
                    let (id, update) = match self.config.write_mode {
                        WriteMode::Upsert => {
                            let id = document.remove("_id").unwrap_or(Bson::Null);
                            (id, doc! { "$set": document })
                        }
                        _ => (document.get("_id").cloned().unwrap_or(Bson::Null), document),
                    };
                    doc! { "q": { "_id": id }, "u": update, "upsert": true }
                })
                .collect();
            if updates.is_empty() {
                return Ok(Vec::new());
            }
            let count = updates.len();
            let answer = database
                .run_command(doc! {
                    "update": &self.config.collection,
                    "updates": updates,
                    "ordered": true,
                })
                .await
                .map_err(|error| self.failed(error))?;
            if let Ok(concern) = answer.get_document("writeConcernError") {
                return Err(self.transient(format!(
                    "write concern not satisfied: {}",
                    concern.get_str("errmsg").unwrap_or_default()
                )));
            }
            if let Some(write) = answer
                .get_array("writeErrors")
                .ok()
                .and_then(|errors| errors.first())
                .and_then(Bson::as_document)
            {
                let code = write.get_i32("code").unwrap_or_default();
                let message = write.get_str("errmsg").unwrap_or_default();
                if is_transient_code(code) {
                    return Err(self.transient(format!("{message} (code {code})")));
                }
                let index = write
                    .get_i32("index")
                    .ok()
                    .and_then(|index| usize::try_from(index).ok())
                    .filter(|&index| index < count)
                    .ok_or_else(|| self.transient(format!("an unattributed write error: {message}")))?;
                return Ok(vec![Rejection {
                    index: positions[base + index],
                    reason: format!(
                        "collection {} refused the document: {message} (code {code})",
                        self.config.collection
                    ),
                }]);
            }
            base += count;
        }
    }

    fn transient(&self, reason: String) -> MongoDbSinkError {
        MongoDbSinkError::WriteTransient {
            collection: self.config.collection.clone(),
            reason,
        }
    }
}

#[async_trait]
impl Sink for MongoDbSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let client = client(
            &self.config.connection_uri,
            self.config.max_pool_size,
            self.config.server_selection_timeout,
            "iggy-connect",
        )
        .await
        .map_err(MongoDbSinkError::ConnectionUri)?;
        self.client = Some(client);
        // Bad credentials fail the start; an unreachable server does not:
        // writes retry until it is back.
        match tokio::time::timeout(OPEN_CHECK_TIMEOUT, self.prepare()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) if !error.is_transient() => return Err(error.into()),
            Ok(Err(error)) => {
                warn!(%error, "mongodb sink cannot reach the server yet; writes will retry")
            }
            Err(_) => warn!(
                "mongodb sink: the server did not answer within {OPEN_CHECK_TIMEOUT:?}; writes will retry"
            ),
        }
        info!(
            database = %self.config.database,
            collection = %self.config.collection,
            write_mode = ?self.config.write_mode,
            payload_format = ?self.config.payload_format,
            "mongodb sink open"
        );
        Ok(())
    }

    /// Binary and string payloads are the stored bytes; JSON is parsed once
    /// either way.
    fn accepts_json_bytes(&self) -> bool {
        true
    }

    /// Inserted documents do not depend on each other; upserts of one entity
    /// must land in order.
    fn writes_concurrently(&self) -> bool {
        self.config.write_mode == WriteMode::Insert
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if messages.is_empty() {
            return Ok(());
        }
        self.prepare().await?;
        let mut documents = Vec::with_capacity(messages.len());
        let mut positions = Vec::with_capacity(messages.len());
        let mut rejected = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match self.layout.document(topic, message) {
                Ok(document) => {
                    documents.push(document);
                    positions.push(index);
                }
                Err(reason) => rejected.push(Rejection { index, reason }),
            }
        }
        if !rejected.is_empty() {
            return Err(SinkError::Rejected(rejected));
        }
        let refused = match self.config.write_mode {
            WriteMode::Insert => self.insert(&documents, &positions).await?,
            WriteMode::Upsert | WriteMode::Replace => self.upsert(documents, &positions).await?,
        };
        if !refused.is_empty() {
            return Err(SinkError::Rejected(refused));
        }
        if self.config.verbose_logging {
            info!(collection = %self.config.collection, messages = messages.len(), "mongodb sink wrote a batch");
        } else {
            debug!(collection = %self.config.collection, messages = messages.len(), "mongodb sink wrote a batch");
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        if let Some(client) = self.client.take() {
            client.shutdown().await;
        }
        Ok(())
    }
}

/// The server's error code of a failed command.
fn command_code(error: &DriverError) -> Option<i32> {
    match error.kind.as_ref() {
        ErrorKind::Command(command) => Some(command.code),
        _ => None,
    }
}
