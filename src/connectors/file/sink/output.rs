//! What the sink writes: the path template, and a batch's messages encoded
//! and grouped by the file they go to.

use std::path::PathBuf;

use serde_json::Value;

use super::config::Format;
use crate::connectors::PluginConfigError;
use crate::connectors::kit::json_line::{header_json, payload_json};
use crate::message::{Payload, SinkMessage, TopicRef};

/// How each message is encoded.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub format: Format,
    pub include_metadata: bool,
    pub include_headers: bool,
}

/// Consecutive messages of one partition bound for one file, encoded (not
/// yet compressed).
#[derive(Debug)]
pub struct Chunk {
    /// Which stream, topic and partition: each has one current file.
    pub slot: String,
    /// The path with `{offset}` still in it: a new base means a new file.
    pub base: String,
    pub first_offset: u64,
    pub bytes: Vec<u8>,
}

impl Chunk {
    /// The file's path when the file starts with this chunk.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(self.base.replace(OFFSET, &self.first_offset.to_string()))
    }
}

const OFFSET: &str = "{offset}";
const PLACEHOLDERS: [&str; 6] = [
    "{stream}",
    "{topic}",
    "{partition}",
    "{date}",
    "{hour}",
    OFFSET,
];

/// The `path` option, checked.
#[derive(Debug, Clone)]
pub struct Template(String);

impl Template {
    pub fn parse(text: &str) -> Result<Self, PluginConfigError> {
        if text.trim().is_empty() || text.ends_with('/') {
            return Err(PluginConfigError::new("path", "expected a file path"));
        }
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                return Err(PluginConfigError::new("path", "unclosed `{`"));
            };
            let placeholder = &rest[open..open + close + 1];
            if !PLACEHOLDERS.contains(&placeholder) {
                return Err(PluginConfigError::new(
                    "path",
                    format!("unknown placeholder {placeholder}; expected one of {PLACEHOLDERS:?}"),
                ));
            }
            rest = &rest[open + close + 1..];
        }
        Ok(Self(text.to_owned()))
    }

    pub fn has_offset(&self) -> bool {
        self.0.contains(OFFSET)
    }

    /// The directory part before the first placeholder: created at open.
    pub fn fixed_directory(&self) -> PathBuf {
        let fixed = &self.0[..self.0.find('{').unwrap_or(self.0.len())];
        match fixed.rfind('/') {
            Some(0) => PathBuf::from("/"),
            Some(end) => PathBuf::from(&fixed[..end]),
            None => PathBuf::from("."),
        }
    }

    /// The path of `message`, with `{offset}` left in.
    fn base(&self, topic: &TopicRef, message: &SinkMessage) -> String {
        let mut base = self
            .0
            .replace("{stream}", &segment(&topic.stream))
            .replace("{topic}", &segment(&topic.topic))
            .replace("{partition}", &message.partition_id.to_string());
        if base.contains("{date}") || base.contains("{hour}") {
            let at = chrono::DateTime::from_timestamp_micros(
                i64::try_from(message.timestamp).unwrap_or(i64::MAX),
            )
            .unwrap_or_default();
            base = base
                .replace("{date}", &at.format("%Y-%m-%d").to_string())
                .replace("{hour}", &at.format("%H").to_string());
        }
        base
    }
}

/// The batch's messages encoded, in runs of one partition and one file.
pub fn chunks(
    template: &Template,
    layout: &Layout,
    topic: &TopicRef,
    messages: &[SinkMessage],
) -> Vec<Chunk> {
    let mut chunks: Vec<Chunk> = Vec::new();
    for message in messages {
        let slot = format!(
            "{}\0{}\0{}",
            topic.stream, topic.topic, message.partition_id
        );
        let base = template.base(topic, message);
        let same = chunks
            .last()
            .is_some_and(|chunk| chunk.slot == slot && chunk.base == base);
        if !same {
            chunks.push(Chunk {
                slot,
                base,
                first_offset: message.offset,
                bytes: Vec::new(),
            });
        }
        if let Some(chunk) = chunks.last_mut() {
            encode(layout, topic, message, &mut chunk.bytes);
        }
    }
    chunks
}

