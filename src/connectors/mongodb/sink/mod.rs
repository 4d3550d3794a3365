//! `mongodb` sink: writes messages as upstream's documents, idempotently.
//!
//! Identity: `_id = "{stream}:{topic}:{partition}:{message_id}"` (upstream's).
//! Batches go out as unordered `insert_many` commands of `batch_size`
//! documents, and the answer is read per document: one without a write error
//! is stored (durable); a duplicate key (11000) on `_id` is a replay of a
//! message already stored and durable too; a duplicate key whose `_id` is not
//! in the collection came from another unique index and the document is
//! rejected by its index (the sink looks the ids up to tell the two apart,
//! which upstream did not: it counted every 11000 as written). A "try again"
//! code leaves its document to the engine's retry, other per-document errors
//! are rejections. Write-concern errors, the driver's retry labels, network,
//! pool and server-selection errors are transient for the documents not
//! reported stored; bad credentials are fatal. The engine retries only what
//! is not durable (`SinkError::Partial`).
//!
//! `open` checks the server and the credentials (creating the collection with
//! `auto_create_collection`): an unreachable server is transient, and the
//! engine opens the sink again; bad credentials are fatal.
//!
//! `write_mode = "upsert" | "replace"` (ours) keeps one document per entity:
//! `_id` is the payload's `key_field`, written by an ordered `update` command
//! with `upsert: true` (`$set` of the sink's fields, or a whole replacement),
//! so the last message of an entity wins and a replay rewrites the same state.
//! The server stops an ordered command at its first refused document: those
//! before it are durable, and the sink sends the ones after it on.

mod config;
mod document;

use std::collections::HashSet;

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::{Client, Collection};
use tracing::{debug, info};

pub use config::{MongoDbSinkConfig, PayloadFormat, WriteMode};
pub use document::{Layout, message_id};

use crate::connectors::mongodb::{
    DUPLICATE_KEY, client, describe, is_auth_error, is_transient, is_transient_code, ping,
};
use crate::connectors::{
    ConnectorError, Rejection, RetrySettings, Sink, SinkEntry, SinkError, parse_plugin_config,
    schema_of,
};
use crate::message::{SinkMessage, TopicRef};

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
inventory::submit!(ENTRY);

pub struct MongoDbSink {
    config: MongoDbSinkConfig,
    layout: Layout,
    client: Option<Client>,
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
    #[error("the server did not answer within {0:?}")]
    NoAnswer(std::time::Duration),
    #[error("the sink is not open")]
    NotOpen,
}

