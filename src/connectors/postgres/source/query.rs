//! SQL the postgres source runs: the per-table polling query, the custom query
//! with its placeholders, and the DELETE/UPDATE applied on commit.
//!
//! Every identifier is quoted; values travel as bind parameters, cast to the
//! column's own type (read from the catalog), so an index on the tracking column
//! serves the cursor comparison.

use std::sync::Arc;

use super::config::{Consume, PayloadFormat, PostgresSourceConfig};
use super::quote::{quote_identifier, quote_qualified};
use crate::connectors::kit::sql_poll::{CatalogEntry, PENDING_CAP, PlanColumns};
pub use crate::connectors::kit::sql_poll::{Placeholders, PlanError};

/// Reads one table's columns, their types and which are unique.
pub const CATALOG_SQL: &str = "\
SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
  EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary \
          AND i.indnatts = 1 AND i.indkey[0] = a.attnum), \
  EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisunique \
          AND i.indpred IS NULL AND i.indnatts = 1 AND i.indkey[0] = a.attnum) \
FROM pg_attribute a \
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
ORDER BY a.attnum";

/// One column of a polled table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogColumn {
    pub name: String,
    pub sql_type: String,
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

/// A column used in SQL: its quoted name and its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub quoted: String,
    pub sql_type: String,
}

/// Everything needed to poll and consume one table, built once per table.
#[derive(Debug, Clone)]
pub struct TablePlan {
    /// The table as configured: the state key and the record's `table_name`.
    pub name: String,
    /// The row's unique key for ties, ids and DELETE/UPDATE; `None` when the
    /// tracking column is itself the key.
    pub key: Option<Column>,
    /// Poll without a saved cursor.
    pub first_sql: Arc<str>,
    /// Poll after a saved cursor (`$1` = tracking value, `$2` = key).
    pub next_sql: Arc<str>,
    /// Applied on commit with `$1` = the delivered keys (text[]).
    pub consume_sql: Option<Arc<str>>,
    /// The custom query template, when the table is read through one.
    pub custom: Option<Arc<str>>,
    /// Counts the rows the poll would read, up to [`PENDING_CAP`] (the lag
    /// probe), without and after a saved cursor like `first_sql` and
    /// `next_sql`; `None` for a custom query.
    pub count_first_sql: Option<Arc<str>>,
    pub count_next_sql: Option<Arc<str>>,
}

impl TablePlan {
    /// Builds the SQL for `table` from the config and the table's catalog rows.
    pub fn build(
        config: &PostgresSourceConfig,
        table: &str,
        catalog: &[CatalogColumn],
    ) -> Result<(Self, Option<String>), PlanError> {
        let found = PlanColumns::find(&config.plan_config(), table, catalog, |a, b| a == b)?;
        let key = found.key.map(column);
        let tracking = column(found.tracking);
        let table_sql = quote_qualified(table).unwrap_or_default();
        let shape = Shape {
            config,
            tracking: &tracking,
            key: key.as_ref(),
        };
        let consume_sql = shape.consume_sql(&table_sql);
        let plan = match &config.custom_query {
            Some(custom) => {
                let wrapped: Arc<str> = shape.wrap_custom(custom).into();
                TablePlan {
                    name: table.to_owned(),
                    key,
                    first_sql: wrapped.clone(),
                    next_sql: wrapped.clone(),
                    consume_sql,
                    custom: Some(wrapped),
                    count_first_sql: None,
                    count_next_sql: None,
                }
            }
            None => TablePlan {
                name: table.to_owned(),
                first_sql: shape.polling_sql(&table_sql, false).into(),
                next_sql: shape.polling_sql(&table_sql, true).into(),
                count_first_sql: Some(shape.count_sql(&table_sql, false).into()),
                count_next_sql: Some(shape.count_sql(&table_sql, true).into()),
                key,
                consume_sql,
                custom: None,
            },
        };
        Ok((plan, found.warning))
    }
}

struct Shape<'a> {
    config: &'a PostgresSourceConfig,
    tracking: &'a Column,
    key: Option<&'a Column>,
}

