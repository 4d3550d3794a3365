//! The `quickwit` sink's `plugin_config`: upstream's `url` and `index` (a
//! YAML index config), plus the commit mode, request limits, the engine's
//! retry settings and TLS.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuickwitSinkConfig {
    /// Base URL of Quickwit 0.8 (http or https), e.g. `http://localhost:7280`.
    pub url: String,
    /// The index config as Quickwit's YAML (`version`, `index_id`,
    /// `doc_mapping`, ...): sent as it is to create the index when missing;
    /// `index_id` names the index written to.
    pub index: String,
    /// The ingest `commit` mode: `auto` (Ok once Quickwit queued the documents
    /// durably; searchable after the index's `commit_timeout_secs`),
    /// `wait_for` (Ok once they are searchable) or `force` (commit now, Ok
    /// once searchable; costly per request).
    #[serde(default)]
    pub commit: CommitMode,
    /// Create the index from `index` at open when it does not exist.
    #[serde(default = "default_true")]
    pub create_index_if_not_exists: bool,
    /// Most documents in one ingest request.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Largest ingest request body in bytes (Quickwit refuses more than 10 MiB
    /// by default); a single document over it is rejected (`on_error`).
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// A field every document gets holding the Iggy message id (32 hex
    /// digits), to find duplicates a replay adds (Quickwit has no document
    /// ids). With `mode: strict` the doc mapping must declare it.
    #[serde(default)]
    pub id_field: Option<String>,
    /// Timeout of one request (with `wait_for`, above the index's
    /// `commit_timeout_secs`).
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Engine retry setting: after this many consecutive failed writes (429,
    /// 5xx, no answer) the sink is marked degraded. The engine keeps writing
    /// again what is not acknowledged yet; nothing is dropped.
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

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommitMode {
    /// Upstream's: acknowledged once queued durably, searchable later.
    #[default]
    Auto,
    WaitFor,
    Force,
}

impl CommitMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CommitMode::Auto => "auto",
            CommitMode::WaitFor => "wait_for",
            CommitMode::Force => "force",
        }
    }
}

/// What the sink reads of the YAML index config.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    pub index_id: String,
    /// `doc_mapping.mode` is `strict`: documents with undeclared fields are
    /// dropped by Quickwit after it acknowledged them.
    pub strict: bool,
    /// `doc_mapping.field_mappings`: (name, type).
    pub fields: Vec<(String, String)>,
}

fn default_true() -> bool {
    true
}

fn default_batch_size() -> usize {
    1000
}

fn default_max_request_bytes() -> usize {
    10 * 1024 * 1024
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
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

impl QuickwitSinkConfig {
    /// Checks the fields, naming the offending one; the base URL and what the
    /// index config says.
    pub fn validate(&self) -> Result<(reqwest::Url, IndexConfig), PluginConfigError> {
        let url = crate::connectors::kit::http::base_url(&self.url)?;
        let index = parse_index(&self.index)?;
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.max_request_bytes == 0 {
            return Err(PluginConfigError::new(
                "max_request_bytes",
                "expected at least 1",
            ));
        }
        if self.id_field.as_deref().is_some_and(str::is_empty) {
            return Err(PluginConfigError::new(
                "id_field",
                "expected a field name, found an empty string",
            ));
        }
        Ok((url, index))
    }
}

/// Reads `index_id` and the doc mapping out of the YAML index config.
pub fn parse_index(text: &str) -> Result<IndexConfig, PluginConfigError> {
    if text.trim().is_empty() {
        return Err(PluginConfigError::new(
            "index",
            "expected Quickwit's YAML index config (with index_id), found an empty string",
        ));
    }
    let value: Value = serde_yaml_ng::from_str(text).map_err(|error| {
        PluginConfigError::new("index", format!("not a valid YAML index config: {error}"))
    })?;
    if !value.is_object() {
        return Err(PluginConfigError::new(
            "index",
            "expected a YAML mapping (version, index_id, doc_mapping, ...)",
        ));
    }
    let index_id = match &value["index_id"] {
        Value::String(id) if valid_index_id(id) => id.clone(),
        Value::Null => {
            return Err(PluginConfigError::new(
                "index.index_id",
                "missing: the YAML index config must name its index_id",
            ));
        }
        other => {
            return Err(PluginConfigError::new(
                "index.index_id",
                format!(
                    "expected 3 to 255 letters, digits, '-', '_' or '.' starting with a letter, found {other}"
                ),
            ));
        }
    };
    let mapping = &value["doc_mapping"];
    let strict = mapping["mode"].as_str() == Some("strict");
    let fields = mapping["field_mappings"]
        .as_array()
        .map(|fields| {
            fields
                .iter()
                .filter_map(|field| {
                    Some((
                        field["name"].as_str()?.to_owned(),
                        field["type"].as_str().unwrap_or("text").to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(IndexConfig {
        index_id,
        strict,
        fields,
    })
}

fn valid_index_id(id: &str) -> bool {
    (3..=255).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_alphabetic())
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<QuickwitSinkConfig, PluginConfigError> {
        let config: QuickwitSinkConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    const INDEX: &str = "version: 0.8\nindex_id: events\ndoc_mapping:\n  mode: strict\n  field_mappings:\n    - name: id\n      type: u64\n    - name: name\n      type: text\n";

    #[test]
    fn given_upstream_fields_when_parsed_should_read_the_index_config() {
        let config = parse(serde_json::json!({"url": "http://h:7280", "index": INDEX})).unwrap();
        assert_eq!(config.commit, CommitMode::Auto);
        assert!(config.create_index_if_not_exists);
        let (_, index) = config.validate().unwrap();
        assert_eq!(index.index_id, "events");
        assert!(index.strict);
        assert_eq!(index.fields[0], ("id".to_owned(), "u64".to_owned()));
    }

    #[test]
    fn given_bad_yaml_or_no_index_id_when_validated_should_name_the_field_not_panic() {
        for (index, field) in [
            ("index_id: [unclosed", "index"),
            ("", "index"),
            ("just text", "index"),
            ("version: 0.8\ndoc_mapping: {}\n", "index.index_id"),
            ("index_id: 9bad", "index.index_id"),
        ] {
            let error = parse(serde_json::json!({"url": "http://h", "index": index})).unwrap_err();
            assert_eq!(error.field, field, "{index:?}: {error}");
        }
        let error = parse(serde_json::json!({"url": "http://h", "index": INDEX, "commit": "now"}))
            .unwrap_err();
        assert_eq!(error.field, "commit");
    }
}
