//! The `http` sink's `plugin_config`: upstream's fields and defaults, plus a
//! circuit breaker named like upstream's influxdb one.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// Where requests go (http or https).
    pub url: String,
    /// HTTP method of the requests.
    #[serde(default)]
    pub method: HttpMethod,
    /// Timeout of one request.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Largest request body; batches are split to stay under it and a single
    /// message over it is refused (`on_error`). 0 disables the limit.
    #[serde(default = "default_max_payload_size_bytes")]
    pub max_payload_size_bytes: u64,
    /// Sent with every request. Values are secrets (they often hold
    /// credentials): never logged, never shown by the API.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub headers: BTreeMap<String, SecretString>,
    /// One request per message (`individual`) or per batch (`ndjson`, `json_array`); `raw` sends payload bytes, one per request.
    #[serde(default)]
    pub batch_mode: BatchMode,
    /// Wrap each payload in `{metadata, payload}`.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Add the message checksum to the metadata.
    #[serde(default)]
    pub include_checksum: bool,
    /// Add the origin timestamp to the metadata.
    #[serde(default)]
    pub include_origin_timestamp: bool,
    /// Probe the endpoint in `open`. No answer, 408, 429 or 5xx: the engine
    /// opens the sink again with backoff (status `starting`); any other
    /// status that is not a success stops it, naming the fix.
    #[serde(default)]
    pub health_check_enabled: bool,
    /// Method of the `open` probe.
    #[serde(default = "default_health_check_method")]
    pub health_check_method: HttpMethod,
    /// Engine retry setting: after this many consecutive failed writes the
    /// engine reports the sink degraded. It keeps retrying what is not
    /// delivered yet: nothing is dropped.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: its wait before writing a failed batch's
    /// undelivered messages again (a longer `Retry-After` is waited instead).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Engine retry setting: growth of its wait per consecutive failed
    /// write; values under 1 count as 1.
    #[serde(default = "default_retry_backoff_multiplier")]
    pub retry_backoff_multiplier: f64,
    /// Engine retry setting: its longest wait between writes (a
    /// `Retry-After` is capped by `[engine] max_retry_after` instead).
    #[serde(default = "default_max_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub max_retry_delay: Duration,
    /// Status codes that mean the request was accepted.
    #[serde(default = "default_success_status_codes")]
    pub success_status_codes: Vec<u16>,
    /// Accept any TLS certificate (development only).
    #[serde(default)]
    pub tls_danger_accept_invalid_certs: bool,
    /// Idle connections kept per host.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Log every request's status, size and duration at debug level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Consecutive failed requests that open the circuit breaker; 0 disables it.
    #[serde(default = "default_circuit_breaker_threshold")]
    pub circuit_breaker_threshold: u32,
    /// How long the breaker stays open (writes fail fast as transient without
    /// calling the endpoint) before one probe request is let through.
    #[serde(
        default = "default_circuit_breaker_cool_down",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub circuit_breaker_cool_down: Duration,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Head,
    #[default]
    Post,
    Put,
    Patch,
    Delete,
}

impl From<HttpMethod> for reqwest::Method {
    fn from(method: HttpMethod) -> Self {
        match method {
            HttpMethod::Get => reqwest::Method::GET,
            HttpMethod::Head => reqwest::Method::HEAD,
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Patch => reqwest::Method::PATCH,
            HttpMethod::Delete => reqwest::Method::DELETE,
        }
    }
}

/// How a batch becomes requests.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BatchMode {
    /// One JSON request per message.
    #[default]
    Individual,
    /// One request per batch, one JSON document per line.
    Ndjson,
    /// One request per batch holding a JSON array.
    JsonArray,
    /// One request per message with the payload bytes as they are.
    Raw,
}

impl BatchMode {
    pub fn content_type(self) -> &'static str {
        match self {
            BatchMode::Individual | BatchMode::JsonArray => "application/json",
            BatchMode::Ndjson => "application/x-ndjson",
            BatchMode::Raw => "application/octet-stream",
        }
    }
}