impl Shape<'_> {
    /// `tracking::text, key::text, payload` of relation `alias`.
    fn select_list(&self, alias: &str) -> String {
        let tracking = &self.tracking.quoted;
        let key = self.key.map_or(tracking, |key| &key.quoted);
        let payload = match self.config.payload() {
            None => format!("row_to_json({alias})::text"),
            Some((column, format)) => {
                let column = quote_identifier(column).unwrap_or_default();
                match format {
                    PayloadFormat::Bytea => format!("{alias}.{column}::bytea"),
                    PayloadFormat::Text => format!("{alias}.{column}::text"),
                    PayloadFormat::JsonDirect => format!("{alias}.{column}::jsonb::text"),
                }
            }
        };
        format!("{alias}.{tracking}::text, {alias}.{key}::text, {payload}")
    }

    fn order_by(&self, alias: &str) -> String {
        match self.key {
            Some(key) => format!("{alias}.{}, {alias}.{}", self.tracking.quoted, key.quoted),
            None => format!("{alias}.{}", self.tracking.quoted),
        }
    }

    /// The built-in polling query. In cursor mode `$1`/`$2` are the saved
    /// cursor; in delete/mark mode the table itself is the progress, so `$1` is
    /// only the constant `initial_offset` lower bound.
    fn polling_sql(&self, table_sql: &str, after_cursor: bool) -> String {
        format!(
            "SELECT {} FROM {table_sql} AS src WHERE {} ORDER BY {} LIMIT {}",
            self.select_list("src"),
            self.conditions(after_cursor).join(" AND "),
            self.order_by("src"),
            self.config.batch_size
        )
    }

    /// The rows the polling query would read, counted up to [`PENDING_CAP`],
    /// with the same parameters.
    fn count_sql(&self, table_sql: &str, after_cursor: bool) -> String {
        format!(
            "SELECT count(*)::int8 FROM (SELECT 1 FROM {table_sql} AS src WHERE {} LIMIT {PENDING_CAP}) AS pending",
            self.conditions(after_cursor).join(" AND "),
        )
    }

    /// The polling query's conditions (see [`Self::polling_sql`]).
    fn conditions(&self, after_cursor: bool) -> Vec<String> {
        let tracking = &self.tracking.quoted;
        let tracking_type = &self.tracking.sql_type;
        let mut conditions = vec![format!("src.{tracking} IS NOT NULL")];
        match (self.config.consume(), after_cursor, self.key) {
            (Consume::Cursor, true, Some(key)) => conditions.push(format!(
                "(src.{tracking}, src.{}) > (CAST($1 AS {tracking_type}), CAST($2 AS {}))",
                key.quoted, key.sql_type
            )),
            (Consume::Cursor, true, None) => {
                conditions.push(format!("src.{tracking} > CAST($1 AS {tracking_type})"))
            }
            (Consume::Cursor, false, _) | (Consume::Delete | Consume::Mark(_), _, _) => {
                if self.config.initial_offset.is_some() {
                    conditions.push(format!("src.{tracking} > CAST($1 AS {tracking_type})"));
                }
            }
        }
        if let Consume::Mark(column) = self.config.consume() {
            let column = quote_identifier(&column).unwrap_or_default();
            conditions.push(format!("src.{column} = FALSE"));
        }
        conditions
    }

    /// The user's query as a subquery, so its rows are read the same way as the
    /// built-in query's. Placeholders stay in and are filled per poll.
    fn wrap_custom(&self, custom: &str) -> String {
        let custom = custom.trim().trim_end_matches(';').trim_end();
        format!(
            "SELECT {} FROM ({custom}) AS q ORDER BY {}",
            self.select_list("q"),
            self.order_by("q")
        )
    }

    fn consume_sql(&self, table_sql: &str) -> Option<Arc<str>> {
        let key = self.key.unwrap_or(self.tracking);
        let filter = format!("WHERE {} = ANY(CAST($1 AS {}[]))", key.quoted, key.sql_type);
        match self.config.consume() {
            Consume::Cursor => None,
            Consume::Delete => Some(format!("DELETE FROM {table_sql} {filter}").into()),
            Consume::Mark(column) => {
                let column = quote_identifier(&column).unwrap_or_default();
                Some(format!("UPDATE {table_sql} SET {column} = TRUE {filter}").into())
            }
        }
    }
}

fn column(catalog: &CatalogColumn) -> Column {
    Column {
        quoted: quote_identifier(&catalog.name).unwrap_or_default(),
        sql_type: catalog.sql_type.clone(),
    }
}

