//! `file` source: tails local files matched by globs, one record per line
//! (or per multi-line record), following rotation by rename and by
//! copytruncate and picking up new files; `.gz` files are read whole once.
//! Its state is one checkpoint per file (device, inode, a fingerprint of the
//! first bytes, the offset after the last line sent), saved by the engine
//! only after Iggy acknowledged the lines before it.

mod checkpoint;
mod config;
mod tailer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::connectors::{
    ConnectorError, PluginConfigError, Source, SourceBatch, SourceEntry, encode_state,
    parse_plugin_config, schema_of,
};

use checkpoint::FileState;
use config::Settings;
pub use config::{FileSourceConfig, ReadFrom};
use tailer::Tailer;

pub const ENTRY: SourceEntry = SourceEntry {
    name: "file",
    feature: "file-source",
    description: "tails local files (globs, rotation, multi-line records, .gz read once)",
    secret_fields: &[],
    sample_config: "include = [\"/var/log/app/*.log\"]\nread_from = \"beginning\"\n",
    config_schema: schema_of::<FileSourceConfig>,
    build: |config| Ok(Box::new(FileSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct FileSource {
    settings: Arc<Settings>,
    poll_interval: Duration,
    tailer: Arc<Mutex<Option<Tailer>>>,
    /// A batch read and not yet returned: a poll dropped while its read ran
    /// leaves it here for the next poll (cancel safety).
    ready: Arc<Mutex<Option<Ready>>>,
}

/// A batch's records and its encoded state.
type Ready = (Vec<crate::message::SourceRecord>, Vec<u8>);

impl FileSource {
    pub fn new(config: FileSourceConfig) -> Result<Self, PluginConfigError> {
        let settings = Settings::from_config(&config)?;
        Ok(Self {
            settings: Arc::new(settings),
            poll_interval: config.poll_interval,
            tailer: Arc::new(Mutex::new(None)),
            ready: Arc::new(Mutex::new(None)),
        })
    }
}

#[async_trait]
impl Source for FileSource {
    /// A state that does not decode is refused: starting afresh would send
    /// every file again (or skip them with `read_from = "end"`).
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        let restored = state.map(FileState::decode).transpose()?;
        let tailer = Tailer::new(Arc::clone(&self.settings), restored);
        *lock(&self.tailer) = Some(tailer);
        Ok(())
    }

    /// Reads what the files hold beyond their checkpoints; when there is
    /// nothing, an empty batch asks the engine to look again `poll_interval`
    /// after this poll began.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let started = tokio::time::Instant::now();
        let shared = Arc::clone(&self.tailer);
        let ready = Arc::clone(&self.ready);
        tokio::task::spawn_blocking(move || {
            let mut slot = lock(&shared);
            let tailer = slot
                .as_mut()
                .ok_or_else(|| ConnectorError::fatal("the file source is not open"))?;
            let mut ready = lock(&ready);
            if ready.is_none() {
                let records = tailer.read_batch();
                if !records.is_empty() {
                    *ready = Some((records, encode_state(&tailer.state())?));
                }
            }
            Ok::<_, ConnectorError>(())
        })
        .await
        .map_err(ConnectorError::fatal)??;
        Ok(match lock(&self.ready).take() {
            Some((records, state)) => SourceBatch {
                records,
                state: Some(state),
                finished: false,
                next_poll: None,
            },
            None => SourceBatch {
                next_poll: Some(started + self.poll_interval),
                ..SourceBatch::default()
            },
        })
    }

    /// Nothing to apply: the files are only read.
    async fn commit(&self) -> Result<(), ConnectorError> {
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        crate::config::connector::MAX_IN_FLIGHT as usize
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        lock(&self.tailer).take();
        lock(&self.ready).take();
        Ok(())
    }
}

fn lock<T>(shared: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
