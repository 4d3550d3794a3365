//! `faulty` sink: a test connector that appends what it writes to a file and
//! fails on demand, controlled from outside the process through the file
//! system, so fault tests can drive a real binary.
//!
//! - `output`: file to append each written payload to, one line per message,
//!   fsynced per batch (the write is durable when `write` returns).
//! - `fail_while_exists`: while this path exists, every write fails transiently.
//! - `reject_containing`: a message whose payload contains this text is refused
//!   for good (the engine then applies the sink's `on_error`).
//! - `write_delay`: every write takes at least this long (a slow backend), so a
//!   crash is likely to land in the middle of one.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use crate::connectors::{
    ConnectorError, Rejection, Sink, SinkEntry, SinkError, parse_plugin_config, schema_of,
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

#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FaultyConfig {
    /// File to append each written payload to, one line per message, fsynced per batch.
    #[serde(default)]
    pub output: Option<PathBuf>,
    /// While this path exists, every write fails transiently.
    #[serde(default)]
    pub fail_while_exists: Option<PathBuf>,
    /// A message whose payload contains this text is refused for good.
    #[serde(default)]
    pub reject_containing: Option<String>,
    /// Every write takes at least this long (a slow backend).
    #[serde(default, with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub write_delay: Duration,
}

pub struct FaultySink {
    config: FaultyConfig,
}

impl FaultySink {
    pub fn new(config: FaultyConfig) -> Self {
        Self { config }
    }
}

#[async_trait]
impl Sink for FaultySink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
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

    async fn write(&self, _topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if !self.config.write_delay.is_zero() {
            tokio::time::sleep(self.config.write_delay).await;
        }
        if let Some(marker) = &self.config.fail_while_exists
            && marker.exists()
        {
            return Err(SinkError::transient(format!(
                "failing on purpose while {} exists",
                marker.display()
            )));
        }
        let mut lines = Vec::with_capacity(messages.len() * 64);
        let mut rejected = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let payload = message.payload.to_bytes();
            if let Some(needle) = &self.config.reject_containing
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
        let Some(output) = self.config.output.clone() else {
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
