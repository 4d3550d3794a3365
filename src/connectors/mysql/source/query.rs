//! SQL the mysql source runs: the per-table polling query, the custom query
//! with its placeholders, and the DELETE/UPDATE applied on commit.
//!
//! Polls go through the text protocol (no bind parameters), so every value
//! arrives as the server renders it and needs no type-specific decoding;
//! cursor values and keys are therefore written into the SQL as hex string
//! literals (`_utf8mb4 X'..'`), which no value can break out of, cast to the
//! column's own type so the comparison is the column's and an index serves it.

use std::sync::Arc;

use super::config::{Consume, MySqlSourceConfig};
use crate::connectors::kit::sql_poll::{CatalogEntry, PENDING_CAP, PlanColumns};
pub use crate::connectors::kit::sql_poll::{Placeholders, PlanError};
use crate::connectors::mysql::{quote_identifier, quote_qualified};

/// One table's columns: name, data type, full column type, whether it is
/// the single-column primary key, whether a single-column unique index
/// covers it. Binds: the database (NULL: the connection's) and the table.
pub const CATALOG_SQL: &str = "\
SELECT CAST(c.column_name AS CHAR), CAST(c.data_type AS CHAR), CAST(c.column_type AS CHAR), \
  (SELECT COUNT(*) FROM information_schema.statistics s WHERE s.table_schema = c.table_schema \
     AND s.table_name = c.table_name AND s.index_name = 'PRIMARY') = 1 \
  AND EXISTS (SELECT 1 FROM information_schema.statistics s WHERE s.table_schema = c.table_schema \
     AND s.table_name = c.table_name AND s.index_name = 'PRIMARY' AND s.column_name = c.column_name), \
  EXISTS (SELECT 1 FROM information_schema.statistics s WHERE s.table_schema = c.table_schema \
     AND s.table_name = c.table_name AND s.non_unique = 0 AND s.column_name = c.column_name \
     AND (SELECT COUNT(*) FROM information_schema.statistics t WHERE t.table_schema = s.table_schema \
          AND t.table_name = s.table_name AND t.index_name = s.index_name) = 1) \
FROM information_schema.columns c \
WHERE c.table_schema = COALESCE(?, DATABASE()) AND c.table_name = ? \
ORDER BY c.ordinal_position";

/// One column of a polled table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogColumn {
    pub name: String,
    /// `data_type` (`int`, `varchar`, `datetime`...).
    pub data_type: String,
    /// `column_type` (`int(10) unsigned`, `decimal(10,2)`...).
    pub column_type: String,
    pub primary_key: bool,
    pub unique: bool,
}

impl CatalogEntry for CatalogColumn {
    fn name(&self) -> &str {
        &self.name
    }

    fn primary_key(&self) -> bool {
        self.primary_key
    }

    fn unique(&self) -> bool {
        self.unique
    }
}

/// A column used in SQL: its quoted name and how a literal becomes its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub quoted: String,
    /// The `CAST(... AS <this>)` target; `None` for string types.
    pub cast: Option<String>,
}

impl Column {
    /// `value` as a literal of this column's type.
    pub fn literal(&self, value: &str) -> String {
        let mut hex = String::with_capacity(value.len() * 2 + 16);
        hex.push_str("_utf8mb4 X'");
        for byte in value.bytes() {
            hex.push_str(&format!("{byte:02x}"));
        }
        hex.push('\'');
        match &self.cast {
            Some(cast) => format!("CAST({hex} AS {cast})"),
            None => hex,
        }
    }
}

/// Everything needed to poll and consume one table, built once per table.
#[derive(Debug, Clone)]
pub struct TablePlan {
    /// The table as configured: the state key and the record's `table_name`.
    pub name: String,
    /// Quoted for SQL.
    pub table_sql: String,
    pub tracking: Column,
    /// The row's unique key for ties, ids and DELETE/UPDATE; `None` when the
    /// tracking column is itself the key.
    pub key: Option<Column>,
    /// The custom query template, when the table is read through one.
    pub custom: Option<Arc<str>>,
}

impl TablePlan {
    /// Builds the plan of `table` from the config and the table's catalog
    /// rows; the warning says when ties on the tracking column can be missed.
    pub fn build(
        config: &MySqlSourceConfig,
        table: &str,
        catalog: &[CatalogColumn],
    ) -> Result<(Self, Option<String>), PlanError> {
        // MySQL compares column names without regard to case.
        let found = PlanColumns::find(
            &config.plan_config(),
            table,
            catalog,
            str::eq_ignore_ascii_case,
        )?;
        Ok((
            TablePlan {
                name: table.to_owned(),
                table_sql: quote_qualified(table).unwrap_or_default(),
                tracking: column(found.tracking),
                key: found.key.map(column),
                custom: config.custom_query.as_deref().map(Arc::from),
            },
            found.warning,
        ))
    }

    /// The key column (the tracking column when it is the key).
    pub fn key_column(&self) -> &Column {
        self.key.as_ref().unwrap_or(&self.tracking)
    }