/// Fills a custom query's placeholders. `$offset` has its single quotes
/// doubled: it is meant to sit inside a quoted literal for non-numeric
/// columns, and a value read from the table must not be able to end that
/// literal.
pub fn fill_placeholders(template: &str, values: &Placeholders<'_>) -> String {
    values.fill(template, |offset| offset.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> PostgresSourceConfig {
        let mut value = serde_json::json!({
            "connection_string": "postgres://localhost/db",
            "tables": ["events"],
        });
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        crate::connectors::parse_plugin_config(&value).unwrap()
    }

    fn catalog(columns: &[(&str, &str, bool, bool)]) -> Vec<CatalogColumn> {
        columns
            .iter()
            .map(|(name, sql_type, primary_key, unique)| CatalogColumn {
                name: (*name).into(),
                sql_type: (*sql_type).into(),
                primary_key: *primary_key,
                unique: *unique,
            })
            .collect()
    }

    #[test]
    fn given_non_unique_tracking_column_when_planned_should_use_a_composite_cursor_with_the_primary_key()
     {
        let config = config(serde_json::json!({"tracking_column": "updated_at"}));
        let columns = catalog(&[
            ("id", "bigint", true, true),
            ("updated_at", "timestamp with time zone", false, false),
        ]);
        let (plan, warning) = TablePlan::build(&config, "events", &columns).unwrap();
        assert!(warning.is_none());
        assert_eq!(
            &*plan.next_sql,
            "SELECT src.\"updated_at\"::text, src.\"id\"::text, row_to_json(src)::text FROM \"events\" AS src \
             WHERE src.\"updated_at\" IS NOT NULL AND (src.\"updated_at\", src.\"id\") > \
             (CAST($1 AS timestamp with time zone), CAST($2 AS bigint)) \
             ORDER BY src.\"updated_at\", src.\"id\" LIMIT 1000"
        );
        assert!(!plan.first_sql.contains("$1"));
    }

    #[test]
    fn given_unique_tracking_column_when_planned_should_compare_the_tracking_value_alone() {
        let config = config(serde_json::json!({}));
        let columns = catalog(&[("id", "bigint", true, true), ("body", "text", false, false)]);
        let (plan, _) = TablePlan::build(&config, "events", &columns).unwrap();
        assert!(plan.key.is_none());
        assert!(plan.next_sql.contains("src.\"id\" > CAST($1 AS bigint)"));
    }

    #[test]
    fn given_delete_mode_when_planned_should_ignore_the_cursor_and_delete_by_key() {
        let config = config(serde_json::json!({"delete_after_read": true}));
        let columns = catalog(&[("id", "integer", true, true)]);
        let (plan, _) = TablePlan::build(&config, "public.events", &columns).unwrap();
        assert_eq!(plan.first_sql, plan.next_sql);
        assert_eq!(
            plan.consume_sql.as_deref(),
            Some("DELETE FROM \"public\".\"events\" WHERE \"id\" = ANY(CAST($1 AS integer[]))")
        );
    }

    #[test]
    fn given_missing_table_or_column_when_planned_should_name_it() {
        let config = config(serde_json::json!({"processed_column": "done"}));
        assert_eq!(
            TablePlan::build(&config, "events", &[]).unwrap_err(),
            PlanError::MissingTable("events".into())
        );
        let error = TablePlan::build(&config, "events", &catalog(&[("id", "int", true, true)]))
            .unwrap_err();
        assert!(
            error.to_string().contains("\"done\" (processed_column)"),
            "{error}"
        );
    }

    #[test]
    fn given_placeholders_when_filled_should_replace_each_once_and_escape_the_offset() {
        let filled = fill_placeholders(
            "SELECT * FROM $table WHERE name > '$offset' AND at < '$now' AND u < $now_unix LIMIT $limit -- $1",
            &Placeholders {
                table: "users",
                offset: "o'brien",
                limit: 10,
                now_rfc3339: "2024-01-01T00:00:00Z",
                now_unix: 1_704_067_200,
            },
        );
        assert_eq!(
            filled,
            "SELECT * FROM users WHERE name > 'o''brien' AND at < '2024-01-01T00:00:00Z' AND u < 1704067200 LIMIT 10 -- $1"
        );
    }

    #[test]
    fn given_identifiers_when_quoted_should_double_embedded_quotes() {
        assert_eq!(quote_identifier("a\"b").unwrap(), "\"a\"\"b\"");
        assert_eq!(quote_qualified("s.T").unwrap(), "\"s\".\"T\"");
        assert!(quote_qualified("s..t").is_err());
    }
}
