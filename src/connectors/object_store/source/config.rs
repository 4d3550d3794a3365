//! The `object_store` source's `plugin_config`.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::config::size::parse_size;
use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreSourceConfig {
    /// Where the objects are: `s3://bucket/prefix`, `az://container/prefix`
    /// (also `abfss://` and `https://account.blob.core.windows.net/...`),
    /// `gs://bucket/prefix` or `file:///directory`. Every object under the
    /// prefix is read (see `glob`).
    pub url: String,
    /// A glob the key below the prefix must match (`*.jsonl.gz`,
    /// `2026/**/*.csv`); `*` stops at `/`, `**` crosses it. Unset: every object.
    #[serde(default)]
    pub glob: Option<String>,
    /// How an object's bytes become records: `json_lines` (alias `jsonl`),
    /// `json_array`, `csv` (first row is the header; each row becomes a JSON
    /// object of strings), `parquet` (each row as a JSON object), `avro`
    /// (an Avro object container file: each datum as JSON), `text_lines`
    /// (one text message per line), `bytes` (the whole object as one raw
    /// message), or `auto`: by the key's extension below `.gz`/`.zst`
    /// (`.parquet`, `.avro`, `.csv`, `.txt`/`.log`, `.json` holding an
    /// array), else Parquet and Avro by their magic bytes, else JSON lines.
    #[serde(default)]
    pub format: Format,
    /// Decompression: `auto` (`.gz`/`.zst` keys, or gzip and zstd magic
    /// bytes), `none`, `gzip` or `zstd`.
    #[serde(default)]
    pub compression: Compression,
    /// Reading order: `key` (lexicographic) or `last_modified` (then key).
    /// State is a watermark in this order: with `key`, an object that appears
    /// later under a key below the watermark is not read; with
    /// `last_modified`, an object written or rewritten later is read (also
    /// one written in the watermark's second under a smaller key).
    #[serde(default)]
    pub order: Order,
    /// Where to start: a key below the prefix (only keys after it are
    /// read), or an RFC 3339 time (`2026-05-01T00:00:00Z`: only objects
    /// last modified after it are read; natural with `order =
    /// "last_modified"`). A value that parses as an RFC 3339 time is a time.
    #[serde(default)]
    pub after: Option<String>,
    /// Objects read and decoded at once, ahead of the one being sent;
    /// records still go out, and commit, in reading order. Each holds up
    /// to `max_object_bytes` in memory while it waits.
    #[serde(default = "default_parallel_reads")]
    pub parallel_reads: usize,
    /// How long to wait before listing the prefix again once every listed
    /// object is read.
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// Records per batch (a batch may span several small objects).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// An object larger than this (stored, or after decompression) is not
    /// read: it goes through `on_error` (`"256MiB"`, `"1GB"`, bytes).
    #[serde(default = "default_max_object_bytes")]
    pub max_object_bytes: String,
    /// What happens to an object once all its records are in Iggy and the
    /// state covering it is saved: `keep`, `delete`, or `move` (to
    /// `done_prefix`).
    #[serde(default)]
    pub after_commit: AfterCommit,
    /// With `after_commit = "move"`: the key prefix (in the same bucket or
    /// container, from its root) finished objects are moved to; never read
    /// even when it lies under `url`'s prefix.
    #[serde(default)]
    pub done_prefix: Option<String>,
    /// An object that cannot be read or decoded (corrupt data, too large):
    /// `skip` (logged with its key, counted as finished), `dlq` (sent to the
    /// connector's `[dead_letter]` topic as one message naming its key, etag,
    /// size and the reason, then counted as finished) or `stop` (the source
    /// stops, naming the key).
    #[serde(default)]
    pub on_error: OnObjectError,
    /// S3 (and S3-compatible) region.
    #[serde(default)]
    pub region: Option<String>,
    /// S3-compatible endpoint URL (MinIO, moto, R2); implies path-style
    /// addressing and allows `http://`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// S3 access key; set both or neither of it and `secret_access_key`
    /// (neither: the `AWS_*` environment, then the instance's role).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub access_key_id: Option<SecretString>,
    /// S3 secret key that goes with `access_key_id`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub secret_access_key: Option<SecretString>,
    /// Any other option of the store, by the `object_store` crate's names:
    /// `azure_storage_account_name`, `azure_storage_account_key`,
    /// `azure_storage_sas_key`, `azure_storage_use_emulator`,
    /// `google_service_account_key`, `aws_session_token`, ... Values are
    /// treated as secrets.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub options: BTreeMap<String, SecretString>,
    /// Timeout of one request to the store.
    #[serde(default = "default_request_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub request_timeout: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    #[default]
    #[serde(alias = "jsonl", alias = "jsonlines")]
    JsonLines,
    JsonArray,
    Csv,
    Parquet,
    Avro,
    TextLines,
    Bytes,
    Auto,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    Auto,
    None,
    Gzip,
    Zstd,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    #[default]
    Key,
    LastModified,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AfterCommit {
    #[default]
    Keep,
    Delete,
    Move,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnObjectError {
    #[default]
    Skip,
    Dlq,
    Stop,
}

/// Where reading starts (`after`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    /// Keys (below the prefix) above this one.
    Key(String),
    /// Objects last modified after this time.
    Time(chrono::DateTime<chrono::Utc>),
}

/// What `validate` derives from the fields.
#[derive(Debug, Clone)]
pub struct Checked {
    pub url: url::Url,
    pub glob: Option<glob::Pattern>,
    pub max_object_bytes: u64,
    /// The done prefix, slashes trimmed.
    pub done_prefix: Option<String>,
    pub after: Option<After>,
}

impl ObjectStoreSourceConfig {
    /// Checks what serde cannot, naming the field.
    pub fn validate(&self) -> Result<Checked, PluginConfigError> {
        let url = url::Url::parse(self.url.trim()).map_err(|error| {
            PluginConfigError::new(
                "url",
                format!("expected s3://, az://, gs:// or file:// URL ({error})"),
            )
        })?;
        if ::object_store::ObjectStoreScheme::parse(&url).is_err() {
            return Err(PluginConfigError::new(
                "url",
                format!("\"{url}\" names no store (s3://, az://, gs://, file://)"),
            ));
        }
        let glob = self
            .glob
            .as_deref()
            .map(glob::Pattern::new)
            .transpose()
            .map_err(|error| PluginConfigError::new("glob", error.to_string()))?;
        let max_object_bytes = parse_size(&self.max_object_bytes)
            .map_err(|message| PluginConfigError::new("max_object_bytes", message))?;
        if max_object_bytes == 0 {
            return Err(PluginConfigError::new(
                "max_object_bytes",
                "must be above 0",
            ));
        }
        if !(1..=64).contains(&self.parallel_reads) {
            return Err(PluginConfigError::new(
                "parallel_reads",
                "must be from 1 to 64",
            ));
        }
        let after = self.after.as_deref().map(|after| {
            match chrono::DateTime::parse_from_rfc3339(after.trim()) {
                Ok(time) => After::Time(time.to_utc()),
                Err(_) => After::Key(after.to_owned()),
            }
        });
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "must be above 0"));
        }
        let done_prefix = self
            .done_prefix
            .as_deref()
            .map(|prefix| prefix.trim_matches('/').to_owned())
            .filter(|prefix| !prefix.is_empty());
        if self.after_commit == AfterCommit::Move && done_prefix.is_none() {
            return Err(PluginConfigError::new(
                "done_prefix",
                "required with after_commit = \"move\"",
            ));
        }
        crate::connectors::kit::store::check_s3_fields(
            self.access_key_id.is_some(),
            self.secret_access_key.is_some(),
            self.endpoint.as_deref(),
        )?;
        Ok(Checked {
            url,
            glob,
            max_object_bytes,
            done_prefix,
            after,
        })
    }
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_parallel_reads() -> usize {
    4
}

