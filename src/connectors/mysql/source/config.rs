//! `plugin_config` of the mysql source: the postgres source's polling field
//! names and defaults, so a postgres source file reads MySQL by changing its
//! URL.

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
use crate::connectors::mysql::{check_connection_string, quote_identifier, quote_qualified};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MySqlSourceConfig {
    /// MySQL or MariaDB URL (`mysql://user:password@host:3306/database`); a secret.
    #[schemars(with = "String")]
    pub connection_string: SecretString,
    /// `polling` (read tables with a query) or `cdc` (read the row binlog as
    /// a replica does).
    #[serde(default)]
    pub mode: Mode,
    /// Tables to read (`table` or `database.table`), each polled in turn.
    pub tables: Vec<String>,
    /// Wait between polls once every table is caught up.
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// Most rows read per table per poll.
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
    /// A query used instead of the generated SELECT (with `$table`, `$offset`,
    /// `$limit`, `$now`, `$now_unix` placeholders).
    pub custom_query: Option<String>,
    /// Rename columns to snake_case in the produced JSON.
    #[serde(default)]
    pub snake_case_columns: bool,
    /// Wrap each row with its table and operation (`{table_name, operation_type, timestamp, data, old_data}`).
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Use this column alone as the message payload instead of the whole row as JSON.
    pub payload_column: Option<String>,
    /// How `payload_column` becomes the payload: `bytea`, `text` or `json_direct`.
    pub payload_format: Option<PayloadFormat>,
    /// Delete the rows once they are durably in Iggy.
    #[serde(default)]
    pub delete_after_read: bool,
    /// Boolean column set to TRUE once a row is durably in Iggy (rows already TRUE are skipped).
    pub processed_column: Option<String>,
    /// Key used by `delete_after_read` and `processed_column` (default: `tracking_column`).
    pub primary_key_column: Option<String>,
    /// Log every poll at info level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Finish once a poll finds nothing new in any table.
    #[serde(default)]
    pub stop_when_caught_up: bool,
    /// Accepted for compatibility; the engine retries failed polls and commits.
    pub max_retries: Option<u32>,
    /// Accepted, unused (the engine retries).
    pub retry_delay: Option<String>,
    /// CDC: which changes to produce, of `INSERT`, `UPDATE`, `DELETE`,
    /// `TRUNCATE` (default: the first three).
    pub capture_operations: Option<Vec<String>>,
    /// CDC: `initial` produces the tables' rows first (consistent with the
    /// binlog position, resumable), `never` only the changes from now on.
    #[serde(default)]
    pub snapshot: SnapshotMode,
    /// CDC: the replica id the binlog connection registers with (unique among
    /// the server's replicas). Default: derived from the connector key.
    pub server_id: Option<u32>,
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
    /// The column's bytes as they are.
    #[serde(alias = "raw")]
    Bytea,
    /// The column as text.
    Text,
    /// The column as a JSON document (a JSON column, or text holding JSON).
    #[serde(alias = "jsonb", alias = "jsonb_direct", alias = "json")]
    JsonDirect,
}

impl MySqlSourceConfig {
    /// Checks what serde cannot: values that parse but make no sense together.
    pub fn validate(&self) -> Result<(), PluginConfigError> {
        check_connection_string(&self.connection_string)?;
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
            quote_qualified(table).map_err(|message| PluginConfigError::new("tables", message))?;
        }
        let columns = [
            ("tracking_column", Some(&self.tracking_column)),
            ("payload_column", self.payload_column.as_ref()),
            ("processed_column", self.processed_column.as_ref()),
            ("primary_key_column", self.primary_key_column.as_ref()),
        ];
        for (field, column) in columns {
            if let Some(column) = column {
                quote_identifier(column)
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
        if self.server_id == Some(0) {
            return Err(PluginConfigError::new(
                "server_id",
                "expected 1 to 4294967295 (0 is refused by the server)",
            ));
        }
        self.operations().map(drop)
    }

    /// The change kinds `mode = "cdc"` produces (`capture_operations`).
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

    /// The payload column and its format, when the payload is one column.
    pub fn payload(&self) -> Option<(&str, PayloadFormat)> {
        self.payload_column
            .as_deref()
            .filter(|column| !column.is_empty())
            .map(|column| (column, self.payload_format.unwrap_or(PayloadFormat::Bytea)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    fn parse(value: serde_json::Value) -> Result<MySqlSourceConfig, PluginConfigError> {
        let config: MySqlSourceConfig = parse_plugin_config(&value)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn given_a_postgres_source_style_config_when_parsed_should_use_the_same_defaults() {
        let config = parse(serde_json::json!({
            "connection_string": "mysql://u:p@localhost/db",
            "mode": "polling",
            "tables": ["shop.users"],
            "initial_offset": 0,
        }))
        .unwrap();
        assert_eq!(config.batch_size, 1000);
        assert_eq!(config.tracking_column, "id");
        assert!(config.include_metadata);
        assert_eq!(config.initial_offset.as_deref(), Some("0"));
        assert_eq!(config.consume(), Consume::Cursor);
    }

    #[test]
    fn given_contradictory_or_unavailable_settings_when_parsed_should_name_the_field() {
        for (field, value) in [
            (
                "delete_after_read",
                serde_json::json!({"delete_after_read": true, "processed_column": "done"}),
            ),
            (
                "custom_query",
                serde_json::json!({"mode": "cdc", "custom_query": "SELECT 1"}),
            ),
            (
                "capture_operations",
                serde_json::json!({"mode": "cdc", "capture_operations": ["MERGE"]}),
            ),
            (
                "server_id",
                serde_json::json!({"mode": "cdc", "server_id": 0}),
            ),
            ("tables", serde_json::json!({"tables": ["a.b.c"]})),
            (
                "initial_offset",
                serde_json::json!({"custom_query": "SELECT * FROM t WHERE id > $offset"}),
            ),
            (
                "payload_format",
                serde_json::json!({"payload_column": "p", "payload_format": "xml"}),
            ),
        ] {
            let mut config = serde_json::json!({
                "connection_string": "mysql://localhost/db",
                "tables": ["t"],
            });
            for (key, entry) in value.as_object().unwrap() {
                config[key] = entry.clone();
            }
            assert_eq!(parse(config).unwrap_err().field, field);
        }
    }
}
