//! The table a message is routed to (dynamic routing).

use crate::message::{Payload, SinkMessage};

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

    use arrow_schema::SchemaRef;
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};

    use super::*;
    use crate::connectors::kit::lake::decode;
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