fn default_batch_size() -> usize {
    1000
}

fn default_max_object_bytes() -> String {
    "256MiB".to_owned()
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<ObjectStoreSourceConfig, PluginConfigError> {
        let mut value = serde_json::json!({"url": "s3://bucket/in"});
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_only_a_url_when_parsed_should_take_the_defaults() {
        let config = config(serde_json::json!({})).unwrap();
        let checked = config.validate().unwrap();
        assert_eq!(config.format, Format::JsonLines);
        assert_eq!(config.compression, Compression::Auto);
        assert_eq!(config.order, Order::Key);
        assert_eq!(config.after_commit, AfterCommit::Keep);
        assert_eq!(config.on_error, OnObjectError::Skip);
        assert_eq!(checked.max_object_bytes, 256 << 20);
        assert!(checked.glob.is_none());
        assert_eq!(config.parallel_reads, 4);
        assert_eq!(checked.after, None);
    }

    #[test]
    fn given_after_as_a_time_or_a_key_when_validated_should_tell_them_apart() {
        let after = |value: &str| {
            config(serde_json::json!({"after": value}))
                .unwrap()
                .validate()
                .unwrap()
                .after
                .unwrap()
        };
        let time = chrono::DateTime::parse_from_rfc3339("2026-05-01T00:00:00Z").unwrap();
        assert_eq!(
            after("2026-05-01T02:00:00+02:00"),
            After::Time(time.to_utc())
        );
        assert_eq!(
            after("2026-05-01/part-0001.jsonl"),
            After::Key("2026-05-01/part-0001.jsonl".to_owned())
        );
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        let cases = [
            (serde_json::json!({"url": "not a url"}), "url"),
            (serde_json::json!({"url": "ftp://host/x"}), "url"),
            (serde_json::json!({"glob": "[a"}), "glob"),
            (
                serde_json::json!({"max_object_bytes": "2 parsecs"}),
                "max_object_bytes",
            ),
            (serde_json::json!({"batch_size": 0}), "batch_size"),
            (serde_json::json!({"parallel_reads": 0}), "parallel_reads"),
            (serde_json::json!({"parallel_reads": 65}), "parallel_reads"),
            (serde_json::json!({"after_commit": "move"}), "done_prefix"),
            (serde_json::json!({"access_key_id": "a"}), "access_key_id"),
            (
                serde_json::json!({"endpoint": "localhost:5000"}),
                "endpoint",
            ),
        ];
        for (extra, field) in cases {
            let error = config(extra.clone()).unwrap().validate().unwrap_err();
            assert_eq!(error.field, field, "{extra}: {error}");
        }
    }
}
