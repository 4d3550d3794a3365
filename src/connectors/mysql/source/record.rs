//! Turns a polled row (text protocol: every value as the server renders it)
//! into a [`SourceRecord`]: the postgres source's `DatabaseRecord` JSON by
//! default, or one column, with a deterministic id from the row's identity.

use bytes::Bytes;
use sqlx::mysql::MySqlRow;
use sqlx::{Column, Row, TypeInfo, ValueRef};

use super::config::PayloadFormat;
use crate::connectors::kit::row_id::{message_id, to_snake_case};
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
    pub key: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RowError {
    #[error("table {table}: a row has a NULL tracking or key value")]
    NullTracking { table: String },
    #[error("table {table}: the tracking or key value is not UTF-8 text")]
    NotText { table: String },
    #[error("table {table}: cannot read a polled row: {source}")]
    Decode {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("table {table}: payload_column is not valid JSON: {source}")]
    Json {
        table: String,
        #[source]
        source: serde_json::Error,
    },
}

impl RowShape {
    /// Converts a row of the polling query (`tracking, key, payload...`).
    /// `now` is the RFC 3339 time stamped on `DatabaseRecord`s.
    pub fn convert(&self, row: &MySqlRow, now: &str) -> Result<ConvertedRow, RowError> {
        let tracking = self.text(row, 0)?;
        let key = self.text(row, 1)?;
        let payload = match self.payload {
            Some(format) => {
                let bytes = self.bytes(row, 2)?.unwrap_or_default();
                match format {
                    PayloadFormat::Bytea => Payload::Raw(Bytes::copy_from_slice(bytes)),
                    PayloadFormat::Text => {
                        Payload::Text(String::from_utf8_lossy(bytes).into_owned())
                    }
                    PayloadFormat::JsonDirect => Payload::Json(if bytes.is_empty() {
                        serde_json::Value::Null
                    } else {
                        serde_json::from_slice(bytes).map_err(|source| RowError::Json {
                            table: self.table.clone(),
                            source,
                        })?
                    }),
                }
            }
            None => Payload::JsonBytes(Bytes::from(self.document(row, now)?)),
        };
        let key_ref = (!self.key_is_tracking).then_some(key.as_str());
        let id = message_id(&self.table, &tracking, key_ref, self.key_is_tracking);
        Ok(ConvertedRow {
            record: SourceRecord::new(payload).with_id(id),
            tracking,
            key,
        })
    }

    fn bytes<'r>(&self, row: &'r MySqlRow, index: usize) -> Result<Option<&'r [u8]>, RowError> {
        let value = row.try_get_raw(index).map_err(|source| RowError::Decode {
            table: self.table.clone(),
            source,
        })?;
        if value.is_null() {
            return Ok(None);
        }
        <&[u8] as sqlx::Decode<sqlx::MySql>>::decode(value)
            .map(Some)
            .map_err(|source| RowError::Decode {
                table: self.table.clone(),
                source: sqlx::Error::Decode(source),
            })
    }

    fn text(&self, row: &MySqlRow, index: usize) -> Result<String, RowError> {
        let bytes = self
            .bytes(row, index)?
            .ok_or_else(|| RowError::NullTracking {
                table: self.table.clone(),
            })?;
        String::from_utf8(bytes.to_vec()).map_err(|_| RowError::NotText {
            table: self.table.clone(),
        })
    }

    /// The row's columns (from index 2) as a JSON object, wrapped as
    /// `DatabaseRecord` with `include_metadata`, written as text directly.
    fn document(&self, row: &MySqlRow, now: &str) -> Result<Vec<u8>, RowError> {
        let mut out = Vec::with_capacity(256);
        if self.include_metadata {
            out.extend_from_slice(b"{\"table_name\":");
            write_string(&mut out, &self.table);
            out.extend_from_slice(b",\"operation_type\":\"SELECT\",\"timestamp\":");
            write_string(&mut out, now);
            out.extend_from_slice(b",\"data\":");
        }
        write_columns(&mut out, row, 2, self.snake_case_columns).map_err(|source| {
            RowError::Decode {
                table: self.table.clone(),
                source,
            }
        })?;
        if self.include_metadata {
            out.extend_from_slice(b",\"old_data\":null}");
        }
        Ok(out)
    }
}

