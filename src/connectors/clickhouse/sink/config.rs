//! The `clickhouse` sink's `plugin_config`: upstream's fields and defaults.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::{Backoff, PluginConfigError, RetrySettings};

/// The engine's backoff between retries is at most this long.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);
/// ... and at least this long, so `retry_delay = 0` does not spin.
const MIN_RETRY_DELAY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseSinkConfig {
    /// Base URL of the ClickHouse HTTP interface (`http://host:8123`).
    pub url: String,
    /// Database of the target table.
    #[serde(default = "default_database")]
    pub database: String,
    /// Target table; it must exist (the sink checks at open).
    pub table: String,
    /// User the sink authenticates as (HTTP basic auth).
    #[serde(default = "default_username")]
    pub username: String,
    /// Password of `username`; a secret.
    #[serde(default = "empty_secret")]
    #[schemars(with = "String")]
    pub password: SecretString,
    /// How payloads are sent: `json_each_row` (JSON objects, the server
    /// converts types), `row_binary` (JSON objects encoded by the sink from the
    /// table's columns, read at open) or `string` (text payloads as they are,
    /// in `string_format`).
    #[serde(default)]
    pub insert_format: InsertFormat,
    /// With `insert_format = "string"`: the format the text payloads are in.
    #[serde(default)]
    pub string_format: StringFormat,
    /// Timeout of one request, in seconds.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Engine retry setting: after this many failed writes in a row the sink
    /// reports itself degraded. The engine keeps retrying what is not stored
    /// (nothing is dropped); the sink sends each insert once per write.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: the wait before the engine's first retry of a
    /// failed write or `open`, in seconds, doubling up to 30 s (0 waits the
    /// shortest backoff, 100 ms).
    #[serde(default = "default_retry_delay")]
    pub retry_delay: u64,
    /// Log every insert's size and duration at debug level.
    #[serde(default)]
    pub verbose_logging: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InsertFormat {
    /// `FORMAT JSONEachRow`: one JSON object per message.
    #[default]
    JsonEachRow,
    /// `FORMAT RowBinaryWithDefaults` (or `RowBinary` on servers without it).
    RowBinary,
    /// Text payloads in `string_format`.
    String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StringFormat {
    #[default]
    JsonEachRow,
    Csv,
    Tsv,
}

impl StringFormat {
    pub fn clickhouse_name(self) -> &'static str {
        match self {
            StringFormat::JsonEachRow => "JSONEachRow",
            StringFormat::Csv => "CSV",
            StringFormat::Tsv => "TabSeparated",
        }
    }
}

impl ClickHouseSinkConfig {
    /// Checks the URL and the identifiers, naming the offending field.
    pub fn validate(&self) -> Result<reqwest::Url, PluginConfigError> {
        let url = reqwest::Url::parse(&self.url)
            .map_err(|error| PluginConfigError::new("url", format!("not a valid URL: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(PluginConfigError::new(
                "url",
                format!("expected an http or https URL, found {}", url.scheme()),
            ));
        }
        for (field, value) in [("database", &self.database), ("table", &self.table)] {
            if !is_identifier(value) {
                return Err(PluginConfigError::new(
                    field,
                    format!(
                        "expected a name of letters, digits and underscores not starting with a digit, found {value:?}"
                    ),
                ));
            }
        }
        if self.timeout_seconds == 0 {
            return Err(PluginConfigError::new(
                "timeout_seconds",
                "expected at least 1 second",
            ));
        }
        Ok(url)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds)
    }

    /// Upstream's retry fields as the engine's policy for this sink.
    pub fn retry_settings(&self) -> RetrySettings {
        let initial = Duration::from_secs(self.retry_delay).clamp(MIN_RETRY_DELAY, MAX_RETRY_DELAY);
        RetrySettings {
            backoff: Backoff {
                initial,
                max: MAX_RETRY_DELAY,
                multiplier: 2.0,
            },
            degraded_after: Some(self.max_retries),
        }
    }
}

/// `^[A-Za-z_][A-Za-z0-9_]*$`: safe inside backquotes and string literals alike.
pub fn is_identifier(name: &str) -> bool {
    let mut characters = name.chars();
    characters
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && characters.all(|character| character.is_ascii_alphanumeric() || character == '_')
}

fn default_database() -> String {
    "default".into()
}

fn default_username() -> String {
    "default".into()
}

fn empty_secret() -> SecretString {
    SecretString::from("")
}

fn default_timeout_seconds() -> u64 {
    30
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> u64 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<ClickHouseSinkConfig, PluginConfigError> {
        let mut value = serde_json::json!({"url": "http://127.0.0.1:8123", "table": "events"});
        value
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_only_url_and_table_when_parsed_should_take_upstreams_defaults() {
        let config = config(serde_json::json!({})).unwrap();
        assert_eq!(config.database, "default");
        assert_eq!(config.username, "default");
        assert_eq!(config.insert_format, InsertFormat::JsonEachRow);
        assert_eq!(config.string_format, StringFormat::JsonEachRow);
        assert_eq!(
            (
                config.timeout_seconds,
                config.max_retries,
                config.retry_delay
            ),
            (30, 3, 1)
        );
        assert!(config.validate().is_ok());
    }

    #[test]
    fn given_upstreams_retry_fields_when_read_should_become_the_engines_backoff() {
        let retry = config(serde_json::json!({"max_retries": 5, "retry_delay": 2}))
            .unwrap()
            .retry_settings();
        assert_eq!(retry.backoff.initial, Duration::from_secs(2));
        assert_eq!(retry.backoff.max, MAX_RETRY_DELAY);
        assert_eq!(retry.degraded_after, Some(5));
        let at_once = config(serde_json::json!({"retry_delay": 0}))
            .unwrap()
            .retry_settings();
        assert_eq!(at_once.backoff.initial, MIN_RETRY_DELAY);
    }

    #[test]
    fn given_a_table_name_with_a_quote_when_validated_should_name_the_field() {
        let error = config(serde_json::json!({"table": "ev`ents"}))
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(error.field, "table");
        let error = config(serde_json::json!({"database": "1db"}))
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(error.field, "database");
    }

    #[test]
    fn given_an_unknown_format_when_parsed_should_name_the_field() {
        let error = config(serde_json::json!({"insert_format": "parquet"})).unwrap_err();
        assert_eq!(error.field, "insert_format");
    }
}
