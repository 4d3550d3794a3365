//! Transforms: per-message changes applied between decode and encode, in the
//! order they appear in the connector file.
//!
//! Each `[transforms.<type>]` table is parsed and checked once, when the
//! connector starts (and by `validate`); the built chain is shared read-only by
//! every message of the connector. Compiled patterns live in the transforms, so
//! the per-message path only reads them.
//!
//! The field transforms act on a top-level JSON object; text, raw and non-object
//! JSON payloads pass through them unchanged.
//!
//! A table is named after its type (`[transforms.add_fields]`), or has any name
//! and says its type (`[transforms.mask] type = "remap"`): so one type can run
//! several times, anywhere in the chain.

mod add_fields;
mod convert;
mod delete_fields;
mod field_value;
mod filter_fields;
mod filter_messages;
mod pattern;
mod unwrap_envelope;
mod update_fields;
#[cfg(feature = "vrl")]
mod vrl_lang;

use std::fmt;

use serde::de::DeserializeOwned;

use crate::codec::SchemaName;
use crate::message::{Headers, Payload, TopicRef};

pub use add_fields::AddFields;
pub use delete_fields::DeleteFields;
pub use filter_fields::FilterFields;
pub use filter_messages::FilterMessages;
pub use unwrap_envelope::UnwrapEnvelope;
pub use update_fields::UpdateFields;

/// A transform type whether or not this build has it: for `features.md`.
pub struct TransformInfo {
    /// As written in `[transforms.<type>]` or `type = "<type>"`.
    pub name: &'static str,
    /// The cargo feature the transform needs, if any.
    pub feature: Option<&'static str>,
    pub description: &'static str,
}

/// Every transform type there is, in the order of [`TRANSFORM_TYPES`].
pub const CATALOG: &[TransformInfo] = &[
    TransformInfo {
        name: "add_fields",
        feature: None,
        description: "writes static or computed values (uuid, time) into top-level fields",
    },
    TransformInfo {
        name: "delete_fields",
        feature: None,
        description: "removes top-level fields",
    },
    TransformInfo {
        name: "update_fields",
        feature: None,
        description: "sets top-level fields always, only when present or only when absent",
    },
    TransformInfo {
        name: "filter_fields",
        feature: None,
        description: "keeps or removes top-level fields by key and value patterns",
    },
    TransformInfo {
        name: "filter_messages",
        feature: None,
        description: "keeps or drops whole messages by key and value patterns (ours)",
    },
    TransformInfo {
        name: "unwrap_envelope",
        feature: None,
        description: "replaces a JSON object with one of its top-level fields (an envelope's data)",
    },
    TransformInfo {
        name: "avro_convert",
        feature: Some("schema-avro"),
        description: "converts the payload between JSON and Avro by a schema",
    },
    TransformInfo {
        name: "proto_convert",
        feature: Some("schema-proto"),
        description: "converts the payload between JSON and Protocol Buffers by a .proto file",
    },
    TransformInfo {
        name: "flat_buffer_convert",
        feature: Some("schema-flatbuffer"),
        description: "converts the payload between JSON and FlatBuffers by a schema",
    },
    TransformInfo {
        name: "remap",
        feature: Some("vrl"),
        description: "runs a Vector Remap Language program on the payload, key and headers",
    },
    TransformInfo {
        name: "filter",
        feature: Some("vrl"),
        description: "keeps the messages for which a VRL condition is true",
    },
];

/// Every transform type this build knows, as written in `[transforms.<type>]`.
pub const TRANSFORM_TYPES: &[&str] = &[
    "add_fields",
    "delete_fields",
    "update_fields",
    "filter_fields",
    "filter_messages",
    "unwrap_envelope",
    "avro_convert",
    "proto_convert",
    "flat_buffer_convert",
    #[cfg(feature = "vrl")]
    "remap",
    #[cfg(feature = "vrl")]
    "filter",
];

/// One transform. Built once per connector from its config and shared read-only
/// by every message of that connector.
pub trait Transform: Send + Sync + fmt::Debug {
    /// Changes the payload in place, or says the message should be dropped.
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError>;

