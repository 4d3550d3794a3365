//! Messages as Meilisearch documents, in upstream's shape: a JSON object as
//! it is, other JSON as `{value}`, raw bytes parsed as JSON or kept as
//! `{data: <base64>, data_type: "raw", data_encoding: "base64"}`, text as
//! `{text, data_type: "text"}`; upstream's deterministic id when the primary
//! key is missing, and the `iggy_*` metadata fields.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Map, Value, json};

use crate::message::{HeaderValue, Payload, SinkMessage, TopicRef};

/// The field upstream puts its deterministic id in.
pub const IGGY_ID: &str = "iggy_id";

/// The longest document id Meilisearch accepts, in bytes.
const MAX_ID_BYTES: usize = 511;

/// Upstream's deterministic id of a message: `iggy_` + base64url (no
/// padding) of the JSON `[stream, topic, partition, offset, "<id>"]`.
pub fn generated_id(topic: &TopicRef, message: &SinkMessage) -> String {
    let parts = json!([
        topic.stream,
        topic.topic,
        message.partition_id,
        message.offset,
        message.id.to_string()
    ]);
    format!("iggy_{}", URL_SAFE_NO_PAD.encode(parts.to_string()))
}

/// The document of `message`, or why Meilisearch would refuse it.
pub fn document(
    message: &SinkMessage,
    topic: &TopicRef,
    primary_key: &str,
    include_metadata: bool,
) -> Result<Map<String, Value>, String> {
    let mut object = match &message.payload {
        Payload::Json(value) => object_of(value.clone()),
        Payload::JsonBytes(bytes) => object_of(
            serde_json::from_slice(bytes)
                .map_err(|error| format!("the JSON payload does not parse: {error}"))?,
        ),
        Payload::Raw(bytes) => match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => object_of(value),
            Err(_) => {
                let mut object = Map::new();
                object.insert("data".into(), Value::String(STANDARD.encode(bytes)));
                object.insert("data_type".into(), json!("raw"));
                object.insert("data_encoding".into(), json!("base64"));
                object
            }
        },
        Payload::Text(text) => {
            let mut object = Map::new();
            object.insert("text".into(), Value::String(text.clone()));
            object.insert("data_type".into(), json!("text"));
            object
        }
    };
    let generated = generated_id(topic, message);
    match object.get(primary_key) {
        None => {
            object.insert(primary_key.to_owned(), Value::String(generated.clone()));
        }
        Some(value) => check_id(primary_key, value)?,
    }
    if let Some(Value::String(id)) = object.get(primary_key)
        && id.len() > MAX_ID_BYTES
    {
        return Err(format!(
            "invalid_document_id: the {primary_key} value is {} bytes, more than Meilisearch's {MAX_ID_BYTES}",
            id.len()
        ));
    }
    if include_metadata {
        if primary_key != IGGY_ID {
            object.insert(IGGY_ID.into(), Value::String(generated));
        }
        object.insert("iggy_message_id".into(), json!(message.id.to_string()));
        object.insert("iggy_offset".into(), json!(message.offset));
        object.insert("iggy_stream".into(), json!(topic.stream));
        object.insert("iggy_topic".into(), json!(topic.topic));
        object.insert("iggy_partition".into(), json!(message.partition_id));
        object.insert("iggy_checksum".into(), json!(message.checksum.to_string()));
        object.insert("iggy_timestamp".into(), json!(message.timestamp));
        object.insert(
            "iggy_origin_timestamp".into(),
            json!(message.origin_timestamp),
        );
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis() as u64)
            .unwrap_or_default();
        object.insert("iggy_ingested_at".into(), json!(now_ms));
        if !message.headers.is_empty() {
            let headers: Map<String, Value> = message
                .headers
                .iter()
                .map(|(name, value)| (name.to_string(), header_json(value)))
                .collect();
            object.insert("iggy_headers".into(), Value::Object(headers));
        }
    }
    Ok(object)
}

