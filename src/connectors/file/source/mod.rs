//! `file` source: tails local files matched by globs, one record per line
//! (or per multi-line record), following rotation by rename and by
//! copytruncate and picking up new files; `.gz` files are read whole once.
//! Its state is one checkpoint per file (device, inode, a fingerprint of the
//! first bytes, the offset after the last line sent), saved by the engine
//! only after Iggy acknowledged the lines before it.

mod checkpoint;
mod tailer;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use crate::connectors::{
    ConnectorError, PluginConfigError, Source, SourceBatch, SourceEntry, encode_state,
    parse_plugin_config, schema_of,
};

use checkpoint::FileState;
use tailer::{Settings, Tailer};

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

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSourceConfig {
    /// Glob patterns of the files to tail (`/var/log/app/*.log`, `**`
    /// allowed). To follow copytruncate rotation without a gap, include the
    /// rotated name too (`app.log*`): the copy is recognised by its first
    /// bytes and read on from the offset reached.
    pub include: Vec<String>,
    /// Glob patterns of files to leave out, even when `include` matches them
    /// (`*.gz` to skip rotated, compressed copies).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Where to start in a file found at the first start of the source (no
    /// saved state): `beginning` or `end`. Files found later, and every file
    /// once the source has state, are read from the beginning (or their
    /// checkpoint), so nothing written after the start is missed.
    #[serde(default)]
    pub read_from: ReadFrom,
    /// How often to look for new data and for new, rotated or truncated
    /// files while the files are idle.
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// A multi-line record starts at a line matching this regular
    /// expression; the lines that follow and do not match belong to it
    /// (stack traces). Unset: one record per line.
    #[serde(default)]
    pub multiline_start: Option<String>,
    /// A multi-line record's last lines are sent once the file has had no
    /// new data for this long (or the next record starts).
    #[serde(
        default = "default_multiline_timeout",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub multiline_timeout: Duration,
    /// How many of a file's first bytes identify it (its fingerprint, with
    /// device and inode): a rotated copy starts with the same bytes. Files
    /// that begin with the same this-many bytes are taken for copies.
    #[serde(default = "default_fingerprint_bytes")]
    pub fingerprint_bytes: u32,
    /// A line longer than this is sent in pieces of this size.
    #[serde(default = "default_max_line_bytes")]
    pub max_line_bytes: usize,
    /// Most records per batch.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// A file that disappeared from the globs (renamed away, deleted) is
    /// read to its end and let go once it has had no new data for this long.
    #[serde(default = "default_rotate_wait", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub rotate_wait: Duration,
    /// Each record carries a `file` header (the path it was read from) and an
    /// `offset` header (its first byte in the file).
    #[serde(default = "default_true")]
    pub include_file_headers: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadFrom {
    #[default]
    Beginning,
    End,
}

fn default_poll_interval() -> Duration {
    Duration::from_millis(250)
}

fn default_multiline_timeout() -> Duration {
    Duration::from_secs(1)
}

fn default_fingerprint_bytes() -> u32 {
    256
}

fn default_max_line_bytes() -> usize {
    1 << 20
}

fn default_batch_size() -> usize {
    1000
}

fn default_rotate_wait() -> Duration {
    Duration::from_secs(5)
}

fn default_true() -> bool {
    true
}

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

    /// Reads what the files hold beyond their checkpoints; waits
    /// `poll_interval` and looks again while there is nothing.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        loop {
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
            if let Some((records, state)) = lock(&self.ready).take() {
                return Ok(SourceBatch {
                    records,
                    state: Some(state),
                    finished: false,
                });
            }
            tokio::time::sleep(self.poll_interval).await;
        }
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
