//! Turns a batch into request bodies: the metadata envelope, and one request
//! per message (`individual`, `raw`) or per batch (`ndjson`, `json_array`),
//! split only where a body would pass `max_payload_size_bytes`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use serde::Serialize;
use serde::ser::SerializeMap;

use super::config::BatchMode;
use crate::connectors::kit::batch::{Body, Framing, Limits, Push};
use crate::message::{HeaderValue, Headers, Payload, SinkMessage, TopicRef};

#[derive(Debug, Clone)]
pub struct BodyOptions {
    pub mode: BatchMode,
    pub include_metadata: bool,
    pub include_checksum: bool,
    pub include_origin_timestamp: bool,
    /// `None`: no limit.
    pub max_body_bytes: Option<usize>,
}

/// The next thing to do for a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Send this body; it carries the messages at `indexes` of the batch.
    Request { body: Bytes, indexes: Vec<usize> },
    /// The message at `index` alone is larger than the body limit.
    TooLarge { index: usize, size: usize },
}

/// Yields the parts for the messages of a batch, in order, building each
/// body only when asked for it.
pub struct Planner<'a> {
    options: &'a BodyOptions,
    topic: &'a TopicRef,
    messages: &'a [SinkMessage],
    pending: std::ops::Range<usize>,
    /// A message encoded for the previous body that did not fit in it.
    carry: Option<(usize, Vec<u8>)>,
}

impl<'a> Planner<'a> {
    pub fn new(options: &'a BodyOptions, topic: &'a TopicRef, messages: &'a [SinkMessage]) -> Self {
        Self {
            options,
            topic,
            messages,
            pending: 0..messages.len(),
            carry: None,
        }
    }

    fn encoded(&mut self) -> Option<(usize, Vec<u8>)> {
        if let Some(carried) = self.carry.take() {
            return Some(carried);
        }
        let index = self.pending.next()?;
        let mut item = Vec::with_capacity(256);
        encode(&self.messages[index], self.topic, self.options, &mut item);
        Some((index, item))
    }

    fn batched(&mut self, framing: Framing) -> Option<Part> {
        let limits = Limits {
            max_items: None,
            max_bytes: self.options.max_body_bytes,
        };
        let mut body = Body::new(framing, limits);
        let mut indexes = Vec::new();
        while let Some((index, item)) = self.encoded() {
            match body.push(&item) {
                Push::Added => indexes.push(index),
                Push::Full => {
                    self.carry = Some((index, item));
                    break;
                }
                Push::TooLarge { size } => return Some(Part::TooLarge { index, size }),
            }
        }
        if body.is_empty() {
            return None;
        }
        Some(Part::Request {
            body: Bytes::from(body.finish()),
            indexes,
        })
    }
}

impl Iterator for Planner<'_> {
    type Item = Part;

    fn next(&mut self) -> Option<Part> {
        let limit = self.options.max_body_bytes.unwrap_or(usize::MAX);
        match self.options.mode {
            BatchMode::Ndjson => self.batched(Framing::NDJSON),
            BatchMode::JsonArray => self.batched(Framing::JSON_ARRAY),
            BatchMode::Individual => {
                let (index, item) = self.encoded()?;
                Some(single(index, Bytes::from(item), limit))
            }
            BatchMode::Raw => {
                let index = self.pending.next()?;
                Some(single(
                    index,
                    self.messages[index].payload.to_bytes(),
                    limit,
                ))
            }
        }
    }
}

fn single(index: usize, body: Bytes, limit: usize) -> Part {
    if body.len() > limit {
        Part::TooLarge {
            index,
            size: body.len(),
        }
    } else {
        Part::Request {
            body,
            indexes: vec![index],
        }
    }
}

/// Writes one message as JSON: the `{metadata, payload}` envelope, or the
/// payload alone without metadata.
pub fn encode(message: &SinkMessage, topic: &TopicRef, options: &BodyOptions, out: &mut Vec<u8>) {
    if options.include_metadata {
        out.extend_from_slice(b"{\"metadata\":");
        write_json(
            out,
            &Metadata {
                iggy_id: uuid::Uuid::from_u128(message.id).hyphenated().to_string(),
                iggy_offset: message.offset,
                iggy_timestamp: message.timestamp,
                iggy_stream: &topic.stream,
                iggy_topic: &topic.topic,
                iggy_partition_id: message.partition_id,
                iggy_checksum: options.include_checksum.then_some(message.checksum),
                iggy_origin_timestamp: options
                    .include_origin_timestamp
                    .then_some(message.origin_timestamp),
                iggy_headers: (!message.headers.is_empty())
                    .then_some(JsonHeaders(&message.headers)),
            },
        );
        out.extend_from_slice(b",\"payload\":");
        write_payload(out, &message.payload);
        out.push(b'}');
    } else {
        write_payload(out, &message.payload);
    }
}

