//! `stdout` sink: prints each payload on its own line when `print_payload = true`
//! and logs a summary per batch. Useful for demos and for checking a pipeline.

use std::io::Write;

use async_trait::async_trait;
use serde::Deserialize;
use tracing::debug;

use crate::connectors::{
    ConnectorError, Sink, SinkEntry, SinkError, parse_plugin_config, schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "stdout",
    feature: "stdout-sink",
    description: "prints messages to standard output",
    secret_fields: &[],
    sample_config: "print_payload = true\n",
    config_schema: schema_of::<StdoutConfig>,
    build: |config| Ok(Box::new(StdoutSink::new(parse_plugin_config(config)?))),
};
inventory::submit!(ENTRY);

#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StdoutConfig {
    /// Print each payload on its own line (otherwise only a summary per batch is logged).
    #[serde(default)]
    pub print_payload: bool,
}

pub struct StdoutSink {
    config: StdoutConfig,
}

impl StdoutSink {
    pub fn new(config: StdoutConfig) -> Self {
        Self { config }
    }
}

#[async_trait]
impl Sink for StdoutSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// JSON is printed as stored: nothing to parse and serialize again.
    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
            return Ok(());
        };
        debug!(
            stream = %topic.stream,
            topic = %topic.topic,
            partition_id = first.partition_id,
            first_offset = first.offset,
            last_offset = last.offset,
            messages = messages.len(),
            "stdout sink received a batch"
        );
        if !self.config.print_payload {
            return Ok(());
        }
        let mut out = Vec::with_capacity(messages.len() * 128);
        for message in messages {
            match &message.payload {
                Payload::Json(value) => {
                    serde_json::to_writer(&mut out, value).map_err(SinkError::fatal)?
                }
                Payload::JsonBytes(bytes) => out.extend_from_slice(bytes),
                Payload::Text(text) => out.extend_from_slice(text.as_bytes()),
                Payload::Raw(bytes) => {
                    out.extend_from_slice(String::from_utf8_lossy(bytes).as_bytes())
                }
            }
            out.push(b'\n');
        }
        // Writing to a pipe can block; keep it off the async workers.
        tokio::task::spawn_blocking(move || {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&out)?;
            stdout.flush()
        })
        .await
        .map_err(SinkError::fatal)?
        .map_err(|error| SinkError::fatal(format!("cannot write to standard output: {error}")))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}