/// The row's columns from index `from` as a JSON object, each value in the
/// JSON form of its type ([`write_value`]).
pub fn write_columns(
    out: &mut Vec<u8>,
    row: &MySqlRow,
    from: usize,
    snake_case_columns: bool,
) -> Result<(), sqlx::Error> {
    out.push(b'{');
    for (position, column) in row.columns().iter().enumerate().skip(from) {
        if position > from {
            out.push(b',');
        }
        if snake_case_columns {
            write_string(out, &to_snake_case(column.name()));
        } else {
            write_string(out, column.name());
        }
        out.push(b':');
        let value = row.try_get_raw(position)?;
        if value.is_null() {
            out.extend_from_slice(b"null");
            continue;
        }
        let bytes =
            <&[u8] as sqlx::Decode<sqlx::MySql>>::decode(value).map_err(sqlx::Error::Decode)?;
        write_value(out, column.type_info().name(), bytes);
    }
    out.push(b'}');
    Ok(())
}

/// A value in the JSON form of its type: numbers as numbers (DECIMAL keeps
/// the server's exact digits), BOOLEAN (`TINYINT(1)`) as true/false, a JSON
/// column as its document, binary strings as `"\x<hex>"` (PostgreSQL's
/// bytea text, as the postgres source renders it), BIT as a number, the
/// rest (strings, dates and times as the server writes them) as strings.
pub fn write_value(out: &mut Vec<u8>, type_name: &str, value: &[u8]) {
    let text = std::str::from_utf8(value);
    match type_name {
        "BOOLEAN" => out.extend_from_slice(if value == b"0" { b"false" } else { b"true" }),
        "TINYINT" | "SMALLINT" | "MEDIUMINT" | "INT" | "BIGINT" | "TINYINT UNSIGNED"
        | "SMALLINT UNSIGNED" | "MEDIUMINT UNSIGNED" | "INT UNSIGNED" | "BIGINT UNSIGNED"
        | "YEAR" | "DECIMAL" | "FLOAT" | "DOUBLE"
            if text.is_ok_and(is_json_number) =>
        {
            out.extend_from_slice(value)
        }
        "JSON" if serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok() => {
            out.extend_from_slice(value)
        }
        "BIT" => {
            let number = value
                .iter()
                .take(8)
                .fold(0u64, |number, byte| (number << 8) | u64::from(*byte));
            out.extend_from_slice(number.to_string().as_bytes());
        }
        "BINARY" | "VARBINARY" | "TINYBLOB" | "BLOB" | "MEDIUMBLOB" | "LONGBLOB" | "GEOMETRY" => {
            let mut hex = String::with_capacity(value.len() * 2 + 2);
            hex.push_str("\\x");
            for byte in value {
                hex.push_str(&format!("{byte:02x}"));
            }
            write_string(out, &hex);
        }
        _ => write_string(out, &String::from_utf8_lossy(value)),
    }
}

fn is_json_number(text: &str) -> bool {
    serde_json::from_str::<serde_json::Number>(text).is_ok()
}

fn write_string(out: &mut Vec<u8>, text: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(type_name: &str, value: &[u8]) -> String {
        let mut out = Vec::new();
        write_value(&mut out, type_name, value);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn given_text_protocol_values_when_written_should_keep_their_json_types() {
        assert_eq!(
            json("BIGINT UNSIGNED", b"18446744073709551615"),
            "18446744073709551615"
        );
        assert_eq!(json("DECIMAL", b"12.50"), "12.50");
        assert_eq!(json("BOOLEAN", b"0"), "false");
        assert_eq!(json("JSON", br#"{"a":[1]}"#), r#"{"a":[1]}"#);
        assert_eq!(json("JSON", b"{broken"), r#""{broken""#);
        assert_eq!(json("VARBINARY", &[0xff, 0x00]), r#""\\xff00""#);
        assert_eq!(json("BIT", &[1, 2]), "258");
        assert_eq!(
            json("DATETIME", b"2024-01-02 03:04:05.000000"),
            r#""2024-01-02 03:04:05.000000""#
        );
        assert_eq!(json("VARCHAR", "say \"hi\"".as_bytes()), r#""say \"hi\"""#);
    }
}
