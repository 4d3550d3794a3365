//! Messages as Elasticsearch documents, in upstream's shape: a JSON object
//! payload as it is, a raw payload parsed as JSON or kept as
//! `{data: <base64>, data_type: "raw"}`, text as `{text, data_type: "text"}`,
//! plus the `_iggy_*` metadata fields.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use crate::message::{HeaderValue, Payload, SinkMessage, TopicRef};

/// The document `_id`: the Iggy message id as 32 hex digits, so a replay
/// overwrites the document it wrote before.
pub fn document_id(message: &SinkMessage) -> String {
    format!("{:032x}", message.id)
}

/// The document of `message`, or why it cannot be one.
pub fn document(
    message: &SinkMessage,
    topic: &TopicRef,
    include_metadata: bool,
) -> Result<Map<String, Value>, String> {
    let mut object = match &message.payload {
        Payload::Json(value) => object_of(value.clone())?,
        Payload::JsonBytes(bytes) => object_of(
            serde_json::from_slice(bytes)
                .map_err(|error| format!("the JSON payload does not parse: {error}"))?,
        )?,
        Payload::Raw(bytes) => match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => object_of(value)?,
            Err(_) => {
                let mut object = Map::new();
                object.insert("data".into(), Value::String(STANDARD.encode(bytes)));
                object.insert("data_type".into(), Value::String("raw".into()));
                object
            }
        },
        Payload::Text(text) => {
            let mut object = Map::new();
            object.insert("text".into(), Value::String(text.clone()));
            object.insert("data_type".into(), Value::String("text".into()));
            object
        }
    };
    if include_metadata {
        object.insert("_iggy_offset".into(), json!(message.offset));
        object.insert("_iggy_stream".into(), json!(topic.stream));
        object.insert("_iggy_topic".into(), json!(topic.topic));
        object.insert("_iggy_partition".into(), json!(message.partition_id));
        object.insert("_iggy_timestamp".into(), json!(message.timestamp / 1000));
        if !message.headers.is_empty() {
            let headers: Map<String, Value> = message
                .headers
                .iter()
                .map(|(name, value)| (name.to_string(), header_json(value)))
                .collect();
            object.insert("_iggy_headers".into(), Value::Object(headers));
        }
    }
    Ok(object)
}

fn object_of(value: Value) -> Result<Map<String, Value>, String> {
    match value {
        Value::Object(object) => Ok(object),
        other => Err(format!(
            "an Elasticsearch document must be a JSON object, the payload is {}",
            kind(&other)
        )),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn header_json(value: &HeaderValue) -> Value {
    match value {
        HeaderValue::String(text) => json!(text),
        HeaderValue::Bool(flag) => json!(flag),
        HeaderValue::Int(number) => json!(number),
        HeaderValue::UInt(number) => json!(number),
        HeaderValue::Float(number) => json!(number),
        HeaderValue::Raw(bytes) => json!(STANDARD.encode(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 0xabc,
            offset: 7,
            partition_id: 2,
            timestamp: 1_700_000_000_123_456,
            origin_timestamp: 0,
            checksum: 0,
            headers: vec![("tenant".into(), HeaderValue::String("acme".into()))],
            payload,
        }
    }

    fn topic() -> TopicRef {
        TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        }
    }

    #[test]
    fn given_a_json_object_when_converted_should_add_upstream_metadata() {
        let document = document(&message(Payload::Json(json!({"a": 1}))), &topic(), true).unwrap();
        assert_eq!(
            Value::Object(document),
            json!({
                "a": 1, "_iggy_offset": 7, "_iggy_stream": "s", "_iggy_topic": "t",
                "_iggy_partition": 2, "_iggy_timestamp": 1_700_000_000_123u64,
                "_iggy_headers": {"tenant": "acme"}
            })
        );
        assert_eq!(
            document_id(&message(Payload::Text(String::new()))).len(),
            32
        );
    }

    #[test]
    fn given_raw_and_text_payloads_when_converted_should_use_upstream_shapes() {
        let raw = document(
            &message(Payload::Raw(Bytes::from_static(b"\x00\x01"))),
            &topic(),
            false,
        )
        .unwrap();
        assert_eq!(
            Value::Object(raw),
            json!({"data": "AAE=", "data_type": "raw"})
        );
        let parsed = document(
            &message(Payload::Raw(Bytes::from_static(b"{\"x\":true}"))),
            &topic(),
            false,
        )
        .unwrap();
        assert_eq!(Value::Object(parsed), json!({"x": true}));
        let text = document(&message(Payload::Text("hi".into())), &topic(), false).unwrap();
        assert_eq!(
            Value::Object(text),
            json!({"text": "hi", "data_type": "text"})
        );
    }

    #[test]
    fn given_a_non_object_payload_when_converted_should_say_why_not() {
        let error = document(&message(Payload::Json(json!([1, 2]))), &topic(), true).unwrap_err();
        assert!(error.contains("an array"), "{error}");
        let error = document(
            &message(Payload::Raw(Bytes::from_static(b"42"))),
            &topic(),
            true,
        )
        .unwrap_err();
        assert!(error.contains("a number"), "{error}");
    }
}
