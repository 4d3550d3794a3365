//! The `influxdb` source's `plugin_config`: upstream's v2 and v3 fields and
//! defaults, plus `version = "v1"` (ours: InfluxQL over `/query`, for
//! InfluxDB 1.x).

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use super::time;
use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InfluxDbSourceConfig {
    /// `v2` (Flux over `/api/v2/query`, org + token), `v3` (SQL over
    /// `/api/v3/query_sql`, db + token) or `v1` (ours: InfluxQL over
    /// `/query`, db + username/password, for InfluxDB 1.x).
    #[serde(default)]
    pub version: Version,
    /// Base URL of the server (`http://host:8086`).
    pub url: String,
    /// v2: the organization.
    pub org: Option<String>,
    /// v1 and v3: the database.
    pub db: Option<String>,
    /// v1: user name (HTTP basic auth).
    pub username: Option<String>,
    /// v1: password of `username`; a secret.
    #[schemars(with = "Option<String>")]
    pub password: Option<SecretString>,
    /// v2 and v3: the API token; v1 (1.8 and later): `user:password`, sent as
    /// `Token ...` instead of `username`/`password`. A secret.
    #[schemars(with = "Option<String>")]
    pub token: Option<SecretString>,
    /// The query (Flux, SQL or InfluxQL by version), with placeholders:
    /// `$cursor` (an RFC 3339 time, required), `$limit` (rows to return) and
    /// `$offset` (always 0: ties are told apart by row, not skipped by count).
    /// It must return rows in ascending order of `cursor_field` and select
    /// rows after `$cursor` (`>` or `>=`, both work).
    pub query: String,
    /// Wait between queries once caught up (an answer shorter than `$limit`).
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// Rows per poll (`$limit`, plus the rows at the cursor's time already read).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// The time column rows are read in order of (default `_time` for v2,
    /// `time` for v1 and v3).
    pub cursor_field: Option<String>,
    /// Where a fresh start reads from: rows after this RFC 3339 time.
    #[serde(default = "default_initial_offset")]
    pub initial_offset: String,
    /// Take the payload from this column only (required by `text` and `raw`).
    pub payload_column: Option<String>,
    /// `json` (the row as a JSON object, or the column's JSON), `text` (the
    /// column as UTF-8) or `raw` (the column, base64-decoded).
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// With `json` and no `payload_column`: keep every column (v2: also
    /// `_measurement`, `_field`, tags and the table columns; v1/v3: also the
    /// time column).
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Log every query's row count and duration at debug level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Upstream's count of query retries inside one poll: accepted, unused.
    /// Each poll sends its query once, and the engine retries a failed poll
    /// (with the backoff of `retry_delay`) until the source is stopped.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: the wait before the engine's first retry of a
    /// failed poll or `open` (doubling, capped at `retry_max_delay`).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Timeout of one request.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Upstream's count of health checks at open: accepted, unused. The
    /// engine retries a failed `open` with this source's backoff until
    /// `[engine] max_open_attempts`.
    #[serde(default = "default_max_open_retries")]
    pub max_open_retries: u32,
    /// Upstream's longest wait between health checks at open: accepted,
    /// unused (the engine's backoff is capped by `retry_max_delay`).
    #[serde(
        default = "default_open_retry_max_delay",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub open_retry_max_delay: Duration,
    /// Engine retry setting: the longest wait between two of the engine's
    /// retries of a poll or `open`.
    #[serde(default = "default_retry_max_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_max_delay: Duration,
    /// Consecutive failed queries that open the circuit breaker; 0 disables it.
    #[serde(default = "default_circuit_breaker_threshold")]
    pub circuit_breaker_threshold: u32,
    /// How long the breaker stays open before one probe request is let through.
    #[serde(
        default = "default_circuit_breaker_cool_down",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub circuit_breaker_cool_down: Duration,
    /// Most rows sharing one timestamp, as a multiple of `batch_size` (at
    /// most 100; 0: no bound). Past it the source stops with an error
    /// instead of sending ever larger queries.
    #[serde(default = "default_stuck_batch_cap_factor")]
    pub stuck_batch_cap_factor: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    #[default]
    V2,
    V3,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
            Version::V3 => "v3",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    #[default]
    Json,
    Text,
    Raw,
}

