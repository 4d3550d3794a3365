//! Turns a polled row into a [`SourceRecord`]: the payload (upstream's
//! `DatabaseRecord` JSON by default, or one column) and a deterministic message
//! id derived from the row's identity.

use bytes::Bytes;
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::config::PayloadFormat;
pub use crate::connectors::kit::row_id::{message_id, to_snake_case};
use crate::message::{Payload, SourceRecord};

/// How rows of one table become records.
#[derive(Debug, Clone)]
pub struct RowShape {
    pub table: String,
    pub payload: Option<PayloadFormat>,
    pub include_metadata: bool,
    pub snake_case_columns: bool,
    /// The tracking column is the row's key, so an integer key can be the id.
    pub key_is_tracking: bool,
}

/// One converted row and where it leaves the table's cursor.
#[derive(Debug)]
pub struct ConvertedRow {
    pub record: SourceRecord,
    pub tracking: String,
    pub key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RowError {
    #[error("table {table}: a row has a NULL tracking value")]
    NullTracking { table: String },
    #[error("table {table}: cannot read a polled row: {source}")]
    Decode {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("table {table}: row is not valid JSON: {source}")]
    Json {
        table: String,
        #[source]
        source: serde_json::Error,
    },
}

impl RowShape {
    /// Converts a row of the polling query (`tracking::text, key::text,
    /// payload`). `now` is the RFC 3339 time stamped on `DatabaseRecord`s.
    pub fn convert(&self, row: &PgRow, now: &str) -> Result<ConvertedRow, RowError> {
        let decode = |source| RowError::Decode {
            table: self.table.clone(),
            source,
        };
        let tracking: Option<String> = row.try_get(0).map_err(decode)?;
        let tracking = tracking.ok_or_else(|| RowError::NullTracking {
            table: self.table.clone(),
        })?;
        let key: Option<String> = row.try_get(1).map_err(decode)?;
        let payload = match self.payload {
            Some(PayloadFormat::Bytea) => {
                let bytes: Option<Vec<u8>> = row.try_get(2).map_err(decode)?;
                Payload::Raw(Bytes::from(bytes.unwrap_or_default()))
            }
            Some(PayloadFormat::Text) => {
                let text: Option<String> = row.try_get(2).map_err(decode)?;
                Payload::Text(text.unwrap_or_default())
            }
            Some(PayloadFormat::JsonDirect) => {
                let text: Option<&str> = row.try_get(2).map_err(decode)?;
                Payload::Json(match text {
                    Some(text) => serde_json::from_str(text).map_err(|source| RowError::Json {
                        table: self.table.clone(),
                        source,
                    })?,
                    None => Value::Null,
                })
            }
            None if !self.snake_case_columns => {
                let text: &str = row.try_get(2).map_err(decode)?;
                Payload::JsonBytes(self.document_text(text, now)?)
            }
            None => {
                let text: &str = row.try_get(2).map_err(decode)?;
                let columns: Map<String, Value> =
                    serde_json::from_str(text).map_err(|source| RowError::Json {
                        table: self.table.clone(),
                        source,
                    })?;
                Payload::Json(self.document(columns, now))
            }
        };
        let id = message_id(&self.table, &tracking, key.as_deref(), self.key_is_tracking);
        Ok(ConvertedRow {
            record: SourceRecord::new(payload).with_id(id),
            tracking,
            key,
        })
    }

    /// The same document as [`document`](Self::document) without renamed
    /// columns, written around the row's JSON as PostgreSQL produced it
    /// (`row_to_json`, valid JSON by construction): the row is neither parsed
    /// nor serialized again, and its numbers keep PostgreSQL's exact text
    /// (`12.50`, 20-digit numerics). Measured with `benches/backends/postgres.rs`.
    fn document_text(&self, row_json: &str, now: &str) -> Result<Bytes, RowError> {
        if !self.include_metadata {
            return Ok(Bytes::copy_from_slice(row_json.as_bytes()));
        }
        let json_error = |source| RowError::Json {
            table: self.table.clone(),
            source,
        };
        let mut out = Vec::with_capacity(row_json.len() + self.table.len() + 112);
        out.extend_from_slice(b"{\"table_name\":");
        serde_json::to_writer(&mut out, &self.table).map_err(json_error)?;
        out.extend_from_slice(b",\"operation_type\":\"SELECT\",\"timestamp\":");
        serde_json::to_writer(&mut out, now).map_err(json_error)?;
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(row_json.as_bytes());
        out.extend_from_slice(b",\"old_data\":null}");
        Ok(Bytes::from(out))
    }

    /// Upstream's `DatabaseRecord` (`include_metadata = true`), or the row's
    /// columns alone.
    fn document(&self, columns: Map<String, Value>, now: &str) -> Value {
        let data = if self.snake_case_columns {
            columns
                .into_iter()
                .map(|(name, value)| (to_snake_case(&name), value))
                .collect()
        } else {
            columns
        };
        if !self.include_metadata {
            return Value::Object(data);
        }
        let mut record = Map::with_capacity(5);
        record.insert("table_name".into(), Value::String(self.table.clone()));
        record.insert("operation_type".into(), Value::String("SELECT".into()));
        record.insert("timestamp".into(), Value::String(now.to_owned()));
        record.insert("data".into(), Value::Object(data));
        record.insert("old_data".into(), Value::Null);
        Value::Object(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_row_as_json_text_when_wrapped_should_match_the_document_built_from_values() {
        let row = r#"{"id":7,"amount":12.50,"note":"a \"quoted\" word","at":"2026-01-02T03:04:05+00:00"}"#;
        for include_metadata in [true, false] {
            let shape = RowShape {
                table: "public.\"Orders\"".into(),
                payload: None,
                include_metadata,
                snake_case_columns: false,
                key_is_tracking: true,
            };
            let now = "2026-01-02T03:04:05.000000Z";
            let text = shape.document_text(row, now).unwrap();
            let from_text: Value = serde_json::from_slice(&text).unwrap();
            let columns: Map<String, Value> = serde_json::from_str(row).unwrap();
            assert_eq!(from_text, shape.document(columns, now));
            let keys: Vec<&String> = from_text.as_object().unwrap().keys().collect();
            if include_metadata {
                assert_eq!(
                    keys,
                    [
                        "table_name",
                        "operation_type",
                        "timestamp",
                        "data",
                        "old_data"
                    ]
                );
                assert!(
                    std::str::from_utf8(&text)
                        .unwrap()
                        .contains(r#""amount":12.50"#),
                    "the row is kept as PostgreSQL wrote it"
                );
            } else {
                assert_eq!(&text[..], row.as_bytes());
            }
        }
    }
}
