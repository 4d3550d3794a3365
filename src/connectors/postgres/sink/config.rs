//! `plugin_config` of the postgres sink: upstream's field names and defaults.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;
use crate::connectors::kit::sql::{default_acquire_timeout, default_max_connections, default_true};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// PostgreSQL URL (`postgres://user:password@host:5432/db`); a secret.
    #[schemars(with = "String")]
    pub connection_string: SecretString,
    /// `table` or `schema.table`, read the way PostgreSQL reads an identifier:
    /// unquoted parts are folded to lower case, `"Quoted"` parts are kept.
    pub target_table: String,
    /// Rows per INSERT statement.
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
    /// Type of the `payload` column: `bytea`, `json` (JSONB) or `text`.
    #[serde(default)]
    pub payload_format: PayloadFormat,
    /// Log every batch written at info level.
    #[serde(default)]
    pub verbose_logging: bool,
    /// Upstream's in-connector retry knobs: accepted for compatibility. Failed
    /// writes are retried by the engine (same batch, capped backoff, offsets
    /// untouched), which never gives up on a transient error.
    pub max_retries: Option<u32>,
    /// Upstream's retry delay: accepted, unused (the engine retries).
    pub retry_delay: Option<String>,
    /// How long a write waits for a pooled connection before it counts as a
    /// transient failure (ours).
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
    /// `BYTEA`: the payload's bytes (JSON serialized, text as UTF-8).
    #[default]
    Bytea,
    /// `JSONB`: the payload must be a JSON document.
    #[serde(alias = "jsonb")]
    Json,
    /// `TEXT`: the payload must be UTF-8 without NUL characters.
    Text,
}

impl PayloadFormat {
    pub fn sql_type(self) -> &'static str {
        match self {
            PayloadFormat::Bytea => "BYTEA",
            PayloadFormat::Json => "JSONB",
            PayloadFormat::Text => "TEXT",
        }
    }
}

impl PostgresSinkConfig {
    /// Checks the values serde accepts but the sink cannot use, and returns the
    /// target table as a quoted SQL name.
    pub fn validate(&self) -> Result<String, PluginConfigError> {
        crate::connectors::postgres::check_connection_string(&self.connection_string)?;
        if self.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        if self.max_connections == 0 {
            return Err(PluginConfigError::new(
                "max_connections",
                "expected at least 1",
            ));
        }
        table_sql(&self.target_table)
            .map_err(|message| PluginConfigError::new("target_table", message))
    }
}

/// Parses `schema.table` as PostgreSQL parses a qualified name and returns it
/// quoted, so the name means what it meant when upstream interpolated it, but
/// cannot inject SQL.
pub fn table_sql(name: &str) -> Result<String, String> {
    let mut parts = Vec::new();
    let mut chars = name.trim().chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    Some('"') => break,
                    Some(other) => part.push(other),
                    None => return Err(format!("unterminated quoted name in \"{name}\"")),
                }
            }
        } else {
            while let Some(&next) = chars.peek() {
                if next == '.' {
                    break;
                }
                if next == '"' || next.is_whitespace() || next == '\0' {
                    return Err(format!("unexpected {next:?} in table name \"{name}\""));
                }
                part.extend(next.to_lowercase());
                chars.next();
            }
        }
        if part.is_empty() || part.contains('\0') {
            return Err(format!(
                "expected \"table\" or \"schema.table\", found \"{name}\""
            ));
        }
        parts.push(format!("\"{}\"", part.replace('"', "\"\"")));
        match chars.next() {
            None => break,
            Some('.') => continue,
            Some(other) => return Err(format!("unexpected {other:?} in table name \"{name}\"")),
        }
    }
    if parts.len() > 2 {
        return Err(format!(
            "expected \"table\" or \"schema.table\", found \"{name}\""
        ));
    }
    Ok(parts.join("."))
}

fn default_batch_size() -> u32 {
    100
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;

    #[test]
    fn given_upstream_config_when_parsed_should_use_upstream_defaults() {
        let config: PostgresSinkConfig = parse_plugin_config(&serde_json::json!({
            "connection_string": "postgres://u:p@localhost/db",
            "target_table": "iggy_messages",
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
        assert_eq!(config.validate().unwrap(), "\"iggy_messages\"");
    }

    #[test]
    fn given_table_names_when_parsed_should_fold_unquoted_parts_like_postgres() {
        assert_eq!(table_sql("Events").unwrap(), "\"events\"");
        assert_eq!(
            table_sql("Sales.\"Big.Orders\"").unwrap(),
            "\"sales\".\"Big.Orders\""
        );
        assert_eq!(table_sql("\"a\"\"b\"").unwrap(), "\"a\"\"b\"");
        for bad in ["", "a..b", "a.b.c", "x; DROP TABLE y", "\"open", "a\"b"] {
            assert!(table_sql(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn given_unknown_payload_format_when_parsed_should_name_the_field() {
        let error = parse_plugin_config::<PostgresSinkConfig>(&serde_json::json!({
            "connection_string": "postgres://localhost/db",
            "target_table": "t",
            "payload_format": "xml",
        }))
        .unwrap_err();
        assert_eq!(error.field, "payload_format");
    }
}
