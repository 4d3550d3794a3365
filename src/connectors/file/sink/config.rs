//! The file sink's `plugin_config`.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSinkConfig {
    /// The file each message goes to: `{stream}`, `{topic}`, `{partition}`,
    /// `{date}` (`YYYY-MM-DD`) and `{hour}` (`HH`) of the message's Iggy
    /// timestamp (UTC, so a replay picks the same file), and `{offset}`, the
    /// offset of the file's first message (needed when files rotate).
    /// Missing directories are created.
    pub path: String,
    /// `json_lines` (alias `jsonl`: one JSON object per line with `payload`
    /// and, if enabled, the metadata and headers) or `raw` (each payload's
    /// bytes followed by a newline).
    #[serde(default)]
    pub format: Format,
    /// With `json_lines`: each line carries `offset`, `timestamp`, `stream`,
    /// `topic` and `partition_id` beside `payload`.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// With `json_lines`: each line carries the message's headers (if any).
    #[serde(default = "default_true")]
    pub include_headers: bool,
    /// `none`, `gzip` or `zstd`. Each batch is one gzip member or zstd frame
    /// appended to the file, so a file is a valid multi-member stream.
    #[serde(default)]
    pub compression: Compression,
    /// Start a new file once the current one has reached this size on disk
    /// (`"64MiB"`, `"500KB"`, bytes); checked before each batch, so a file
    /// may exceed it by one batch. Needs `{offset}` in `path`. Unset: no
    /// rotation by size.
    #[serde(default)]
    pub max_file_size: Option<String>,
    /// Start a new file once the current one has been written to for this
    /// long (by this process); `"0s"` (the default) never. Needs `{offset}`
    /// in `path`.
    #[serde(default, with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub rotate_interval: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    #[default]
    #[serde(alias = "jsonl")]
    JsonLines,
    Raw,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Zstd,
}

fn default_true() -> bool {
    true
}
