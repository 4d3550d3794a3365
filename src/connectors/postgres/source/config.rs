//! `plugin_config` of the postgres source: upstream's field names and defaults
//! for the polling mode, checked when the connector is built.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;
pub use crate::connectors::kit::cdc::{Operation, SnapshotMode};
use crate::connectors::kit::sql::{default_max_connections, default_true};
pub use crate::connectors::kit::sql_poll::Consume;
use crate::connectors::kit::sql_poll::{
    PlanConfig, PollingChecks, default_batch_size, default_poll_interval, default_tracking_column,
    scalar_as_string,
};

/// Upstream's `plugin_config` for the postgres source, in polling mode and in
/// `mode = "cdc"` (logical replication with pgoutput).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostgresSourceConfig {
    /// PostgreSQL URL (`postgres://user:password@host:5432/db`); a secret.
    #[schemars(with = "String")]
    pub connection_string: SecretString,
    /// `polling` (read tables with a query) or `cdc` (logical replication).
    #[serde(default)]
    pub mode: Mode,
    /// Tables to read, each polled in turn (cdc: the tables captured).
    pub tables: Vec<String>,
    /// Wait between polls once every table is caught up (a poll that filled a
    /// whole batch is followed by the next one at once).
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// Most rows read per table per poll (cdc: snapshot rows per batch, or
    /// changes per batch: whole transactions, ended at the first commit that
    /// reaches it).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Column that orders the rows; the cursor saved in the state is its last value.
    #[serde(default = "default_tracking_column")]
    pub tracking_column: String,
    /// Start after this tracking value when there is no saved cursor.
    #[serde(default, deserialize_with = "scalar_as_string")]
    pub initial_offset: Option<String>,
    /// Connections in the pool.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// A query used instead of the generated SELECT (with `$table`, `$offset`, `$limit` placeholders).
    pub custom_query: Option<String>,
    /// Rename columns to snake_case in the produced JSON.
    #[serde(default)]
    pub snake_case_columns: bool,
    /// Wrap each row with its table and operation (`{table, operation, data}`).
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Use this column alone as the message payload instead of the whole row as JSON.
    pub payload_column: Option<String>,
    /// How `payload_column` becomes the payload: `bytea`, `text` or `json_direct`.
    pub payload_format: Option<PayloadFormat>,
    /// Delete the rows once they are durably in Iggy.
    #[serde(default)]
    pub delete_after_read: bool,
    /// Boolean column set to true once a row is durably in Iggy (rows already true are skipped).
    pub processed_column: Option<String>,
    /// Key used by `delete_after_read` and `processed_column` (default: `tracking_column`).
    pub primary_key_column: Option<String>,
    /// Log every poll at info level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Finish once a poll finds nothing new in any table (an export that ends
    /// by itself, e.g. under `pipe`); by default the source polls forever.
    #[serde(default)]
    pub stop_when_caught_up: bool,
    /// Upstream's in-connector retry knobs: accepted for compatibility; the
    /// engine retries failed polls and commits with its own capped backoff.
    pub max_retries: Option<u32>,
    /// Upstream's retry delay: accepted, unused (the engine retries).
    pub retry_delay: Option<String>,
    /// CDC: the logical replication slot (pgoutput), created when missing.
    /// Default: `iggy_` + the connector key, so two connectors never share one.
    pub replication_slot: Option<String>,
    /// CDC: which changes to produce, of `INSERT`, `UPDATE`, `DELETE`,
    /// `TRUNCATE` (default: the first three, as upstream).
    pub capture_operations: Option<Vec<String>>,
    /// CDC: upstream's backend choice (`builtin` or `pg_replicate`); both mean
    /// pgoutput over the streaming replication protocol here.
    pub cdc_backend: Option<String>,
    /// CDC: the publication naming the captured tables, created for `tables`
    /// when missing (default: the slot's name).
    pub publication: Option<String>,
    /// CDC: `initial` produces the tables' rows first (consistent with the
    /// slot, resumable), `never` only the changes.
    #[serde(default)]
    pub snapshot: SnapshotMode,
    /// CDC: WAL bytes the slot may retain before `/health` says degraded.
    #[serde(default = "default_slot_lag_warning")]
    pub slot_lag_warning: u64,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Polling,
    Cdc,
}

