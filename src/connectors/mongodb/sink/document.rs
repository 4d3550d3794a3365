//! One message as upstream's MongoDB document: `_id` from the message
//! identity, the `iggy_*` metadata fields and `payload` in the chosen format.

use std::borrow::Cow;

use mongodb::bson::{self, Binary, Bson, DateTime, Document, spec::BinarySubtype};

use super::config::{MongoDbSinkConfig, PayloadFormat};
use crate::message::{Payload, SinkMessage, TopicRef};

/// What the document holds besides the payload.
#[derive(Debug, Clone)]
pub struct Layout {
    pub metadata: bool,
    pub checksum: bool,
    pub origin_timestamp: bool,
    pub format: PayloadFormat,
    /// The payload path whose value is the `_id` (upsert and replace).
    pub key_path: Option<Vec<String>>,
}

impl Layout {
    pub fn new(config: &MongoDbSinkConfig) -> Self {
        Self {
            metadata: config.include_metadata,
            checksum: config.include_checksum,
            origin_timestamp: config.include_origin_timestamp,
            format: config.payload_format,
            key_path: config
                .key_field
                .as_ref()
                .map(|field| field.split('.').map(str::to_owned).collect()),
        }
    }

    /// The message's document, its `_id` first; an error says why the
    /// message cannot be stored (a payload that does not fit the format, a
    /// missing key).
    pub fn document(&self, topic: &TopicRef, message: &SinkMessage) -> Result<Document, String> {
        let message_id = message_id(topic, message);
        let json = match (&self.key_path, self.format) {
            (Some(_), _) | (None, PayloadFormat::Json) => Some(json_of(&message.payload)?),
            _ => None,
        };
        let mut document = Document::new();
        match (&self.key_path, &json) {
            (Some(path), Some(json)) => {
                document.insert("_id", key_of(json, path)?);
                document.insert("iggy_message_id", message_id);
            }
            _ => {
                document.insert("_id", message_id);
            }
        }
        if self.metadata {
            match i64::try_from(message.offset) {
                Ok(offset) => document.insert("iggy_offset", offset),
                Err(_) => document.insert("iggy_offset_str", message.offset.to_string()),
            };
            document.insert("iggy_timestamp", date(message.timestamp));
            document.insert("iggy_stream", topic.stream.as_str());
            document.insert("iggy_topic", topic.topic.as_str());
            document.insert("iggy_partition_id", partition(message.partition_id));
        }
        if self.checksum {
            document.insert(
                "iggy_checksum",
                i64::try_from(message.checksum)
                    .map(Bson::Int64)
                    .unwrap_or_else(|_| Bson::String(message.checksum.to_string())),
            );
        }
        if self.origin_timestamp {
            document.insert("iggy_origin_timestamp", date(message.origin_timestamp));
        }
        let payload = match (self.format, json) {
            (PayloadFormat::Json, Some(json)) => bson::to_bson(json.as_ref())
                .map_err(|error| format!("the JSON payload has no BSON form: {error}"))?,
            (PayloadFormat::String, _) => Bson::String(text_of(&message.payload)?),
            _ => Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: message.payload.to_bytes().to_vec(),
            }),
        };
        document.insert("payload", payload);
        Ok(document)
    }
}

/// Upstream's document id: `{stream}:{topic}:{partition}:{message_id}`.
pub fn message_id(topic: &TopicRef, message: &SinkMessage) -> String {
    format!(
        "{}:{}:{}:{}",
        topic.stream, topic.topic, message.partition_id, message.id
    )
}

/// The payload as JSON: a JSON payload as is, text or bytes parsed.
fn json_of(payload: &Payload) -> Result<Cow<'_, serde_json::Value>, String> {
    let bytes = match payload {
        Payload::Json(value) => return Ok(Cow::Borrowed(value)),
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => bytes.as_ref(),
        Payload::Text(text) => text.as_bytes(),
    };
    serde_json::from_slice(bytes)
        .map(Cow::Owned)
        .map_err(|error| format!("the payload is not JSON: {error}"))
}

fn text_of(payload: &Payload) -> Result<String, String> {
    match payload {
        Payload::Text(text) => Ok(text.clone()),
        Payload::Json(value) => Ok(value.to_string()),
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => String::from_utf8(bytes.to_vec())
            .map_err(|error| format!("the payload is not UTF-8: {error}")),
    }
}