/// One message in the output format and its newline, appended to `out`.
fn encode(layout: &Layout, topic: &TopicRef, message: &SinkMessage, out: &mut Vec<u8>) {
    if layout.format == Format::Raw {
        match &message.payload {
            Payload::Json(value) => {
                let _ = serde_json::to_writer(&mut *out, value);
            }
            Payload::Text(text) => out.extend_from_slice(text.as_bytes()),
            Payload::JsonBytes(bytes) | Payload::Raw(bytes) => out.extend_from_slice(bytes),
        }
        out.push(b'\n');
        return;
    }
    let mut line = serde_json::Map::new();
    if layout.include_metadata {
        line.insert("offset".into(), message.offset.into());
        line.insert("timestamp".into(), rfc3339(message.timestamp).into());
        line.insert("stream".into(), topic.stream.clone().into());
        line.insert("topic".into(), topic.topic.clone().into());
        line.insert("partition_id".into(), message.partition_id.into());
    }
    if layout.include_headers && !message.headers.is_empty() {
        let headers: serde_json::Map<String, Value> = message
            .headers
            .iter()
            .map(|(key, value)| (key.to_string(), header_json(value)))
            .collect();
        line.insert("headers".into(), Value::Object(headers));
    }
    // Everything but the payload through serde_json; the payload's stored
    // text is copied unless it spans lines.
    let text = serde_json::to_vec(&line).unwrap_or_default();
    out.extend_from_slice(&text[..text.len() - 1]);
    if !line.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(b"\"payload\":");
    payload_json(&message.payload, out);
    out.extend_from_slice(b"}\n");
}

/// Microseconds since the epoch as an RFC 3339 UTC time, to the microsecond.
fn rfc3339(micros: u64) -> String {
    chrono::DateTime::from_timestamp_micros(i64::try_from(micros).unwrap_or(i64::MAX))
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// A stream or topic name as one path segment: `[A-Za-z0-9._-]` kept, `_`
/// for the rest (no `/`, no `..` climbing out of the directory).
fn segment(name: &str) -> String {
    let kept: String = name
        .chars()
        .map(|character| {
            if character.is_ascii_alphanumeric() || matches!(character, '.' | '_' | '-') {
                character
            } else {
                '_'
            }
        })
        .collect();
    if kept.chars().all(|character| character == '.') {
        kept.replace('.', "_")
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Headers;

    fn message(offset: u64, partition_id: u32, timestamp: u64, payload: Payload) -> SinkMessage {
        SinkMessage {
            id: u128::from(offset),
            offset,
            partition_id,
            timestamp,
            origin_timestamp: timestamp,
            checksum: 0,
            headers: Headers::new(),
            payload,
        }
    }

    fn topic() -> TopicRef {
        TopicRef {
            stream: "shop/../x".into(),
            topic: "orders".into(),
        }
    }

    const DAY: u64 = 86_400_000_000;

    #[test]
    fn given_a_template_when_messages_cross_a_day_and_a_partition_should_split_into_runs() {
        let template =
            Template::parse("/out/{stream}/{topic}-{partition}-{date}-{offset}.log").unwrap();
        let layout = Layout {
            format: Format::Raw,
            include_metadata: false,
            include_headers: false,
        };
        let batch = [
            message(5, 1, DAY - 1, Payload::Text("a".into())),
            message(6, 1, DAY, Payload::Text("b".into())),
            message(7, 1, DAY + 1, Payload::Text("c".into())),
            message(3, 2, DAY + 1, Payload::Text("d".into())),
        ];
        let chunks = chunks(&template, &layout, &topic(), &batch);
        let paths: Vec<_> = chunks.iter().map(Chunk::path).collect();
        assert_eq!(
            paths,
            [
                PathBuf::from("/out/shop_.._x/orders-1-1970-01-01-5.log"),
                PathBuf::from("/out/shop_.._x/orders-1-1970-01-02-6.log"),
                PathBuf::from("/out/shop_.._x/orders-2-1970-01-02-3.log"),
            ]
        );
        assert_eq!(chunks[1].bytes, b"b\nc\n");
        assert_eq!(template.fixed_directory(), PathBuf::from("/out"));
    }

    #[test]
    fn given_json_lines_when_encoded_should_hold_metadata_and_the_payload_on_one_line() {
        let layout = Layout {
            format: Format::JsonLines,
            include_metadata: true,
            include_headers: true,
        };
        let mut out = Vec::new();
        let json = Payload::JsonBytes(bytes::Bytes::from_static(b"{\"a\":\n1}"));
        encode(&layout, &topic(), &message(9, 3, 0, json), &mut out);
        let bare = Layout {
            include_metadata: false,
            ..layout
        };
        encode(
            &bare,
            &topic(),
            &message(10, 3, 0, Payload::Raw(vec![0xff].into())),
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["payload"], serde_json::json!({"a": 1}));
        assert_eq!(lines[0]["offset"], 9);
        assert_eq!(lines[0]["partition_id"], 3);
        assert_eq!(lines[1], serde_json::json!({"payload": "/w=="}));
    }

    #[test]
    fn given_an_unknown_placeholder_when_parsed_should_name_the_field() {
        let error = Template::parse("/out/{month}.log").unwrap_err();
        assert_eq!(error.field, "path");
        assert!(error.message.contains("{month}"), "{error}");
    }
}
