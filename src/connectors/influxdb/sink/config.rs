//! The `influxdb` sink's `plugin_config`: upstream's v2 and v3 fields and
//! defaults, plus `version = "v1"` (ours) for InfluxDB 1.x.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InfluxDbSinkConfig {
    /// `v2` (`/api/v2/write`, org + bucket + token), `v3` (`/api/v3/write_lp`,
    /// db + token) or `v1` (ours: `/write`, db + rp + username/password, for
    /// InfluxDB 1.x).
    #[serde(default)]
    pub version: Version,
    /// Base URL of the server (`http://host:8086`).
    pub url: String,
    /// v2: the organization.
    pub org: Option<String>,
    /// v2: the bucket.
    pub bucket: Option<String>,
    /// v1 and v3: the database.
    pub db: Option<String>,
    /// v1: the retention policy (the database's default when unset).
    pub rp: Option<String>,
    /// v1: user name (HTTP basic auth).
    pub username: Option<String>,
    /// v1: password of `username`; a secret.
    #[schemars(with = "Option<String>")]
    pub password: Option<SecretString>,
    /// v2 and v3: the API token; v1 (1.8 and later): `user:password`, sent
    /// as `Token ...` instead of `username`/`password`. A secret.
    #[schemars(with = "Option<String>")]
    pub token: Option<SecretString>,
    /// Measurement every point goes to.
    #[serde(default = "default_measurement")]
    pub measurement: String,
    /// Timestamp precision of the points: `ns`, `us`, `ms` or `s`.
    #[serde(default)]
    pub precision: Precision,
    /// Where a point keeps its message's offset (ours). `tag` (the default,
    /// upstream's layout): an `offset` tag, one series per message, which InfluxDB 1.x
    /// refuses past `max-values-per-tag` (100,000 by default) and which
    /// bloats 2.x's index. `timestamp`: an `iggy_offset` field, the point's
    /// time is the message's µs timestamp * 1000 + offset % 1000 (needs
    /// `precision = "ns"` and the partition tag); more than 1000 messages of
    /// one partition with one timestamp are rejected, not overwritten.
    #[serde(default)]
    pub offset_placement: OffsetPlacement,
    /// Points per write request.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Add the stream/topic/partition tags (or fields) of the message.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Add the `iggy_checksum` field.
    #[serde(default = "default_true")]
    pub include_checksum: bool,
    /// Add the `iggy_origin_timestamp` field.
    #[serde(default = "default_true")]
    pub include_origin_timestamp: bool,
    /// With `include_metadata`: the stream as a tag (else an `iggy_stream` field).
    #[serde(default = "default_true")]
    pub include_stream_tag: bool,
    /// With `include_metadata`: the topic as a tag (else an `iggy_topic` field).
    #[serde(default = "default_true")]
    pub include_topic_tag: bool,
    /// With `include_metadata`: the partition as a tag (else an `iggy_partition` field).
    #[serde(default = "default_true")]
    pub include_partition_tag: bool,
    /// The payload as a `payload_json` (compact JSON), `payload_text` (UTF-8)
    /// or `payload_base64` string field.
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// Log every request's size and duration at debug level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Engine retry setting: after this many failed writes in a row the sink
    /// reports itself degraded. The engine keeps retrying what is not stored
    /// (nothing is dropped); the sink sends each request once per write.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Engine retry setting: the wait before the engine's first retry of a
    /// failed write or `open` (doubling, capped at `retry_max_delay`).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Timeout of one request.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
    /// Upstream's count of health checks at open: accepted, unused. The
    /// engine retries a failed `open` with this sink's backoff until `[engine]
    /// max_open_attempts`.
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
    /// retries (a server's `Retry-After` is honoured up to `[engine]
    /// max_retry_after`).
    #[serde(default = "default_retry_max_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_max_delay: Duration,
    /// Consecutive failed requests that open the circuit breaker; 0 disables it.
    #[serde(default = "default_circuit_breaker_threshold")]
    pub circuit_breaker_threshold: u32,
    /// How long the breaker stays open before one probe request is let through.
    #[serde(
        default = "default_circuit_breaker_cool_down",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub circuit_breaker_cool_down: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    #[default]
    V2,
    V3,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Ns,
    #[default]
    Us,
    Ms,
    S,
}

impl Precision {
    /// A timestamp in microseconds in this precision.
    pub fn from_micros(self, micros: u64) -> u64 {
        match self {
            Precision::Ns => micros.saturating_mul(1000),
            Precision::Us => micros,
            Precision::Ms => micros / 1000,
            Precision::S => micros / 1_000_000,
        }
    }