    /// The polling query. `cursor` is the saved (tracking, key) to read
    /// after, in cursor mode or past batches still in flight; in delete and
    /// mark mode without batches in flight the table itself is the progress.
    /// A custom query has its placeholders filled here.
    pub fn polling_sql(
        &self,
        config: &MySqlSourceConfig,
        cursor: Option<(&str, Option<&str>)>,
        placeholders: &Placeholders<'_>,
    ) -> String {
        let payload = match config.payload() {
            None => "*".to_owned(),
            Some((column, _)) => quote_identifier(column).unwrap_or_default(),
        };
        let tracking = &self.tracking.quoted;
        let key = &self.key_column().quoted;
        let order = match &self.key {
            Some(key) => format!("src.{tracking}, src.{}", key.quoted),
            None => format!("src.{tracking}"),
        };
        let select = if payload == "*" {
            format!("src.{tracking}, src.{key}, src.*")
        } else {
            format!("src.{tracking}, src.{key}, src.{payload}")
        };
        if let Some(template) = &self.custom {
            let custom = fill_placeholders(template, placeholders);
            let custom = custom.trim().trim_end_matches(';').trim_end();
            return format!("SELECT {select} FROM ({custom}) AS src ORDER BY {order}");
        }
        let conditions = self.conditions(config, cursor);
        format!(
            "SELECT {select} FROM {} AS src WHERE {} ORDER BY {order} LIMIT {}",
            self.table_sql,
            conditions.join(" AND "),
            config.batch_size
        )
    }

    /// Counts the rows the polling query would read after `cursor` (see
    /// [`Self::polling_sql`]), up to [`PENDING_CAP`]; `None` for a custom
    /// query, which cannot be counted.
    pub fn pending_sql(
        &self,
        config: &MySqlSourceConfig,
        cursor: Option<(&str, Option<&str>)>,
    ) -> Option<String> {
        self.custom.is_none().then(|| {
            format!(
                "SELECT COUNT(*) FROM (SELECT 1 FROM {} AS src WHERE {} LIMIT {PENDING_CAP}) AS pending",
                self.table_sql,
                self.conditions(config, cursor).join(" AND ")
            )
        })
    }

    /// The built-in polling query's conditions.
    fn conditions(
        &self,
        config: &MySqlSourceConfig,
        cursor: Option<(&str, Option<&str>)>,
    ) -> Vec<String> {
        let tracking = &self.tracking.quoted;
        let mut conditions = vec![format!("src.{tracking} IS NOT NULL")];
        match (cursor, &self.key) {
            (Some((after, Some(after_key))), Some(key)) => conditions.push(format!(
                "(src.{tracking} > {value} OR (src.{tracking} = {value} AND src.{} > {}))",
                key.quoted,
                key.literal(after_key),
                value = self.tracking.literal(after),
            )),
            (Some((after, _)), _) => {
                conditions.push(format!("src.{tracking} > {}", self.tracking.literal(after)))
            }
            (None, _) => {
                if let Some(initial) = &config.initial_offset {
                    conditions.push(format!(
                        "src.{tracking} > {}",
                        self.tracking.literal(initial)
                    ));
                }
            }
        }
        if let Consume::Mark(column) = config.consume() {
            let column = quote_identifier(&column).unwrap_or_default();
            conditions.push(format!("src.{column} = FALSE"));
        }
        conditions
    }

    /// The DELETE or UPDATE of delivered rows, by key, in statements of at
    /// most `CONSUME_KEYS` keys.
    pub fn consume_sql(&self, config: &MySqlSourceConfig, keys: &[String]) -> Vec<String> {
        const CONSUME_KEYS: usize = 1000;
        let key = self.key_column();
        keys.chunks(CONSUME_KEYS)
            .map(|chunk| {
                let list = chunk
                    .iter()
                    .map(|value| key.literal(value))
                    .collect::<Vec<_>>()
                    .join(", ");
                let filter = format!("WHERE {} IN ({list})", key.quoted);
                match config.consume() {
                    Consume::Mark(column) => format!(
                        "UPDATE {} SET {} = TRUE {filter}",
                        self.table_sql,
                        quote_identifier(&column).unwrap_or_default()
                    ),
                    Consume::Delete | Consume::Cursor => {
                        format!("DELETE FROM {} {filter}", self.table_sql)
                    }
                }
            })
            .collect()
    }
}

pub fn column(catalog: &CatalogColumn) -> Column {
    Column {
        quoted: quote_identifier(&catalog.name).unwrap_or_default(),
        cast: cast_type(&catalog.data_type, &catalog.column_type),
    }
}

/// The CAST target that turns a string into a value of the column's type,
/// `None` for string types (compared in the column's collation).
fn cast_type(data_type: &str, column_type: &str) -> Option<String> {
    let unsigned = column_type.contains("unsigned");
    match data_type.to_ascii_lowercase().as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" | "year" => {
            Some(if unsigned { "UNSIGNED" } else { "SIGNED" }.to_owned())
        }
        "decimal" | "numeric" => {
            let precision = column_type
                .find('(')
                .and_then(|start| {
                    column_type[start..]
                        .find(')')
                        .map(|end| &column_type[start..start + end + 1])
                })
                .unwrap_or("(65,30)");
            Some(format!("DECIMAL{precision}"))
        }
        "float" | "double" | "real" => Some("DOUBLE".to_owned()),
        "date" => Some("DATE".to_owned()),
        "datetime" | "timestamp" => Some("DATETIME(6)".to_owned()),
        "time" => Some("TIME(6)".to_owned()),
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
            Some("BINARY".to_owned())
        }
        _ => None,
    }
}

