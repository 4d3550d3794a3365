//! `plugin_config` of the mysql sink: the postgres sink's field names and
//! defaults, so a postgres sink file points at MySQL by changing its URL.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;
use crate::connectors::kit::sql::{default_acquire_timeout, default_max_connections, default_true};
use crate::connectors::mysql::{check_connection_string, quote_identifier};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MySqlSinkConfig {
    /// MySQL or MariaDB URL (`mysql://user:password@host:3306/database`); a secret.
    #[schemars(with = "String")]
    pub connection_string: SecretString,
    /// `table` or `database.table` (default database: the URL's), case kept.
    pub target_table: String,
    /// Rows per INSERT statement (fewer when the payloads of a statement would
    /// pass 4 MiB, well under the server's `max_allowed_packet`).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Connections in the pool.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Create the target table in `open` when it does not exist.
    #[serde(default)]
    pub auto_create_table: bool,
    /// Write the message metadata columns (id, offset, stream, topic, partition, timestamp).
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Write the message checksum column.
    #[serde(default = "default_true")]
    pub include_checksum: bool,
    /// Write the origin timestamp column.
    #[serde(default = "default_true")]
    pub include_origin_timestamp: bool,
    /// Type of the `payload` column: `bytea` (LONGBLOB), `json` (JSON) or `text` (LONGTEXT).
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// Log every batch written at info level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Accepted for compatibility with postgres sink files: failed writes are
    /// retried by the engine (same batch, capped backoff, offsets untouched).
    pub max_retries: Option<u32>,
    /// Accepted, unused (the engine retries).
    pub retry_delay: Option<String>,
    /// How long a write waits for a pooled connection before it counts as a
    /// transient failure.
    #[serde(default = "default_acquire_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub acquire_timeout: Duration,
}

/// The `payload` column's type and how payloads are stored in it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// `LONGBLOB`: the payload's bytes (JSON serialized, text as UTF-8).
    #[default]
    #[serde(alias = "blob", alias = "binary")]
    Bytea,
    /// `JSON`: the payload must be a JSON document.
    #[serde(alias = "jsonb")]
    Json,
    /// `LONGTEXT`: the payload must be UTF-8.
    Text,
}

impl PayloadFormat {
    pub fn sql_type(self) -> &'static str {
        match self {
            PayloadFormat::Bytea => "LONGBLOB",
            PayloadFormat::Json => "JSON",
            PayloadFormat::Text => "LONGTEXT",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PayloadFormat::Bytea => "bytea",
            PayloadFormat::Json => "json",
            PayloadFormat::Text => "text",
        }
    }
}

/// The target table: its database (None: the connection's) and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub database: Option<String>,
    pub table: String,
    /// Quoted for SQL.
    pub sql: String,
}

impl MySqlSinkConfig {
    /// Checks the values serde accepts but the sink cannot use, and returns
    /// the target table.
    pub fn validate(&self) -> Result<Target, PluginConfigError> {
        check_connection_string(&self.connection_string)?;
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.max_connections == 0 {
            return Err(PluginConfigError::new(
                "max_connections",
                "expected at least 1",
            ));
        }
        let invalid = |message: String| PluginConfigError::new("target_table", message);
        let parts: Vec<&str> = self.target_table.trim().split('.').collect();
        let (database, table) = match parts.as_slice() {
            [table] => (None, *table),
            [database, table] => (Some(*database), *table),
            _ => {
                return Err(invalid(format!(
                    "expected \"table\" or \"database.table\", found \"{}\"",
                    self.target_table
                )));
            }
        };
        let mut sql = quote_identifier(table).map_err(invalid)?;
        if let Some(database) = database {
            sql = format!("{}.{sql}", quote_identifier(database).map_err(invalid)?);
        }
        Ok(Target {
            database: database.map(str::to_owned),
            table: table.to_owned(),
            sql,
        })
    }
}

fn default_batch_size() -> u32 {
    100
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    #[test]
    fn given_a_postgres_sink_style_config_when_parsed_should_use_the_same_defaults() {
        let config: MySqlSinkConfig = parse_plugin_config(&serde_json::json!({
            "connection_string": "mysql://u:p@localhost/db",
            "target_table": "shop.Events",
            "payload_format": "jsonb",
            "max_retries": 3,
            "retry_delay": "1s",
        }))
        .unwrap();
        assert_eq!(config.batch_size, 100);
        assert_eq!(config.max_connections, 10);
        assert!(!config.auto_create_table);
        assert!(
            config.include_metadata && config.include_checksum && config.include_origin_timestamp
        );
        assert_eq!(config.payload_format, PayloadFormat::Json);
        let target = config.validate().unwrap();
        assert_eq!(target.sql, "`shop`.`Events`");
        assert_eq!(target.database.as_deref(), Some("shop"));
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        for (field, value) in [
            ("target_table", serde_json::json!("a.b.c")),
            ("target_table", serde_json::json!("")),
            (
                "connection_string",
                serde_json::json!("postgres://localhost/db"),
            ),
            ("batch_size", serde_json::json!(0)),
        ] {
            let mut config = serde_json::json!({
                "connection_string": "mysql://localhost/db",
                "target_table": "t",
            });
            config[field] = value;
            let parsed: MySqlSinkConfig = parse_plugin_config(&config).unwrap();
            assert_eq!(parsed.validate().unwrap_err().field, field);
        }
    }
}
