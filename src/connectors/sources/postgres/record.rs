//! Turns a polled row into a [`SourceRecord`]: the payload (upstream's
//! `DatabaseRecord` JSON by default, or one column) and a deterministic message
//! id derived from the row's identity.

use bytes::Bytes;
use serde_json::{Map, Value};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::config::PayloadFormat;
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
    /// (`12.50`, 20-digit numerics). Measured with `benches/postgres.rs`.
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

/// A deterministic Iggy message id for a row version, so a row read twice (after
/// a NACK or a crash) carries the same id both times and Iggy's or a sink's
/// deduplication can drop the copy.
///
/// - The tracking column is the key and its value is an integer in `0..2^64`:
///   the high 64 bits are FNV-1a-64 of the table name and the low 64 bits are
///   the key itself, so the key can be read off the id and two tables never share ids.
/// - Otherwise: FNV-1a-128 of `table \0 key \0 tracking value`, so a row whose
///   tracking value changed (an update) gets a new id.
pub fn message_id(table: &str, tracking: &str, key: Option<&str>, key_is_tracking: bool) -> u128 {
    if key_is_tracking && let Ok(number) = tracking.parse::<u64>() {
        return (u128::from(fnv1a_64(table.as_bytes())) << 64) | u128::from(number);
    }
    let mut hash = Fnv128::new();
    hash.write(table.as_bytes());
    hash.write(&[0]);
    hash.write(key.unwrap_or("").as_bytes());
    hash.write(&[0]);
    hash.write(tracking.as_bytes());
    hash.finish()
}

fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn new() -> Self {
        Self(Self::OFFSET)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u128::from(*byte)).wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u128 {
        self.0
    }
}

/// `userId` -> `user_id`, `HTTPServer` -> `http_server`, `Order Date` -> `order_date`.
pub fn to_snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (index, &current) in chars.iter().enumerate() {
        if current == ' ' || current == '-' {
            if !out.ends_with('_') {
                out.push('_');
            }
            continue;
        }
        if current.is_uppercase() && index > 0 {
            let previous = chars[index - 1];
            let next_is_lower = chars.get(index + 1).is_some_and(|next| next.is_lowercase());
            let boundary = previous.is_lowercase()
                || previous.is_ascii_digit()
                || (previous.is_uppercase() && next_is_lower);
            if boundary && !out.ends_with('_') {
                out.push('_');
            }
        }
        out.extend(current.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_integer_tracking_key_when_identified_should_keep_the_key_in_the_low_bits() {
        let id = message_id("orders", "42", None, true);
        assert_eq!(id as u64, 42);
        assert_ne!(id >> 64, 0);
        assert_ne!(id, message_id("users", "42", None, true));
        assert_eq!(id, message_id("orders", "42", None, true));
    }

    #[test]
    fn given_other_keys_when_identified_should_hash_the_row_version() {
        let first = message_id("orders", "2024-01-01", Some("7"), false);
        assert_eq!(first, message_id("orders", "2024-01-01", Some("7"), false));
        assert_ne!(first, message_id("orders", "2024-01-02", Some("7"), false));
        assert_ne!(first, message_id("orders", "2024-01-01", Some("8"), false));
        assert_ne!(
            message_id("orders", "abc", None, true),
            message_id("orders", "abd", None, true)
        );
    }

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

    #[test]
    fn given_column_names_when_snake_cased_should_split_words() {
        assert_eq!(to_snake_case("userId"), "user_id");
        assert_eq!(to_snake_case("UserName"), "user_name");
        assert_eq!(to_snake_case("HTTPServer"), "http_server");
        assert_eq!(to_snake_case("Order Date"), "order_date");
        assert_eq!(to_snake_case("already_snake"), "already_snake");
    }
}
