//! What a VRL program runs on: the payload as `.`, the message's metadata
//! as `%`.
//!
//! | `%` field | value |
//! | --- | --- |
//! | `headers` | object of the user headers (strings, integers, floats, booleans; raw bytes as bytes); writable |
//! | `key` | source: `null`, writable (a string: messages with one key go to one partition) |
//! | `id` | the message id as a decimal string (`null` on a source until the bus mints one) |
//! | `offset` | sink: the message's offset; source: `null` |
//! | `timestamp`, `origin_timestamp` | timestamps (server's and producer's; `null` when unknown) |
//! | `stream`, `topic`, `partition` | where the message goes (source) or came from (sink); `stream` and `topic` are always text |

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

use vrl::value::kind::{Collection, Field};
use vrl::value::{KeyString, Kind, ObjectMap, Value};

use crate::message::{HeaderValue, Headers, Payload};
use crate::transforms::MessageMeta;

/// `%` fields a program may only read.
pub(crate) const READ_ONLY_METADATA: &[&str] = &[
    "id",
    "offset",
    "timestamp",
    "origin_timestamp",
    "stream",
    "topic",
    "partition",
];

/// The type of `%` the compiler checks programs against: `%stream + "/" +
/// %topic` needs no error handling, `%offset + 1` does (it may be `null`).
pub(crate) fn metadata_kind() -> Kind {
    let fields: BTreeMap<Field, Kind> = [
        ("headers", Kind::object(Collection::any())),
        ("key", Kind::bytes().or_null()),
        ("id", Kind::bytes().or_null()),
        ("offset", Kind::integer().or_bytes().or_null()),
        ("timestamp", Kind::timestamp().or_null()),
        ("origin_timestamp", Kind::timestamp().or_null()),
        ("stream", Kind::bytes()),
        ("topic", Kind::bytes()),
        ("partition", Kind::integer().or_null()),
    ]
    .into_iter()
    .map(|(name, kind)| (Field::from(name), kind))
    .collect();
    Kind::object(fields)
}

/// The shape a payload had before the program, kept when the program leaves
/// its result in that shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    Json,
    Text,
    Raw,
}

/// The payload as a VRL value, and its shape.
pub(crate) fn payload_value(payload: &Payload) -> Result<(Value, Shape), String> {
    Ok(match payload {
        Payload::Json(json) => (Value::from(json), Shape::Json),
        Payload::JsonBytes(bytes) => (
            serde_json::from_slice::<Value>(bytes)
                .map_err(|error| format!("payload is not valid JSON: {error}"))?,
            Shape::Json,
        ),
        Payload::Text(text) => (Value::from(text.as_str()), Shape::Text),
        Payload::Raw(bytes) => (Value::Bytes(bytes.clone()), Shape::Raw),
    })
}

/// The program's `.` back as a payload: text stays text and bytes stay raw
/// when the program left a string; anything else is JSON.
pub(crate) fn into_payload(value: Value, shape: Shape) -> Result<Payload, String> {
    match (shape, value.as_bytes()) {
        (Shape::Raw, Some(bytes)) => Ok(Payload::Raw(bytes.clone())),
        (Shape::Text, Some(bytes)) => Ok(match String::from_utf8(bytes.to_vec()) {
            Ok(text) => Payload::Text(text),
            Err(_) => Payload::Raw(bytes.clone()),
        }),
        _ => value
            .try_into()
            .map(Payload::Json)
            .map_err(|error| format!("the program's result is not JSON: {error}")),
    }
}

