//! The `meilisearch` sink's `plugin_config`: upstream's fields and defaults
//! (its retry fields are the engine's retry settings for this sink), plus
//! TLS options.

use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MeilisearchSinkConfig {
    /// Base URL of Meilisearch 1.x (http or https). Query and fragment are
    /// ignored; a path is kept (a reverse proxy's prefix).
    pub url: String,
    /// Target index uid (letters, digits, `-` and `_`).
    pub index: String,
    /// API key, sent as `Authorization: Bearer ...` (a master key or a key
    /// with `documents.add`, `tasks.get`, and `indexes.create` for
    /// `create_index_if_not_exists`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub api_key: Option<SecretString>,
    /// The index's primary key field. A document without it gets upstream's
    /// deterministic id (`iggy_` + base64url of stream, topic, partition,
    /// offset and message id), so a replay replaces instead of duplicating.
    #[serde(default = "default_primary_key")]
    pub primary_key: String,
    /// `replace` (the default: add or replace whole documents) or `update` (add or update:
    /// fields are merged into the stored document).
    #[serde(default)]
    pub document_action: DocumentAction,
    /// Create a missing index (with `primary_key`) at open.
    #[serde(default = "default_true")]
    pub create_index_if_not_exists: bool,
    /// Add upstream's `iggy_*` fields (they overwrite payload fields of the
    /// same name): `iggy_message_id`, `iggy_offset`, `iggy_stream`,
    /// `iggy_topic`, `iggy_partition`, `iggy_checksum` (a string),
    /// `iggy_timestamp`, `iggy_origin_timestamp` (microseconds),
    /// `iggy_ingested_at` (ms), `iggy_headers`, and `iggy_id` when
    /// `primary_key` is another field.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Most documents in one documents request (one Meilisearch task).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Timeout of one HTTP request.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Follow each documents task until it `succeeded` (then `write` returns
    /// `Ok`) or `failed`. `false`: `Ok` once Meilisearch enqueued the task,
    /// and a task failing later is never seen (see docs/connectors/meilisearch.md).
    #[serde(default = "default_true")]
    pub wait_for_tasks: bool,
    /// Longest wait for one task to finish; past it the write is transient
    /// (the engine writes the batch again: it replaces the same documents).
    #[serde(default = "default_task_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub task_timeout: Duration,
    /// Delay between two looks at a task.
    #[serde(
        default = "default_task_poll_interval",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub task_poll_interval: Duration,
    /// Engine retry setting: after this many consecutive failed writes (429,
    /// 5xx, no answer, a task failed with an internal error) the sink is
    /// marked degraded. The engine keeps writing again what is not durable
    /// yet; nothing is dropped.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: the wait before writing again what failed, and
    /// before opening again (doubling, with jitter; a longer `Retry-After`
    /// wins).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Engine retry setting: the longest wait between two attempts.
    #[serde(default = "default_max_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub max_retry_delay: Duration,
    /// Accepted for upstream's files and not used: the engine retries a
    /// transient failure at open (health, index check and creation) on a
    /// fresh sink, waiting as `retry_delay` and `max_retry_delay` say, until
    /// it opens or `[engine] max_open_attempts` is reached.
    #[serde(default = "default_max_open_retries")]
    pub max_open_retries: u32,
    /// PEM file of CA certificates trusted besides the built-in roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Accept any TLS certificate (development only).
    #[serde(default)]
    pub tls_danger_accept_invalid_certs: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DocumentAction {
    /// `POST /indexes/{index}/documents`: a document replaces the stored one.
    #[default]
    Replace,
    /// `PUT /indexes/{index}/documents`: its fields update the stored one.
    Update,
}

fn default_primary_key() -> String {
    "iggy_id".into()
}

fn default_true() -> bool {
    true
}

fn default_batch_size() -> usize {
    1000
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_task_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_task_poll_interval() -> Duration {
    Duration::from_millis(100)
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_millis(500)
}

fn default_max_retry_delay() -> Duration {
    Duration::from_secs(5)
}

fn default_max_open_retries() -> u32 {
    5
}

impl MeilisearchSinkConfig {
    /// Checks the fields, naming the offending one; the base URL.
    pub fn validate(&self) -> Result<reqwest::Url, PluginConfigError> {
        let url = crate::connectors::kit::http::base_url(&self.url)?;
        if !valid_uid(&self.index) {
            return Err(PluginConfigError::new(
                "index",
                format!(
                    "expected an index uid of 1 to 400 letters, digits, '-' or '_', found \"{}\"",
                    self.index
                ),
            ));
        }
        if self.primary_key.is_empty() {
            return Err(PluginConfigError::new(
                "primary_key",
                "expected a field name, found an empty string",
            ));
        }
        for (field, value) in [
            ("batch_size", self.batch_size as u128),
            ("timeout", self.timeout.as_millis()),
            ("task_timeout", self.task_timeout.as_millis()),
            ("task_poll_interval", self.task_poll_interval.as_millis()),
        ] {
            if value == 0 {
                return Err(PluginConfigError::new(
                    field,
                    "expected more than zero (a duration of at least 1ms)",
                ));
            }
        }
        Ok(url)
    }
}

/// An index uid Meilisearch accepts.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 400
        && uid
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<MeilisearchSinkConfig, PluginConfigError> {
        let config: MeilisearchSinkConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_only_the_required_fields_when_parsed_should_use_upstream_defaults() {
        let config = parse(serde_json::json!({"url": "http://h:7700", "index": "i"})).unwrap();
        assert_eq!(config.primary_key, "iggy_id");
        assert_eq!(config.document_action, DocumentAction::Replace);
        assert!(config.create_index_if_not_exists && config.include_metadata);
        assert!(config.wait_for_tasks);
        assert_eq!(config.batch_size, 1000);
        assert_eq!(config.timeout, Duration::from_secs(30));
        assert_eq!(config.task_timeout, Duration::from_secs(30));
        assert_eq!(config.task_poll_interval, Duration::from_millis(100));
        assert_eq!(config.max_retries, 3);
        assert_eq!(config.retry_delay, Duration::from_millis(500));
        assert_eq!(config.max_retry_delay, Duration::from_secs(5));
        assert_eq!(config.max_open_retries, 5);
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (config, field) in [
            (serde_json::json!({"url": "ftp://h", "index": "i"}), "url"),
            (
                serde_json::json!({"url": "http://h", "index": "a b"}),
                "index",
            ),
            (serde_json::json!({"url": "http://h", "index": ""}), "index"),
            (
                serde_json::json!({"url": "http://h", "index": "i", "primary_key": ""}),
                "primary_key",
            ),
            (
                serde_json::json!({"url": "http://h", "index": "i", "batch_size": 0}),
                "batch_size",
            ),
            (
                serde_json::json!({"url": "http://h", "index": "i", "task_timeout": "0s"}),
                "task_timeout",
            ),
            (
                serde_json::json!({"url": "http://h", "index": "i", "document_action": "upsert"}),
                "document_action",
            ),
            (
                serde_json::json!({"url": "http://h", "index": "i", "timeout": "soon"}),
                "timeout",
            ),
        ] {
            assert_eq!(parse(config.clone()).unwrap_err().field, field, "{config}");
        }
    }
}
