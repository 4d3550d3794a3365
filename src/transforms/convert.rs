//! `avro_convert`, `proto_convert` and `flat_buffer_convert`: turn a payload
//! between JSON and Avro, Protocol Buffers or FlatBuffers bytes inside the
//! transform chain, for a stream whose own schema is `raw` (or `json`/`text`,
//! for the decoding direction on a sink).
//! Upstream's fields, every one optional here (`text` is JSON text on either
//! side, for every format):
//!
//! ```toml
//! [transforms.avro_convert]
//! enabled = true
//! source_format = "avro"          # or "json" to encode
//! target_format = "json"          # or "text" (JSON text), or "avro"
//! schema_path = "schemas/user.avsc"   # or schema_json = '{...}'
//! field_mappings = { user_id = "id" } # top-level keys renamed, JSON side
//! ```
//!
//! `proto_convert` takes `schema_path` (a `.proto` file, compiled at run time)
//! or `descriptor_set`, with `message_type` and `include_paths`.
//! `flat_buffer_convert` takes `schema_path` (a binary schema, `.bfbs`) and
//! `root_table_name` (the schema's `root_type` when unset).
//!
//! Decoding takes the bytes of a raw or text payload; encoding takes JSON (a
//! value or JSON text) and gives raw bytes. A payload that does not fit fails
//! the message, not the batch. `conversion_options`, `schema_registry_url` and
//! `preserve_unknown_fields` are accepted and have no effect.

use std::collections::HashMap;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use crate::codec::{Schema, SchemaName, SchemaOptions};
use crate::message::Payload;
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvertConfig {
    pub source_format: Option<String>,
    pub target_format: Option<String>,
    pub schema_path: Option<String>,
    pub schema_json: Option<String>,
    pub message_type: Option<String>,
    pub descriptor_set: Option<String>,
    pub root_table_name: Option<String>,
    #[serde(default)]
    pub include_paths: Vec<String>,
    #[serde(default)]
    pub field_mappings: HashMap<String, String>,
    // Accepted as upstream writes them; they have no effect here.
    #[serde(rename = "conversion_options")]
    pub _conversion_options: Option<serde_json::Map<String, Value>>,
    #[serde(rename = "schema_registry_url")]
    pub _schema_registry_url: Option<String>,
    #[serde(rename = "preserve_unknown_fields")]
    pub _preserve_unknown_fields: Option<bool>,
}

#[derive(Debug)]
pub struct Convert {
    kind: &'static str,
    codec: Schema,
    direction: Direction,
    field_mappings: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Bytes of the codec's schema into JSON (or JSON text).
    Decode { text: bool },
    /// JSON into bytes of the codec's schema.
    Encode,
}

impl Convert {
    /// `schema` is the format this transform converts from or to (`avro` or `proto`).
    pub(crate) fn build(
        kind: &'static str,
        schema: SchemaName,
        config: ConvertConfig,
    ) -> Result<Self, FieldError> {
        let format = |field: &str, value: Option<&str>, default: SchemaName| match value {
            None => Ok(default),
            Some(value) => value
                .parse::<SchemaName>()
                .map_err(|message| FieldError::new(field, message)),
        };
        let source = format("source_format", config.source_format.as_deref(), schema)?;
        let target = format(
            "target_format",
            config.target_format.as_deref(),
            SchemaName::Json,
        )?;
        let direction = match (source, target) {
            (source, SchemaName::Json | SchemaName::Text) if source == schema => {
                Direction::Decode {
                    text: target == SchemaName::Text,
                }
            }
            (SchemaName::Json | SchemaName::Text, target) if target == schema => Direction::Encode,
            (source, target) => {
                return Err(FieldError::new(
                    "target_format",
                    format!(
                        "{kind} converts {schema} to json or text, or json or text to {schema}; \
                         found {source} to {target}"
                    ),
                ));
            }
        };
        let options = match schema {
            SchemaName::Avro => SchemaOptions {
                avro_schema_json: config.schema_json,
                avro_schema_path: config.schema_path,
                ..SchemaOptions::default()
            },
            SchemaName::FlatBuffer => SchemaOptions {
                flatbuffer_schema_path: config.schema_path,
                flatbuffer_root_table_name: config.root_table_name,
                ..SchemaOptions::default()
            },
            _ => SchemaOptions {
                proto_schema_path: config.schema_path,
                proto_descriptor_set: config.descriptor_set,
                proto_message_type: config.message_type,
                proto_include_paths: config.include_paths,
                ..SchemaOptions::default()
            },
        };
        let codec = Schema::load(schema, &options).map_err(|error| {
            // The stream fields' names, without their `avro_`/`proto_`/`flatbuffer_` prefix.
            let field = error
                .field
                .strip_prefix("avro_")
                .or_else(|| error.field.strip_prefix("proto_"))
                .or_else(|| error.field.strip_prefix("flatbuffer_"))
                .unwrap_or("source_format");
            FieldError::new(field, error.message)
        })?;
        let mut field_mappings: Vec<_> = config.field_mappings.into_iter().collect();
        field_mappings.sort();
        Ok(Self {
            kind,
            codec,
            direction,
            field_mappings,
        })
    }