    /// As [`Transform::apply`], for a transform that also reads or changes the
    /// message's metadata (headers, key, offsets).
    fn apply_with(
        &self,
        payload: &mut Payload,
        _meta: &mut MessageMeta<'_>,
    ) -> Result<Verdict, TransformError> {
        self.apply(payload)
    }
}

/// Which side of the bus a message is on when transformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A source's record, before it is encoded and sent.
    Source,
    /// A consumed message, decoded, before a sink writes it.
    Sink,
}

/// What a transform sees of a message besides its payload. `headers` and
/// (on a source) `key` may be changed; the rest is read-only.
#[derive(Debug)]
pub struct MessageMeta<'a> {
    pub side: Side,
    /// The source's target topic, or the topic a sink consumed from.
    pub topic: Option<&'a TopicRef>,
    pub partition: Option<u32>,
    pub id: Option<u128>,
    /// Sinks only.
    pub offset: Option<u64>,
    /// Server timestamp (sinks), microseconds since the epoch.
    pub timestamp: Option<u64>,
    /// Producer-side timestamp, microseconds since the epoch.
    pub origin_timestamp: Option<u64>,
    pub headers: &'a mut Headers,
    /// A key set by a source's transform: records with the same key go to
    /// the same partition.
    pub key: Option<String>,
}

impl<'a> MessageMeta<'a> {
    /// Metadata with nothing known but the headers.
    pub fn headers_only(side: Side, headers: &'a mut Headers) -> Self {
        Self {
            side,
            topic: None,
            partition: None,
            id: None,
            offset: None,
            timestamp: None,
            origin_timestamp: None,
            headers,
            key: None,
        }
    }

