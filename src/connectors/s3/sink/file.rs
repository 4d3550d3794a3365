//! One object in the making: messages of one partition encoded in the
//! output format, closed by the rotation rule, named from its offsets.

use std::io::Write;

use bytes::Bytes;
use serde_json::Value;

use super::config::{Compression, OutputFormat, Rotation};
use crate::connectors::kit::json_line::{header_json, payload_json};
use crate::message::{SinkMessage, TopicRef};

/// How messages are laid out in an object.
#[derive(Debug, Clone)]
pub struct Layout {
    pub format: OutputFormat,
    pub include_metadata: bool,
    pub include_headers: bool,
    pub rotation: Rotation,
}

/// A partition's messages not yet in a closed file.
#[derive(Debug, Default)]
pub struct OpenFile {
    body: Vec<u8>,
    count: u64,
    first_offset: u64,
    last_offset: u64,
    first_timestamp: u64,
}

/// A closed file, waiting for its upload.
#[derive(Debug, Clone)]
pub struct ClosedFile {
    pub partition_id: u32,
    pub first_offset: u64,
    pub last_offset: u64,
    pub first_timestamp: u64,
    pub count: u64,
    /// The finished, uncompressed content.
    pub body: Bytes,
}

impl OpenFile {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one message; `Some` with the closed file when the rotation
    /// rule says this message fills it. The rule counts messages, or bytes
    /// of encoded messages before compression, so where a file ends depends
    /// only on the messages from its first offset on: a replay from that
    /// offset closes the same file.
    pub fn push(
        &mut self,
        layout: &Layout,
        topic: &TopicRef,
        message: &SinkMessage,
    ) -> Option<ClosedFile> {
        if self.count == 0 {
            self.first_offset = message.offset;
            self.first_timestamp = message.timestamp;
            if layout.format == OutputFormat::JsonArray {
                self.body.push(b'[');
            }
        } else if layout.format == OutputFormat::JsonArray {
            self.body.push(b',');
        }
        encode(layout, topic, message, &mut self.body);
        if layout.format == OutputFormat::JsonLines {
            self.body.push(b'\n');
        }
        self.count += 1;
        self.last_offset = message.offset;
        let full = match layout.rotation {
            Rotation::Bytes(limit) => self.body.len() as u64 >= limit,
            Rotation::Messages(limit) => self.count >= limit,
        };
        full.then(|| self.close(layout, message.partition_id))
    }

    /// Closes the file (empty afterwards).
    pub fn close(&mut self, layout: &Layout, partition_id: u32) -> ClosedFile {
        let mut file = std::mem::take(self);
        if layout.format == OutputFormat::JsonArray {
            file.body.push(b']');
        }
        ClosedFile {
            partition_id,
            first_offset: file.first_offset,
            last_offset: file.last_offset,
            first_timestamp: file.first_timestamp,
            count: file.count,
            body: Bytes::from(file.body),
        }
    }
}

/// One message in the output format, appended to `out`.
fn encode(layout: &Layout, topic: &TopicRef, message: &SinkMessage, out: &mut Vec<u8>) {
    if layout.format == OutputFormat::Raw {
        out.extend_from_slice(&message.payload.to_bytes());
        return;
    }
    out.push(b'{');
    if layout.include_metadata {
        let fields = serde_json::json!({
            "offset": message.offset,
            "timestamp": rfc3339(message.timestamp),
            "stream": topic.stream,
            "topic": topic.topic,
            "partition_id": message.partition_id,
        });
        push_fields(out, &fields);
        out.push(b',');
    }
    if layout.include_headers && !message.headers.is_empty() {
        let headers: serde_json::Map<String, Value> = message
            .headers
            .iter()
            .map(|(key, value)| (key.to_string(), header_json(value)))
            .collect();
        out.extend_from_slice(b"\"headers\":");
        out.extend_from_slice(&serde_json::to_vec(&headers).unwrap_or_default());
        out.push(b',');
    }
    out.extend_from_slice(b"\"payload\":");
    payload_json(&message.payload, out);
    out.push(b'}');
}

/// An object's fields without its braces.
fn push_fields(out: &mut Vec<u8>, fields: &Value) {
    let text = serde_json::to_vec(fields).unwrap_or_default();
    if text.len() >= 2 {
        out.extend_from_slice(&text[1..text.len() - 1]);
    }
}