/// The value at `path` as an `_id`: a string, number, boolean or object
/// (MongoDB refuses arrays as `_id`).
fn key_of(json: &serde_json::Value, path: &[String]) -> Result<Bson, String> {
    let mut value = json;
    for part in path {
        value = value
            .get(part)
            .ok_or_else(|| format!("the payload has no key field `{}`", path.join(".")))?;
    }
    match value {
        serde_json::Value::Null | serde_json::Value::Array(_) => Err(format!(
            "the key field `{}` is {}; expected a string, number, boolean or object",
            path.join("."),
            if value.is_null() { "null" } else { "an array" }
        )),
        other => bson::to_bson(other)
            .map_err(|error| format!("the key field `{}`: {error}", path.join("."))),
    }
}

/// Iggy's microseconds as a BSON date (milliseconds).
fn date(micros: u64) -> DateTime {
    DateTime::from_millis(i64::try_from(micros / 1000).unwrap_or(i64::MAX))
}

fn partition(partition_id: u32) -> Bson {
    i32::try_from(partition_id)
        .map(Bson::Int32)
        .unwrap_or_else(|_| Bson::Int64(i64::from(partition_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(format: PayloadFormat, key: Option<&str>) -> Layout {
        Layout {
            metadata: true,
            checksum: true,
            origin_timestamp: true,
            format,
            key_path: key.map(|key| key.split('.').map(str::to_owned).collect()),
        }
    }

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 42,
            offset: 7,
            partition_id: 3,
            timestamp: 1_700_000_000_123_456,
            origin_timestamp: 1_700_000_000_000_000,
            checksum: u64::MAX,
            headers: Vec::new(),
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
    fn given_a_json_message_when_built_should_have_upstreams_shape() {
        let document = layout(PayloadFormat::Json, None)
            .document(
                &topic(),
                &message(Payload::Json(serde_json::json!({"a": 1}))),
            )
            .unwrap();
        assert_eq!(document.get_str("_id").unwrap(), "s:t:3:42");
        assert_eq!(document.get_i64("iggy_offset").unwrap(), 7);
        assert_eq!(document.get_i32("iggy_partition_id").unwrap(), 3);
        assert_eq!(
            document
                .get_datetime("iggy_timestamp")
                .unwrap()
                .timestamp_millis(),
            1_700_000_000_123
        );
        assert_eq!(
            document.get_str("iggy_checksum").unwrap(),
            u64::MAX.to_string()
        );
        assert_eq!(
            document
                .get_document("payload")
                .unwrap()
                .get_i64("a")
                .unwrap(),
            1
        );
    }

    #[test]
    fn given_payloads_that_do_not_fit_when_built_should_say_why() {
        let raw = message(Payload::Raw(bytes::Bytes::from_static(b"\xff\x00")));
        let json = layout(PayloadFormat::Json, None).document(&topic(), &raw);
        assert!(json.unwrap_err().contains("not JSON"));
        let text = layout(PayloadFormat::String, None).document(&topic(), &raw);
        assert!(text.unwrap_err().contains("not UTF-8"));
        let binary = layout(PayloadFormat::Binary, None)
            .document(&topic(), &raw)
            .unwrap();
        assert_eq!(binary.get_binary_generic("payload").unwrap(), b"\xff\x00");
    }

    #[test]
    fn given_a_key_field_when_built_should_use_it_as_id_or_refuse_without_it() {
        let keyed = layout(PayloadFormat::Binary, Some("user.id"));
        let document = keyed
            .document(
                &topic(),
                &message(Payload::Json(serde_json::json!({"user": {"id": "u1"}}))),
            )
            .unwrap();
        assert_eq!(document.get_str("_id").unwrap(), "u1");
        assert_eq!(document.get_str("iggy_message_id").unwrap(), "s:t:3:42");
        for payload in [
            serde_json::json!({"user": {}}),
            serde_json::json!({"user": {"id": [1]}}),
        ] {
            let error = keyed
                .document(&topic(), &message(Payload::Json(payload)))
                .unwrap_err();
            assert!(error.contains("user.id"), "{error}");
        }
    }
}
