//! The message shapes that cross the boundaries between connectors, the engine
//! and the bus.

use std::fmt;

use bytes::Bytes;
use compact_str::CompactString;

/// A message payload as connectors and transforms see it.
///
/// Sources hand the engine a payload in whatever shape they naturally have; the
/// engine encodes it once with the stream's schema. On the sink side the engine
/// decodes the stored bytes once with the stream's schema.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Json(serde_json::Value),
    /// A JSON document kept as its serialized text (UTF-8), known to be valid
    /// JSON: written by a source that generates JSON itself (no `Value` built,
    /// nothing re-serialized), or checked by the engine for a sink that takes
    /// JSON as text ([`Sink::accepts_json_bytes`]). Transforms see it as
    /// `Json`: a transform chain parses it first.
    ///
    /// [`Sink::accepts_json_bytes`]: crate::connectors::Sink::accepts_json_bytes
    JsonBytes(Bytes),
    Text(String),
    Raw(Bytes),
}

impl Payload {
    /// The payload as bytes: JSON is serialized, text and raw are returned as is.
    pub fn to_bytes(&self) -> Bytes {
        match self {
            Payload::Json(value) => Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
            Payload::Text(text) => Bytes::copy_from_slice(text.as_bytes()),
            Payload::JsonBytes(bytes) | Payload::Raw(bytes) => bytes.clone(),
        }
    }

    /// A top-level string (non-empty) or number field of a JSON payload, as
    /// text: how sinks route a message by a field of it.
    pub fn text_field(&self, field: &str) -> Option<String> {
        let value = match self {
            Payload::Json(value) => value.get(field)?.clone(),
            Payload::JsonBytes(bytes) => serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()?
                .get(field)?
                .clone(),
            Payload::Text(_) | Payload::Raw(_) => return None,
        };
        match value {
            serde_json::Value::String(text) if !text.is_empty() => Some(text),
            serde_json::Value::Number(number) => Some(number.to_string()),
            _ => None,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Payload::Json(_) | Payload::JsonBytes(_) => "json",
            Payload::Text(_) => "text",
            Payload::Raw(_) => "raw",
        }
    }
}

/// A user header value. Iggy's integer and float kinds are widened to 64 bits;
/// 128-bit integers travel as raw bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    String(HeaderText),
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Raw(Bytes),
}

impl fmt::Display for HeaderValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderValue::String(value) => f.write_str(value),
            HeaderValue::Bool(value) => write!(f, "{value}"),
            HeaderValue::Int(value) => write!(f, "{value}"),
            HeaderValue::UInt(value) => write!(f, "{value}"),
            HeaderValue::Float(value) => write!(f, "{value}"),
            HeaderValue::Raw(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => f.write_str(text),
                Err(_) => write!(f, "{bytes:?}"),
            },
        }
    }
}

impl From<&str> for HeaderValue {
    fn from(value: &str) -> Self {
        HeaderValue::String(value.into())
    }
}

impl From<String> for HeaderValue {
    fn from(value: String) -> Self {
        HeaderValue::String(value.into())
    }
}

/// A header's name. Up to 24 bytes it is held inline: a record's usual
/// headers cost no allocation each (a Kafka record's six headers were half
/// the allocations of the source's conversion).
pub type HeaderName = CompactString;

/// A header's text value, inline up to 24 bytes like [`HeaderName`].
pub type HeaderText = CompactString;

/// User headers in insertion order. Keys are unique; an empty list does not allocate.
pub type Headers = Vec<(HeaderName, HeaderValue)>;

/// One record produced by a source, before transforms and encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRecord {
    /// The record's natural identity (a primary key, an idempotency key), used as
    /// the Iggy message id. `None` lets the bus mint one.
    pub id: Option<u128>,
    /// Which `[[streams]]` entry of the connector this record goes to (0 = first).
    pub stream_index: usize,
    pub headers: Headers,
    pub payload: Payload,
    /// The record's partition at its origin (a replicated Iggy message's
    /// partition): records with the same one go to the same target partition,
    /// in order. `None`: the target topic's balanced partitioning.
    pub partition: Option<u32>,
    /// When the record was produced at its origin, microseconds since the
    /// epoch; `None`: when it is sent.
    pub origin_timestamp: Option<u64>,
}

impl SourceRecord {
    pub fn new(payload: Payload) -> Self {
        Self {
            id: None,
            stream_index: 0,
            headers: Headers::new(),
            payload,
            partition: None,
            origin_timestamp: None,
        }
    }

    pub fn with_id(mut self, id: u128) -> Self {
        self.id = Some(id);
        self
    }
}

/// A message ready to be sent to the bus: encoded payload plus identity and headers.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingMessage {
    pub id: Option<u128>,
    pub headers: Headers,
    pub payload: Bytes,
    /// See [`SourceRecord::partition`].
    pub partition: Option<u32>,
    /// See [`SourceRecord::origin_timestamp`].
    pub origin_timestamp: Option<u64>,
}

impl OutgoingMessage {
    /// A message the bus partitions and timestamps itself.
    pub fn new(id: Option<u128>, headers: Headers, payload: Bytes) -> Self {
        Self {
            id,
            headers,
            payload,
            partition: None,
            origin_timestamp: None,
        }
    }
}

/// A message as the bus delivered it to a sink pipeline, still encoded.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumedMessage {
    pub id: u128,
    pub offset: u64,
    pub partition_id: u32,
    /// Server timestamp, microseconds since the epoch.
    pub timestamp: u64,
    /// Producer-side timestamp, microseconds since the epoch.
    pub origin_timestamp: u64,
    pub checksum: u64,
    pub headers: Headers,
    pub payload: Bytes,
}

/// A message handed to a sink: the consumed message with its payload decoded
/// and transformed.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkMessage {
    pub id: u128,
    pub offset: u64,
    pub partition_id: u32,
    pub timestamp: u64,
    pub origin_timestamp: u64,
    pub checksum: u64,
    pub headers: Headers,
    pub payload: Payload,
}

/// Where a batch of sink messages came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicRef {
    pub stream: String,
    pub topic: String,
}

impl TopicRef {
    /// `template` with `{stream}` and `{topic}` replaced by this stream and topic.
    pub fn fill(&self, template: &str) -> String {
        template
            .replace("{stream}", &self.stream)
            .replace("{topic}", &self.topic)
    }
}

impl fmt::Display for TopicRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.stream, self.topic)
    }
}