/// How `payload_column` becomes the message payload.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PayloadFormat {
    /// The column's bytes as they are (`bytea`).
    #[serde(alias = "raw")]
    Bytea,
    /// The column as text.
    Text,
    /// The column as a JSON document (`json`, `jsonb`, or text holding JSON).
    #[serde(alias = "jsonb", alias = "jsonb_direct", alias = "json")]
    JsonDirect,
}

impl PostgresSourceConfig {
    /// Checks what serde cannot: values that parse but make no sense together.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        crate::connectors::postgres::check_connection_string(&self.connection_string)?;
        if self.mode == Mode::Cdc {
            self.validate_cdc()?;
        }
        if self.tables.is_empty() {
            return Err(PluginConfigError::new(
                "tables",
                "expected at least one table",
            ));
        }
        for table in &self.tables {
            super::quote::quote_qualified(table)
                .map_err(|message| PluginConfigError::new("tables", message))?;
        }
        let columns = [
            ("tracking_column", Some(&self.tracking_column)),
            ("payload_column", self.payload_column.as_ref()),
            ("processed_column", self.processed_column.as_ref()),
            ("primary_key_column", self.primary_key_column.as_ref()),
        ];
        for (field, column) in columns {
            if let Some(column) = column {
                super::quote::quote_identifier(column)
                    .map_err(|message| PluginConfigError::new(field, message))?;
            }
        }
        PollingChecks {
            batch_size: self.batch_size,
            max_connections: self.max_connections,
            delete_after_read: self.delete_after_read,
            processed_column: self.processed_column.as_ref(),
            custom_query: self.custom_query.as_ref(),
            initial_offset: self.initial_offset.as_ref(),
        }
        .validate()
    }

    fn validate_cdc(&self) -> Result<(), PluginConfigError> {
        crate::connectors::kit::cdc::refuse_polling_fields(&[
            ("custom_query", self.custom_query.is_some()),
            ("payload_column", self.payload_column.is_some()),
            ("delete_after_read", self.delete_after_read),
            ("processed_column", self.processed_column.is_some()),
        ])?;
        for (field, name) in [
            ("replication_slot", self.replication_slot.as_deref()),
            ("publication", self.publication.as_deref()),
        ] {
            if let Some(name) = name {
                let valid = !name.is_empty()
                    && name.len() <= 63
                    && name.bytes().all(|byte| {
                        byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_'
                    });
                if !valid {
                    return Err(PluginConfigError::new(
                        field,
                        "expected 1 to 63 lowercase letters, digits or underscores",
                    ));
                }
            }
        }
        if let Some(backend) = &self.cdc_backend
            && !matches!(backend.as_str(), "builtin" | "pg_replicate" | "pgoutput")
        {
            return Err(PluginConfigError::new(
                "cdc_backend",
                "expected \"builtin\" or \"pg_replicate\" (both read pgoutput)",
            ));
        }
        self.operations().map(drop)
    }

    /// The change kinds a CDC source produces (`capture_operations`).
    pub fn operations(&self) -> Result<Vec<Operation>, PluginConfigError> {
        crate::connectors::kit::cdc::operations(self.capture_operations.as_deref())
    }

    pub fn consume(&self) -> Consume {
        Consume::of(self.processed_column.as_ref(), self.delete_after_read)
    }

    /// The fields a table plan's columns come from.
    pub fn plan_config(&self) -> PlanConfig<'_> {
        PlanConfig {
            tracking_column: &self.tracking_column,
            payload_column: self.payload().map(|(column, _)| column),
            consume: self.consume(),
            primary_key_column: self.primary_key_column.as_deref(),
            custom_query: self.custom_query.is_some(),
        }
    }

    /// The payload column and its format, when the payload is one column rather
    /// than the whole row.
    pub fn payload(&self) -> Option<(&str, PayloadFormat)> {
        self.payload_column
            .as_deref()
            .filter(|column| !column.is_empty())
            .map(|column| (column, self.payload_format.unwrap_or(PayloadFormat::Bytea)))
    }
}