/// JSON payloads as they are, text as a JSON string, raw bytes as
/// `{"data": <base64>, "iggy_payload_encoding": "base64"}` (upstream's shape).
fn write_payload(out: &mut Vec<u8>, payload: &Payload) {
    match payload {
        Payload::Json(value) => write_json(out, value),
        // JSON text the engine checked (the sink accepts JSON as text): copied
        // as stored, numbers and key order included. Its line breaks can only
        // be white space between tokens (a JSON string cannot hold one), so
        // they become spaces and an ndjson body keeps one message per line.
        Payload::JsonBytes(text) => out.extend(text.iter().map(|&byte| match byte {
            b'\n' | b'\r' => b' ',
            byte => byte,
        })),
        Payload::Text(text) => write_json(out, text),
        Payload::Raw(bytes) => write_json(
            out,
            &RawPayload {
                data: STANDARD.encode(bytes),
                iggy_payload_encoding: "base64",
            },
        ),
    }
}

fn write_json(out: &mut Vec<u8>, value: &impl Serialize) {
    // Serializing these types into a Vec cannot fail (map keys are strings,
    // and serde_json writes non-finite floats as null).
    let _ = serde_json::to_writer(out, value);
}

#[derive(Serialize)]
struct Metadata<'a> {
    iggy_id: String,
    iggy_offset: u64,
    iggy_timestamp: u64,
    iggy_stream: &'a str,
    iggy_topic: &'a str,
    iggy_partition_id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    iggy_checksum: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iggy_origin_timestamp: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iggy_headers: Option<JsonHeaders<'a>>,
}

#[derive(Serialize)]
struct RawPayload {
    data: String,
    iggy_payload_encoding: &'static str,
}

struct JsonHeaders<'a>(&'a Headers);

