//! A message as upstream's SurrealDB record: the deterministic id, the
//! `iggy_*` fields the `include_*` flags ask for, `payload` and
//! `payload_encoding`. Built as JSON text for the request's variables, a
//! JSON payload's stored bytes copied as they are.

use std::fmt::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::config::{PayloadFormat, SurrealdbSinkConfig};
use crate::message::{HeaderValue, Payload, SinkMessage, TopicRef};

/// Upstream's record id key: `s{hex stream}_t{hex topic}_p{partition}_o{offset}_m{id as 32 hex}`.
pub fn record_id(topic: &TopicRef, message: &SinkMessage) -> String {
    let mut id = String::with_capacity(2 * (topic.stream.len() + topic.topic.len()) + 64);
    id.push('s');
    push_hex(&mut id, topic.stream.as_bytes());
    id.push_str("_t");
    push_hex(&mut id, topic.topic.as_bytes());
    let _ = write!(
        id,
        "_p{}_o{}_m{:032x}",
        message.partition_id, message.offset, message.id
    );
    id
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
}

/// The record of `message` as a JSON object's text, or why its payload does
/// not fit `payload_format`.
pub fn record_json(
    config: &SurrealdbSinkConfig,
    topic: &TopicRef,
    message: &SinkMessage,
) -> Result<Vec<u8>, String> {
    let mut record = Map::new();
    record.insert("id".into(), Value::String(record_id(topic, message)));
    record.insert("iggy_message_id".into(), json!(message.id.to_string()));
    if config.include_metadata {
        record.insert("iggy_stream".into(), json!(topic.stream));
        record.insert("iggy_topic".into(), json!(topic.topic));
        record.insert(
            "iggy_partition_id".into(),
            json!(message.partition_id.to_string()),
        );
        record.insert("iggy_offset".into(), json!(message.offset.to_string()));
        record.insert(
            "iggy_timestamp".into(),
            json!(message.timestamp.to_string()),
        );
        record.insert("iggy_schema".into(), json!(schema(&message.payload)));
    }
    if config.include_checksum {
        record.insert("iggy_checksum".into(), json!(message.checksum.to_string()));
    }
    if config.include_origin_timestamp {
        record.insert(
            "iggy_origin_timestamp".into(),
            json!(message.origin_timestamp.to_string()),
        );
    }
    if config.include_headers && !message.headers.is_empty() {
        let mut headers: Vec<_> = message.headers.iter().collect();
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        let headers: Map<String, Value> = headers
            .into_iter()
            .map(|(key, value)| (key.to_string(), header_json(value)))
            .collect();
        record.insert("iggy_headers".into(), Value::Object(headers));
    }
    let (payload, encoding) = payload(config.payload_format, &message.payload)?;
    record.insert("payload_encoding".into(), json!(encoding));
    let mut text = serde_json::to_vec(&record).map_err(|error| error.to_string())?;
    // `record` is never empty: replace its closing brace with the payload.
    text.pop();
    text.extend_from_slice(b",\"payload\":");
    match payload {
        PayloadJson::Value(value) => {
            serde_json::to_writer(&mut text, &value).map_err(|error| error.to_string())?
        }
        PayloadJson::Text(bytes) => text.extend_from_slice(bytes),
    }
    text.push(b'}');
    Ok(text)
}

/// Upstream's `iggy_schema`: what the payload was decoded as.
fn schema(payload: &Payload) -> &'static str {
    match payload {
        Payload::Json(_) | Payload::JsonBytes(_) => "json",
        Payload::Text(_) => "text",
        Payload::Raw(_) => "raw",
    }
}

fn header_json(value: &HeaderValue) -> Value {
    match value {
        HeaderValue::Raw(bytes) => json!({
            "data": STANDARD.encode(bytes),
            "iggy_header_encoding": "base64",
        }),
        other => Value::String(other.to_string()),
    }
}

enum PayloadJson<'a> {
    Value(Value),
    /// Valid JSON text, copied as it is.
    Text(&'a [u8]),
}