impl MongoDbSinkError {
    fn is_transient(&self) -> bool {
        match self {
            Self::Prepare { source, .. } | Self::Write { source, .. } => is_transient(source),
            Self::WriteTransient { .. } | Self::NoAnswer(_) => true,
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
                    Ok(()) => {
                        info!(collection = %self.config.collection, "mongodb sink created the collection")
                    }
                    Err(error) if command_code(&error) == Some(NAMESPACE_EXISTS) => {}
                    Err(error) => return Err(prepare_error(error)),
                }
            }
        }
        Ok(())
    }

    /// Inserts every chunk unordered, reading the answer per document.
    async fn insert(&self, documents: &[Document], positions: &[usize]) -> Result<(), SinkError> {
        let collection = self.collection()?;
        let chunk = self.config.batch_size as usize;
        let mut settled = Settled::default();
        for (part, positions) in documents.chunks(chunk).zip(positions.chunks(chunk)) {
            let Err(error) = collection.insert_many(part).ordered(false).await else {
                settled.durable.extend(positions);
                continue;
            };
            if let Err(rest) = self.settle(error, part, positions, &mut settled).await {
                return Err(settled.rest(rest));
            }
        }
        settled.finish()
    }

    /// Reads the failed `insert_many` of `part` (the batch's messages at
    /// `positions`) per document into `settled`; `Err` with how the others
    /// failed when the write stops there.
    async fn settle(
        &self,
        error: DriverError,
        part: &[Document],
        positions: &[usize],
        settled: &mut Settled,
    ) -> Result<(), SinkError> {
        let ErrorKind::InsertMany(insert) = error.kind.as_ref() else {
            return Err(self.failed(error).into());
        };
        if let Some(concern) = &insert.write_concern_error {
            let reason = format!(
                "write concern not satisfied: {} (code {})",
                concern.message, concern.code
            );
            return Err(SinkError::transient(self.transient(reason)));
        }
        let refused = |reason: String| {
            let collection = &self.config.collection;
            format!("collection {collection} refused the document: {reason}")
        };
        let mut failed = vec![false; part.len()];
        let mut duplicates = Vec::new();
        let mut retry = None;
        for write in insert.write_errors.iter().flatten() {
            let Some(seen) = failed.get_mut(write.index) else {
                let reason = format!(
                    "the server named document {} of {}",
                    write.index,
                    part.len()
                );
                return Err(SinkError::transient(self.transient(reason)));
            };
            *seen = true;
            let reason = format!("{} (code {})", write.message, write.code);
            if write.code == DUPLICATE_KEY {
                duplicates.push(write.index);
            } else if is_transient_code(write.code) {
                retry = Some(reason);
            } else {
                let index = positions[write.index];
                settled.rejected.push(Rejection {
                    index,
                    reason: refused(reason),
                });
            }
        }
        let foreign = self.foreign_duplicates(part, &duplicates).await?;
        for index in duplicates {
            if foreign.contains(&index) {
                let reason = "a duplicate key on a unique index other than _id".to_owned();
                settled.rejected.push(Rejection {
                    index: positions[index],
                    reason: refused(reason),
                });
            } else {
                settled.durable.push(positions[index]);
            }
        }
        let stored = positions
            .iter()
            .zip(&failed)
            .filter(|(_, failed)| !**failed);
        settled.durable.extend(stored.map(|(index, _)| *index));
        match retry {
            Some(reason) => Err(SinkError::transient(self.transient(reason))),
            None => Ok(()),
        }
    }

    /// Of the documents of `part` refused as duplicate keys (`duplicates`
    /// index it), those whose `_id` is not in the collection: they clash on
    /// another unique index. The others are copies of messages stored
    /// before (a replay).
    async fn foreign_duplicates(
        &self,
        part: &[Document],
        duplicates: &[usize],
    ) -> Result<HashSet<usize>, MongoDbSinkError> {
        if duplicates.is_empty() {
            return Ok(HashSet::new());
        }
        let ids: Vec<Bson> = duplicates
            .iter()
            .filter_map(|&index| part[index].get("_id").cloned())
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
            .copied()
            .filter(|&index| {
                part[index]
                    .get("_id")
                    .is_none_or(|id| !stored.contains(&id.to_string()))
            })
            .collect())
    }

    /// Upserts every document in order, one ordered `update` command per
    /// chunk. The server stops a command at its first refused document:
    /// those before it are durable, it is rejected (or, with a "try again"
    /// code, left to the engine's retry with the rest), and the next command
    /// starts right after it.
    async fn upsert(&self, documents: Vec<Document>, positions: &[usize]) -> Result<(), SinkError> {
        let client = self.client.as_ref().ok_or(MongoDbSinkError::NotOpen)?;
        let database = client.database(&self.config.database);
        let chunk = self.config.batch_size as usize;
        let updates: Vec<Document> = documents
            .into_iter()
            .map(|document| self.update(document))
            .collect();
        let mut settled = Settled::default();
        let mut next = 0;
        while next < updates.len() {
            let part = &updates[next..(next + chunk).min(updates.len())];
            let answer = match database
                .run_command(doc! {
                    "update": &self.config.collection,
                    "updates": part,
                    "ordered": true,
                })
                .await
            {
                Ok(answer) => answer,
                Err(error) => return Err(settled.rest(self.failed(error).into())),
            };
            if let Ok(concern) = answer.get_document("writeConcernError") {
                return Err(settled.rest(SinkError::transient(self.transient(format!(
                    "write concern not satisfied: {}",
                    concern.get_str("errmsg").unwrap_or_default()
                )))));
            }
            let Some(write) = answer
                .get_array("writeErrors")
                .ok()
                .and_then(|errors| errors.first())
                .and_then(Bson::as_document)
            else {
                settled.durable.extend(&positions[next..next + part.len()]);
                next += part.len();
                continue;
            };
            let code = write.get_i32("code").unwrap_or_default();
            let message = write.get_str("errmsg").unwrap_or_default();
            let Some(index) = write
                .get_i32("index")
                .ok()
                .and_then(|index| usize::try_from(index).ok())
                .filter(|&index| index < part.len())
            else {
                let reason = format!("an unattributed write error: {message}");
                return Err(settled.rest(SinkError::transient(self.transient(reason))));
            };
            settled.durable.extend(&positions[next..next + index]);
            if is_transient_code(code) {
                let reason = format!("{message} (code {code})");
                return Err(settled.rest(SinkError::transient(self.transient(reason))));
            }
            settled.rejected.push(Rejection {
                index: positions[next + index],
                reason: format!(
                    "collection {} refused the document: {message} (code {code})",
                    self.config.collection
                ),
            });
            next += index + 1;
        }
        settled.finish()
    }

    /// One statement of an `update` command upserting `document`.
    fn update(&self, mut document: Document) -> Document {
        // A replacement keeps its `_id` (the same as the query's, which the
        // server accepts); `$set` may not name it.
        let (id, update) = match self.config.write_mode {
            WriteMode::Upsert => {
                let id = document.remove("_id").unwrap_or(Bson::Null);
                (id, doc! { "$set": document })
            }
            _ => (document.get("_id").cloned().unwrap_or(Bson::Null), document),
        };
        doc! { "q": { "_id": id }, "u": update, "upsert": true }
    }

    fn transient(&self, reason: String) -> MongoDbSinkError {
        MongoDbSinkError::WriteTransient {
            collection: self.config.collection.clone(),
            reason,
        }
    }
}

