//! `plugin_config` of the mongodb source, named after the postgres source's
//! fields (upstream has no MongoDB source yet; its proposal, PR #4225, polls
//! by a tracking field too).

use std::time::Duration;

use mongodb::bson::{Bson, Document};
use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MongoDbSourceConfig {
    /// MongoDB connection URI (`mongodb://user:password@host:27017/?authSource=admin`
    /// or `mongodb+srv://...`); a secret.
    #[schemars(with = "String")]
    pub connection_uri: SecretString,
    /// Database the collection lives in.
    pub database: String,
    /// Collection to read.
    pub collection: String,
    /// `polling` (by `tracking_field`) or `change_stream` (ours): the
    /// collection's change stream (inserts, updates, replaces, deletes) from
    /// the source's first poll on, resumed after the saved resume token. A
    /// change stream needs a replica set or a sharded cluster.
    #[serde(default)]
    pub mode: MongoDbSourceMode,
    /// Wait between polls once the collection is caught up (a poll that filled
    /// a whole batch is followed by the next one at once).
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// Most documents read per poll.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Field that orders the documents; the cursor saved in the state is its
    /// last value, with `_id` breaking ties between documents that share it.
    #[serde(default = "default_tracking_field")]
    pub tracking_field: String,
    /// Start after this tracking value when there is no saved cursor, in
    /// MongoDB Extended JSON (`5`, `"abc"`, `{"$date": "2026-01-01T00:00:00Z"}`,
    /// `{"$oid": "..."}`); a text that is not JSON is taken as a string.
    #[serde(default, deserialize_with = "scalar_as_string")]
    pub initial_offset: Option<String>,
    /// Only documents matching this query (Extended JSON, such as
    /// `{"status": "ready"}`) are read.
    pub filter: Option<String>,
    /// Delete the documents once they are durably in Iggy (then every poll
    /// reads from the start of what is left).
    #[serde(default)]
    pub delete_after_read: bool,
    /// Boolean field set to true once a document is durably in Iggy;
    /// documents where it is already true are skipped.
    pub processed_field: Option<String>,
    /// Most connections the driver keeps open (the driver's default, 10, when unset).
    pub max_pool_size: Option<u32>,
    /// How long an operation waits for a reachable server before the poll fails
    /// (transiently) and the engine tries again.
    #[serde(
        default = "default_server_selection_timeout",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub server_selection_timeout: Duration,
    /// Log every batch read at info level.
    #[serde(default)]
    pub verbose_logging: bool,
}

/// See [`MongoDbSourceConfig::mode`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MongoDbSourceMode {
    #[default]
    Polling,
    ChangeStream,
}

impl MongoDbSourceConfig {
    /// Checks the values serde accepts but the source cannot use.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        if self.mode == MongoDbSourceMode::ChangeStream {
            for (field, set) in [
                ("delete_after_read", self.delete_after_read),
                ("processed_field", self.processed_field.is_some()),
                ("filter", self.filter.is_some()),
                ("initial_offset", self.initial_offset.is_some()),
            ] {
                if set {
                    return Err(PluginConfigError::new(
                        field,
                        "applies to mode = \"polling\" only; a change stream reads every change of the collection",
                    ));
                }
            }
        }
        crate::connectors::mongodb::check_connection_uri(&self.connection_uri)?;
        for (field, value) in [
            ("database", &self.database),
            ("collection", &self.collection),
            ("tracking_field", &self.tracking_field),
        ] {
            if value.is_empty() {
                return Err(PluginConfigError::new(field, "expected a name"));
            }
        }
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.delete_after_read && self.processed_field.is_some() {
            return Err(PluginConfigError::new(
                "processed_field",
                "set either delete_after_read or processed_field, not both",
            ));
        }
        if self.processed_field.as_deref() == Some("") {
            return Err(PluginConfigError::new(
                "processed_field",
                "expected a field name",
            ));
        }
        self.filter()?;
        self.initial_offset()?;
        Ok(())
    }

    /// The `filter` query, parsed.
    pub fn filter(&self) -> Result<Document, PluginConfigError> {
        let Some(text) = &self.filter else {
            return Ok(Document::new());
        };
        let error = |message: String| PluginConfigError::new("filter", message);
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|parse| error(format!("expected a JSON query document: {parse}")))?;
        match Bson::try_from(json) {
            Ok(Bson::Document(document)) => Ok(document),
            Ok(_) => Err(error("expected a JSON object".into())),
            Err(parse) => Err(error(format!("not MongoDB Extended JSON: {parse}"))),
        }
    }

    /// `initial_offset` as a BSON value.
    pub fn initial_offset(&self) -> Result<Option<Bson>, PluginConfigError> {
        self.initial_offset
            .as_deref()
            .map(|text| {
                parse_value(text)
                    .map_err(|message| PluginConfigError::new("initial_offset", message))
            })
            .transpose()
    }
}

/// A value written as Extended JSON, or a plain string.
pub fn parse_value(text: &str) -> Result<Bson, String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(json) => {
            Bson::try_from(json).map_err(|error| format!("not MongoDB Extended JSON: {error}"))
        }
        Err(_) => Ok(Bson::String(text.to_owned())),
    }
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_batch_size() -> u32 {
    1000
}

fn default_tracking_field() -> String {
    "_id".to_owned()
}

fn default_server_selection_timeout() -> Duration {
    Duration::from_secs(10)
}

/// TOML users write `initial_offset = 1000` as naturally as `"1000"`.
fn scalar_as_string<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    Ok(match Option::<toml::Value>::deserialize(deserializer)? {
        None => None,
        Some(toml::Value::String(text)) => Some(text),
        Some(other) => Some(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(extra: serde_json::Value) -> Result<MongoDbSourceConfig, PluginConfigError> {
        let mut config = serde_json::json!({
            "connection_uri": "mongodb://localhost:27017",
            "database": "db",
            "collection": "c",
        });
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        let config: MongoDbSourceConfig = parse_plugin_config(&config)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_initial_offsets_when_parsed_should_read_extended_json_or_text() {
        let offset = |value: serde_json::Value| {
            parse(serde_json::json!({ "initial_offset": value }))
                .unwrap()
                .initial_offset()
                .unwrap()
                .unwrap()
        };
        assert_eq!(offset(serde_json::json!(5)), Bson::Int32(5));
        assert_eq!(offset(serde_json::json!("abc")), Bson::String("abc".into()));
        assert!(matches!(
            offset(serde_json::json!("{\"$date\": \"2026-01-01T00:00:00Z\"}")),
            Bson::DateTime(_)
        ));
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (extra, field) in [
            (serde_json::json!({"filter": "[1]"}), "filter"),
            (serde_json::json!({"filter": "{nope"}), "filter"),
            (serde_json::json!({"batch_size": 0}), "batch_size"),
            (
                serde_json::json!({"delete_after_read": true, "processed_field": "done"}),
                "processed_field",
            ),
            (
                serde_json::json!({"connection_uri": "postgres://x"}),
                "connection_uri",
            ),
            (
                serde_json::json!({"mode": "change_stream", "delete_after_read": true}),
                "delete_after_read",
            ),
            (
                serde_json::json!({"mode": "change_stream", "filter": "{}"}),
                "filter",
            ),
        ] {
            assert_eq!(parse(extra.clone()).unwrap_err().field, field, "{extra}");
        }
    }
}
