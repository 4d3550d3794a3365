//! `redis` source: reads Redis streams through a consumer group (`mode =
//! "streams"`, at-least-once) or Redis pub/sub channels (`mode = "pubsub"`,
//! at-most-once).
//!
//! Streams: the group (created at the start of the stream, or at its end
//! with `start_from_oldest = false`, when missing) is the position. Entries
//! are read with `XREADGROUP` and acknowledged with `XACK` only in `commit`,
//! that is once Iggy acknowledged them and the engine saved the state. An
//! entry read and never acknowledged (a NACK the engine gave up on, a stop,
//! a cancelled poll, a crash, a Redis restart) stays in the group's pending
//! list: the source reads its own pending entries (`XREADGROUP ... 0`)
//! before new ones at every start and after every interrupted poll, and
//! takes over entries that another consumer of the group left pending for
//! `claim_min_idle` (`XAUTOCLAIM`), so a dead consumer's entries are
//! delivered too. Duplicates of such entries, never loss. The Iggy message
//! id is derived from the stream and the entry id, so a redelivered entry
//! keeps its id.
//!
//! Pub/sub: `SUBSCRIBE` to `channels`; Redis keeps no copy of a message, so
//! what arrives while the source is stopped, disconnected or before Iggy
//! took it is lost. The source keeps no state in this mode.
//!
//! Failures: the engine retries, the source never does. In streams mode the
//! shared [`Connection`] drops a connection that failed and opens a new one
//! on the next command, so a lost connection is `Transient`: the engine polls
//! (or commits) again and that reconnects. A pub/sub subscription lives on
//! its own connection, which nothing reopens: when it closes, `poll` hands
//! out what arrived before and then fails as `Disconnected`, and the engine
//! opens a fresh source, which subscribes again. A consumer group that went
//! away (`NOGROUP`: a server restarted without its data, a stream deleted)
//! is `Disconnected` too: `open` creates it again (or, with `create_group =
//! false`, stops naming the field).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use redis::Value;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::connectors::redis::{Class, Connection, classify, tls_files};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch, SourceEntry,
    decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "redis",
    feature: "redis-source",
    description: "reads Redis streams through a consumer group (XACK on commit) or pub/sub channels (at-most-once)",
    secret_fields: &["url"],
    sample_config: "url = \"redis://:secret@127.0.0.1:6379/0\"\nmode = \"streams\"\nstreams = [\"events\"]\ngroup = \"iggy-connect\"\nbatch_size = 100\n",
    config_schema: schema_of::<RedisSourceConfig>,
    build: |config| Ok(Box::new(RedisSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// What to read and how.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisSourceConfig {
    /// The server: `redis://[user:password@]host:port[/db]`, `rediss://` for
    /// TLS; a secret (it may hold the password).
    #[schemars(with = "String")]
    pub url: SecretString,
    /// PEM file of the CA certificates a `rediss://` server's certificate
    /// must be signed by (default: the system's).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate, for a server that asks for one
    /// (`tls-auth-clients`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// `streams` (consumer group, at-least-once) or `pubsub` (channels,
    /// at-most-once).
    #[serde(default)]
    pub mode: Mode,
    /// The stream keys to read (`mode = "streams"`).
    #[serde(default)]
    pub streams: Vec<String>,
    /// The channels to subscribe to (`mode = "pubsub"`).
    #[serde(default)]
    pub channels: Vec<String>,
    /// The consumer group on every stream.
    #[serde(default = "default_group")]
    pub group: String,
    /// This reader's consumer name in the group; empty uses the connector
    /// key. Keep it stable across restarts: a restarted source reads its own
    /// pending entries again by this name.
    #[serde(default)]
    pub consumer: String,
    /// Create a missing group (and stream) at the start: `true` reads the
    /// stream from its first entry, `false` only entries added afterwards.
    #[serde(default = "default_true")]
    pub start_from_oldest: bool,
    /// Create the group when it is missing; `false` refuses to start without it.
    #[serde(default = "default_true")]
    pub create_group: bool,
    /// Most entries per batch (`COUNT`).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// How long one read waits for new entries (`BLOCK`).
    #[serde(default = "default_block", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub block: Duration,
    /// `mode = "pubsub"`: after the first message of a batch, wait this long
    /// for more (up to `batch_size`).
    #[serde(default = "default_linger", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub linger: Duration,
    /// Entries another consumer of the group left pending this long are taken
    /// over (`XAUTOCLAIM`); `0s` never takes any over.
    #[serde(default = "default_claim_min_idle", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub claim_min_idle: Duration,
    /// The entry field holding the payload (as the redis sink writes it); an
    /// entry without it becomes a JSON object of all its fields.
    #[serde(default = "default_payload_field")]
    pub payload_field: String,
    /// Time to connect to the server.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub connect_timeout: Duration,
    /// Time Redis has to answer a command (a blocking read gets `block` more).
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Consumer group reads, `XACK` on commit: at-least-once.
    #[default]
    Streams,
    /// Pub/sub channels: at-most-once, nothing to acknowledge.
    Pubsub,
}

fn default_group() -> String {
    "iggy-connect".into()
}

fn default_true() -> bool {
    true
}

fn default_batch_size() -> u32 {
    100
}

fn default_block() -> Duration {
    Duration::from_millis(500)
}

fn default_linger() -> Duration {
    Duration::from_millis(5)
}

fn default_claim_min_idle() -> Duration {
    Duration::from_secs(60)
}

fn default_payload_field() -> String {
    "payload".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

/// What the source saves: the last acknowledged entry id per stream.
/// Informational (the group is the position); an undecodable state still
/// stops the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisSourceState {
    pub acked: BTreeMap<String, String>,
}

pub struct RedisSource {
    config: RedisSourceConfig,
    connection: Connection,
    consumer: String,
    reader: tokio::sync::Mutex<Reader>,
    /// Entry ids of the batch in flight, per stream index.
    staged: Mutex<Vec<(usize, Vec<String>)>>,
    committed: Mutex<RedisSourceState>,
    messages: Option<tokio::sync::Mutex<Inbox>>,
    subscriber: Option<JoinHandle<()>>,
}

/// Where the next stream read starts.
struct Reader {
    /// Per stream: `Some(id)` reads this consumer's pending entries after
    /// `id`; `None` reads new entries (`>`).
    pending_after: Vec<Option<String>>,
    /// A poll did not finish (cancelled or failed): what it may have read is
    /// pending, read it again.
    interrupted: bool,
    /// Per stream, where the current `XAUTOCLAIM` scan goes on.
    claim_cursor: Vec<String>,
    next_claim: Instant,
}

impl RedisSource {
    pub fn new(config: RedisSourceConfig) -> Result<Self, PluginConfigError> {
        match config.mode {
            Mode::Streams if config.streams.is_empty() => {
                return Err(PluginConfigError::new(
                    "streams",
                    "expected at least one stream key (mode = \"streams\")",
                ));
            }
            Mode::Pubsub if config.channels.is_empty() => {
                return Err(PluginConfigError::new(
                    "channels",
                    "expected at least one channel (mode = \"pubsub\")",
                ));
            }
            _ => {}
        }
        if config.mode == Mode::Streams && config.group.is_empty() {
            return Err(PluginConfigError::new(
                "group",
                "expected a consumer group name",
            ));
        }
        if config.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        // A blocking read must not hit the response timeout.
        let connection = Connection::new(
            &config.url,
            &tls_files(&config.ca_file, &config.cert_file, &config.key_file),
            config.connect_timeout,
            config.timeout + config.block,
        )?;
        let streams = config.streams.len();
        Ok(Self {
            consumer: config.consumer.clone(),
            reader: tokio::sync::Mutex::new(Reader {
                pending_after: vec![Some("0".into()); streams],
                interrupted: false,
                claim_cursor: vec!["0-0".into(); streams],
                next_claim: Instant::now(),
            }),
            staged: Mutex::new(Vec::new()),
            committed: Mutex::new(RedisSourceState::default()),
            messages: None,
            subscriber: None,
            connection,
            config,
        })
    }

    async fn create_groups(&self) -> Result<(), ConnectorError> {
        let start = if self.config.start_from_oldest {
            "0"
        } else {
            "$"
        };
        for stream in &self.config.streams {
            let mut command = redis::cmd("XGROUP");
            command
                .arg("CREATE")
                .arg(stream)
                .arg(&self.config.group)
                .arg(start)
                .arg("MKSTREAM");
            match self.connection.query::<()>(&command).await {
                Ok(()) => {
                    info!(stream = %stream, group = %self.config.group, "created the consumer group")
                }
                Err(error) if error.code() == Some("BUSYGROUP") => {}
                Err(error) => return Err(open_error(&self.connection, &error)),
            }
        }
        Ok(())
    }

    /// Fails when a stream lacks the group (with `create_group = false`).
    async fn check_groups(&self) -> Result<(), ConnectorError> {
        for stream in &self.config.streams {
            let mut command = redis::cmd("XINFO");
            command.arg("GROUPS").arg(stream);
            let groups: Value = match self.connection.query(&command).await {
                Ok(groups) => groups,
                Err(error) if classify(&error) == Class::Refused => Value::Array(Vec::new()),
                Err(error) => return Err(open_error(&self.connection, &error)),
            };
            let found = match &groups {
                Value::Array(groups) => groups
                    .iter()
                    .any(|group| group_name(group).as_deref() == Some(self.config.group.as_str())),
                _ => false,
            };
            if !found {
                return Err(ConnectorError::fatal(format!(
                    "plugin_config.group: stream {stream} has no consumer group {:?}; create it \
                     (XGROUP CREATE {stream} {} 0 MKSTREAM) or set create_group = true",
                    self.config.group, self.config.group
                )));
            }
        }
        Ok(())
    }

    async fn poll_streams(&self) -> Result<SourceBatch, ConnectorError> {
        let mut reader = self.reader.lock().await;
        if reader.interrupted {
            reader.pending_after.fill(Some("0".into()));
        }
        // Cleared only when this poll returns a batch: a poll dropped or
        // failed after Redis delivered entries leaves them pending.
        reader.interrupted = true;
        let mut read = Read::default();
        if !self.config.claim_min_idle.is_zero() && Instant::now() >= reader.next_claim {
            self.claim(&mut reader, &mut read).await?;
        }
        if read.is_empty() && reader.pending_after.iter().any(Option::is_some) {
            self.read_pending(&mut reader, &mut read).await?;
        }
        if read.is_empty() && reader.pending_after.iter().all(Option::is_none) {
            self.read_new(&mut read).await?;
        }
        let batch = self.stage(read)?;
        reader.interrupted = false;
        Ok(batch)
    }

    /// Takes over entries idle for `claim_min_idle` (another consumer's, or
    /// ours from before a crash).
    async fn claim(&self, reader: &mut Reader, read: &mut Read) -> Result<(), ConnectorError> {
        let idle = self.config.claim_min_idle.as_millis().to_string();
        let mut scan_done = true;
        for (index, stream) in self.config.streams.iter().enumerate() {
            let mut command = redis::cmd("XAUTOCLAIM");
            command
                .arg(stream)
                .arg(&self.config.group)
                .arg(&self.consumer)
                .arg(&idle)
                .arg(&reader.claim_cursor[index])
                .arg("COUNT")
                .arg(self.config.batch_size);
            let answer: Value = self.command(&command).await?;
            let Value::Array(mut parts) = answer else {
                return Err(ConnectorError::transient(
                    "redis: XAUTOCLAIM answered no array",
                ));
            };
            if parts.len() < 2 {
                return Err(ConnectorError::transient(
                    "redis: XAUTOCLAIM answered too little",
                ));
            }
            let entries = parts.swap_remove(1);
            let cursor: String =
                redis::from_redis_value(parts.swap_remove(0)).map_err(|error| {
                    ConnectorError::transient(format!("redis: XAUTOCLAIM: {error}"))
                })?;
            if cursor != "0-0" {
                scan_done = false;
            }
            reader.claim_cursor[index] = cursor;
            let before = read.len();
            read.entries(index, entries);
            if read.len() > before {
                warn!(stream = %stream, claimed = read.len() - before, "took over entries left pending by a consumer of the group");
            }
        }
        if scan_done {
            reader.next_claim = Instant::now() + self.config.claim_min_idle / 2;
        }
        Ok(())
    }

    async fn read_pending(
        &self,
        reader: &mut Reader,
        read: &mut Read,
    ) -> Result<(), ConnectorError> {
        let reading: Vec<usize> = (0..self.config.streams.len())
            .filter(|index| reader.pending_after[*index].is_some())
            .collect();
        let mut command = self.xreadgroup(None);
        for index in &reading {
            command.arg(&self.config.streams[*index]);
        }
        for index in &reading {
            command.arg(reader.pending_after[*index].as_deref().unwrap_or("0"));
        }
        let answer: Value = self.command(&command).await?;
        let mut found = vec![false; self.config.streams.len()];
        for (index, entries) in self.by_stream(answer) {
            if let Some(last) = last_id(&entries) {
                found[index] = true;
                reader.pending_after[index] = Some(last);
            }
            read.entries(index, entries);
        }
        for index in reading {
            if !found[index] {
                // Nothing of ours is pending there any more: read new entries.
                reader.pending_after[index] = None;
            }
        }
        Ok(())
    }

    async fn read_new(&self, read: &mut Read) -> Result<(), ConnectorError> {
        let mut command = self.xreadgroup(Some(self.config.block));
        for stream in &self.config.streams {
            command.arg(stream);
        }
        for _ in &self.config.streams {
            command.arg(">");
        }
        let answer: Value = self.command(&command).await?;
        for (index, entries) in self.by_stream(answer) {
            read.entries(index, entries);
        }
        Ok(())
    }

    fn xreadgroup(&self, block: Option<Duration>) -> redis::Cmd {
        let mut command = redis::cmd("XREADGROUP");
        command
            .arg("GROUP")
            .arg(&self.config.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.config.batch_size);
        if let Some(block) = block {
            command.arg("BLOCK").arg(block.as_millis().max(1) as u64);
        }
        command.arg("STREAMS");
        command
    }

    /// An `XREADGROUP` answer as (stream index, entries).
    fn by_stream(&self, answer: Value) -> Vec<(usize, Value)> {
        let streams = match answer {
            Value::Array(streams) => streams
                .into_iter()
                .filter_map(|stream| match stream {
                    Value::Array(mut pair) if pair.len() == 2 => {
                        let entries = pair.pop()?;
                        Some((pair.pop()?, entries))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>(),
            Value::Map(streams) => streams,
            _ => Vec::new(),
        };
        streams
            .into_iter()
            .filter_map(|(name, entries)| {
                let name: String = redis::from_redis_value(name).ok()?;
                let index = self
                    .config
                    .streams
                    .iter()
                    .position(|stream| *stream == name)?;
                Some((index, entries))
            })
            .collect()
    }

    async fn command(&self, command: &redis::Cmd) -> Result<Value, ConnectorError> {
        self.connection
            .query::<Value>(command)
            .await
            .map_err(|error| poll_error(&error))
    }

    /// Turns what was read into the batch in flight.
    fn stage(&self, read: Read) -> Result<SourceBatch, ConnectorError> {
        let mut state = self
            .committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let mut staged: Vec<(usize, Vec<String>)> = Vec::new();
        let mut records = Vec::with_capacity(read.records.len());
        for entry in read.records {
            let stream = &self.config.streams[entry.stream];
            match staged.iter_mut().find(|(index, _)| *index == entry.stream) {
                Some((_, ids)) => ids.push(entry.id.clone()),
                None => staged.push((entry.stream, vec![entry.id.clone()])),
            }
            state.acked.insert(stream.clone(), entry.id.clone());
            let Some(fields) = entry.fields else {
                // Deleted or trimmed while pending: acknowledged, not sent.
                continue;
            };
            records.push(SourceRecord {
                id: Some(message_id(stream, &entry.id)),
                stream_index: 0,
                headers: vec![
                    (
                        "redis_stream".into(),
                        HeaderValue::String(stream.as_str().into()),
                    ),
                    ("redis_id".into(), HeaderValue::String(entry.id.into())),
                ],
                payload: payload_of(fields, &self.config.payload_field),
                partition: None,
                origin_timestamp: None,
            });
        }
        let has_entries = !staged.is_empty();
        *self
            .staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = staged;
        Ok(SourceBatch {
            records,
            state: if has_entries {
                Some(encode_state(&state)?)
            } else {
                None
            },
            finished: false,
            next_poll: None,
        })
    }

    async fn poll_pubsub(&self) -> Result<SourceBatch, ConnectorError> {
        let messages = self
            .messages
            .as_ref()
            .ok_or_else(|| ConnectorError::fatal("the redis source was polled before open"))?;
        let mut inbox = messages.lock().await;
        // Cancel-safe: what was received waits in `buffer` for the next poll.
        let deadline = tokio::time::Instant::now() + self.config.linger;
        let limit = self.config.batch_size as usize;
        while inbox.buffer.len() < limit {
            let received = if inbox.buffer.is_empty() {
                inbox.receiver.recv().await
            } else {
                match tokio::time::timeout_at(deadline, inbox.receiver.recv()).await {
                    Ok(received) => received,
                    Err(_) => break,
                }
            };
            match received {
                Some(message) => inbox.buffer.push(message),
                // The subscription's connection closed: what came before
                // goes out first, then the engine opens a fresh source.
                None if inbox.buffer.is_empty() => {
                    return Err(ConnectorError::disconnected(
                        "the redis pub/sub connection closed",
                    ));
                }
                None => break,
            }
        }
        let records = inbox.buffer.drain(..).map(channel_record).collect();
        Ok(SourceBatch {
            records,
            state: None,
            finished: false,
            next_poll: None,
        })
    }

    /// Subscribes to `channels` on a connection of its own, and forwards
    /// what arrives to `poll` until that connection closes.
    async fn subscribe(&mut self) -> Result<(), ConnectorError> {
        let connection = Connection::new(
            &self.config.url,
            &tls_files(
                &self.config.ca_file,
                &self.config.cert_file,
                &self.config.key_file,
            ),
            self.config.connect_timeout,
            self.config.timeout,
        )
        .map_err(ConnectorError::fatal)?;
        let mut pubsub = connection
            .pubsub()
            .await
            .map_err(|error| subscribe_error(&connection, &error))?;
        for channel in &self.config.channels {
            pubsub
                .subscribe(channel)
                .await
                .map_err(|error| subscribe_error(&connection, &error))?;
        }
        let (sender, receiver) = mpsc::channel(self.config.batch_size as usize * 4);
        self.subscriber = Some(tokio::spawn(forward(pubsub, sender)));
        self.messages = Some(tokio::sync::Mutex::new(Inbox {
            receiver,
            buffer: Vec::new(),
        }));
        Ok(())
    }
}

/// Hands the subscription's messages to `poll` until its connection closes
/// (or the source is closed); dropping `sender` then tells `poll`.
async fn forward(pubsub: redis::aio::PubSub, sender: mpsc::Sender<redis::Msg>) {
    let mut messages = pubsub.into_on_message();
    while let Some(message) = messages.next().await {
        if sender.send(message).await.is_err() {
            return;
        }
    }
    warn!("the redis pub/sub connection closed");
}

#[async_trait]
impl Source for RedisSource {
    fn attach(&mut self, context: ConnectorContext) {
        if self.consumer.is_empty() {
            self.consumer = context.key;
        }
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if self.consumer.is_empty() {
            self.consumer = "iggy-connect".into();
        }
        if self.config.mode == Mode::Pubsub {
            // Nothing to restore: any saved state is ignored.
            return self.subscribe().await;
        }
        if let Some(state) = state {
            *self
                .committed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = decode_state(state)?;
        }
        if self.config.create_group {
            self.create_groups().await
        } else {
            self.check_groups().await
        }
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        match self.config.mode {
            Mode::Streams => self.poll_streams().await,
            Mode::Pubsub => self.poll_pubsub().await,
        }
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let staged = std::mem::take(
            &mut *self
                .staged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for (position, (index, ids)) in staged.iter().enumerate() {
            let stream = &self.config.streams[*index];
            let mut command = redis::cmd("XACK");
            command.arg(stream).arg(&self.config.group).arg(ids);
            if let Err(error) = self.connection.query::<i64>(&command).await {
                // Put back what is not acknowledged: the engine retries the commit.
                *self
                    .staged
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = staged[position..].to_vec();
                return Err(poll_error(&error));
            }
            if let Some(last) = ids.last() {
                self.committed
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .acked
                    .insert(stream.clone(), last.clone());
            }
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
        self.messages.take();
        if let Some(subscriber) = self.subscriber.take() {
            subscriber.abort();
            let _ = subscriber.await;
        }
        Ok(())
    }
}

/// Pub/sub messages received and not yet handed out.
struct Inbox {
    receiver: mpsc::Receiver<redis::Msg>,
    buffer: Vec<redis::Msg>,
}

/// Entries read by one poll, in the order they go to Iggy.
#[derive(Default)]
struct Read {
    records: Vec<ReadEntry>,
}

struct ReadEntry {
    stream: usize,
    id: String,
    /// `None` for an entry deleted while it was pending.
    fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl Read {
    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn len(&self) -> usize {
        self.records.len()
    }

    /// Adds a list of `[id, [field, value, ...]]` entries of one stream.
    fn entries(&mut self, stream: usize, entries: Value) {
        let Value::Array(entries) = entries else {
            return;
        };
        for entry in entries {
            let Value::Array(mut parts) = entry else {
                continue;
            };
            if parts.is_empty() {
                continue;
            }
            let fields = if parts.len() > 1 {
                parts.swap_remove(1)
            } else {
                Value::Nil
            };
            let Ok(id) = redis::from_redis_value::<String>(parts.swap_remove(0)) else {
                continue;
            };
            let fields = match fields {
                Value::Nil => None,
                fields => redis::from_redis_value::<Vec<Vec<u8>>>(fields)
                    .ok()
                    .map(|flat| {
                        let mut pairs = Vec::with_capacity(flat.len() / 2);
                        let mut flat = flat.into_iter();
                        while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                            pairs.push((name, value));
                        }
                        pairs
                    }),
            };
            self.records.push(ReadEntry { stream, id, fields });
        }
    }
}

fn last_id(entries: &Value) -> Option<String> {
    let Value::Array(entries) = entries else {
        return None;
    };
    let Value::Array(parts) = entries.last()? else {
        return None;
    };
    redis::from_redis_value(parts.first()?.clone()).ok()
}

fn group_name(group: &Value) -> Option<String> {
    let fields: Vec<(String, Value)> = match group {
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(key, value)| {
                Some((redis::from_redis_value(key.clone()).ok()?, value.clone()))
            })
            .collect(),
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|pair| {
                Some((
                    redis::from_redis_value(pair.first()?.clone()).ok()?,
                    pair.get(1)?.clone(),
                ))
            })
            .collect(),
        _ => return None,
    };
    fields
        .into_iter()
        .find(|(key, _)| key == "name")
        .and_then(|(_, value)| redis::from_redis_value(value).ok())
}

/// The payload field's bytes, or every field as a JSON object of strings.
fn payload_of(fields: Vec<(Vec<u8>, Vec<u8>)>, payload_field: &str) -> Payload {
    let mut fields = fields;
    if let Some(position) = fields
        .iter()
        .position(|(name, _)| name == payload_field.as_bytes())
    {
        return Payload::Raw(fields.swap_remove(position).1.into());
    }
    let object: serde_json::Map<String, serde_json::Value> = fields
        .into_iter()
        .map(|(name, value)| {
            (
                String::from_utf8_lossy(&name).into_owned(),
                serde_json::Value::String(String::from_utf8_lossy(&value).into_owned()),
            )
        })
        .collect();
    Payload::Json(serde_json::Value::Object(object))
}

/// A stable Iggy message id for an entry: 32 bits of the stream name's
/// CRC-32, the entry id's milliseconds (48 bits) and sequence (48 bits).
fn message_id(stream: &str, entry_id: &str) -> u128 {
    let (millis, sequence) = entry_id.split_once('-').unwrap_or((entry_id, "0"));
    let millis = millis.parse::<u64>().unwrap_or_default() & 0xFFFF_FFFF_FFFF;
    let sequence = sequence.parse::<u64>().unwrap_or_default() & 0xFFFF_FFFF_FFFF;
    (u128::from(crc32fast::hash(stream.as_bytes())) << 96)
        | (u128::from(millis) << 48)
        | u128::from(sequence)
}

fn channel_record(message: redis::Msg) -> SourceRecord {
    let channel = message.get_channel_name().into();
    SourceRecord {
        id: None,
        stream_index: 0,
        headers: vec![("redis_channel".into(), HeaderValue::String(channel))],
        payload: Payload::Raw(bytes::Bytes::copy_from_slice(message.get_payload_bytes())),
        partition: None,
        origin_timestamp: None,
    }
}

fn open_error(connection: &Connection, error: &redis::RedisError) -> ConnectorError {
    if let Some(refused) = connection.tls_refusal(error) {
        return refused;
    }
    match classify(error) {
        Class::Fatal => ConnectorError::fatal(format!(
            "redis refused the credentials or permissions of plugin_config.url: {error}"
        )),
        Class::Transient => ConnectorError::transient(format!("redis: {error}")),
        Class::Refused => ConnectorError::fatal(format!(
            "plugin_config.streams: redis refused the consumer group: {error}"
        )),
    }
}

fn poll_error(error: &redis::RedisError) -> ConnectorError {
    if error.code() == Some("NOGROUP") {
        return ConnectorError::disconnected(format!("redis: the consumer group is gone: {error}"));
    }
    match classify(error) {
        Class::Fatal => ConnectorError::fatal(format!(
            "redis refused the credentials or permissions of plugin_config.url: {error}"
        )),
        Class::Transient => ConnectorError::transient(format!("redis: {error}")),
        Class::Refused => ConnectorError::fatal(format!("plugin_config.streams: redis: {error}")),
    }
}

fn subscribe_error(connection: &Connection, error: &redis::RedisError) -> ConnectorError {
    if let Some(refused) = connection.tls_refusal(error) {
        return refused;
    }
    match classify(error) {
        Class::Fatal => ConnectorError::fatal(format!(
            "redis refused the credentials or permissions of plugin_config.url: {error}"
        )),
        Class::Transient => ConnectorError::transient(format!("redis: {error}")),
        Class::Refused => ConnectorError::fatal(format!(
            "plugin_config.channels: redis refused the subscription: {error}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<RedisSource, PluginConfigError> {
        RedisSource::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_mode_without_its_list_when_built_should_name_the_field() {
        let error = build(json!({"url": "redis://127.0.0.1:1"})).err().unwrap();
        assert_eq!(error.field, "streams");
        let error = build(json!({"url": "redis://127.0.0.1:1", "mode": "pubsub"}))
            .err()
            .unwrap();
        assert_eq!(error.field, "channels");
        let error = build(json!({"url": "redis://127.0.0.1:1", "streams": ["s"], "mode": "other"}))
            .err()
            .unwrap();
        assert_eq!(error.field, "mode");
    }

    #[test]
    fn given_entry_ids_when_mapped_should_give_distinct_stable_ids() {
        assert_eq!(message_id("s", "1-2"), message_id("s", "1-2"));
        assert_ne!(message_id("s", "1-2"), message_id("s", "1-3"));
        assert_ne!(message_id("s", "1-2"), message_id("t", "1-2"));
        assert_ne!(message_id("s", "2-0"), message_id("s", "1-0"));
    }

    #[test]
    fn given_entry_without_payload_field_when_read_should_become_an_object() {
        let fields = vec![(b"a".to_vec(), b"1".to_vec())];
        assert_eq!(
            payload_of(fields, "payload"),
            Payload::Json(json!({"a": "1"}))
        );
        let fields = vec![(b"payload".to_vec(), b"{}".to_vec())];
        assert_eq!(
            payload_of(fields, "payload"),
            Payload::Raw(bytes::Bytes::from_static(b"{}"))
        );
    }
}