/// Fills a custom query's placeholders. `$offset` is meant to sit inside a
/// quoted literal, so its quotes and backslashes are doubled and a value read
/// from the table cannot end that literal.
pub fn fill_placeholders(template: &str, values: &Placeholders<'_>) -> String {
    values.fill(template, |offset| {
        offset.replace('\\', "\\\\").replace('\'', "''")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> MySqlSourceConfig {
        let mut value = serde_json::json!({
            "connection_string": "mysql://localhost/db",
            "tables": ["events"],
        });
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        crate::connectors::parse_plugin_config(&value).unwrap()
    }

    fn catalog(columns: &[(&str, &str, &str, bool, bool)]) -> Vec<CatalogColumn> {
        columns
            .iter()
            .map(
                |(name, data_type, column_type, primary_key, unique)| CatalogColumn {
                    name: (*name).into(),
                    data_type: (*data_type).into(),
                    column_type: (*column_type).into(),
                    primary_key: *primary_key,
                    unique: *unique,
                },
            )
            .collect()
    }

    const PLACEHOLDERS: Placeholders<'static> = Placeholders {
        table: "events",
        offset: "",
        limit: 10,
        now_rfc3339: "2024-01-01T00:00:00Z",
        now_unix: 1_704_067_200,
    };

    #[test]
    fn given_a_non_unique_tracking_column_when_planned_should_break_ties_with_the_primary_key() {
        let config = config(serde_json::json!({"tracking_column": "updated_at", "batch_size": 5}));
        let columns = catalog(&[
            ("id", "bigint", "bigint(20) unsigned", true, true),
            ("updated_at", "datetime", "datetime(6)", false, false),
        ]);
        let (plan, warning) = TablePlan::build(&config, "events", &columns).unwrap();
        assert!(warning.is_none());
        assert_eq!(
            plan.polling_sql(&config, Some(("2024-01-01", Some("7"))), &PLACEHOLDERS),
            "SELECT src.`updated_at`, src.`id`, src.* FROM `events` AS src WHERE src.`updated_at` IS NOT NULL AND \
             (src.`updated_at` > CAST(_utf8mb4 X'323032342d30312d3031' AS DATETIME(6)) OR \
             (src.`updated_at` = CAST(_utf8mb4 X'323032342d30312d3031' AS DATETIME(6)) AND \
             src.`id` > CAST(_utf8mb4 X'37' AS UNSIGNED))) ORDER BY src.`updated_at`, src.`id` LIMIT 5"
        );
    }

    #[test]
    fn given_delete_and_mark_modes_when_consuming_should_name_keys_as_literals() {
        let columns = catalog(&[
            ("code", "varchar", "varchar(20)", true, true),
            ("done", "tinyint", "tinyint(1)", false, false),
        ]);
        let delete =
            config(serde_json::json!({"tracking_column": "code", "delete_after_read": true}));
        let (plan, _) = TablePlan::build(&delete, "shop.events", &columns).unwrap();
        assert_eq!(
            plan.consume_sql(&delete, &["a'".into(), "b".into()]),
            ["DELETE FROM `shop`.`events` WHERE `code` IN (_utf8mb4 X'6127', _utf8mb4 X'62')"]
        );
        let mark =
            config(serde_json::json!({"tracking_column": "code", "processed_column": "done"}));
        let (plan, _) = TablePlan::build(&mark, "events", &columns).unwrap();
        assert!(
            plan.polling_sql(&mark, None, &PLACEHOLDERS)
                .contains("src.`done` = FALSE")
        );
        assert_eq!(
            plan.consume_sql(&mark, &["x".into()]),
            ["UPDATE `events` SET `done` = TRUE WHERE `code` IN (_utf8mb4 X'78')"]
        );
    }

    #[test]
    fn given_missing_table_or_column_when_planned_should_name_it() {
        let config = config(serde_json::json!({"processed_column": "done"}));
        assert_eq!(
            TablePlan::build(&config, "events", &[]).unwrap_err(),
            PlanError::MissingTable("events".into())
        );
        let error = TablePlan::build(
            &config,
            "events",
            &catalog(&[("id", "int", "int(11)", true, true)]),
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("\"done\" (processed_column)"),
            "{error}"
        );
    }

    #[test]
    fn given_placeholders_when_filled_should_escape_quotes_and_backslashes_of_the_offset() {
        let filled = fill_placeholders(
            "SELECT * FROM $table WHERE name > '$offset' AND u < $now_unix LIMIT $limit",
            &Placeholders {
                offset: "o'b\\",
                ..PLACEHOLDERS
            },
        );
        assert_eq!(
            filled,
            "SELECT * FROM events WHERE name > 'o''b\\\\' AND u < 1704067200 LIMIT 10"
        );
    }
}
