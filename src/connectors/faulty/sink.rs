//! `faulty` sink: a test connector that appends what it writes to a file and
//! fails on demand, controlled from outside the process through the file
//! system, so fault tests can drive a real binary.
//!
//! - `output`: file to append each written payload to, one line per message,
//!   fsynced per batch (the write is durable when `write` returns).
//! - `fail_while_exists`: while this path exists, every write fails transiently.
//! - `down_while_exists`: while this path exists the backend is down: `open`
//!   fails transiently (connection refused) and a write says the connection
//!   is lost, so the engine closes the sink and opens it again.
//! - `reject_containing`: a message whose payload contains this text is refused
//!   for good (the engine then applies the sink's `on_error`).
//! - `reject_while_exists`: with `reject_containing`, refuse only while this
//!   path exists (the backend fixed once it is gone: a dead-letter replay).
//! - `write_delay`: every write takes at least this long (a slow backend), so a
//!   crash is likely to land in the middle of one.
//! - `buffer_messages`: defer acknowledgement (rule K6): hold each partition's
//!   messages in memory and append them to `output` (fsynced) once this many
//!   are held, after `flush_interval` and at a stop; only then are they
//!   durable. `fail_while_exists` then fails flushes.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use crate::connectors::{
    ConnectorError, Deferred, Flush, Rejection, Sink, SinkEntry, SinkError, parse_plugin_config,
    schema_of,
};
use crate::message::{SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "faulty",
    feature: "faulty-sink",
    description: "test sink: appends to a file, fails on demand",
    secret_fields: &[],
    sample_config: "output = \"faulty-sink.out\"\nwrite_delay = \"0s\"\n",
    config_schema: schema_of::<FaultyConfig>,
    build: |config| Ok(Box::new(FaultySink::new(parse_plugin_config(config)?))),
};
inventory::submit!(ENTRY);

#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultyConfig {
    /// File to append each written payload to, one line per message, fsynced per batch.
    #[serde(default)]
    pub output: Option<PathBuf>,
    /// While this path exists, every write fails transiently.
    #[serde(default)]
    pub fail_while_exists: Option<PathBuf>,
    /// While this path exists the backend is down: `open` fails transiently
    /// and a write reports the connection lost.
    #[serde(default)]
    pub down_while_exists: Option<PathBuf>,
    /// A message whose payload contains this text is refused for good.
    #[serde(default)]
    pub reject_containing: Option<String>,
    /// With `reject_containing`: refuse only while this path exists.
    #[serde(default)]
    pub reject_while_exists: Option<PathBuf>,
    /// Every write takes at least this long (a slow backend).
    #[serde(default, with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub write_delay: Duration,
    /// Defer acknowledgement: hold messages and append them once this many of
    /// a partition are held (also after `flush_interval` and at a stop).
    #[serde(default)]
    pub buffer_messages: Option<usize>,
    /// With `buffer_messages`: flush what is held once the oldest is this old
    /// (`0s`, the default: only on count and at a stop).
    #[serde(default, with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub flush_interval: Duration,
}

pub struct FaultySink {
    config: FaultyConfig,
    held: Mutex<Held>,
}

/// (stream, topic, partition).
type PartitionKey = (String, String, u32);

/// What a deferred faulty sink holds.
#[derive(Default)]
struct Held {
    /// Lines of each partition not sealed yet: the lines, how many, the last
    /// offset among them.
    open: HashMap<PartitionKey, (Vec<u8>, usize, u64)>,
    /// Sealed lines waiting for a flush, with their last offset.
    sealed: Vec<(PartitionKey, Vec<u8>, u64)>,
    durable: HashMap<PartitionKey, u64>,
}

impl FaultySink {
    pub fn new(config: FaultyConfig) -> Self {
        Self {
            config,
            held: Mutex::new(Held::default()),
        }
    }

    fn fail_now(&self) -> Result<(), SinkError> {
        if let Some(marker) = &self.config.fail_while_exists
            && marker.exists()
        {
            return Err(SinkError::transient(format!(
                "failing on purpose while {} exists",
                marker.display()
            )));
        }
        Ok(())
    }

    /// Whether `reject_containing` applies now.
    fn refusing(&self) -> bool {
        self.config
            .reject_while_exists
            .as_ref()
            .is_none_or(|marker| marker.exists())
    }

    /// The backend is down while the `down_while_exists` marker exists.
    fn down(&self) -> Option<String> {
        let marker = self.config.down_while_exists.as_ref()?;
        marker
            .exists()
            .then(|| format!("down on purpose while {} exists", marker.display()))
    }

