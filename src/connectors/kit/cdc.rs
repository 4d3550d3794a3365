//! What the change-data-capture modes of the SQL sources (postgres's logical
//! replication, mysql's row binlog) share: the change kinds
//! `capture_operations` names, the initial snapshot setting, and upstream's
//! `DatabaseRecord` envelope around a change.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;

use super::row_id::to_snake_case;
use crate::connectors::PluginConfigError;
use crate::message::Payload;

/// Whether a CDC source first produces the rows already in its tables.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    #[default]
    Initial,
    Never,
}

/// A change kind `capture_operations` can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Insert,
    Update,
    Delete,
    Truncate,
}

impl Operation {
    pub fn name(self) -> &'static str {
        match self {
            Self::Insert => "INSERT",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Truncate => "TRUNCATE",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Self::Insert, Self::Update, Self::Delete, Self::Truncate]
            .into_iter()
            .find(|operation| operation.name().eq_ignore_ascii_case(text.trim()))
    }
}

/// The change kinds of `capture_operations` (default: inserts, updates and
/// deletes, as upstream), or the field's error naming the unknown one.
pub fn operations(names: Option<&[String]>) -> Result<Vec<Operation>, PluginConfigError> {
    match names {
        None => Ok(vec![Operation::Insert, Operation::Update, Operation::Delete]),
        Some(names) => names
            .iter()
            .map(|name| {
                Operation::parse(name).ok_or_else(|| {
                    PluginConfigError::new(
                        "capture_operations",
                        format!("unknown operation {name:?}; expected INSERT, UPDATE, DELETE or TRUNCATE"),
                    )
                })
            })
            .collect(),
    }
}

/// Refuses, in `mode = "cdc"`, the first of the polling mode's fields that
/// is set.
pub fn refuse_polling_fields(fields: &[(&'static str, bool)]) -> Result<(), PluginConfigError> {
    match fields.iter().find(|(_, set)| *set) {
        Some(&(field, _)) => Err(PluginConfigError::new(
            field,
            "applies to mode = \"polling\" only; remove it or use polling",
        )),
        None => Ok(()),
    }
}

/// How a change becomes a payload.
#[derive(Debug, Clone, Copy)]
pub struct RecordShape {
    /// Upstream's `{table_name, operation_type, timestamp, data, old_data}`
    /// envelope; without it the payload is `data` alone.
    pub include_metadata: bool,
    pub snake_case_columns: bool,
}

impl RecordShape {
    /// The payload of one change: `data` and `old_data` are rows already
    /// rendered as JSON objects (text), kept as they are unless columns are
    /// renamed.
    pub fn payload<'a>(
        self,
        table: &str,
        operation: &str,
        timestamp: &str,
        data: Option<&'a str>,
        old_data: Option<&'a str>,
    ) -> Payload {
        let rename = |text: &'a str| -> Cow<'a, str> {
            if !self.snake_case_columns {
                return Cow::Borrowed(text);
            }
            match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
                Ok(columns) => Cow::Owned(
                    serde_json::Value::Object(
                        columns
                            .into_iter()
                            .map(|(name, value)| (to_snake_case(&name), value))
                            .collect(),
                    )
                    .to_string(),
                ),
                Err(_) => Cow::Borrowed(text),
            }
        };
        let data = data.map(rename);
        let old_data = old_data.map(rename);
        if !self.include_metadata {
            let data = data.unwrap_or(Cow::Borrowed("null"));
            return Payload::JsonBytes(Bytes::from(data.into_owned()));
        }
        let mut out = Vec::with_capacity(
            96 + table.len()
                + timestamp.len()
                + data.as_ref().map_or(4, |data| data.len())
                + old_data.as_ref().map_or(4, |data| data.len()),
        );
        // serde_json writes a &str as a JSON string; a Vec takes every write.
        let quoted = |out: &mut Vec<u8>, text: &str| {
            let _ = serde_json::to_writer(out, text);
        };
        out.extend_from_slice(b"{\"table_name\":");
        quoted(&mut out, table);
        out.extend_from_slice(b",\"operation_type\":");
        quoted(&mut out, operation);
        out.extend_from_slice(b",\"timestamp\":");
        quoted(&mut out, timestamp);
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(data.as_deref().unwrap_or("null").as_bytes());
        out.extend_from_slice(b",\"old_data\":");
        out.extend_from_slice(old_data.as_deref().unwrap_or("null").as_bytes());
        out.push(b'}');
        Payload::JsonBytes(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(payload: Payload) -> String {
        match payload {
            Payload::JsonBytes(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
            other => panic!("expected JSON text, got {other:?}"),
        }
    }

    #[test]
    fn given_a_change_when_wrapped_should_keep_the_rendered_rows_and_rename_only_when_asked() {
        let envelope = RecordShape {
            include_metadata: true,
            snake_case_columns: true,
        };
        let payload = envelope.payload(
            "shop.users",
            "UPDATE",
            "2024-01-02T03:04:05Z",
            Some(r#"{"userId":2}"#),
            Some(r#"{"userId":1}"#),
        );
        assert_eq!(
            text(payload),
            r#"{"table_name":"shop.users","operation_type":"UPDATE","timestamp":"2024-01-02T03:04:05Z","data":{"user_id":2},"old_data":{"user_id":1}}"#
        );
        let bare = RecordShape {
            include_metadata: false,
            snake_case_columns: false,
        };
        assert_eq!(
            text(bare.payload("t", "DELETE", "", None, Some("{}"))),
            "null"
        );
        assert_eq!(
            text(bare.payload("t", "INSERT", "", Some(r#"{"userId":2}"#), None)),
            r#"{"userId":2}"#
        );
    }

    #[test]
    fn given_operation_names_when_parsed_should_ignore_case_and_name_the_field_for_unknown_ones() {
        let names = ["insert".to_owned(), " DELETE ".to_owned()];
        assert_eq!(
            operations(Some(&names)).unwrap(),
            [Operation::Insert, Operation::Delete]
        );
        assert_eq!(operations(None).unwrap().len(), 3);
        let error = operations(Some(&["MERGE".to_owned()])).unwrap_err();
        assert_eq!(error.field, "capture_operations");
    }
}
