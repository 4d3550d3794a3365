//! The `otlp` source's `plugin_config`: where it listens (gRPC, HTTP), which
//! signal goes to which `[[streams]]` entry, how records are stored, its
//! limits and when it answers exporters.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpSourceConfig {
    /// Which receivers run: `grpc` (OTLP/gRPC) and `http` (OTLP/HTTP,
    /// protobuf and JSON).
    #[serde(default = "default_protocols")]
    pub protocols: Vec<Protocol>,
    /// OTLP/gRPC listen address (the OTLP default port is 4317).
    #[serde(default = "default_grpc_address")]
    pub grpc_address: String,
    /// OTLP/HTTP listen address (the OTLP default port is 4318); exporters POST
    /// to `/v1/logs`, `/v1/traces` and `/v1/metrics`.
    #[serde(default = "default_http_address")]
    pub http_address: String,
    /// `[[streams]]` entry (0 = first) for logs. When none of the three
    /// `*_stream` fields is set: logs 0, traces 1, metrics 2, each only when
    /// the connector has that many streams. When any is set, only the signals
    /// set are received; the others are answered 404 / UNIMPLEMENTED.
    #[serde(default)]
    pub logs_stream: Option<usize>,
    /// `[[streams]]` entry for traces (see `logs_stream`).
    #[serde(default)]
    pub traces_stream: Option<usize>,
    /// `[[streams]]` entry for metrics (see `logs_stream`).
    #[serde(default)]
    pub metrics_stream: Option<usize>,
    /// How each message is stored: `json` (OTLP/JSON, schema "json") or `raw`
    /// (the protobuf export request, schema "raw").
    #[serde(default)]
    pub format: Format,
    /// What one Iggy message holds: `scope` (one resource and scope with all of
    /// its records) or `record` (one log record, span or metric with its
    /// resource and scope). Either way a message is a complete export request.
    #[serde(default)]
    pub split: Split,
    /// When set, exporters must send `Authorization: Bearer <token>` (HTTP
    /// header or gRPC metadata).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub token: Option<SecretString>,
    /// When an exporter hears back: once its records are in Iggy (`durable`),
    /// or as soon as they are queued in memory (`accepted`, lost on a crash).
    #[serde(default)]
    pub ack: AckMode,
    /// Most messages per batch handed to the engine; one request is never split
    /// across batches.
    #[serde(default = "default_batch_length")]
    pub batch_length: usize,
    /// How long the first waiting request may wait for others to join its batch.
    #[serde(default = "default_linger_time", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub linger_time: Duration,
    /// Largest request accepted, after gzip decompression (HTTP 413 beyond;
    /// over gRPC tonic answers OUT_OF_RANGE).
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: usize,
    /// Largest stored message. A scope batch above it is stored record by
    /// record; a single record above it is refused through the answer's
    /// partial success (`rejected_*`), never retried.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Most messages waiting for a batch; requests beyond are refused as
    /// retryable (HTTP 503 / 429 with `Retry-After`, gRPC UNAVAILABLE /
    /// RESOURCE_EXHAUSTED with `RetryInfo`).
    #[serde(default = "default_max_waiting_messages")]
    pub max_waiting_messages: usize,
    /// With `ack = "durable"`: how long a request waits for its batch to be
    /// committed before it is answered as retryable. Keep it below the
    /// exporters' timeout (10 s by default in the OpenTelemetry SDKs).
    #[serde(default = "default_request_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub request_timeout: Duration,
    /// The wait asked of exporters with retryable answers (`Retry-After`,
    /// `RetryInfo`), at least one second.
    #[serde(default = "default_retry_after", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_after: Duration,
    /// `/health` (HTTP) answers 503 once requests have waited this long
    /// without a batch being committed.
    #[serde(default = "default_unhealthy_after", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub unhealthy_after: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Grpc,
    Http,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// OTLP/JSON (hex trace and span ids, 64-bit integers as strings).
    #[default]
    Json,
    /// The protobuf export request, as received over gRPC or HTTP/protobuf.
    Raw,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    #[default]
    Scope,
    Record,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AckMode {
    #[default]
    Durable,
    Accepted,
}

