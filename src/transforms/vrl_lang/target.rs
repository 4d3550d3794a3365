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

use chrono::{DateTime, SecondsFormat, Utc};
use std::collections::BTreeMap;

use vrl::compiler::{SecretTarget, Target};
use vrl::path::{OwnedSegment, OwnedTargetPath, PathPrefix};
use vrl::value::kind::{Collection, Field};
use vrl::value::{KeyString, Kind, ObjectMap, Secrets, Value};

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
    /// A JSON object of which `.` holds only some fields (see [`View`]).
    Fields,
    Text,
    Raw,
}

/// Which part of a JSON object payload a program needs as `.`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum View {
    /// The whole payload.
    Whole,
    /// Only these top-level fields of an object: the program reads, writes
    /// and deletes nothing else of `.`, so the rest is never converted, and
    /// what it changed is written back into the payload field by field.
    Fields(Vec<KeyString>),
}

/// The payload as a VRL value (the part `view` asks for), and its shape:
/// [`Shape::Fields`] when it holds only the fields of the view.
pub(crate) fn payload_value(payload: &Payload, view: &View) -> Result<(Value, Shape), String> {
    Ok(match payload {
        Payload::Json(json) => match (view, json) {
            (View::Fields(fields), serde_json::Value::Object(object)) => (
                Value::Object(
                    fields
                        .iter()
                        .filter_map(|field| {
                            let value = object.get(field.as_str())?;
                            Some((field.clone(), json_to_vrl(value)))
                        })
                        .collect(),
                ),
                Shape::Fields,
            ),
            _ => (json_to_vrl(json), Shape::Json),
        },
        Payload::JsonBytes(bytes) => (
            serde_json::from_slice::<Value>(bytes)
                .map_err(|error| format!("payload is not valid JSON: {error}"))?,
            Shape::Json,
        ),
        Payload::Text(text) => (Value::from(text.as_str()), Shape::Text),
        Payload::Raw(bytes) => (Value::Bytes(bytes.clone()), Shape::Raw),
    })
}

/// A JSON value as a VRL value, read from the reference: strings and keys
/// are copied once, with no intermediate clone of the JSON tree. Numbers as
/// vrl's own `From<serde_json::Value>`: integers past `i64::MAX` become text.
pub(crate) fn json_to_vrl(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(flag) => Value::Boolean(*flag),
        serde_json::Value::Number(number) => match (number.as_i64(), number.as_f64()) {
            (Some(integer), _) => Value::Integer(integer),
            (None, Some(float)) if number.is_f64() => Value::from_f64_or_zero(float),
            _ => Value::from(number.to_string()),
        },
        serde_json::Value::String(text) => Value::from(text.as_str()),
        serde_json::Value::Array(items) => Value::Array(items.iter().map(json_to_vrl).collect()),
        serde_json::Value::Object(object) => Value::Object(
            object
                .iter()
                .map(|(key, value)| (KeyString::from(key.as_str()), json_to_vrl(value)))
                .collect(),
        ),
    }
}

/// The fields of a [`Shape::Fields`] payload as the program left them, as
/// JSON: `None` for a field it deleted (or never had).
pub(crate) type FieldChanges = Vec<(String, Option<serde_json::Value>)>;

/// What the program changed in the `fields` it was given of a JSON object
/// (those of `changed_fields`, or all when it changed `.` itself).
pub(crate) fn field_changes(
    value: Value,
    changed_fields: &[KeyString],
    fields: &[KeyString],
) -> Result<FieldChanges, String> {
    let Value::Object(mut object) = value else {
        return Err("the program replaced `.`, which it was given only in part".into());
    };
    let changed = if changed_fields.is_empty() {
        fields
    } else {
        changed_fields
    };
    let changes = changed
        .iter()
        .map(|field| {
            let value = object.remove(field.as_str()).map(vrl_to_json);
            (field.to_string(), value)
        })
        .collect();
    let unknown = |field: &KeyString| !fields.contains(field);
    if let Some(field) = object
        .keys()
        .find(|field| unknown(field))
        .or(changed.iter().find(|field| unknown(field)))
    {
        // `compile` lists every field the program writes; never drop one.
        return Err(format!(
            "the program wrote `.{field}`, which it was not given"
        ));
    }
    Ok(changes)
}

/// Writes [`field_changes`] into the payload's object, keeping the order of
/// its other fields; new fields go last.
pub(crate) fn apply_field_changes(payload: &mut Payload, changes: FieldChanges) {
    if let Payload::Json(serde_json::Value::Object(object)) = payload {
        for (field, value) in changes {
            match value {
                Some(value) => {
                    object.insert(field, value);
                }
                None => {
                    object.shift_remove(&field);
                }
            }
        }
    }
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
        (_, Some(bytes)) => match std::str::from_utf8(bytes) {
            Ok(text) => Ok(Payload::Json(serde_json::Value::from(text))),
            Err(error) => Err(format!("the program's result is not JSON: {error}")),
        },
        _ => Ok(Payload::Json(vrl_to_json(value))),
    }
}

