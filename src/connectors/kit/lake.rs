//! What the lakehouse sinks (delta, iceberg) share: the columns of a table
//! they create, their flush triggers, and JSON payloads decoded into Arrow
//! rows of a table's schema (a batch decodes as a whole, and when it does
//! not, each message alone says which ones spoil it).

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_json::ReaderBuilder;
use arrow_schema::SchemaRef;
use serde::Deserialize;

use crate::config::size::parse_size;
use crate::connectors::{PluginConfigError, Rejection};
use crate::message::{Payload, SinkMessage};

/// One column of a table the sink creates (or expects).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Column {
    /// The column's name; a payload's top-level field of this name fills it.
    pub name: String,
    /// The column's type in the table format's names (`long`, `string`,
    /// `timestamp`, `decimal(10,2)`, ...; see `columns`).
    #[serde(rename = "type")]
    pub data_type: String,
    /// Whether rows may leave it out (an optional column); `false` makes it
    /// required, and a payload without it is rejected.
    #[serde(default = "default_true")]
    pub nullable: bool,
}

/// The flush triggers' byte limit from `max_file_size`, both triggers
/// checked to be above 0.
pub fn max_bytes(
    max_messages_per_file: u64,
    max_file_size: &str,
) -> Result<u64, PluginConfigError> {
    if max_messages_per_file == 0 {
        return Err(PluginConfigError::new(
            "max_messages_per_file",
            "must be above 0",
        ));
    }
    let max_bytes = parse_size(max_file_size)
        .map_err(|message| PluginConfigError::new("max_file_size", message))?;
    if max_bytes == 0 {
        return Err(PluginConfigError::new("max_file_size", "must be above 0"));
    }
    Ok(max_bytes)
}

pub fn default_max_messages() -> u64 {
    100_000
}

pub fn default_max_file_size() -> String {
    "64MiB".to_owned()
}

pub fn default_flush_interval() -> Duration {
    Duration::from_secs(10)
}

fn default_true() -> bool {
    true
}

/// Decodes the messages at `indexes` into one batch of `schema`'s rows. A
/// payload that does not decode (not JSON, not one object, a value of the
/// wrong type, a required column missing) is rejected by its index; then
/// nothing of the batch is returned.
pub fn decode(
    schema: &SchemaRef,
    messages: &[SinkMessage],
    indexes: &[usize],
) -> Result<RecordBatch, Vec<Rejection>> {
    let whole = decode_rows(schema, indexes.iter().map(|&index| &messages[index]));
    match whole {
        Ok(batch) if batch.num_rows() == indexes.len() => Ok(batch),
        // Which messages spoiled it: each alone.
        _ => Err(indexes
            .iter()
            .filter_map(|&index| {
                let reason = match decode_rows(schema, [&messages[index]]) {
                    Ok(batch) if batch.num_rows() == 1 => return None,
                    Ok(batch) => format!(
                        "the payload holds {} JSON values, expected one object",
                        batch.num_rows()
                    ),
                    Err(reason) => reason,
                };
                Some(Rejection { index, reason })
            })
            .collect()),
    }
}

/// Rows of `schema` from JSON payloads: ISO 8601 strings into timestamps,
/// numbers and booleans into string columns, unknown fields ignored.
fn decode_rows<'a>(
    schema: &SchemaRef,
    messages: impl IntoIterator<Item = &'a SinkMessage>,
) -> Result<RecordBatch, String> {
    let messages: Vec<&SinkMessage> = messages.into_iter().collect();
    // One row more than messages: a payload holding two values shows as an
    // extra row. (A huge batch size overflows the decoder's buffer sizing.)
    let mut decoder = ReaderBuilder::new(schema.clone())
        .with_coerce_primitive(true)
        .with_batch_size(messages.len() + 1)
        .build_decoder()
        .map_err(|error| error.to_string())?;
    let mut text = Vec::new();
    for message in messages {
        match &message.payload {
            Payload::Json(value) => {
                serde_json::to_writer(&mut text, value).map_err(|error| error.to_string())?
            }
            Payload::JsonBytes(bytes) | Payload::Raw(bytes) => text.extend_from_slice(bytes),
            Payload::Text(string) => text.extend_from_slice(string.as_bytes()),
        }
        text.push(b'\n');
    }
    let mut at = 0;
    while at < text.len() {
        let read = decoder
            .decode(&text[at..])
            .map_err(|error| error.to_string())?;
        if read == 0 {
            break;
        }
        at += read;
    }
    Ok(decoder
        .flush()
        .map_err(|error| error.to_string())?
        .unwrap_or_else(|| RecordBatch::new_empty(schema.clone())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::message::Headers;

    fn message(payload: &str) -> SinkMessage {
        SinkMessage {
            id: 1,
            offset: 0,
            partition_id: 0,
            timestamp: 1,
            origin_timestamp: 1,
            checksum: 0,
            headers: Headers::default(),
            payload: Payload::JsonBytes(bytes::Bytes::from(payload.to_owned())),
        }
    }

    #[test]
    fn given_misfits_among_messages_when_decoded_should_reject_exactly_those_by_index() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let messages: Vec<SinkMessage> = [
            r#"{"n": 1}"#,
            "not json",
            r#"{"n": 2} {"n": 3}"#,
            r#"{"other": 4}"#,
            r#"{"n": 5, "extra": "ignored"}"#,
        ]
        .into_iter()
        .map(message)
        .collect();
        let all: Vec<usize> = (0..messages.len()).collect();
        let rejected: Vec<usize> = decode(&schema, &messages, &all)
            .unwrap_err()
            .into_iter()
            .map(|rejection| rejection.index)
            .collect();
        assert_eq!(rejected, [1, 2, 3]);
        let batch = decode(&schema, &messages, &[0, 4]).unwrap();
        assert_eq!(batch.num_rows(), 2);
    }
}