/// `%` for one message.
pub(crate) fn metadata(meta: &MessageMeta<'_>) -> Value {
    let mut map = ObjectMap::new();
    let mut put = |key: &str, value: Value| {
        map.insert(KeyString::from(key), value);
    };
    put("headers", headers_value(meta.headers));
    put("key", meta.key.as_deref().map_or(Value::Null, Value::from));
    put(
        "id",
        meta.id
            .map_or(Value::Null, |id| Value::from(id.to_string())),
    );
    put("offset", meta.offset.map_or(Value::Null, integer));
    put("timestamp", meta.timestamp.map_or(Value::Null, timestamp));
    put(
        "origin_timestamp",
        meta.origin_timestamp.map_or(Value::Null, timestamp),
    );
    // Always text (empty when not known), as `metadata_kind` says.
    put(
        "stream",
        Value::from(meta.topic.map_or("", |topic| topic.stream.as_str())),
    );
    put(
        "topic",
        Value::from(meta.topic.map_or("", |topic| topic.topic.as_str())),
    );
    put("partition", meta.partition.map_or(Value::Null, Value::from));
    Value::Object(map)
}

/// Reads back what the program may change in `%`: the headers and the key.
/// Nothing is changed when either is invalid.
pub(crate) fn write_back(metadata: Value, meta: &mut MessageMeta<'_>) -> Result<(), String> {
    let Value::Object(mut map) = metadata else {
        return Err("`%` must stay an object".into());
    };
    let headers = match map.remove("headers") {
        None | Some(Value::Null) => Headers::new(),
        Some(Value::Object(headers)) => from_headers_value(headers)?,
        Some(other) => {
            return Err(format!(
                "`%headers` must be an object, found {}",
                other.kind()
            ));
        }
    };
    let key =
        match map.remove("key") {
            None | Some(Value::Null) => None,
            Some(value) => Some(scalar_text(&value).ok_or_else(|| {
                format!("`%key` must be a string or number, found {}", value.kind())
            })?),
        };
    *meta.headers = headers;
    meta.key = key;
    Ok(())
}

fn headers_value(headers: &Headers) -> Value {
    let map: ObjectMap = headers
        .iter()
        .map(|(name, value)| {
            let value = match value {
                HeaderValue::String(text) => Value::from(text.as_str()),
                HeaderValue::Bool(flag) => Value::from(*flag),
                HeaderValue::Int(number) => Value::from(*number),
                HeaderValue::UInt(number) => integer(*number),
                HeaderValue::Float(number) => Value::from_f64_or_zero(*number),
                HeaderValue::Raw(bytes) => Value::Bytes(bytes.clone()),
            };
            (KeyString::from(name.as_str()), value)
        })
        .collect();
    Value::Object(map)
}

fn from_headers_value(map: ObjectMap) -> Result<Headers, String> {
    let mut headers = Headers::with_capacity(map.len());
    for (name, value) in map {
        let value = match value {
            Value::Null => continue,
            Value::String(text) => HeaderValue::String(text.to_string()),
            Value::Bytes(bytes) => match std::str::from_utf8(&bytes) {
                Ok(text) => HeaderValue::String(text.to_owned()),
                Err(_) => HeaderValue::Raw(bytes),
            },
            Value::Boolean(flag) => HeaderValue::Bool(flag),
            Value::Integer(number) => HeaderValue::Int(number),
            Value::Float(number) => HeaderValue::Float(number.into_inner()),
            Value::Timestamp(time) => HeaderValue::String(time.to_rfc3339()),
            other => {
                return Err(format!(
                    "header \"{name}\" must be a string, number or boolean, found {}",
                    other.kind()
                ));
            }
        };
        headers.push((name.into(), value));
    }
    Ok(headers)
}

/// A string or number as text.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(_) | Value::Bytes(_) => value.to_str_lossy().map(|text| text.into_owned()),
        Value::Integer(number) => Some(number.to_string()),
        Value::Float(number) => Some(number.to_string()),
        _ => None,
    }
}

/// An unsigned number as a VRL integer, or as text past `i64::MAX`.
fn integer(number: u64) -> Value {
    i64::try_from(number).map_or_else(|_| Value::from(number.to_string()), Value::from)
}

fn timestamp(micros: u64) -> Value {
    i64::try_from(micros)
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_micros)
        .map_or(Value::Null, Value::from)
}
