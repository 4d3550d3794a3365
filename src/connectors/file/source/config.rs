//! The file source's `plugin_config`, and the same checked and compiled
//! once (`Settings`).

use std::time::Duration;

use regex::bytes::Regex;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

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

/// The config, checked and compiled.
pub struct Settings {
    pub include: Vec<String>,
    pub exclude: Vec<glob::Pattern>,
    pub read_from_end: bool,
    pub multiline_start: Option<Regex>,
    pub multiline_timeout: Duration,
    pub fingerprint_bytes: usize,
    pub max_line_bytes: usize,
    pub batch_size: usize,
    pub rotate_wait: Duration,
    pub scan_interval: Duration,
    pub headers: bool,
}

impl Settings {
    pub fn from_config(config: &FileSourceConfig) -> Result<Self, PluginConfigError> {
        if config.include.is_empty() {
            return Err(PluginConfigError::new(
                "include",
                "expected at least one pattern",
            ));
        }
        for (index, pattern) in config.include.iter().enumerate() {
            glob::Pattern::new(pattern).map_err(|error| {
                PluginConfigError::new(format!("include.{index}"), error.to_string())
            })?;
        }
        let exclude = config
            .exclude
            .iter()
            .enumerate()
            .map(|(index, pattern)| {
                glob::Pattern::new(pattern).map_err(|error| {
                    PluginConfigError::new(format!("exclude.{index}"), error.to_string())
                })
            })
            .collect::<Result<_, _>>()?;
        let multiline_start = config
            .multiline_start
            .as_deref()
            .map(Regex::new)
            .transpose()
            .map_err(|error| PluginConfigError::new("multiline_start", error.to_string()))?;
        for (field, value) in [
            ("fingerprint_bytes", config.fingerprint_bytes as usize),
            ("max_line_bytes", config.max_line_bytes),
            ("batch_size", config.batch_size),
        ] {
            if value == 0 {
                return Err(PluginConfigError::new(field, "must be above 0"));
            }
        }
        Ok(Self {
            include: config.include.clone(),
            exclude,
            read_from_end: config.read_from == ReadFrom::End,
            multiline_start,
            multiline_timeout: config.multiline_timeout,
            fingerprint_bytes: config.fingerprint_bytes as usize,
            max_line_bytes: config.max_line_bytes,
            batch_size: config.batch_size,
            rotate_wait: config.rotate_wait,
            scan_interval: config.poll_interval,
            headers: config.include_file_headers,
        })
    }
}