/// Microseconds since the epoch as an RFC 3339 UTC time, to the second.
fn rfc3339(micros: u64) -> String {
    chrono::DateTime::from_timestamp_micros(micros as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The object key of a closed file: `{prefix}/{template}/{partition:05}-
/// {first:020}-{last:020}.{ext}`, the same for the same messages.
pub fn object_key(
    prefix: Option<&str>,
    template: &str,
    topic: &TopicRef,
    file: &ClosedFile,
    format: OutputFormat,
    compression: Compression,
) -> String {
    let at =
        chrono::DateTime::from_timestamp_micros(file.first_timestamp as i64).unwrap_or_default();
    let directory = template
        .replace("{stream}", &key_segment(&topic.stream))
        .replace("{topic}", &key_segment(&topic.topic))
        .replace("{partition}", &file.partition_id.to_string())
        .replace("{date}", &at.format("%Y-%m-%d").to_string())
        .replace("{hour}", &at.format("%H").to_string())
        .replace("{timestamp}", &(file.first_timestamp / 1000).to_string());
    let name = format!(
        "{:05}-{:020}-{:020}.{}{}",
        file.partition_id,
        file.first_offset,
        file.last_offset,
        format.extension(),
        compression.extension()
    );
    [prefix.unwrap_or(""), directory.as_str(), name.as_str()]
        .iter()
        .map(|part| part.trim_matches('/'))
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// Keeps `[A-Za-z0-9._-]` of a stream or topic name, `_` for the rest.
fn key_segment(name: &str) -> String {
    name.chars()
        .map(|character| {
            if character.is_ascii_alphanumeric() || matches!(character, '.' | '_' | '-') {
                character
            } else {
                '_'
            }
        })
        .collect()
}

/// The object's bytes: the file's content, compressed as configured.
pub fn compress(body: &Bytes, compression: Compression) -> std::io::Result<Bytes> {
    match compression {
        Compression::None => Ok(body.clone()),
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(body)?;
            encoder.finish().map(Bytes::from)
        }
        Compression::Zstd => zstd::bulk::compress(body, 3).map(Bytes::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{HeaderValue, Payload};

    fn message(offset: u64, payload: Payload) -> SinkMessage {
        SinkMessage {
            id: u128::from(offset),
            offset,
            partition_id: 2,
            timestamp: 1_710_597_751_000_000,
            origin_timestamp: 0,
            checksum: 0,
            headers: vec![("kind".into(), HeaderValue::String("a".into()))],
            payload,
        }
    }

    fn topic() -> TopicRef {
        TopicRef {
            stream: "app logs".into(),
            topic: "api".into(),
        }
    }

    fn layout(format: OutputFormat, rotation: Rotation) -> Layout {
        Layout {
            format,
            include_metadata: true,
            include_headers: true,
            rotation,
        }
    }

    #[test]
    fn given_json_lines_when_the_count_is_reached_should_close_a_file_of_one_line_each() {
        let layout = layout(OutputFormat::JsonLines, Rotation::Messages(2));
        let mut file = OpenFile::default();
        let json = Payload::JsonBytes(Bytes::from_static(b"{\"a\":\n1}"));
        assert!(file.push(&layout, &topic(), &message(7, json)).is_none());
        let text = Payload::Text("hi".into());
        let closed = file.push(&layout, &topic(), &message(8, text)).unwrap();
        assert!(file.is_empty());
        assert_eq!(
            (closed.first_offset, closed.last_offset, closed.count),
            (7, 8, 2)
        );
        let lines: Vec<Value> = std::str::from_utf8(&closed.body)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["payload"], serde_json::json!({"a": 1}));
        assert_eq!(lines[0]["offset"], 7);
        assert_eq!(lines[0]["stream"], "app logs");
        assert_eq!(lines[0]["timestamp"], "2024-03-16T14:02:31Z");
        assert_eq!(lines[0]["headers"]["kind"], "a");
        assert_eq!(lines[1]["payload"], "hi");
    }

    #[test]
    fn given_a_size_rule_when_filled_should_close_at_the_same_message_whatever_the_batches() {
        let layout = layout(OutputFormat::JsonArray, Rotation::Bytes(300));
        let mut file = OpenFile::default();
        let mut closed = Vec::new();
        for offset in 0..20 {
            let payload = Payload::Json(serde_json::json!({"n": offset}));
            closed.extend(file.push(&layout, &topic(), &message(offset, payload)));
        }
        let bounds: Vec<(u64, u64)> = closed
            .iter()
            .map(|file| (file.first_offset, file.last_offset))
            .collect();
        assert!(bounds.len() >= 2, "{bounds:?}");
        for file in &closed {
            let array: Vec<Value> = serde_json::from_slice(&file.body).unwrap();
            assert_eq!(array.len() as u64, file.count);
            assert!(file.body.len() >= 300);
        }
        // Starting again at the second file's first offset closes the same file.
        let mut again = OpenFile::default();
        let start = closed[1].first_offset;
        let replayed = (start..20)
            .find_map(|offset| {
                let payload = Payload::Json(serde_json::json!({"n": offset}));
                again.push(&layout, &topic(), &message(offset, payload))
            })
            .unwrap();
        assert_eq!(replayed.body, closed[1].body);
    }

    #[test]
    fn given_a_template_when_named_should_hold_the_partition_offsets_and_first_time() {
        let layout = layout(OutputFormat::JsonLines, Rotation::Messages(1));
        let mut file = OpenFile::default();
        let closed = file
            .push(&layout, &topic(), &message(42, Payload::Text("x".into())))
            .unwrap();
        let key = object_key(
            Some("/iggy/raw/"),
            "{stream}/{topic}/{date}/{hour}/{partition}/{timestamp}",
            &topic(),
            &closed,
            OutputFormat::JsonLines,
            Compression::Gzip,
        );
        assert_eq!(
            key,
            "iggy/raw/app_logs/api/2024-03-16/14/2/1710597751000/00002-00000000000000000042-00000000000000000042.jsonl.gz"
        );
    }

    #[test]
    fn given_each_compression_when_compressed_should_decompress_to_the_body() {
        use std::io::Read;
        let body = Bytes::from_static(b"{\"n\":1}\n{\"n\":2}\n");
        let mut gunzipped = Vec::new();
        flate2::read::GzDecoder::new(&compress(&body, Compression::Gzip).unwrap()[..])
            .read_to_end(&mut gunzipped)
            .unwrap();
        assert_eq!(gunzipped, body);
        let unzstd = zstd::decode_all(&compress(&body, Compression::Zstd).unwrap()[..]).unwrap();
        assert_eq!(unzstd, body);
        assert_eq!(compress(&body, Compression::None).unwrap(), body);
    }
}
