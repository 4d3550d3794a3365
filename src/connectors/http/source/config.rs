//! The `http` source's `plugin_config`: where it listens, which paths lead to
//! which `[[streams]]` entry, its limits and when it answers clients.

use std::collections::HashSet;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSourceConfig {
    /// Address to listen on, such as `0.0.0.0:8080` or `localhost:8080`.
    pub address: String,
    /// Paths clients POST to. Without any, `POST /messages` feeds the first
    /// `[[streams]]` entry.
    #[serde(default = "default_endpoints")]
    pub endpoints: Vec<EndpointConfig>,
    /// When a client hears back: once its messages are in Iggy (`durable`), or as
    /// soon as they are queued in memory (`accepted`, lost on a crash).
    #[serde(default)]
    pub ack: AckMode,
    /// Most messages per batch handed to the engine. A single request larger
    /// than this still travels as one batch: a request is never split.
    #[serde(default = "default_batch_length")]
    pub batch_length: usize,
    /// How long the first waiting request may wait for others to join its batch.
    #[serde(default = "default_linger_time", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub linger_time: Duration,
    /// Largest request body accepted (413 beyond).
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// Largest single message accepted (413 beyond), as stored.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// How deeply a JSON body may nest arrays and objects (400 `json_too_deep`
    /// beyond). Parsed without recursion, so a large limit is safe.
    #[serde(default = "default_max_json_depth")]
    pub max_json_depth: usize,
    /// Most messages waiting for a batch; requests beyond are refused with
    /// 503 (`durable`) or 429 (`accepted`) and `Retry-After`.
    #[serde(default = "default_max_waiting_messages")]
    pub max_waiting_messages: usize,
    /// With `ack = "durable"`: how long a request waits for its batch to be
    /// committed before it gets 503. Keep it below your clients' own timeout.
    #[serde(default = "default_request_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub request_timeout: Duration,
    /// The `Retry-After` sent with 429 and 503 answers (whole seconds, at least 1).
    #[serde(default = "default_retry_after", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_after: Duration,
    /// Request header whose value becomes the message id (hashed to 128 bits).
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// Request headers copied into every message of the request as user headers
    /// (lower-cased names).
    #[serde(default)]
    pub forward_headers: Vec<String>,
    /// Path of this listener's own health check (GET).
    #[serde(default = "default_health_path")]
    pub health_path: String,
    /// `/health` answers 503 once requests have waited this long without a batch
    /// being committed.
    #[serde(default = "default_unhealthy_after", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub unhealthy_after: Duration,
    /// A client must send a request's complete headers within this time (also
    /// the time an idle keep-alive connection may wait for its next request).
    #[serde(
        default = "default_header_read_timeout",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub header_read_timeout: Duration,
    /// A connection on which nothing was read or written for this long while a
    /// request is under way (a stalled body) is closed. At least
    /// `request_timeout` plus a second is used, so a durable request waiting
    /// for its commit is not.
    #[serde(default = "default_idle_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub idle_timeout: Duration,
    /// Most open connections; one more is answered 503 `too_many_connections`
    /// and closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// Path clients POST to, such as `/events`.
    pub path: String,
    /// Which `[[streams]]` entry of the connector the messages go to (0 = first).
    #[serde(default)]
    pub stream_index: usize,
    /// When set, requests must carry `Authorization: Bearer <token>`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub token: Option<SecretString>,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AckMode {
    /// 2xx only after the batch holding the request's messages was committed.
    #[default]
    Durable,
    /// 202 as soon as the messages are queued in memory: lost on a crash.
    Accepted,
}

impl HttpSourceConfig {
    /// Checks what serde cannot: paths, limits, header names.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        let port = self
            .address
            .rsplit_once(':')
            .map(|(_, port)| port.parse::<u16>());
        if !matches!(port, Some(Ok(_))) {
            return Err(PluginConfigError::new(
                "address",
                format!("expected HOST:PORT, found \"{}\"", self.address),
            ));
        }
        if self.endpoints.is_empty() {
            return Err(PluginConfigError::new(
                "endpoints",
                "expected at least one endpoint",
            ));
        }
        let mut paths = HashSet::new();
        for (index, endpoint) in self.endpoints.iter().enumerate() {
            let field = format!("endpoints[{index}].path");
            check_path(&field, &endpoint.path)?;
            if endpoint.path == self.health_path {
                return Err(PluginConfigError::new(
                    field,
                    format!("\"{}\" is the health_path", endpoint.path),
                ));
            }
            if !paths.insert(endpoint.path.as_str()) {
                return Err(PluginConfigError::new(
                    field,
                    format!("\"{}\" is used by another endpoint", endpoint.path),
                ));
            }
        }
        check_path("health_path", &self.health_path)?;
        let positive = [
            ("batch_length", self.batch_length),
            ("max_request_bytes", self.max_request_bytes),
            ("max_message_bytes", self.max_message_bytes),
            ("max_json_depth", self.max_json_depth),
            ("max_waiting_messages", self.max_waiting_messages),
            ("max_connections", self.max_connections),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(PluginConfigError::new(field, "expected a positive number"));
            }
        }
        for (field, value) in [
            ("request_timeout", self.request_timeout),
            ("header_read_timeout", self.header_read_timeout),
        ] {
            if value.is_zero() {
                return Err(PluginConfigError::new(
                    field,
                    "expected a positive duration",
                ));
            }
        }
        let headers = std::iter::once(("idempotency_header".to_owned(), &self.idempotency_header))
            .chain(
                self.forward_headers
                    .iter()
                    .enumerate()
                    .map(|(index, name)| (format!("forward_headers[{index}]"), name)),
            );
        for (field, name) in headers {
            if axum::http::HeaderName::try_from(name.as_str()).is_err() {
                return Err(PluginConfigError::new(
                    field,
                    format!("\"{name}\" is not a valid HTTP header name"),
                ));
            }
        }
        Ok(())
    }

    /// The idle timeout the listener applies (see `idle_timeout`).
    pub fn effective_idle_timeout(&self) -> Duration {
        self.idle_timeout
            .max(self.request_timeout + Duration::from_secs(1))
    }

    /// `Retry-After` in whole seconds, rounded up.
    pub fn retry_after_secs(&self) -> u64 {
        let millis = self.retry_after.as_millis() as u64;
        millis.div_ceil(1000).max(1)
    }
}