    /// The `precision` query parameter of `version`'s write endpoint.
    pub fn parameter(self, version: Version) -> &'static str {
        match (version, self) {
            (Version::V3, Precision::Ns) => "nanosecond",
            (Version::V3, Precision::Us) => "microsecond",
            (Version::V3, Precision::Ms) => "millisecond",
            (Version::V3, Precision::S) => "second",
            (Version::V1, Precision::Us) => "u",
            (_, Precision::Ns) => "ns",
            (_, Precision::Us) => "us",
            (_, Precision::Ms) => "ms",
            (_, Precision::S) => "s",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OffsetPlacement {
    #[default]
    Tag,
    Timestamp,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    #[default]
    Json,
    Text,
    Base64,
}

impl InfluxDbSinkConfig {
    /// Checks what the version needs, naming the offending field; the write URL.
    pub fn validate(&self) -> Result<reqwest::Url, PluginConfigError> {
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
            Version::V2 => &[
                ("org", self.org.is_some()),
                ("bucket", self.bucket.is_some()),
                ("token", self.token.is_some()),
            ],
            Version::V3 => &[("db", self.db.is_some()), ("token", self.token.is_some())],
        };
        for (field, present) in required {
            if !present {
                return Err(PluginConfigError::new(
                    *field,
                    format!("required with version = \"{}\"", self.version_name()),
                ));
            }
        }
        super::line::check_measurement(&self.measurement)
            .map_err(|message| PluginConfigError::new("measurement", message))?;
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.offset_placement == OffsetPlacement::Timestamp {
            if self.precision != Precision::Ns {
                return Err(PluginConfigError::new(
                    "offset_placement",
                    "offset_placement = \"timestamp\" keeps the offset in the nanoseconds of the point's time: it needs precision = \"ns\"",
                ));
            }
            if !(self.include_metadata && self.include_partition_tag) {
                return Err(PluginConfigError::new(
                    "offset_placement",
                    "offset_placement = \"timestamp\" needs the partition tag (include_metadata and include_partition_tag true): two partitions' messages would share points",
                ));
            }
        }
        let path = match self.version {
            Version::V1 => "write",
            Version::V2 => "api/v2/write",
            Version::V3 => "api/v3/write_lp",
        };
        let mut url = base.join(path).map_err(|error| {
            PluginConfigError::new("url", format!("cannot add {path}: {error}"))
        })?;
        {
            let mut query = url.query_pairs_mut();
            let text = |value: &Option<String>| value.clone().unwrap_or_default();
            match self.version {
                Version::V1 => {
                    query.append_pair("db", &text(&self.db));
                    if let Some(rp) = &self.rp {
                        query.append_pair("rp", rp);
                    }
                }
                Version::V2 => {
                    query.append_pair("org", &text(&self.org));
                    query.append_pair("bucket", &text(&self.bucket));
                }
                Version::V3 => {
                    query.append_pair("db", &text(&self.db));
                }
            }
            query.append_pair("precision", self.precision.parameter(self.version));
        }
        Ok(url)
    }

    pub fn version_name(&self) -> &'static str {
        match self.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
            Version::V3 => "v3",
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_measurement() -> String {
    "iggy_messages".into()
}

fn default_batch_size() -> u32 {
    500
}

fn default_max_retries() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_secs(1)
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: serde_json::Value) -> Result<InfluxDbSinkConfig, PluginConfigError> {
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_each_version_when_validated_should_build_its_write_url() {
        let v2 = parse(
            serde_json::json!({"url": "http://h:8086", "org": "o", "bucket": "b", "token": "t"}),
        )
        .unwrap();
        assert_eq!(
            v2.validate().unwrap().as_str(),
            "http://h:8086/api/v2/write?org=o&bucket=b&precision=us"
        );
        let v3 = parse(serde_json::json!({"version": "v3", "url": "http://h:8086", "db": "d", "token": "t", "precision": "ms"})).unwrap();
        assert_eq!(
            v3.validate().unwrap().as_str(),
            "http://h:8086/api/v3/write_lp?db=d&precision=millisecond"
        );
        let v1 = parse(
            serde_json::json!({"version": "v1", "url": "http://h:8086", "db": "d", "rp": "week"}),
        )
        .unwrap();
        assert_eq!(
            v1.validate().unwrap().as_str(),
            "http://h:8086/write?db=d&rp=week&precision=u"
        );
    }

    #[test]
    fn given_a_missing_field_of_the_version_when_validated_should_name_it() {
        let error = parse(serde_json::json!({"url": "http://h", "org": "o", "token": "t"}))
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(error.field, "bucket");
        let error = parse(serde_json::json!({"version": "v3", "url": "http://h", "db": "d"}))
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(error.field, "token");
        let error = parse(serde_json::json!({"version": "v4", "url": "http://h"})).unwrap_err();
        assert_eq!(error.field, "version");
    }

    #[test]
    fn given_offset_placement_timestamp_when_validated_should_need_ns_and_the_partition_tag() {
        let base = serde_json::json!({"version": "v1", "url": "http://h", "db": "d", "offset_placement": "timestamp"});
        let with = |extra: serde_json::Value| {
            let mut config = base.clone();
            config
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(config).unwrap().validate()
        };
        let error = with(serde_json::json!({})).unwrap_err();
        assert_eq!(error.field, "offset_placement");
        assert!(error.message.contains("precision = \"ns\""), "{error}");
        assert!(with(serde_json::json!({"precision": "ns"})).is_ok());
        let error = with(serde_json::json!({"precision": "ns", "include_partition_tag": false}))
            .unwrap_err();
        assert!(error.message.contains("include_partition_tag"), "{error}");
        let tag =
            parse(serde_json::json!({"version": "v1", "url": "http://h", "db": "d"})).unwrap();
        assert_eq!(tag.offset_placement, OffsetPlacement::Tag);
    }
}