/// A document id Meilisearch accepts: an integer, or a string of 1 to 511
/// bytes of letters, digits, `-` and `_`.
fn check_id(primary_key: &str, value: &Value) -> Result<(), String> {
    let valid = match value {
        Value::Number(number) => number.is_i64() || number.is_u64(),
        Value::String(id) => {
            !id.is_empty()
                && id.len() <= MAX_ID_BYTES
                && id
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
        }
        _ => false,
    };
    if valid {
        return Ok(());
    }
    let mut shown = value.to_string();
    shown.truncate(80);
    Err(format!(
        "invalid_document_id: {primary_key} = {shown} is not a Meilisearch document id (an integer, or 1 to {MAX_ID_BYTES} bytes of letters, digits, '-' and '_')"
    ))
}

fn object_of(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(object) => object,
        other => {
            let mut object = Map::new();
            object.insert("value".into(), other);
            object
        }
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
            id: 42,
            offset: 7,
            partition_id: 2,
            timestamp: 1_700_000_000_123_456,
            origin_timestamp: 1_700_000_000_000_000,
            checksum: u64::MAX,
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
    fn given_a_message_when_its_id_is_generated_should_encode_upstreams_parts() {
        let id = generated_id(&topic(), &message(Payload::Text(String::new())));
        let encoded = id.strip_prefix("iggy_").unwrap();
        let decoded = URL_SAFE_NO_PAD.decode(encoded).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&decoded).unwrap(),
            json!(["s", "t", 2, 7, "42"])
        );
        assert!(check_id("k", &Value::String(id)).is_ok());
    }

    #[test]
    fn given_a_json_object_when_converted_should_add_the_id_and_upstream_metadata() {
        let document = document(
            &message(Payload::Json(json!({"a": 1, "iggy_offset": "mine"}))),
            &topic(),
            "iggy_id",
            true,
        )
        .unwrap();
        assert_eq!(document["a"], 1);
        assert_eq!(
            document["iggy_offset"], 7,
            "metadata overwrites the payload"
        );
        assert_eq!(document["iggy_checksum"], u64::MAX.to_string());
        assert_eq!(document["iggy_message_id"], "42");
        assert_eq!(document["iggy_timestamp"], 1_700_000_000_123_456u64);
        assert_eq!(document["iggy_headers"], json!({"tenant": "acme"}));
        assert!(document["iggy_id"].as_str().unwrap().starts_with("iggy_"));
    }

    #[test]
    fn given_a_payload_with_its_own_key_when_converted_should_keep_it_and_add_iggy_id() {
        let document = document(
            &message(Payload::Json(json!({"sku": "ab-1"}))),
            &topic(),
            "sku",
            true,
        )
        .unwrap();
        assert_eq!(document["sku"], "ab-1");
        assert!(document["iggy_id"].as_str().unwrap().starts_with("iggy_"));
        let bare = document_without_metadata(Payload::Json(json!({"sku": 5})), "sku");
        assert_eq!(Value::Object(bare), json!({"sku": 5}));
    }

    fn document_without_metadata(payload: Payload, key: &str) -> Map<String, Value> {
        document(&message(payload), &topic(), key, false).unwrap()
    }

    #[test]
    fn given_non_object_raw_and_text_payloads_when_converted_should_use_upstream_shapes() {
        let id = generated_id(&topic(), &message(Payload::Text(String::new())));
        let wrapped = document_without_metadata(Payload::Json(json!([1, 2])), "iggy_id");
        assert_eq!(
            Value::Object(wrapped),
            json!({"value": [1, 2], "iggy_id": id})
        );
        let raw = document_without_metadata(Payload::Raw(Bytes::from_static(b"\x00")), "k");
        assert_eq!(raw["data"], "AA==");
        assert_eq!(raw["data_encoding"], "base64");
        let text = document_without_metadata(Payload::Text("hi".into()), "k");
        assert_eq!(text["text"], "hi");
        assert_eq!(text["data_type"], "text");
    }

    #[test]
    fn given_an_id_meilisearch_refuses_when_converted_should_say_why() {
        for bad in [
            json!("a b"),
            json!(""),
            json!(1.5),
            json!({"x": 1}),
            json!("x".repeat(512)),
        ] {
            let error = document(
                &message(Payload::Json(json!({"k": bad}))),
                &topic(),
                "k",
                false,
            )
            .unwrap_err();
            assert!(error.starts_with("invalid_document_id"), "{error}");
        }
        assert!(
            document(
                &message(Payload::Json(json!({"k": -3}))),
                &topic(),
                "k",
                false
            )
            .is_ok()
        );
    }
}
