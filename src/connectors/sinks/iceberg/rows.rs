//! JSON payloads into Arrow rows of a table's schema, and the table a message
//! is routed to.

use arrow_array::RecordBatch;
use arrow_json::ReaderBuilder;
use arrow_schema::SchemaRef;

use crate::connectors::Rejection;
use crate::message::{Payload, SinkMessage};

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

/// The table `field` of a message's JSON object names, as its index in
/// `tables` (`namespace.table` names).
pub fn route(message: &SinkMessage, field: &str, tables: &[String]) -> Result<usize, String> {
    let parsed;
    let value = match &message.payload {
        Payload::Json(value) => value,
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => {
            parsed = serde_json::from_slice::<serde_json::Value>(bytes)
                .map_err(|error| format!("not JSON: {error}"))?;
            &parsed
        }
        Payload::Text(text) => {
            parsed = serde_json::from_str::<serde_json::Value>(text)
                .map_err(|error| format!("not JSON: {error}"))?;
            &parsed
        }
    };
    let object = value
        .as_object()
        .ok_or("dynamic routing needs a JSON object payload")?;
    let name = match object.get(field) {
        Some(serde_json::Value::String(name)) => name,
        Some(other) => {
            return Err(format!(
                "the route field \"{field}\" is {other}, expected a table name string"
            ));
        }
        None => return Err(format!("no route field \"{field}\" in the payload")),
    };
    tables
        .iter()
        .position(|table| table == name.trim())
        .ok_or_else(|| {
            format!(
                "\"{name}\" (field \"{field}\") is not one of the sink's `tables`: {}",
                tables.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

    use super::*;
    use crate::message::Headers;

    fn schema_of(columns: &[(&str, PrimitiveType)]) -> SchemaRef {
        let fields = columns.iter().enumerate().map(|(index, (name, kind))| {
            Arc::new(NestedField::optional(
                index as i32 + 1,
                *name,
                Type::Primitive(kind.clone()),
            ))
        });
        let schema = Schema::builder().with_fields(fields).build().unwrap();
        Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).unwrap())
    }

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
    fn given_every_documented_type_when_decoded_should_take_its_json_value() {
        let cases = [
            (PrimitiveType::Boolean, "true"),
            (PrimitiveType::Int, "7"),
            (PrimitiveType::Long, "7"),
            (PrimitiveType::Float, "1.5"),
            (PrimitiveType::Double, "1.5"),
            (PrimitiveType::String, "\"text\""),
            (PrimitiveType::Date, "\"2026-12-04\""),
            (PrimitiveType::Timestamp, "\"2026-12-04T10:00:00\""),
            (PrimitiveType::Timestamptz, "\"2026-12-04T10:00:00Z\""),
            (
                PrimitiveType::Decimal {
                    precision: 10,
                    scale: 2,
                },
                "\"12.34\"",
            ),
        ];
        for (kind, value) in cases {
            let schema = schema_of(&[("c", kind.clone())]);
            let messages = [message(&format!("{{\"c\": {value}}}"))];
            let batch = decode(&schema, &messages, &[0])
                .unwrap_or_else(|rejections| panic!("{kind}: {rejections:?}"));
            assert_eq!(batch.num_rows(), 1, "{kind}");
            assert_eq!(batch.column(0).null_count(), 0, "{kind}");
        }
    }
}
