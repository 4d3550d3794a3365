//! `faulty` sink: a test connector that appends what it writes to a file and
//! fails on demand, controlled from outside the process through the file
//! system, so fault tests can drive a real binary.
//!
//! - `output`: file to append each written payload to, one line per message,
//!   fsynced per batch (the write is durable when `write` returns).
//! - `fail_while_exists`: while this path exists, every write fails transiently.
//! - `reject_containing`: a message whose payload contains this text is refused
//!   for good (the engine then applies the sink's `on_error`).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::Deserialize;

use crate::connectors::registry::SinkEntry;
use crate::connectors::{ConnectorError, Rejection, Sink, SinkError, parse_plugin_config};
use crate::message::{SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "faulty",
    feature: "faulty-sink",
    description: "test sink: appends to a file, fails on demand",
    secret_fields: &[],
    build: |config| Ok(Box::new(FaultySink::new(parse_plugin_config(config)?))),
};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultyConfig {
    #[serde(default)]
    pub output: Option<PathBuf>,
    #[serde(default)]
    pub fail_while_exists: Option<PathBuf>,
    #[serde(default)]
    pub reject_containing: Option<String>,
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
        Ok(())
    }

    async fn write(&self, _topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}