/// A VRL value as JSON, moving what it can, without going through serde's
/// serializer. As vrl's `Serialize`: text that is not UTF-8 is read lossily,
/// timestamps are RFC 3339 text, regexes their pattern, and a float JSON
/// cannot hold (infinite) is `null`.
fn vrl_to_json(value: Value) -> serde_json::Value {
    match value {
        Value::Null => serde_json::Value::Null,
        Value::Boolean(flag) => serde_json::Value::Bool(flag),
        Value::Integer(number) => serde_json::Value::from(number),
        Value::Float(number) => serde_json::Value::from(number.into_inner()),
        Value::Bytes(_) | Value::String(_) => serde_json::Value::String(
            value
                .to_str_lossy()
                .map(std::borrow::Cow::into_owned)
                .unwrap_or_default(),
        ),
        Value::Timestamp(time) => {
            serde_json::Value::String(time.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        }
        Value::Regex(regex) => serde_json::Value::String(regex.as_str().to_owned()),
        Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(vrl_to_json).collect())
        }
        Value::Object(object) => serde_json::Value::Object(
            object
                .into_iter()
                .map(|(key, value)| (String::from(key), vrl_to_json(value)))
                .collect(),
        ),
    }
}

/// What a program runs on: `.` and `%`, noting whether the program changed
/// either, so an unchanged payload or metadata is not converted back.
#[derive(Debug)]
pub(crate) struct Tracked {
    pub value: Value,
    pub metadata: Value,
    secrets: Secrets,
    /// The program assigned to, deleted from or borrowed mutably a part of `.`.
    pub value_changed: bool,
    /// As `value_changed`, for `%`.
    pub metadata_changed: bool,
    /// The top-level fields of `.` the program changed (all may have, when
    /// `value_changed` with none listed: it changed `.` itself).
    pub changed_fields: Vec<KeyString>,
}

impl Tracked {
    pub(crate) fn new(value: Value, metadata: Value) -> Self {
        Self {
            value,
            metadata,
            secrets: Secrets::default(),
            value_changed: false,
            metadata_changed: false,
            changed_fields: Vec::new(),
        }
    }

    fn changing(&mut self, path: &OwnedTargetPath) -> &mut Value {
        match path.prefix {
            PathPrefix::Event => {
                match path.path.segments.first() {
                    Some(OwnedSegment::Field(field)) if self.value_changed => {
                        if !self.changed_fields.is_empty() && !self.changed_fields.contains(field) {
                            self.changed_fields.push(field.clone());
                        }
                    }
                    Some(OwnedSegment::Field(field)) => self.changed_fields.push(field.clone()),
                    _ => self.changed_fields.clear(),
                }
                self.value_changed = true;
                &mut self.value
            }
            PathPrefix::Metadata => {
                self.metadata_changed = true;
                &mut self.metadata
            }
        }
    }
}

impl Target for Tracked {
    fn target_insert(&mut self, path: &OwnedTargetPath, value: Value) -> Result<(), String> {
        self.changing(path).insert(&path.path, value);
        Ok(())
    }

    fn target_get(&self, path: &OwnedTargetPath) -> Result<Option<&Value>, String> {
        Ok(match path.prefix {
            PathPrefix::Event => self.value.get(&path.path),
            PathPrefix::Metadata => self.metadata.get(&path.path),
        })
    }

    fn target_get_mut(&mut self, path: &OwnedTargetPath) -> Result<Option<&mut Value>, String> {
        Ok(self.changing(path).get_mut(&path.path))
    }

    fn target_remove(
        &mut self,
        path: &OwnedTargetPath,
        compact: bool,
    ) -> Result<Option<Value>, String> {
        Ok(self.changing(path).remove(&path.path, compact))
    }
}

impl SecretTarget for Tracked {
    fn get_secret(&self, key: &str) -> Option<&str> {
        self.secrets.get_secret(key)
    }

    fn insert_secret(&mut self, key: &str, value: &str) {
        self.secrets.insert_secret(key, value);
    }

    fn remove_secret(&mut self, key: &str) {
        self.secrets.remove_secret(key);
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
            Value::String(text) => HeaderValue::String(text.to_string().into()),
            Value::Bytes(bytes) => match std::str::from_utf8(&bytes) {
                Ok(text) => HeaderValue::String(text.into()),
                Err(_) => HeaderValue::Raw(bytes),
            },
            Value::Boolean(flag) => HeaderValue::Bool(flag),
            Value::Integer(number) => HeaderValue::Int(number),
            Value::Float(number) => HeaderValue::Float(number.into_inner()),
            Value::Timestamp(time) => HeaderValue::String(time.to_rfc3339().into()),
            other => {
                return Err(format!(
                    "header \"{name}\" must be a string, number or boolean, found {}",
                    other.kind()
                ));
            }
        };
        headers.push((String::from(name).into(), value));
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
