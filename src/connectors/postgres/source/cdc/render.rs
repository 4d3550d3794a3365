//! Renders pgoutput's text values as the polling mode renders rows: PostgreSQL
//! parses them back into the table's row type (`json_populate_record`) and
//! writes the row with `row_to_json`, so numbers, booleans, JSON columns,
//! timestamps and arrays come out exactly as a polled row's do.

use sqlx::postgres::PgPool;
use tracing::warn;

use super::pgoutput::{Relation, Value};
use crate::connectors::postgres::source::quote::quote_identifier;
use crate::connectors::postgres::{describe, is_transient};

/// `json` and `jsonb`: their text is JSON already and goes in as JSON.
const JSON_TYPES: [u32; 2] = [114, 3802];

/// One tuple to render: only the columns PostgreSQL sent (not unchanged
/// TOASTed ones; only the key columns of a key-only old tuple).
pub struct Tuple {
    doc: String,
}

impl Tuple {
    pub fn new(relation: &Relation, values: &[Value], key_only: bool) -> Self {
        let mut doc = String::from("{");
        for (column, value) in relation.columns.iter().zip(values) {
            if key_only && !column.key {
                continue;
            }
            let text = match value {
                Value::Unchanged => continue,
                Value::Null => "null".to_owned(),
                Value::Text(text) if JSON_TYPES.contains(&column.type_oid) => text.clone(),
                Value::Text(text) => serde_json::Value::String(text.clone()).to_string(),
            };
            if doc.len() > 1 {
                doc.push(',');
            }
            doc.push_str(&serde_json::Value::String(column.name.clone()).to_string());
            doc.push(':');
            doc.push_str(&text);
        }
        doc.push('}');
        Self { doc }
    }
}

/// The tuples of `relation` as JSON objects, in order. A relation PostgreSQL
/// can no longer parse them into (dropped, altered since) gets its values as
/// JSON strings instead, with a warning: the change is not lost.
pub async fn render(
    pool: &PgPool,
    relation: &Relation,
    tuples: &[Tuple],
) -> Result<Vec<String>, sqlx::Error> {
    if tuples.is_empty() {
        return Ok(Vec::new());
    }
    let table = format!(
        "{}.{}",
        quote_identifier(&relation.namespace).unwrap_or_default(),
        quote_identifier(&relation.name).unwrap_or_default()
    );
    let sql = format!(
        "SELECT coalesce((SELECT json_object_agg(e.key, e.value) \
           FROM json_each(row_to_json(json_populate_record(NULL::{table}, d.doc))) AS e \
           WHERE e.key IN (SELECT json_object_keys(d.doc))), '{{}}'::json)::text \
         FROM json_array_elements($1::json) WITH ORDINALITY AS d(doc, n) ORDER BY d.n"
    );
    let mut array = String::with_capacity(
        tuples
            .iter()
            .map(|tuple| tuple.doc.len() + 1)
            .sum::<usize>()
            + 2,
    );
    array.push('[');
    for (index, tuple) in tuples.iter().enumerate() {
        if index > 0 {
            array.push(',');
        }
        array.push_str(&tuple.doc);
    }
    array.push(']');
    match sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(&array)
        .fetch_all(pool)
        .await
    {
        Ok(rendered) => Ok(rendered),
        Err(error) if is_transient(&error) && !is_missing_table(&error) => Err(error),
        Err(error) => {
            warn!(table = %table, error = %describe(&error), "cannot render changed rows with the table's current types; producing their values as text");
            Ok(tuples.iter().map(|tuple| tuple.doc.clone()).collect())
        }
    }
}

fn is_missing_table(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(database) if database.code().as_deref() == Some("42P01"))
}