impl InfluxDbSourceConfig {
    /// Checks what the version needs, naming the offending field; the base URL
    /// and the initial cursor time (ns since the epoch).
    pub fn validate(&self) -> Result<(reqwest::Url, i64), PluginConfigError> {
        let base = reqwest::Url::parse(&self.url)
            .map_err(|error| PluginConfigError::new("url", format!("not a valid URL: {error}")))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(PluginConfigError::new(
                "url",
                format!("expected an http or https URL, found {}", base.scheme()),
            ));
        }
        let required: &[(&str, bool)] = match self.version {
            Version::V1 => &[("db", self.db.is_some())],
            Version::V2 => &[("org", self.org.is_some()), ("token", self.token.is_some())],
            Version::V3 => &[("db", self.db.is_some()), ("token", self.token.is_some())],
        };
        for (field, present) in required {
            if !present {
                return Err(PluginConfigError::new(
                    *field,
                    format!("required with version = \"{}\"", self.version.name()),
                ));
            }
        }
        if !self.query.contains("$cursor") {
            return Err(PluginConfigError::new(
                "query",
                "expected the $cursor placeholder (rows after it are read; without it every poll reads the same rows)",
            ));
        }
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.stuck_batch_cap_factor > 100 {
            return Err(PluginConfigError::new(
                "stuck_batch_cap_factor",
                "expected 0 (no bound) to 100",
            ));
        }
        if self.cursor_field.as_deref() == Some("") {
            return Err(PluginConfigError::new(
                "cursor_field",
                "expected a column name",
            ));
        }
        match (self.payload_format, self.payload_column.as_deref()) {
            (_, Some("")) => {
                return Err(PluginConfigError::new(
                    "payload_column",
                    "expected a column name",
                ));
            }
            (PayloadFormat::Text | PayloadFormat::Raw, None) => {
                return Err(PluginConfigError::new(
                    "payload_column",
                    "required with payload_format = \"text\" or \"raw\"",
                ));
            }
            _ => {}
        }
        let initial = time::parse(&self.initial_offset).ok_or_else(|| {
            PluginConfigError::new(
                "initial_offset",
                format!(
                    "expected an RFC 3339 time such as 1970-01-01T00:00:00Z, found {:?}",
                    self.initial_offset
                ),
            )
        })?;
        Ok((base, initial))
    }

    pub fn cursor_field(&self) -> &str {
        match (&self.cursor_field, self.version) {
            (Some(field), _) => field,
            (None, Version::V2) => "_time",
            (None, Version::V1 | Version::V3) => "time",
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_batch_size() -> u32 {
    500
}

fn default_initial_offset() -> String {
    "1970-01-01T00:00:00Z".into()
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_secs(1)
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_open_retries() -> u32 {
    10
}

fn default_open_retry_max_delay() -> Duration {
    Duration::from_secs(60)
}

fn default_retry_max_delay() -> Duration {
    Duration::from_secs(5)
}

fn default_circuit_breaker_threshold() -> u32 {
    5
}

fn default_circuit_breaker_cool_down() -> Duration {
    Duration::from_secs(30)
}

fn default_stuck_batch_cap_factor() -> u32 {
    10
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: serde_json::Value) -> Result<InfluxDbSourceConfig, PluginConfigError> {
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_upstreams_fields_when_parsed_should_take_upstreams_defaults() {
        let config = parse(serde_json::json!({"url": "http://h:8086", "org": "o", "token": "t", "query": "x $cursor"})).unwrap();
        config.validate().unwrap();
        assert_eq!(config.version, Version::V2);
        assert_eq!(config.poll_interval, Duration::from_secs(5));
        assert_eq!(config.batch_size, 500);
        assert_eq!(config.cursor_field(), "_time");
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.stuck_batch_cap_factor, 10);
        let v3 = parse(serde_json::json!({"version": "v3", "url": "http://h", "db": "d", "token": "t", "query": "$cursor"})).unwrap();
        assert_eq!(v3.cursor_field(), "time");
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (config, field) in [
            (
                serde_json::json!({"url": "http://h", "token": "t", "query": "$cursor"}),
                "org",
            ),
            (
                serde_json::json!({"version": "v3", "url": "http://h", "db": "d", "query": "$cursor"}),
                "token",
            ),
            (
                serde_json::json!({"version": "v1", "url": "http://h", "query": "$cursor"}),
                "db",
            ),
            (
                serde_json::json!({"version": "v1", "url": "http://h", "db": "d", "query": "SELECT *"}),
                "query",
            ),
            (
                serde_json::json!({"version": "v1", "url": "http://h", "db": "d", "query": "$cursor", "initial_offset": "yesterday"}),
                "initial_offset",
            ),
            (
                serde_json::json!({"version": "v1", "url": "http://h", "db": "d", "query": "$cursor", "payload_format": "text"}),
                "payload_column",
            ),
            (
                serde_json::json!({"version": "v1", "url": "http://h", "db": "d", "query": "$cursor", "stuck_batch_cap_factor": 101}),
                "stuck_batch_cap_factor",
            ),
        ] {
            let error = parse(config.clone()).unwrap().validate().unwrap_err();
            assert_eq!(error.field, field, "{config}");
        }
    }
}
