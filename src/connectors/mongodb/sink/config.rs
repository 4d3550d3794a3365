//! `plugin_config` of the mongodb sink: upstream's field names and defaults,
//! plus `write_mode`/`key_field` and `server_selection_timeout` (ours).

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::{Backoff, PluginConfigError, RetrySettings};

/// The engine's backoff without `retry_delay`: its first wait...
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(100);
/// ... and its longest.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MongoDbSinkConfig {
    /// MongoDB connection URI (`mongodb://user:password@host:27017/?authSource=admin`
    /// or `mongodb+srv://...`); a secret.
    #[schemars(with = "String")]
    pub connection_uri: SecretString,
    /// Database the collection lives in.
    pub database: String,
    /// Collection the documents are written to.
    pub collection: String,
    /// Most connections the driver keeps open (the driver's default, 10, when unset).
    pub max_pool_size: Option<u32>,
    /// Create the collection in `open` when it does not exist. Without it,
    /// MongoDB creates the collection on the first write, as upstream relied on.
    #[serde(default)]
    pub auto_create_collection: bool,
    /// Documents per `insert_many` (or `update`) command.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Write `iggy_offset`, `iggy_timestamp`, `iggy_stream`, `iggy_topic` and
    /// `iggy_partition_id`.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Write `iggy_checksum`.
    #[serde(default = "default_true")]
    pub include_checksum: bool,
    /// Write `iggy_origin_timestamp`.
    #[serde(default = "default_true")]
    pub include_origin_timestamp: bool,
    /// How the `payload` field holds the message: `binary` (BSON binary),
    /// `json` (a BSON document; the payload must be JSON) or `string` (alias
    /// `text`; the payload must be UTF-8).
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// Log every batch written at info level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Engine retry setting: after this many failed writes in a row the sink
    /// reports itself degraded. The engine keeps retrying what is not stored
    /// (offsets untouched, nothing dropped); the sink never retries itself.
    pub max_retries: Option<u32>,
    /// Engine retry setting: the wait before the engine's first retry of a
    /// failed write or `open` (`"1s"`), doubling up to 30 s; the engine's
    /// default (100 ms) when unset.
    pub retry_delay: Option<String>,
    /// `insert` (upstream's event log: one document per message, `_id` from the
    /// message identity), `upsert` (one document per entity, `_id` = the
    /// payload's `key_field`, fields merged with `$set`) or `replace` (the same,
    /// the whole document replaced). Ours.
    #[serde(default)]
    pub write_mode: WriteMode,
    /// With `write_mode = "upsert"` or `"replace"`: the payload field (a dotted
    /// path into the JSON payload, such as `user.id`) whose value is the
    /// entity's `_id`. Ours.
    pub key_field: Option<String>,
    /// How long an operation waits for a reachable server (and a connection
    /// attempt may take) before the write fails transiently and the engine
    /// retries it. Ours.
    #[serde(
        default = "default_server_selection_timeout",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub server_selection_timeout: Duration,
}

/// How the `payload` field holds the message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// BSON binary (subtype 0) of the payload's bytes.
    #[default]
    Binary,
    /// A BSON document converted from the JSON payload.
    Json,
    /// A BSON string of the UTF-8 payload.
    #[serde(alias = "text")]
    String,
}

/// What one message does to the collection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Insert one document per message; a replay's duplicate `_id` counts as written.
    #[default]
    Insert,
    /// Upsert the entity's document, setting the message's fields.
    Upsert,
    /// Upsert the entity's document, replacing it whole.
    Replace,
}

impl MongoDbSinkConfig {
    /// Checks the values serde accepts but the sink cannot use.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        crate::connectors::mongodb::check_connection_uri(&self.connection_uri)?;
        if self.database.is_empty() {
            return Err(PluginConfigError::new(
                "database",
                "expected a database name",
            ));
        }
        if self.collection.is_empty() {
            return Err(PluginConfigError::new(
                "collection",
                "expected a collection name",
            ));
        }
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        self.retry_delay()?;
        if self.max_pool_size == Some(0) {
            return Err(PluginConfigError::new(
                "max_pool_size",
                "expected at least 1",
            ));
        }
        let keyed = self.write_mode != WriteMode::Insert;
        match self.key_field.as_deref() {
            None if keyed => Err(PluginConfigError::new(
                "key_field",
                "write_mode = \"upsert\" or \"replace\" needs the payload field that identifies the entity",
            )),
            Some(field) if field.is_empty() || field.split('.').any(str::is_empty) => Err(
                PluginConfigError::new("key_field", "expected a field name or a dotted path"),
            ),
            Some(_) if !keyed => Err(PluginConfigError::new(
                "key_field",
                "only used with write_mode = \"upsert\" or \"replace\"",
            )),
            _ => Ok(()),
        }
    }
}