    /// The partition a source record goes to: its key's, when a transform set
    /// one (a stable hash, so one key always lands on one partition), else
    /// the record's own.
    pub fn partition_for_source(&self) -> Option<u32> {
        match &self.key {
            Some(key) => Some(crc32fast::hash(key.as_bytes())),
            None => self.partition,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transform {transform} failed: {message}")]
pub struct TransformError {
    pub transform: String,
    pub message: String,
}

/// An invalid `[transforms.<type>]` table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransformConfigError {
    /// The transform type, as written in the file.
    pub transform: String,
    /// The offending field inside the transform's table (empty for the table).
    pub field: String,
    pub message: String,
}

/// The configured transforms of one connector, in file order.
#[derive(Debug, Default)]
pub struct TransformChain {
    steps: Vec<Step>,
}

impl TransformChain {
    /// Builds the chain from `(name, table)` pairs in file order, the name
    /// being the type unless the table says its `type`. A table with
    /// `enabled = false` is skipped.
    pub fn build(configs: &[(String, serde_json::Value)]) -> Result<Self, TransformConfigError> {
        let mut steps = Vec::with_capacity(configs.len());
        for (name, config) in configs {
            if let Some((kind, transform)) = build_one(name, config)? {
                steps.push((kind, transform));
            }
        }
        Ok(Self { steps })
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// The types of the enabled transforms, in the order they run.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().map(|(kind, _)| kind.as_str())
    }

    /// Runs every transform in order; stops at the first that drops the message.
    pub fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        let mut headers = Headers::new();
        self.apply_with(
            payload,
            &mut MessageMeta::headers_only(Side::Sink, &mut headers),
        )
    }

    /// As [`TransformChain::apply`], with the message's metadata, which
    /// `remap` reads and may change.
    pub fn apply_with(
        &self,
        payload: &mut Payload,
        meta: &mut MessageMeta<'_>,
    ) -> Result<Verdict, TransformError> {
        if self.steps.is_empty() {
            return Ok(Verdict::Keep);
        }
        if let Payload::JsonBytes(bytes) = payload {
            // Transforms work on values: JSON kept as text is parsed once here.
            let value = serde_json::from_slice(bytes).map_err(|error| TransformError {
                transform: self.names().next().unwrap_or_default().to_owned(),
                message: format!("payload is not valid JSON: {error}"),
            })?;
            *payload = Payload::Json(value);
        }
        for (_, transform) in &self.steps {
            if transform.apply_with(payload, meta)? == Verdict::Drop {
                return Ok(Verdict::Drop);
            }
        }
        Ok(Verdict::Keep)
    }
}

/// A problem with one field of a transform's table, before the transform type
/// is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    /// Dotted path inside the table (`fields[0].value`); empty for the table.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A built transform and its type.
type Step = (String, Box<dyn Transform>);

/// One transform and its type; `None` when disabled.
fn build_one(name: &str, config: &serde_json::Value) -> Result<Option<Step>, TransformConfigError> {
    let error = |field: FieldError| TransformConfigError {
        transform: name.to_owned(),
        field: field.field,
        message: field.message,
    };
    let serde_json::Value::Object(table) = config else {
        return Err(error(FieldError::new("", "expected a table")));
    };
    let kind = match table.get("type") {
        None => name,
        Some(serde_json::Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(error(FieldError::new("type", "expected a string"))),
    };
    match table.get("enabled") {
        // Upstream requires `enabled`; a missing flag is read as enabled here.
        None | Some(serde_json::Value::Bool(true)) => {}
        Some(serde_json::Value::Bool(false)) => return Ok(None),
        Some(_) => return Err(error(FieldError::new("enabled", "expected a boolean"))),
    }
    let mut settings = table.clone();
    settings.shift_remove("enabled");
    settings.shift_remove("type");
    build_kind(kind, &serde_json::Value::Object(settings))
        .map(|transform| Some((kind.to_owned(), transform)))
        .map_err(error)
}

fn build_kind(kind: &str, settings: &serde_json::Value) -> Result<Box<dyn Transform>, FieldError> {
    match kind {
        "add_fields" => AddFields::build(parse(settings)?).map(boxed),
        "delete_fields" => DeleteFields::build(parse(settings)?).map(boxed),
        "update_fields" => UpdateFields::build(parse(settings)?).map(boxed),
        "filter_fields" => FilterFields::build(parse(settings)?).map(boxed),
        "filter_messages" => FilterMessages::build(parse(settings)?).map(boxed),
        "unwrap_envelope" => UnwrapEnvelope::build(parse(settings)?).map(boxed),
        "avro_convert" => {
            convert::Convert::build("avro_convert", SchemaName::Avro, parse(settings)?).map(boxed)
        }
        "proto_convert" => {
            convert::Convert::build("proto_convert", SchemaName::Proto, parse(settings)?).map(boxed)
        }
        // Upstream's serde name, and the spelling its docs also use.
        "flat_buffer_convert" | "flatbuffer_convert" => convert::Convert::build(
            "flat_buffer_convert",
            SchemaName::FlatBuffer,
            parse(settings)?,
        )
        .map(boxed),
        #[cfg(feature = "vrl")]
        "remap" => vrl_lang::Remap::build(parse(settings)?).map(boxed),
        #[cfg(feature = "vrl")]
        "filter" => vrl_lang::Filter::build(parse(settings)?).map(boxed),
        #[cfg(not(feature = "vrl"))]
        "remap" | "filter" => Err(FieldError::new(
            "",
            format!(
                "the {kind} transform needs the cargo feature `vrl`, not compiled into this binary"
            ),
        )),
        other => Err(FieldError::new(
            "",
            format!(
                "unknown transform type \"{other}\"; expected one of {} (or any table name with `type = \"<type>\"`)",
                TRANSFORM_TYPES.join(", ")
            ),
        )),
    }
}

fn boxed<T: Transform + 'static>(transform: T) -> Box<dyn Transform> {
    Box::new(transform)
}

/// Parses a transform's table (without `enabled`) into its typed config, naming
/// the field that does not fit.
fn parse<T: DeserializeOwned>(settings: &serde_json::Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(settings).map_err(|error| {
        let (field, message) = crate::connectors::serde_field(error);
        FieldError { field, message }
    })
}

#[cfg(test)]
mod tests;
