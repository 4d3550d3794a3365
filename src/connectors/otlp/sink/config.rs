//! The `otlp` sink's `plugin_config`.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpSinkConfig {
    /// The collector: `http://host:4317` for gRPC, `http://host:4318` for HTTP
    /// (requests go to `/v1/logs`, `/v1/traces`, `/v1/metrics` under it).
    pub endpoint: String,
    /// `grpc`, `http/protobuf` or `http/json` (the OTLP exporters' names).
    #[serde(default)]
    pub protocol: Protocol,
    /// The signal of messages without an `otlp-signal` header (the otlp
    /// source writes one); without it such messages are rejected.
    #[serde(default)]
    pub signal: Option<SignalName>,
    /// What becomes of a message that is not an OTLP export request (or names
    /// no signal): `reject` (through `on_error`) or `log` (exported as one log
    /// record: the payload as its body, the Iggy message id, offset and
    /// partition as attributes, the message timestamp as its time).
    #[serde(default)]
    pub other_payloads: OtherPayloads,
    /// The `service.name` resource attribute of logs made with
    /// `other_payloads = "log"`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Sent as `Authorization: Bearer <token>` (HTTP header, gRPC metadata).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub token: Option<SecretString>,
    /// More headers (gRPC metadata) sent with every export.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub headers: BTreeMap<String, SecretString>,
    /// `gzip` compresses every export; `none` does not.
    #[serde(default)]
    pub compression: Compression,
    /// One export, answer included.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Most Iggy messages merged into one export request.
    #[serde(default = "default_max_batch_messages")]
    pub max_batch_messages: usize,
    /// Most bytes (encoded, before compression) of one export request; the
    /// OpenTelemetry Collector's gRPC receiver takes 4 MiB by default.
    #[serde(default = "default_max_batch_bytes")]
    pub max_batch_bytes: usize,
    /// Engine retry setting: after this many consecutive failed writes (the
    /// OTLP spec's retryable answers, connection errors, timeouts) the
    /// engine reports the sink degraded. It keeps retrying what is not
    /// exported yet: nothing is dropped.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: its first wait before exporting again when the
    /// collector asks for none; doubles up to `max_retry_delay`. A longer
    /// `Retry-After` / `RetryInfo` is waited instead (up to `[engine]
    /// max_retry_after`).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Engine retry setting: its longest wait between writes.
    #[serde(default = "default_max_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub max_retry_delay: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
pub enum Protocol {
    #[serde(rename = "grpc")]
    Grpc,
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "http/json")]
    HttpJson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SignalName {
    Logs,
    Traces,
    Metrics,
}

impl SignalName {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "logs" => Some(Self::Logs),
            "traces" => Some(Self::Traces),
            "metrics" => Some(Self::Metrics),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OtherPayloads {
    #[default]
    Reject,
    Log,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
}

impl OtlpSinkConfig {
    pub fn validate(&self) -> Result<reqwest::Url, PluginConfigError> {
        let url = reqwest::Url::parse(&self.endpoint)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.host().is_some())
            .ok_or_else(|| {
                PluginConfigError::new(
                    "endpoint",
                    format!(
                        "expected an http:// or https:// URL such as http://localhost:4318, found \"{}\"",
                        self.endpoint
                    ),
                )
            })?;
        for (field, value) in [
            ("max_batch_messages", self.max_batch_messages),
            ("max_batch_bytes", self.max_batch_bytes),
        ] {
            if value == 0 {
                return Err(PluginConfigError::new(field, "expected a positive number"));
            }
        }
        for name in self.headers.keys() {
            if reqwest::header::HeaderName::try_from(name.as_str()).is_err() {
                return Err(PluginConfigError::new(
                    format!("headers.{name}"),
                    "not a valid header name",
                ));
            }
        }
        Ok(url)
    }
}

fn default_service_name() -> String {
    "iggy-connect".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_batch_messages() -> usize {
    1000
}

fn default_max_batch_bytes() -> usize {
    4 * 1024 * 1024 - 64 * 1024
}

fn default_max_retries() -> u32 {
    5
}

fn default_retry_delay() -> Duration {
    Duration::from_secs(1)
}

fn default_max_retry_delay() -> Duration {
    Duration::from_secs(30)
}