impl HttpSinkConfig {
    /// Checks the URL and status codes and builds the header map, naming the
    /// offending field (never a header's value).
    pub fn validate(&self) -> Result<(reqwest::Url, HeaderMap), PluginConfigError> {
        let url = reqwest::Url::parse(&self.url)
            .map_err(|error| PluginConfigError::new("url", format!("not a valid URL: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(PluginConfigError::new(
                "url",
                format!(
                    "expected an http or https URL, found scheme \"{}\"",
                    url.scheme()
                ),
            ));
        }
        if self.success_status_codes.is_empty() {
            return Err(PluginConfigError::new(
                "success_status_codes",
                "expected at least one status code",
            ));
        }
        if let Some(code) = self
            .success_status_codes
            .iter()
            .find(|code| !(100..=599).contains(*code))
        {
            return Err(PluginConfigError::new(
                "success_status_codes",
                format!("{code} is not an HTTP status code"),
            ));
        }
        if self.timeout.is_zero() {
            return Err(PluginConfigError::new(
                "timeout",
                "expected a positive duration",
            ));
        }
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let field = format!("headers.{name}");
            let header = HeaderName::try_from(name.as_str()).map_err(|_| {
                PluginConfigError::new(field.clone(), "not a valid HTTP header name")
            })?;
            let mut value = HeaderValue::from_str(value.expose_secret()).map_err(|_| {
                PluginConfigError::new(field, "the value holds characters a header cannot carry")
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        Ok((url, headers))
    }

    pub fn is_success(&self, status: u16) -> bool {
        self.success_status_codes.contains(&status)
    }
}

fn default_true() -> bool {
    true
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_payload_size_bytes() -> u64 {
    10 * 1024 * 1024
}

fn default_health_check_method() -> HttpMethod {
    HttpMethod::Head
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_secs(1)
}

fn default_retry_backoff_multiplier() -> f64 {
    2.0
}

fn default_max_retry_delay() -> Duration {
    Duration::from_secs(30)
}

fn default_success_status_codes() -> Vec<u16> {
    vec![200, 201, 202, 204]
}

fn default_max_connections() -> usize {
    10
}

fn default_circuit_breaker_threshold() -> u32 {
    5
}

fn default_circuit_breaker_cool_down() -> Duration {
    Duration::from_secs(30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<HttpSinkConfig, PluginConfigError> {
        let config: HttpSinkConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_only_a_url_when_parsed_should_use_upstream_defaults() {
        let config = parse(serde_json::json!({"url": "http://localhost:9090/ingest"})).unwrap();
        assert_eq!(config.method, HttpMethod::Post);
        assert_eq!(config.batch_mode, BatchMode::Individual);
        assert_eq!(config.timeout, Duration::from_secs(30));
        assert_eq!(config.max_payload_size_bytes, 10 * 1024 * 1024);
        assert!(config.include_metadata);
        assert!(!config.include_checksum && !config.include_origin_timestamp);
        assert_eq!(config.health_check_method, HttpMethod::Head);
        assert_eq!(config.max_retries, 3);
        assert_eq!(config.success_status_codes, vec![200, 201, 202, 204]);
        assert_eq!(config.max_connections, 10);
        assert_eq!(config.circuit_breaker_threshold, 5);
    }

    #[test]
    fn given_an_upstream_config_when_parsed_should_accept_every_field() {
        let config = parse(serde_json::json!({
            "url": "https://api.example.com/ingest",
            "method": "PUT",
            "timeout": "10s",
            "max_payload_size_bytes": 0,
            "headers": {"Authorization": "Bearer t", "X-Tenant-ID": "tenant-123"},
            "batch_mode": "json_array",
            "include_metadata": false,
            "include_checksum": true,
            "include_origin_timestamp": true,
            "health_check_enabled": true,
            "health_check_method": "GET",
            "max_retries": 5,
            "retry_delay": "500ms",
            "retry_backoff_multiplier": 1.5,
            "max_retry_delay": "5s",
            "success_status_codes": [200],
            "tls_danger_accept_invalid_certs": true,
            "max_connections": 20,
            "verbose_logging": true,
        }))
        .unwrap();
        assert_eq!(config.batch_mode, BatchMode::JsonArray);
        assert_eq!(config.method, HttpMethod::Put);
    }

    #[test]
    fn given_a_non_http_url_when_validated_should_name_the_url() {
        let error = parse(serde_json::json!({"url": "ftp://example.com"})).unwrap_err();
        assert_eq!(error.field, "url");
    }

    #[test]
    fn given_a_bad_header_value_when_validated_should_not_echo_the_secret() {
        let error = parse(serde_json::json!({
            "url": "http://localhost/",
            "headers": {"Authorization": "Bearer s3cret\n"},
        }))
        .unwrap_err();
        assert_eq!(error.field, "headers.Authorization");
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }

    #[test]
    fn given_config_with_secret_header_when_debug_printed_should_redact_it() {
        let config = parse(serde_json::json!({
            "url": "http://localhost/",
            "headers": {"Authorization": "Bearer s3cret"},
        }))
        .unwrap();
        assert!(!format!("{config:?}").contains("s3cret"));
    }
}