impl MongoDbSinkConfig {
    /// Upstream's `max_retries` and `retry_delay` as the engine's policy
    /// for this sink; `None` (the engine's default) without either.
    pub fn retry_settings(&self) -> Option<RetrySettings> {
        let delay = self.retry_delay().ok().flatten();
        if delay.is_none() && self.max_retries.is_none() {
            return None;
        }
        Some(RetrySettings {
            backoff: Backoff {
                initial: delay.unwrap_or(DEFAULT_RETRY_DELAY).min(MAX_RETRY_DELAY),
                max: MAX_RETRY_DELAY,
                multiplier: 2.0,
            },
            degraded_after: self.max_retries,
        })
    }

    fn retry_delay(&self) -> Result<Option<Duration>, PluginConfigError> {
        self.retry_delay
            .as_deref()
            .map(|text| {
                humantime::parse_duration(text).map_err(|error| {
                    PluginConfigError::new(
                        "retry_delay",
                        format!("expected a duration such as \"1s\": {error}"),
                    )
                })
            })
            .transpose()
    }
}

fn default_batch_size() -> u32 {
    100
}

fn default_true() -> bool {
    true
}

fn default_server_selection_timeout() -> Duration {
    Duration::from_secs(10)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(extra: serde_json::Value) -> Result<MongoDbSinkConfig, PluginConfigError> {
        let mut config = serde_json::json!({
            "connection_uri": "mongodb://localhost:27017",
            "database": "db",
            "collection": "c",
        });
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        let config: MongoDbSinkConfig = parse_plugin_config(&config)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_upstream_fields_when_parsed_should_use_upstream_defaults() {
        let config = parse(serde_json::json!({"max_retries": 3, "retry_delay": "1s"})).unwrap();
        assert_eq!(config.batch_size, 100);
        assert!(!config.auto_create_collection);
        assert!(
            config.include_metadata && config.include_checksum && config.include_origin_timestamp
        );
        assert_eq!(config.payload_format, PayloadFormat::Binary);
        assert_eq!(config.write_mode, WriteMode::Insert);
        let text = parse(serde_json::json!({"payload_format": "text"})).unwrap();
        assert_eq!(text.payload_format, PayloadFormat::String);
    }

    #[test]
    fn given_upstreams_retry_fields_when_read_should_become_the_engines_policy() {
        let retry = parse(serde_json::json!({"max_retries": 3, "retry_delay": "2s"}))
            .unwrap()
            .retry_settings()
            .unwrap();
        assert_eq!(retry.backoff.initial, Duration::from_secs(2));
        assert_eq!(retry.degraded_after, Some(3));
        let only_count = parse(serde_json::json!({"max_retries": 1}))
            .unwrap()
            .retry_settings()
            .unwrap();
        assert_eq!(only_count.backoff.initial, DEFAULT_RETRY_DELAY);
        assert_eq!(parse(serde_json::json!({})).unwrap().retry_settings(), None);
        let error = parse(serde_json::json!({"retry_delay": "soon"})).unwrap_err();
        assert_eq!(error.field, "retry_delay");
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (extra, field) in [
            (
                serde_json::json!({"payload_format": "xml"}),
                "payload_format",
            ),
            (
                serde_json::json!({"connection_uri": "http://x"}),
                "connection_uri",
            ),
            (serde_json::json!({"batch_size": 0}), "batch_size"),
            (serde_json::json!({"write_mode": "upsert"}), "key_field"),
            (serde_json::json!({"key_field": "id"}), "key_field"),
            (
                serde_json::json!({"write_mode": "replace", "key_field": "a..b"}),
                "key_field",
            ),
        ] {
            assert_eq!(parse(extra.clone()).unwrap_err().field, field, "{extra}");
        }
        assert!(parse(serde_json::json!({"write_mode": "upsert", "key_field": "user.id"})).is_ok());
    }
}