impl OtlpSourceConfig {
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        if self.protocols.is_empty() {
            return Err(PluginConfigError::new(
                "protocols",
                "expected at least one of \"grpc\", \"http\"",
            ));
        }
        for (field, address, protocol) in [
            ("grpc_address", &self.grpc_address, Protocol::Grpc),
            ("http_address", &self.http_address, Protocol::Http),
        ] {
            let port = address
                .rsplit_once(':')
                .map(|(_, port)| port.parse::<u16>());
            if self.protocols.contains(&protocol) && !matches!(port, Some(Ok(_))) {
                return Err(PluginConfigError::new(
                    field,
                    format!("expected HOST:PORT, found \"{address}\""),
                ));
            }
        }
        for (field, value) in [
            ("batch_length", self.batch_length),
            ("max_request_bytes", self.max_request_bytes),
            ("max_message_bytes", self.max_message_bytes),
            ("max_waiting_messages", self.max_waiting_messages),
        ] {
            if value == 0 {
                return Err(PluginConfigError::new(field, "expected a positive number"));
            }
        }
        if self.request_timeout.is_zero() {
            return Err(PluginConfigError::new(
                "request_timeout",
                "expected a positive duration",
            ));
        }
        Ok(())
    }

    /// The `[[streams]]` entry of each signal (logs, traces, metrics), `None`
    /// when it is not received, given how many streams the connector has
    /// (`None`: unknown, as in a bare build). An explicit index beyond the
    /// streams is an error naming its field.
    pub fn signal_streams(
        &self,
        streams: Option<usize>,
    ) -> Result<[Option<usize>; 3], PluginConfigError> {
        let explicit = [self.logs_stream, self.traces_stream, self.metrics_stream];
        if explicit.iter().all(Option::is_none) {
            return Ok([0, 1, 2].map(|index| match streams {
                Some(count) if index >= count => None,
                _ => Some(index),
            }));
        }
        for (field, index) in ["logs_stream", "traces_stream", "metrics_stream"]
            .into_iter()
            .zip(explicit)
        {
            if let (Some(index), Some(count)) = (index, streams)
                && index >= count
            {
                return Err(PluginConfigError::new(
                    field,
                    format!(
                        "the connector has {count} [[streams]] entries, so {index} names none (0 is the first)"
                    ),
                ));
            }
        }
        Ok(explicit)
    }

    pub fn retry_after_secs(&self) -> u64 {
        (self.retry_after.as_millis() as u64).div_ceil(1000).max(1)
    }
}

fn default_protocols() -> Vec<Protocol> {
    vec![Protocol::Grpc, Protocol::Http]
}

fn default_grpc_address() -> String {
    "127.0.0.1:4317".into()
}

fn default_http_address() -> String {
    "127.0.0.1:4318".into()
}

fn default_batch_length() -> usize {
    1000
}

fn default_linger_time() -> Duration {
    Duration::from_millis(5)
}

fn default_max_request_bytes() -> usize {
    20 * 1024 * 1024
}

fn default_max_message_bytes() -> usize {
    1024 * 1024
}

fn default_max_waiting_messages() -> usize {
    100_000
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_retry_after() -> Duration {
    Duration::from_secs(1)
}

fn default_unhealthy_after() -> Duration {
    Duration::from_secs(10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<OtlpSourceConfig, PluginConfigError> {
        let config: OtlpSourceConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_no_stream_fields_when_resolved_should_map_signals_to_the_streams_there_are() {
        let config = parse(serde_json::json!({})).unwrap();
        assert_eq!(
            config.signal_streams(Some(3)).unwrap(),
            [Some(0), Some(1), Some(2)]
        );
        assert_eq!(
            config.signal_streams(Some(1)).unwrap(),
            [Some(0), None, None]
        );
    }

    #[test]
    fn given_an_explicit_stream_beyond_the_streams_when_resolved_should_name_the_field() {
        let config = parse(serde_json::json!({"traces_stream": 0, "metrics_stream": 4})).unwrap();
        let error = config.signal_streams(Some(2)).unwrap_err();
        assert_eq!(error.field, "metrics_stream");
        let config = parse(serde_json::json!({"traces_stream": 0})).unwrap();
        assert_eq!(
            config.signal_streams(Some(1)).unwrap(),
            [None, Some(0), None]
        );
    }

    #[test]
    fn given_a_bad_address_when_validated_should_name_it_only_if_that_protocol_runs() {
        let error = parse(serde_json::json!({"grpc_address": "nowhere"})).unwrap_err();
        assert_eq!(error.field, "grpc_address");
        assert!(
            parse(serde_json::json!({"grpc_address": "nowhere", "protocols": ["http"]})).is_ok()
        );
        let error = parse(serde_json::json!({"protocols": []})).unwrap_err();
        assert_eq!(error.field, "protocols");
    }
}
