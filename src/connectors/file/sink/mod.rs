//! `file` sink: appends messages to local files named by a path template
//! (stream, topic, partition, date), as JSON lines or raw payloads, optionally
//! compressed (each batch one gzip member or zstd frame), and fsyncs them
//! before `write` answers `Ok`, so the engine commits only offsets whose
//! messages are on disk.

mod config;
mod files;
mod output;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::config::size::parse_size;
use crate::connectors::{
    ConnectorError, PluginConfigError, Sink, SinkEntry, SinkError, parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

pub use config::{Compression, FileSinkConfig, Format};
use files::{Files, Rotation};
use output::{Layout, Template};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "file",
    feature: "file-sink",
    description: "appends messages to local files (JSON lines or raw, gzip/zstd), fsynced",
    secret_fields: &[],
    sample_config: "path = \"/tmp/iggy-connect/{stream}/{topic}/{partition}-{date}-{offset}.jsonl\"\nmax_file_size = \"64MiB\"\n",
    config_schema: schema_of::<FileSinkConfig>,
    build: |config| Ok(Box::new(FileSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct FileSink {
    template: Template,
    layout: Layout,
    /// The open files, shared with the blocking threads that write them.
    files: Arc<Mutex<Files>>,
}

impl FileSink {
    pub fn new(config: FileSinkConfig) -> Result<Self, PluginConfigError> {
        let template = Template::parse(&config.path)?;
        let max_bytes = match &config.max_file_size {
            Some(text) => match parse_size(text) {
                Ok(0) => return Err(PluginConfigError::new("max_file_size", "must be above 0")),
                Ok(bytes) => Some(bytes),
                Err(message) => return Err(PluginConfigError::new("max_file_size", message)),
            },
            None => None,
        };
        let max_age = (!config.rotate_interval.is_zero()).then_some(config.rotate_interval);
        if (max_bytes.is_some() || max_age.is_some()) && !template.has_offset() {
            return Err(PluginConfigError::new(
                "path",
                "rotation (max_file_size, rotate_interval) needs {offset} in the path, so each new file has a name of its own",
            ));
        }
        let layout = Layout {
            format: config.format,
            include_metadata: config.include_metadata,
            include_headers: config.include_headers,
        };
        let rotation = Rotation { max_bytes, max_age };
        Ok(Self {
            template,
            layout,
            files: Arc::new(Mutex::new(Files::new(config.compression, rotation))),
        })
    }
}

#[async_trait]
impl Sink for FileSink {
    /// Creates the template's fixed directory: a path the process may not
    /// write to is a config error, anything else (a full disk, a mount not
    /// there yet) is worth retrying.
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let directory = self.template.fixed_directory();
        tokio::task::spawn_blocking(move || std::fs::create_dir_all(&directory))
            .await
            .map_err(ConnectorError::fatal)?
            .map_err(|error| match files::classify(&error) {
                files::Class::Fatal => ConnectorError::fatal(error),
                files::Class::Transient => ConnectorError::transient(error),
            })
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    /// Appends the batch to its files and fsyncs them. On any error every
    /// file touched is cut back to its length before the batch, so a retry
    /// writes the batch once.
    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if messages.is_empty() {
            return Ok(());
        }
        let chunks = output::chunks(&self.template, &self.layout, topic, messages);
        let files = Arc::clone(&self.files);
        tokio::task::spawn_blocking(move || files_lock(&files).append(chunks))
            .await
            .map_err(SinkError::fatal)?
            .map_err(|error| match files::classify(&error) {
                files::Class::Fatal => SinkError::fatal(error),
                files::Class::Transient => SinkError::transient(error),
            })
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        files_lock(&self.files).close_all();
        Ok(())
    }
}

fn files_lock(files: &Mutex<Files>) -> std::sync::MutexGuard<'_, Files> {
    files
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(config: serde_json::Value) -> Result<FileSink, PluginConfigError> {
        FileSink::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_rotation_without_an_offset_in_the_path_when_built_should_name_the_path() {
        let error = build(serde_json::json!({"path": "/out/{topic}.log", "max_file_size": "1MiB"}))
            .err()
            .unwrap();
        assert_eq!(error.field, "path");
        let error = build(serde_json::json!({"path": "/out/{topic}.log", "rotate_interval": "1h"}))
            .err()
            .unwrap();
        assert_eq!(error.field, "path");
        let error = build(serde_json::json!({"path": "/out/{offset}.log", "max_file_size": "0"}))
            .err()
            .unwrap();
        assert_eq!(error.field, "max_file_size");
        assert!(
            build(serde_json::json!({"path": "/out/{offset}.log", "rotate_interval": "1h"}))
                .is_ok()
        );
    }
}
