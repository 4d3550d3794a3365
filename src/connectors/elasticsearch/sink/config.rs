//! The `elasticsearch` sink's `plugin_config`: upstream's fields and defaults
//! (`batch_size` and `timeout_seconds` now do what they say), plus API key
//! auth, an ingest pipeline, the engine's retry settings and TLS options.

use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;
use crate::connectors::kit::http::Auth;

use super::template::IndexTemplate;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ElasticsearchSinkConfig {
    /// Base URL of the cluster (http or https), Elasticsearch 8/9 or OpenSearch 2.
    pub url: String,
    /// Target index. May be a template: `{field}` is a field of the document
    /// (dotted for nested ones, `_iggy_topic` too) and `%Y`, `%m`, `%d`, `%H`
    /// the message timestamp (UTC), e.g. `logs-{service}-%Y.%m.%d`.
    pub index: String,
    /// Basic auth user (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic auth password.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub password: Option<SecretString>,
    /// An API key in its encoded form (base64 of `id:key`, as Elasticsearch
    /// returns it), sent as `Authorization: ApiKey ...`. When set,
    /// `username`/`password` are not sent.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub api_key: Option<SecretString>,
    /// Create a missing index (with `index_mapping`) at open, or for a
    /// template when a message first names it.
    #[serde(default = "default_true")]
    pub create_index_if_not_exists: bool,
    /// Body of the create-index request: `{"mappings": ..., "settings": ...}`.
    #[serde(default)]
    pub index_mapping: Option<serde_json::Value>,
    /// Most documents in one `_bulk` request.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Largest `_bulk` request body in bytes; a larger batch is split, and a
    /// single document over it is rejected (`on_error`).
    #[serde(default = "default_max_bulk_bytes")]
    pub max_bulk_bytes: usize,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Ingest pipeline every document goes through (`?pipeline=`).
    #[serde(default)]
    pub pipeline: Option<String>,
    /// Add upstream's `_iggy_offset`, `_iggy_stream`, `_iggy_topic`,
    /// `_iggy_partition`, `_iggy_timestamp` and `_iggy_headers` fields.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Engine retry setting: after this many consecutive failed writes (429,
    /// 5xx, no answer) the sink is marked degraded. The engine keeps writing
    /// again what is not durable yet; nothing is dropped.
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
    /// PEM file of CA certificates trusted besides the built-in roots.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Accept any TLS certificate (development only).
    #[serde(default)]
    pub tls_danger_accept_invalid_certs: bool,
}

fn default_true() -> bool {
    true
}

fn default_batch_size() -> usize {
    1000
}

fn default_max_bulk_bytes() -> usize {
    10 * 1024 * 1024
}

fn default_timeout_seconds() -> u64 {
    30
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_millis(200)
}

fn default_max_retry_delay() -> Duration {
    Duration::from_secs(10)
}

impl ElasticsearchSinkConfig {
    /// Checks the fields, naming the offending one; the URL and index template.
    pub fn validate(&self) -> Result<(reqwest::Url, IndexTemplate, Auth), PluginConfigError> {
        let url = crate::connectors::elasticsearch::base_url(&self.url)?;
        let auth = crate::connectors::elasticsearch::auth(
            self.api_key.as_ref(),
            self.username.as_ref(),
            self.password.as_ref(),
        )?;
        let template = IndexTemplate::parse(&self.index)
            .map_err(|reason| PluginConfigError::new("index", reason))?;
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.timeout_seconds == 0 {
            return Err(PluginConfigError::new(
                "timeout_seconds",
                "expected at least 1",
            ));
        }
        if let Some(mapping) = &self.index_mapping
            && !mapping.is_object()
        {
            return Err(PluginConfigError::new(
                "index_mapping",
                "expected a JSON object (the create-index body, {\"mappings\": ...})",
            ));
        }
        if self.pipeline.as_deref().is_some_and(str::is_empty) {
            return Err(PluginConfigError::new(
                "pipeline",
                "expected a pipeline id, found an empty string",
            ));
        }
        Ok((url, template, auth))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<ElasticsearchSinkConfig, PluginConfigError> {
        let config: ElasticsearchSinkConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_upstream_fields_when_parsed_should_use_upstream_defaults() {
        let config = parse(serde_json::json!({
            "url": "http://localhost:9200",
            "index": "iggy_messages",
            "create_index_if_not_exists": true,
            "batch_size": 100,
            "timeout_seconds": 30,
        }))
        .unwrap();
        assert!(config.create_index_if_not_exists && config.include_metadata);
        assert_eq!(config.batch_size, 100);
        let defaults = parse(serde_json::json!({"url": "http://h:9200", "index": "i"})).unwrap();
        assert!(defaults.create_index_if_not_exists);
        assert_eq!(defaults.timeout_seconds, 30);
    }

    #[test]
    fn given_half_of_basic_auth_when_validated_should_name_the_missing_field() {
        let error = parse(serde_json::json!({"url": "http://h", "index": "i", "username": "u"}))
            .unwrap_err();
        assert_eq!(error.field, "password");
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (config, field) in [
            (serde_json::json!({"url": "ftp://h", "index": "i"}), "url"),
            (
                serde_json::json!({"url": "http://h", "index": "Logs"}),
                "index",
            ),
            (
                serde_json::json!({"url": "http://h", "index": "i", "index_mapping": [1]}),
                "index_mapping",
            ),
            (
                serde_json::json!({"url": "http://h", "index": "i", "batch_size": 0}),
                "batch_size",
            ),
        ] {
            assert_eq!(parse(config).unwrap_err().field, field);
        }
    }
}