fn check_path(field: &str, path: &str) -> Result<(), PluginConfigError> {
    let valid = path.starts_with('/')
        && !path.contains(['{', '}', '*', '?', '#'])
        && !path.chars().any(char::is_whitespace);
    if valid {
        Ok(())
    } else {
        Err(PluginConfigError::new(
            field,
            format!(
                "expected a literal path starting with '/' (no wildcards or queries), found \"{path}\""
            ),
        ))
    }
}

fn default_endpoints() -> Vec<EndpointConfig> {
    vec![EndpointConfig {
        path: "/messages".into(),
        stream_index: 0,
        token: None,
    }]
}

fn default_batch_length() -> usize {
    1000
}

fn default_linger_time() -> Duration {
    Duration::from_millis(5)
}

fn default_max_request_bytes() -> usize {
    10 * 1024 * 1024
}

fn default_max_message_bytes() -> usize {
    1024 * 1024
}

fn default_max_json_depth() -> usize {
    1024
}

fn default_max_waiting_messages() -> usize {
    100_000
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_retry_after() -> Duration {
    Duration::from_secs(1)
}

fn default_idempotency_header() -> String {
    "Idempotency-Key".into()
}

fn default_health_path() -> String {
    "/health".into()
}

fn default_unhealthy_after() -> Duration {
    Duration::from_secs(10)
}

fn default_header_read_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_max_connections() -> usize {
    1024
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<HttpSourceConfig, PluginConfigError> {
        let config: HttpSourceConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_only_an_address_when_parsed_should_use_durable_defaults() {
        let config = parse(serde_json::json!({"address": "127.0.0.1:0"})).unwrap();
        assert_eq!(config.ack, AckMode::Durable);
        assert_eq!(config.endpoints.len(), 1);
        assert_eq!(config.endpoints[0].path, "/messages");
        assert_eq!(config.idempotency_header, "Idempotency-Key");
        assert_eq!(config.batch_length, 1000);
    }

    #[test]
    fn given_address_without_port_when_validated_should_name_the_address() {
        let error = parse(serde_json::json!({"address": "localhost"})).unwrap_err();
        assert_eq!(error.field, "address");
        assert!(parse(serde_json::json!({"address": "localhost:0"})).is_ok());
        assert!(parse(serde_json::json!({"address": "[::1]:0"})).is_ok());
    }

    #[test]
    fn given_duplicate_paths_when_validated_should_name_the_endpoint() {
        let error = parse(serde_json::json!({
            "address": "127.0.0.1:0",
            "endpoints": [{"path": "/a"}, {"path": "/a", "stream_index": 1}],
        }))
        .unwrap_err();
        assert_eq!(error.field, "endpoints[1].path");
    }

    #[test]
    fn given_wildcard_path_when_validated_should_refuse_it() {
        let error = parse(serde_json::json!({
            "address": "127.0.0.1:0",
            "endpoints": [{"path": "/a/{id}"}],
        }))
        .unwrap_err();
        assert_eq!(error.field, "endpoints[0].path");
    }

    #[test]
    fn given_invalid_header_name_when_validated_should_name_the_field() {
        let error = parse(serde_json::json!({
            "address": "127.0.0.1:0",
            "forward_headers": ["ok", "not ok"],
        }))
        .unwrap_err();
        assert_eq!(error.field, "forward_headers[1]");
    }

    #[test]
    fn given_unknown_ack_mode_when_parsed_should_name_the_field() {
        let error =
            parse(serde_json::json!({"address": "127.0.0.1:0", "ack": "maybe"})).unwrap_err();
        assert_eq!(error.field, "ack");
    }

    #[test]
    fn given_sub_second_retry_after_when_read_should_round_up_to_one_second() {
        let config =
            parse(serde_json::json!({"address": "127.0.0.1:0", "retry_after": "200ms"})).unwrap();
        assert_eq!(config.retry_after_secs(), 1);
    }
}