/// CDC: WAL bytes a slot may retain before `/health` says degraded (1 GiB).
fn default_slot_lag_warning() -> u64 {
    1 << 30
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<PostgresSourceConfig, PluginConfigError> {
        let config: PostgresSourceConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_upstream_polling_config_when_parsed_should_use_upstream_defaults() {
        let config = parse(serde_json::json!({
            "connection_string": "postgres://u:p@localhost/db",
            "mode": "polling",
            "tables": ["users"],
            "initial_offset": 0,
        }))
        .unwrap();
        assert_eq!(config.batch_size, 1000);
        assert_eq!(config.tracking_column, "id");
        assert_eq!(config.max_connections, 10);
        assert!(config.include_metadata);
        assert_eq!(config.initial_offset.as_deref(), Some("0"));
        assert_eq!(config.consume(), Consume::Cursor);
        assert!(config.payload().is_none());
    }

    #[test]
    fn given_cdc_mode_when_validated_should_accept_upstream_fields_and_refuse_polling_ones() {
        let config = parse(serde_json::json!({
            "connection_string": "postgres://localhost/db",
            "mode": "cdc",
            "tables": ["users"],
            "replication_slot": "iggy_slot",
            "capture_operations": ["insert", "DELETE"],
            "cdc_backend": "builtin",
        }))
        .unwrap();
        assert_eq!(
            config.operations().unwrap(),
            [Operation::Insert, Operation::Delete]
        );
        assert_eq!(config.snapshot, SnapshotMode::Initial);
        assert_eq!(config.slot_lag_warning, 1 << 30);
        for (field, value) in [
            ("delete_after_read", serde_json::json!(true)),
            ("replication_slot", serde_json::json!("Bad-Name")),
            ("capture_operations", serde_json::json!(["MERGE"])),
            ("cdc_backend", serde_json::json!("debezium")),
        ] {
            let mut value_config = serde_json::json!({
                "connection_string": "postgres://localhost/db",
                "mode": "cdc",
                "tables": ["users"],
            });
            value_config[field] = value;
            assert_eq!(parse(value_config).unwrap_err().field, field);
        }
    }

    #[test]
    fn given_payload_format_aliases_when_parsed_should_map_to_three_formats() {
        for (name, expected) in [
            ("bytea", PayloadFormat::Bytea),
            ("raw", PayloadFormat::Bytea),
            ("text", PayloadFormat::Text),
            ("json_direct", PayloadFormat::JsonDirect),
            ("jsonb", PayloadFormat::JsonDirect),
        ] {
            let config = parse(serde_json::json!({
                "connection_string": "postgres://localhost/db",
                "tables": ["t"],
                "payload_column": "body",
                "payload_format": name,
            }))
            .unwrap();
            assert_eq!(config.payload(), Some(("body", expected)), "{name}");
        }
    }

    #[test]
    fn given_contradictory_or_unknown_settings_when_parsed_should_name_the_field() {
        let base = |extra: serde_json::Value| {
            let mut value = serde_json::json!({
                "connection_string": "postgres://localhost/db",
                "tables": ["t"],
            });
            for (key, field) in extra.as_object().unwrap() {
                value[key] = field.clone();
            }
            parse(value).unwrap_err()
        };
        let both = base(serde_json::json!({"delete_after_read": true, "processed_column": "done"}));
        assert_eq!(both.field, "delete_after_read");
        let typo = base(serde_json::json!({"delete_after_reads": true}));
        assert!(typo.message.contains("delete_after_reads"), "{typo}");
        let offset =
            base(serde_json::json!({"custom_query": "SELECT * FROM t WHERE id > $offset"}));
        assert_eq!(offset.field, "initial_offset");
        let table = base(serde_json::json!({"tables": ["a.b.c.d"]}));
        assert_eq!(table.field, "tables");
        let format = base(serde_json::json!({"payload_column": "p", "payload_format": "xml"}));
        assert_eq!(format.field, "payload_format");
    }
}