/// What a write settled so far, as batch indexes.
#[derive(Default)]
struct Settled {
    durable: Vec<usize>,
    rejected: Vec<Rejection>,
}

impl Settled {
    /// The write stopped: what it settled, and `rest` for the others.
    fn rest(self, rest: SinkError) -> SinkError {
        if self.durable.is_empty() && self.rejected.is_empty() {
            return rest;
        }
        SinkError::partial(self.durable, self.rejected, rest)
    }

    /// Every document was sent: `Ok` unless some were refused.
    fn finish(self) -> Result<(), SinkError> {
        if self.rejected.is_empty() {
            return Ok(());
        }
        Err(self.rest(SinkError::transient(
            "every other document of the batch is stored",
        )))
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
        // Server selection, then the command itself: a server that accepts
        // connections and never answers is transient too.
        let wait = self.config.server_selection_timeout * 2;
        tokio::time::timeout(wait, self.prepare())
            .await
            .map_err(|_| MongoDbSinkError::NoAnswer(wait))??;
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
        match self.config.write_mode {
            WriteMode::Insert => self.insert(&documents, &positions).await?,
            WriteMode::Upsert | WriteMode::Replace => self.upsert(documents, &positions).await?,
        }
        if self.config.verbose_logging {
            info!(collection = %self.config.collection, messages = messages.len(), "mongodb sink wrote a batch");
        } else {
            debug!(collection = %self.config.collection, messages = messages.len(), "mongodb sink wrote a batch");
        }
        Ok(())
    }

    /// Upstream's `max_retries` and `retry_delay`, as the engine's policy.
    fn retry(&self) -> Option<RetrySettings> {
        self.config.retry_settings()
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