    fn fail(&self, message: impl Into<String>) -> TransformError {
        TransformError {
            transform: self.kind.to_owned(),
            message: message.into(),
        }
    }

    fn rename(&self, value: &mut Value) {
        if let Value::Object(map) = value {
            for (from, to) in &self.field_mappings {
                if let Some(field) = map.shift_remove(from) {
                    map.insert(to.clone(), field);
                }
            }
        }
    }
}

impl Transform for Convert {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        match self.direction {
            Direction::Decode { text } => {
                let bytes = match payload {
                    Payload::Raw(bytes) | Payload::JsonBytes(bytes) => bytes.clone(),
                    Payload::Text(text) => Bytes::from(text.clone().into_bytes()),
                    Payload::Json(_) => {
                        return Err(
                            self.fail(format!("expected {} bytes, found a JSON value", self.codec))
                        );
                    }
                };
                let Payload::Json(mut value) = self
                    .codec
                    .decode(bytes)
                    .map_err(|error| self.fail(error.to_string()))?
                else {
                    return Err(self.fail("the decoder gave no JSON"));
                };
                self.rename(&mut value);
                *payload = if text {
                    Payload::Text(value.to_string())
                } else {
                    Payload::Json(value)
                };
            }
            Direction::Encode => {
                let mut value = match payload {
                    Payload::Json(value) => std::mem::take(value),
                    Payload::Text(text) => serde_json::from_str(text)
                        .map_err(|error| self.fail(format!("payload is not JSON: {error}")))?,
                    Payload::JsonBytes(bytes) | Payload::Raw(bytes) => {
                        serde_json::from_slice(bytes)
                            .map_err(|error| self.fail(format!("payload is not JSON: {error}")))?
                    }
                };
                self.rename(&mut value);
                let bytes = self
                    .codec
                    .encode(&Payload::Json(value))
                    .map_err(|error| self.fail(error.to_string()))?;
                *payload = Payload::Raw(bytes);
            }
        }
        Ok(Verdict::Keep)
    }
}

#[cfg(all(test, feature = "schema-avro", feature = "schema-proto"))]
mod tests {
    use super::*;
    use crate::transforms::TransformChain;

    const USER: &str = r#"{"type":"record","name":"U","fields":[{"name":"id","type":"long"},{"name":"name","type":"string"}]}"#;

    fn chain(kind: &str, settings: Value) -> TransformChain {
        let mut settings = settings;
        settings["enabled"] = true.into();
        TransformChain::build(&[(kind.to_owned(), settings)]).unwrap()
    }

    #[test]
    fn given_avro_convert_both_ways_when_applied_should_round_trip_with_renamed_fields() {
        let encode = chain(
            "avro_convert",
            serde_json::json!({"source_format": "json", "target_format": "avro",
                "schema_json": USER, "field_mappings": {"user": "name"}}),
        );
        let decode = chain(
            "avro_convert",
            serde_json::json!({"schema_json": USER, "field_mappings": {"name": "user"}}),
        );
        let mut payload = Payload::Json(serde_json::json!({"id": 3, "user": "ann"}));
        encode.apply(&mut payload).unwrap();
        assert_eq!(payload, Payload::Raw(Bytes::from_static(b"\x06\x06ann")));
        decode.apply(&mut payload).unwrap();
        assert_eq!(
            payload,
            Payload::Json(serde_json::json!({"id": 3, "user": "ann"}))
        );
    }

    #[test]
    fn given_proto_convert_to_text_when_applied_should_give_json_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.proto");
        std::fs::write(&path, "syntax = \"proto3\";\nmessage M { string s = 1; }\n").unwrap();
        let decode = chain(
            "proto_convert",
            serde_json::json!({"source_format": "proto", "target_format": "text",
                "schema_path": path, "message_type": "M", "include_paths": ["."],
                "conversion_options": {"pretty_json": false}}),
        );
        let mut payload = Payload::Raw(Bytes::from_static(b"\x0a\x02hi"));
        decode.apply(&mut payload).unwrap();
        assert_eq!(payload, Payload::Text(r#"{"s":"hi"}"#.into()));
        let mut bad = Payload::Raw(Bytes::from_static(b"\x0a\x05hi"));
        assert!(decode.apply(&mut bad).is_err());
    }

    #[test]
    fn given_bad_convert_tables_when_built_should_name_the_field() {
        let cases = [
            ("avro_convert", serde_json::json!({}), "schema_json"),
            (
                "avro_convert",
                serde_json::json!({"schema_json": "{"}),
                "schema_json",
            ),
            (
                "avro_convert",
                serde_json::json!({"schema_json": USER, "target_format": "proto"}),
                "target_format",
            ),
            (
                "avro_convert",
                serde_json::json!({"schema_json": USER, "source_format": "yaml"}),
                "source_format",
            ),
            (
                "proto_convert",
                serde_json::json!({"schema_path": "/nonexistent.proto", "message_type": "M"}),
                "schema_path",
            ),
            ("flat_buffer_convert", serde_json::json!({}), "schema_path"),
        ];
        for (kind, mut settings, field) in cases {
            settings["enabled"] = true.into();
            let error = TransformChain::build(&[(kind.to_owned(), settings.clone())]).unwrap_err();
            assert_eq!(error.field, field, "{kind} {settings}: {error}");
        }
    }
}