impl Serialize for JsonHeaders<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            match value {
                HeaderValue::String(text) => map.serialize_entry(name, text)?,
                HeaderValue::Bool(flag) => map.serialize_entry(name, flag)?,
                HeaderValue::Int(number) => map.serialize_entry(name, number)?,
                HeaderValue::UInt(number) => map.serialize_entry(name, number)?,
                HeaderValue::Float(number) => map.serialize_entry(name, number)?,
                HeaderValue::Raw(bytes) => map.serialize_entry(name, &STANDARD.encode(bytes))?,
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn topic() -> TopicRef {
        TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        }
    }

    fn message(offset: u64, payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
            offset,
            partition_id: 1,
            timestamp: 10,
            origin_timestamp: 9,
            checksum: 7,
            headers: vec![("h".into(), HeaderValue::UInt(3))],
            payload,
        }
    }

    fn options(mode: BatchMode, max_body_bytes: Option<usize>) -> BodyOptions {
        BodyOptions {
            mode,
            include_metadata: false,
            include_checksum: false,
            include_origin_timestamp: false,
            max_body_bytes,
        }
    }

    fn parts(options: &BodyOptions, messages: &[SinkMessage]) -> Vec<Part> {
        let topic = topic();
        Planner::new(options, &topic, messages).collect()
    }

    fn body(part: &Part) -> &[u8] {
        match part {
            Part::Request { body, .. } => body,
            Part::TooLarge { .. } => panic!("expected a request, got {part:?}"),
        }
    }

    #[test]
    fn given_metadata_flags_when_encoded_should_match_upstream_envelope() {
        let mut out = Vec::new();
        let options = BodyOptions {
            include_metadata: true,
            include_checksum: true,
            include_origin_timestamp: true,
            ..options(BatchMode::Individual, None)
        };
        encode(
            &message(5, Payload::Json(json!({"a": 1}))),
            &topic(),
            &options,
            &mut out,
        );
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            value,
            json!({
                "metadata": {
                    "iggy_id": "01234567-89ab-cdef-0123-456789abcdef",
                    "iggy_offset": 5,
                    "iggy_timestamp": 10,
                    "iggy_stream": "s",
                    "iggy_topic": "t",
                    "iggy_partition_id": 1,
                    "iggy_checksum": 7,
                    "iggy_origin_timestamp": 9,
                    "iggy_headers": {"h": 3},
                },
                "payload": {"a": 1},
            })
        );
    }

    #[test]
    fn given_json_text_when_encoded_as_ndjson_should_keep_it_as_stored_on_one_line() {
        let stored = "{\"price\": 12.50,\n  \"tags\": [\"a\\nb\"],\r\n  \"z\": 1e3}";
        let messages = vec![
            message(0, Payload::JsonBytes(Bytes::from(stored))),
            message(1, Payload::JsonBytes(Bytes::from_static(b"[1,2]"))),
        ];
        let options = BodyOptions {
            include_metadata: true,
            ..options(BatchMode::Ndjson, None)
        };
        let parts = parts(&options, &messages);
        let lines: Vec<&[u8]> = body(&parts[0]).split(|&byte| byte == b'\n').collect();
        assert_eq!(lines.len(), 3, "two lines and the empty rest: {lines:?}");
        let first = std::str::from_utf8(lines[0]).unwrap();
        assert!(
            first.ends_with(
                ",\"payload\":{\"price\": 12.50,   \"tags\": [\"a\\nb\"],    \"z\": 1e3}}"
            ),
            "{first}"
        );
        let envelope: serde_json::Value = serde_json::from_str(first).unwrap();
        assert_eq!(envelope["metadata"]["iggy_offset"], 0);
        assert_eq!(envelope["payload"]["tags"], json!(["a\nb"]));
        let second: serde_json::Value = serde_json::from_slice(lines[1]).unwrap();
        assert_eq!(second["payload"], json!([1, 2]));
    }

    #[test]
    fn given_raw_payload_when_encoded_as_json_should_be_base64_marked() {
        let mut out = Vec::new();
        let raw = Payload::Raw(Bytes::from_static(b"\x00\x01"));
        encode(
            &message(0, raw),
            &topic(),
            &options(BatchMode::Individual, None),
            &mut out,
        );
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            value,
            json!({"data": "AAE=", "iggy_payload_encoding": "base64"})
        );
    }

    #[test]
    fn given_limit_when_planning_json_array_should_split_into_valid_arrays() {
        let messages: Vec<SinkMessage> = (0..5)
            .map(|offset| message(offset, Payload::Json(json!(offset))))
            .collect();
        // "[0,1]" is 5 bytes: at most two single-digit items per body.
        let parts = parts(&options(BatchMode::JsonArray, Some(5)), &messages);
        let bodies: Vec<&[u8]> = parts.iter().map(body).collect();
        assert_eq!(bodies, vec![&b"[0,1]"[..], b"[2,3]", b"[4]"]);
    }

    #[test]
    fn given_limit_when_planning_ndjson_should_split_on_lines() {
        let messages: Vec<SinkMessage> = (0..3)
            .map(|offset| message(offset, Payload::Json(json!(offset))))
            .collect();
        let parts = parts(&options(BatchMode::Ndjson, Some(4)), &messages);
        let bodies: Vec<&[u8]> = parts.iter().map(body).collect();
        assert_eq!(bodies, vec![&b"0\n1\n"[..], b"2\n"]);
    }

    #[test]
    fn given_one_oversized_message_when_planning_should_refuse_only_it() {
        let messages = vec![
            message(0, Payload::Json(json!(1))),
            message(1, Payload::Text("x".repeat(100))),
            message(2, Payload::Json(json!(2))),
        ];
        let parts = parts(&options(BatchMode::Ndjson, Some(50)), &messages);
        assert_eq!(parts.len(), 3);
        assert!(
            matches!(parts[1], Part::TooLarge { index: 1, .. }),
            "{parts:?}"
        );
        assert_eq!(body(&parts[2]), b"2\n");
    }

    #[test]
    fn given_raw_mode_when_planning_should_send_payload_bytes_one_per_request() {
        let messages = vec![
            message(0, Payload::Raw(Bytes::from_static(b"\x01\x02"))),
            message(1, Payload::Text("hi".into())),
        ];
        let parts = parts(&options(BatchMode::Raw, None), &messages);
        assert_eq!(body(&parts[0]), b"\x01\x02");
        assert_eq!(body(&parts[1]), b"hi");
    }
}