    fn append(&self, lines: Vec<u8>) -> impl Future<Output = Result<(), SinkError>> + use<> {
        let output = self.config.output.clone();
        async move {
            let Some(output) = output else {
                return Ok(());
            };
            tokio::task::spawn_blocking(move || {
                let mut file = OpenOptions::new().create(true).append(true).open(&output)?;
                file.write_all(&lines)?;
                file.sync_data()
            })
            .await
            .map_err(SinkError::fatal)?
            .map_err(SinkError::transient)
        }
    }
}

#[async_trait]
impl Sink for FaultySink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        if let Some(down) = self.down() {
            return Err(ConnectorError::transient(format!(
                "connection refused: {down}"
            )));
        }
        // A crash in the middle of a write can leave a torn last line; that
        // write was never acknowledged, so drop the fragment before appending.
        let Some(output) = self.config.output.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || truncate_torn_tail(&output))
            .await
            .map_err(ConnectorError::fatal)?
            .map_err(ConnectorError::fatal)
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if !self.config.write_delay.is_zero() {
            tokio::time::sleep(self.config.write_delay).await;
        }
        if let Some(down) = self.down() {
            return Err(SinkError::disconnected(format!("connection reset: {down}")));
        }
        if self.config.buffer_messages.is_none() {
            self.fail_now()?;
        }
        let mut lines = Vec::with_capacity(messages.len() * 64);
        let mut rejected = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let payload = message.payload.to_bytes();
            if let Some(needle) = &self.config.reject_containing
                && self.refusing()
                && contains(&payload, needle.as_bytes())
            {
                rejected.push(Rejection {
                    index,
                    reason: format!("payload contains \"{needle}\""),
                });
                continue;
            }
            lines.extend_from_slice(&payload);
            lines.push(b'\n');
        }
        if !rejected.is_empty() {
            return Err(SinkError::Rejected(rejected));
        }
        let Some(seal_at) = self.config.buffer_messages else {
            return self.append(lines).await;
        };
        let mut held = crate::sync::lock(&self.held);
        let held = &mut *held;
        for message in messages {
            let key = (
                topic.stream.clone(),
                topic.topic.clone(),
                message.partition_id,
            );
            let (open, count, last) = held.open.entry(key.clone()).or_default();
            open.extend_from_slice(&message.payload.to_bytes());
            open.push(b'\n');
            *count += 1;
            *last = message.offset;
            if *count >= seal_at {
                let lines = std::mem::take(open);
                held.sealed.push((key.clone(), lines, *last));
                held.open.remove(&key);
            }
        }
        Ok(())
    }

    fn deferred(&self) -> Option<Deferred> {
        self.config.buffer_messages.map(|_| Deferred {
            flush_interval: Some(self.config.flush_interval).filter(|interval| !interval.is_zero()),
        })
    }

    async fn flush(&self, topic: &TopicRef, scope: Flush) -> Result<(), SinkError> {
        let mine = |key: &PartitionKey| key.0 == topic.stream && key.1 == topic.topic;
        let (lines, durable) = {
            let mut held = crate::sync::lock(&self.held);
            let held = &mut *held;
            if scope == Flush::All {
                let keys: Vec<_> = held.open.keys().filter(|key| mine(key)).cloned().collect();
                for key in keys {
                    if let Some((lines, _, last)) = held.open.remove(&key) {
                        held.sealed.push((key, lines, last));
                    }
                }
            }
            let mut lines = Vec::new();
            let mut durable = Vec::new();
            for (key, file, last) in held.sealed.iter().filter(|(key, ..)| mine(key)) {
                lines.extend_from_slice(file);
                durable.push((key.clone(), *last));
            }
            (lines, durable)
        };
        if durable.is_empty() {
            return Ok(());
        }
        self.fail_now()?;
        self.append(lines).await?;
        let mut held = crate::sync::lock(&self.held);
        held.sealed.retain(|(key, ..)| !mine(key));
        for (key, last) in durable {
            held.durable.insert(key, last);
        }
        Ok(())
    }

    fn durable(&self, topic: &TopicRef) -> Vec<(u32, u64)> {
        crate::sync::lock(&self.held)
            .durable
            .iter()
            .filter(|(key, _)| key.0 == topic.stream && key.1 == topic.topic)
            .map(|(key, &offset)| (key.2, offset))
            .collect()
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

fn truncate_torn_tail(path: &std::path::Path) -> std::io::Result<()> {
    let content = match std::fs::read(path) {
        Ok(content) => content,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    let complete = content
        .iter()
        .rposition(|byte| *byte == b'\n')
        .map_or(0, |at| at + 1);
    if complete < content.len() {
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(complete as u64)?;
        file.sync_data()?;
    }
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}