fn payload(
    format: PayloadFormat,
    payload: &Payload,
) -> Result<(PayloadJson<'_>, &'static str), String> {
    let base64 = |bytes: &[u8]| (PayloadJson::Value(json!(STANDARD.encode(bytes))), "base64");
    Ok(match (format, payload) {
        (PayloadFormat::Auto | PayloadFormat::Json, Payload::Json(value)) => {
            (PayloadJson::Value(value.clone()), "json")
        }
        (PayloadFormat::Auto | PayloadFormat::Json, Payload::JsonBytes(bytes)) => {
            (PayloadJson::Text(bytes), "json")
        }
        (PayloadFormat::Auto, Payload::Text(text)) => (PayloadJson::Value(json!(text)), "text"),
        (PayloadFormat::Auto, Payload::Raw(bytes)) => base64(bytes),
        (PayloadFormat::Json, Payload::Raw(bytes)) => {
            serde_json::from_slice::<Value>(bytes).map_err(|error| {
                format!("payload_format = \"json\": the payload is not JSON: {error}")
            })?;
            (PayloadJson::Text(bytes), "json")
        }
        (PayloadFormat::Json, Payload::Text(text)) => {
            let value = serde_json::from_str(text).map_err(|error| {
                format!("payload_format = \"json\": the payload is not JSON: {error}")
            })?;
            (PayloadJson::Value(value), "json")
        }
        (PayloadFormat::Text, Payload::Text(text)) => (PayloadJson::Value(json!(text)), "text"),
        (PayloadFormat::Text, Payload::Json(value)) => {
            (PayloadJson::Value(json!(value.to_string())), "text")
        }
        (PayloadFormat::Text, Payload::JsonBytes(bytes) | Payload::Raw(bytes)) => {
            let text = std::str::from_utf8(bytes).map_err(|error| {
                format!("payload_format = \"text\": the payload is not UTF-8: {error}")
            })?;
            (PayloadJson::Value(json!(text)), "text")
        }
        (PayloadFormat::Base64, Payload::Json(value)) => base64(value.to_string().as_bytes()),
        (PayloadFormat::Base64, Payload::Text(text)) => base64(text.as_bytes()),
        (PayloadFormat::Base64, Payload::JsonBytes(bytes) | Payload::Raw(bytes)) => base64(bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::parse_plugin_config;
    use bytes::Bytes;

    fn config(extra: Value) -> SurrealdbSinkConfig {
        let mut value = json!({
            "endpoint": "h:1", "namespace": "n", "database": "d", "table": "t",
            "auth_scope": "none",
        });
        value
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        parse_plugin_config(&value).unwrap()
    }

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 0xabc,
            offset: 7,
            partition_id: 2,
            timestamp: 10,
            origin_timestamp: 9,
            checksum: 5,
            headers: vec![
                ("z".into(), HeaderValue::UInt(1)),
                (
                    "a".into(),
                    HeaderValue::Raw(Bytes::from_static(b"\x00\x01")),
                ),
            ],
            payload,
        }
    }

    fn topic() -> TopicRef {
        TopicRef {
            stream: "st".into(),
            topic: "tp".into(),
        }
    }

    fn record(config: &SurrealdbSinkConfig, payload: Payload) -> Result<Value, String> {
        record_json(config, &topic(), &message(payload))
            .map(|text| serde_json::from_slice(&text).unwrap())
    }

    #[test]
    fn given_a_message_when_its_id_is_built_should_follow_upstreams_layout() {
        assert_eq!(
            record_id(&topic(), &message(Payload::Text(String::new()))),
            "s7374_t7470_p2_o7_m00000000000000000000000000000abc"
        );
    }

    #[test]
    fn given_every_flag_when_built_should_hold_upstreams_fields_as_strings() {
        let value = record(
            &config(json!({})),
            Payload::JsonBytes(Bytes::from_static(b"{\"k\": [1, 2]}")),
        )
        .unwrap();
        assert_eq!(value["payload"], json!({"k": [1, 2]}));
        assert_eq!(value["payload_encoding"], "json");
        assert_eq!(value["iggy_message_id"], "2748");
        assert_eq!(value["iggy_partition_id"], "2");
        assert_eq!(value["iggy_offset"], "7");
        assert_eq!(value["iggy_schema"], "json");
        assert_eq!(value["iggy_checksum"], "5");
        assert_eq!(value["iggy_origin_timestamp"], "9");
        assert_eq!(
            value["iggy_headers"],
            json!({"a": {"data": "AAE=", "iggy_header_encoding": "base64"}, "z": "1"})
        );
        let keys: Vec<&String> = value["iggy_headers"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["a", "z"], "sorted like upstream");
    }

    #[test]
    fn given_the_flags_off_when_built_should_hold_only_id_message_id_and_payload() {
        let config = config(json!({
            "include_metadata": false, "include_headers": false,
            "include_checksum": false, "include_origin_timestamp": false,
        }));
        let value = record(&config, Payload::Text("hi".into())).unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["id", "iggy_message_id", "payload_encoding", "payload"]
        );
        assert_eq!(value["payload"], "hi");
    }

    #[test]
    fn given_each_format_when_built_should_store_or_refuse_like_upstream() {
        let raw = || Payload::Raw(Bytes::from_static(b"\xff\x00"));
        let auto = config(json!({}));
        assert_eq!(record(&auto, raw()).unwrap()["payload"], "/wA=");
        assert_eq!(record(&auto, raw()).unwrap()["payload_encoding"], "base64");
        let json_format = config(json!({"payload_format": "json"}));
        assert!(
            record(&json_format, raw())
                .unwrap_err()
                .contains("not JSON")
        );
        assert_eq!(
            record(&json_format, Payload::Raw(Bytes::from_static(b"[1]"))).unwrap()["payload"],
            json!([1])
        );
        let text = config(json!({"payload_format": "text"}));
        assert!(record(&text, raw()).unwrap_err().contains("not UTF-8"));
        assert_eq!(
            record(&text, Payload::Json(json!({"a": 1}))).unwrap()["payload"],
            "{\"a\":1}"
        );
        let base64 = config(json!({"payload_format": "base64"}));
        let value = record(&base64, Payload::Text("hi".into())).unwrap();
        assert_eq!(value["payload"], "aGk=");
        assert_eq!(value["payload_encoding"], "base64");
    }
}
