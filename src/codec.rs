//! Stream schemas: how a payload becomes the bytes stored in Iggy (sources) and
//! how stored bytes become a payload again (sinks). Names follow upstream's
//! `schema` values. `avro` (feature `schema-avro`), `proto` (feature
//! `schema-proto`) and `flat_buffer` (feature `schema-flatbuffer`) carry the
//! schema their stream config names; see [`avro`], [`proto`] and [`flatbuffer`].
//!
//! JSON is parsed once into the `serde_json::Value` that transforms change in
//! place, and serialized once. serde_json stays over simd-json
//! (`benches/engine/codec.rs`, simd-json vs serde_json): producing our `Value`,
//! simd-json decoded a 300-byte record in 824 vs 569 ns and a database row in
//! 2.95 vs 2.69 µs, and was 3% faster only on a 5 KiB order (35.7 vs 36.9 µs);
//! it encoded the row in 640 vs 509 ns and the order in 7.4 vs 5.0 µs, and was
//! faster only on the string-heavy record (124 vs 179 ns).

#[cfg(feature = "schema-avro")]
pub mod avro;
#[cfg(feature = "schema-flatbuffer")]
pub mod flatbuffer;
#[cfg(feature = "schema-proto")]
pub mod proto;
#[cfg(feature = "schema-registry")]
pub mod registry;

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use crate::message::Payload;

/// Initial size of the buffer a JSON payload is serialized into.
const JSON_ENCODE_CAPACITY: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schema {
    Json,
    Raw,
    Text,
    #[cfg(feature = "schema-avro")]
    Avro(avro::AvroCodec),
    #[cfg(feature = "schema-proto")]
    Proto(proto::ProtoCodec),
    #[cfg(feature = "schema-flatbuffer")]
    FlatBuffer(flatbuffer::FlatBufferCodec),
}

/// A `schema` value as written in a config, before the schema it names is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaName {
    Json,
    Raw,
    Text,
    Avro,
    Proto,
    FlatBuffer,
}

/// The per-stream fields that say where an `avro` or `proto` schema is.
#[derive(Debug, Clone, Default)]
pub struct SchemaOptions {
    pub avro_schema_json: Option<String>,
    pub avro_schema_path: Option<String>,
    pub proto_schema_path: Option<String>,
    pub proto_descriptor_set: Option<String>,
    pub proto_message_type: Option<String>,
    pub proto_include_paths: Vec<String>,
    /// A FlatBuffers binary schema (`.bfbs`) and the table a buffer's root is.
    pub flatbuffer_schema_path: Option<String>,
    pub flatbuffer_root_table_name: Option<String>,
    /// A Confluent-compatible schema registry for an `avro` stream.
    pub schema_registry_url: Option<String>,
    /// The subject a source registers its schema under; `{topic}-value` when unset.
    pub schema_registry_subject: Option<String>,
    pub schema_registry_username: Option<String>,
    pub schema_registry_password: Option<secrecy::SecretString>,
    pub schema_registry_ca_file: Option<String>,
}

impl SchemaOptions {
    /// The stream config fields these options are read from.
    pub const FIELDS: [&'static str; 13] = [
        "avro_schema_json",
        "avro_schema_path",
        "proto_schema_path",
        "proto_descriptor_set",
        "proto_message_type",
        "proto_include_paths",
        "flatbuffer_schema_path",
        "flatbuffer_root_table_name",
        "schema_registry_url",
        "schema_registry_subject",
        "schema_registry_username",
        "schema_registry_password",
        "schema_registry_ca_file",
    ];
}

/// Why a stream's schema could not be loaded: the field to blame and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaConfigError {
    pub field: &'static str,
    pub message: String,
}

impl SchemaConfigError {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("payload is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("payload is not valid UTF-8 text")]
    InvalidText,
    #[error("payload does not match the Avro schema: {0}")]
    InvalidAvro(String),
    #[error("payload does not match the protobuf message type: {0}")]
    InvalidProto(String),
    #[error("payload does not match the FlatBuffers table: {0}")]
    InvalidFlatBuffer(String),
    #[error("{0}")]
    Registry(String),
}

impl Schema {
    /// Loads the schema a stream's `schema` value and options name.
    pub fn load(name: SchemaName, options: &SchemaOptions) -> Result<Self, SchemaConfigError> {
        match name {
            SchemaName::Json => Ok(Schema::Json),
            SchemaName::Raw => Ok(Schema::Raw),
            SchemaName::Text => Ok(Schema::Text),
            SchemaName::Avro => load_avro(options),
            SchemaName::Proto => load_proto(options),
            SchemaName::FlatBuffer => load_flatbuffer(options),
        }
    }

    /// Turns a payload into the bytes stored under this schema.
    ///
    /// `json` accepts JSON values, text (stored as a JSON string, as upstream does)
    /// and raw bytes that already hold valid JSON; `text` accepts text, JSON
    /// (serialized) and raw UTF-8; `raw` stores whatever bytes the payload has.
    pub fn encode(&self, payload: &Payload) -> Result<Bytes, CodecError> {
        match (self, payload) {
            (Schema::Json, Payload::Json(value)) => {
                // serde_json's `to_vec` starts at 128 bytes and regrows for a
                // typical record; starting at 512 measured ~25% faster on a
                // 300-byte record and no slower on a 5 KiB one (benches/engine/codec.rs).
                let mut buffer = Vec::with_capacity(JSON_ENCODE_CAPACITY);
                serde_json::to_writer(&mut buffer, value)
                    .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
                Ok(Bytes::from(buffer))
            }
            // Valid by construction (see `Payload::JsonBytes`): stored as is.
            (Schema::Json, Payload::JsonBytes(bytes)) => Ok(bytes.clone()),
            (Schema::Json, Payload::Text(text)) => serde_json::to_vec(text)
                .map(Bytes::from)
                .map_err(|error| CodecError::InvalidJson(error.to_string())),
            (Schema::Json, Payload::Raw(bytes)) => {
                serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
                    .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
                Ok(bytes.clone())
            }
            (Schema::Text, Payload::Raw(bytes)) => {
                std::str::from_utf8(bytes).map_err(|_| CodecError::InvalidText)?;
                Ok(bytes.clone())
            }
            (Schema::Text | Schema::Raw, payload) => Ok(payload.to_bytes()),
            #[cfg(feature = "schema-avro")]
            (Schema::Avro(codec), payload) => codec.encode(payload),
            #[cfg(feature = "schema-proto")]
            (Schema::Proto(codec), payload) => codec.encode(payload),
            #[cfg(feature = "schema-flatbuffer")]
            (Schema::FlatBuffer(codec), payload) => codec.encode(payload),
        }
    }

    /// Like [`decode`](Self::decode), but JSON stays the stored text
    /// ([`Payload::JsonBytes`]), checked without building a value: UTF-8 and
    /// one document of JSON's grammar (RFC 8259). For a sink that writes JSON
    /// as text when there are no transforms to run: 114 vs 601 ns on a
    /// 200-byte record, 0.37 vs 2.57 µs on a 19-field row (`cargo bench
    /// --bench codec`, `kept_as_text`), and a payload that is not JSON is
    /// still refused here, message by message.
    pub fn decode_keeping_json_text(&self, bytes: Bytes) -> Result<Payload, CodecError> {
        match self {
            Schema::Json => {
                let text = std::str::from_utf8(&bytes)
                    .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
                serde_json::from_str::<serde::de::IgnoredAny>(text)
                    .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
                Ok(Payload::JsonBytes(bytes))
            }
            _ => self.decode(bytes),
        }
    }

    /// Turns stored bytes into a payload, checking they fit the schema.
    pub fn decode(&self, bytes: Bytes) -> Result<Payload, CodecError> {
        match self {
            Schema::Json => serde_json::from_slice(&bytes)
                .map(Payload::Json)
                .map_err(|error| CodecError::InvalidJson(error.to_string())),
            Schema::Text => String::from_utf8(bytes.into())
                .map(Payload::Text)
                .map_err(|_| CodecError::InvalidText),
            Schema::Raw => Ok(Payload::Raw(bytes)),
            #[cfg(feature = "schema-avro")]
            Schema::Avro(codec) => codec.decode(&bytes),
            #[cfg(feature = "schema-proto")]
            Schema::Proto(codec) => codec.decode(&bytes),
            #[cfg(feature = "schema-flatbuffer")]
            Schema::FlatBuffer(codec) => codec.decode(&bytes),
        }
    }

    /// The config value naming this schema.
    pub fn name(&self) -> SchemaName {
        match self {
            Schema::Json => SchemaName::Json,
            Schema::Raw => SchemaName::Raw,
            Schema::Text => SchemaName::Text,
            #[cfg(feature = "schema-avro")]
            Schema::Avro(_) => SchemaName::Avro,
            #[cfg(feature = "schema-proto")]
            Schema::Proto(_) => SchemaName::Proto,
            #[cfg(feature = "schema-flatbuffer")]
            Schema::FlatBuffer(_) => SchemaName::FlatBuffer,
        }
    }
}

#[cfg(feature = "schema-avro")]
fn load_avro(options: &SchemaOptions) -> Result<Schema, SchemaConfigError> {
    // Upstream's rule: the inline schema wins over the file.
    let (field, text) = match (&options.avro_schema_json, &options.avro_schema_path) {
        (Some(json), _) => ("avro_schema_json", json.clone()),
        (None, Some(path)) => (
            "avro_schema_path",
            std::fs::read_to_string(path).map_err(|error| {
                SchemaConfigError::new("avro_schema_path", format!("cannot read {path}: {error}"))
            })?,
        ),
        (None, None) => {
            return Err(SchemaConfigError::new(
                "avro_schema_json",
                "schema \"avro\" needs its schema: set avro_schema_json (the schema as JSON \
                 text) or avro_schema_path (a file holding it)",
            ));
        }
    };
    let Some(url) = &options.schema_registry_url else {
        return avro::AvroCodec::parse(&text)
            .map(Schema::Avro)
            .map_err(|error| {
                SchemaConfigError::new(field, format!("not a valid Avro schema: {error}"))
            });
    };
    load_registry_avro(&text, field, url, options)
}

#[cfg(all(feature = "schema-avro", feature = "schema-registry"))]
fn load_registry_avro(
    text: &str,
    field: &'static str,
    url: &str,
    options: &SchemaOptions,
) -> Result<Schema, SchemaConfigError> {
    AvroSchemaCheck::check(text, field)?;
    let registry = registry::RegistryOptions {
        url: url.to_owned(),
        subject: options.schema_registry_subject.clone().unwrap_or_default(),
        username: options.schema_registry_username.clone(),
        password: options.schema_registry_password.clone(),
        ca_file: options.schema_registry_ca_file.clone(),
    };
    avro::AvroCodec::with_registry(text, registry)
        .map(Schema::Avro)
        .map_err(|error| SchemaConfigError::new("schema_registry_url", error))
}

#[cfg(all(feature = "schema-avro", not(feature = "schema-registry")))]
fn load_registry_avro(
    _: &str,
    _: &'static str,
    _: &str,
    _: &SchemaOptions,
) -> Result<Schema, SchemaConfigError> {
    Err(SchemaConfigError::new(
        "schema_registry_url",
        "the schema registry is not in this build of iggy-connect; build it with the \
         schema-registry feature (included in full)",
    ))
}

/// Blames the schema field, not the registry, for a schema that does not parse.
#[cfg(all(feature = "schema-avro", feature = "schema-registry"))]
struct AvroSchemaCheck;

#[cfg(all(feature = "schema-avro", feature = "schema-registry"))]
impl AvroSchemaCheck {
    fn check(text: &str, field: &'static str) -> Result<(), SchemaConfigError> {
        apache_avro::Schema::parse_str(text)
            .map(drop)
            .map_err(|error| {
                SchemaConfigError::new(field, format!("not a valid Avro schema: {error}"))
            })
    }
}

#[cfg(not(feature = "schema-avro"))]
fn load_avro(_: &SchemaOptions) -> Result<Schema, SchemaConfigError> {
    Err(not_built("avro", "schema-avro"))
}

#[cfg(feature = "schema-proto")]
fn load_proto(options: &SchemaOptions) -> Result<Schema, SchemaConfigError> {
    use std::path::PathBuf;
    let source = match (&options.proto_schema_path, &options.proto_descriptor_set) {
        (Some(path), None) => proto::ProtoSource::SchemaFile {
            path: PathBuf::from(path),
            include_paths: options
                .proto_include_paths
                .iter()
                .map(PathBuf::from)
                .collect(),
        },
        (None, Some(path)) => proto::ProtoSource::DescriptorSet(PathBuf::from(path)),
        (Some(_), Some(_)) => {
            return Err(SchemaConfigError::new(
                "proto_descriptor_set",
                "set either proto_schema_path or proto_descriptor_set, not both",
            ));
        }
        (None, None) => {
            return Err(SchemaConfigError::new(
                "proto_schema_path",
                "schema \"proto\" needs its message type: set proto_schema_path (a .proto \
                 file) or proto_descriptor_set (a descriptor set file), and proto_message_type",
            ));
        }
    };
    let field = match source {
        proto::ProtoSource::SchemaFile { .. } => "proto_schema_path",
        proto::ProtoSource::DescriptorSet(_) => "proto_descriptor_set",
    };
    let Some(message_type) = &options.proto_message_type else {
        return Err(SchemaConfigError::new(
            "proto_message_type",
            "missing required field for schema \"proto\", expected the full name of a \
             message type, such as \"shop.v1.Order\"",
        ));
    };
    proto::ProtoCodec::load(source, message_type)
        .map(Schema::Proto)
        .map_err(|message| {
            let field = if message.contains("is not defined") {
                "proto_message_type"
            } else {
                field
            };
            SchemaConfigError::new(field, message)
        })
}

#[cfg(not(feature = "schema-proto"))]
fn load_proto(_: &SchemaOptions) -> Result<Schema, SchemaConfigError> {
    Err(not_built("proto", "schema-proto"))
}

#[cfg(feature = "schema-flatbuffer")]
fn load_flatbuffer(options: &SchemaOptions) -> Result<Schema, SchemaConfigError> {
    let Some(path) = &options.flatbuffer_schema_path else {
        return Err(SchemaConfigError::new(
            "flatbuffer_schema_path",
            "schema \"flat_buffer\" needs its table type: set flatbuffer_schema_path (a binary \
             schema, written by `flatc -b --schema FILE.fbs`) and, when the buffers' root is \
             not the schema's root_type, flatbuffer_root_table_name",
        ));
    };
    let root_table = options.flatbuffer_root_table_name.as_deref();
    flatbuffer::FlatBufferCodec::load(std::path::Path::new(path), root_table)
        .map(Schema::FlatBuffer)
        .map_err(|message| {
            let field = if message.contains("is not defined") {
                "flatbuffer_root_table_name"
            } else {
                "flatbuffer_schema_path"
            };
            SchemaConfigError::new(field, message)
        })
}

#[cfg(not(feature = "schema-flatbuffer"))]
fn load_flatbuffer(_: &SchemaOptions) -> Result<Schema, SchemaConfigError> {
    Err(not_built("flat_buffer", "schema-flatbuffer"))
}

#[cfg(not(all(
    feature = "schema-avro",
    feature = "schema-proto",
    feature = "schema-flatbuffer"
)))]
fn not_built(schema: &str, feature: &str) -> SchemaConfigError {
    SchemaConfigError::new(
        "schema",
        format!(
            "schema \"{schema}\" is not in this build of iggy-connect; build it with the \
             {feature} feature (included in full)"
        ),
    )
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.name().fmt(f)
    }
}

impl fmt::Display for SchemaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SchemaName::Json => "json",
            SchemaName::Raw => "raw",
            SchemaName::Text => "text",
            SchemaName::Avro => "avro",
            SchemaName::Proto => "proto",
            SchemaName::FlatBuffer => "flat_buffer",
        })
    }
}

impl FromStr for SchemaName {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "json" => Ok(SchemaName::Json),
            "raw" => Ok(SchemaName::Raw),
            "text" => Ok(SchemaName::Text),
            "avro" => Ok(SchemaName::Avro),
            "proto" => Ok(SchemaName::Proto),
            // Upstream's serde name, and the spelling its docs also use.
            "flat_buffer" | "flatbuffer" => Ok(SchemaName::FlatBuffer),
            other => Err(format!(
                "expected one of json, raw, text, avro, proto, flat_buffer; found \"{other}\""
            )),
        }
    }
}

/// A schema that needs nothing but its name (`json`, `raw`, `text`), as the
/// command line's `--schema` takes it.
impl FromStr for Schema {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Schema::load(value.parse()?, &SchemaOptions::default()).map_err(|error| error.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_json_value_when_encoded_and_decoded_should_round_trip() {
        let value = serde_json::json!({"id": 1, "name": "x"});
        let bytes = Schema::Json.encode(&Payload::Json(value.clone())).unwrap();
        assert_eq!(Schema::Json.decode(bytes).unwrap(), Payload::Json(value));
    }

    #[test]
    fn given_invalid_bytes_when_decoded_as_json_or_text_should_fail() {
        assert!(Schema::Json.decode(Bytes::from_static(b"{nope")).is_err());
        assert!(
            Schema::Text
                .decode(Bytes::from_static(&[0xff, 0xfe]))
                .is_err()
        );
        assert!(Schema::Raw.decode(Bytes::from_static(&[0xff])).is_ok());
    }

    #[test]
    fn given_raw_bytes_when_encoded_as_json_should_require_valid_json() {
        assert!(
            Schema::Json
                .encode(&Payload::Raw(Bytes::from_static(b"[1,2]")))
                .is_ok()
        );
        assert!(
            Schema::Json
                .encode(&Payload::Raw(Bytes::from_static(b"[1,")))
                .is_err()
        );
    }

    #[test]
    fn given_text_when_encoded_as_json_should_become_a_json_string() {
        let bytes = Schema::Json.encode(&Payload::Text("hi".into())).unwrap();
        assert_eq!(&bytes[..], b"\"hi\"");
    }

    #[test]
    fn given_each_schema_and_payload_when_encoded_should_store_the_expected_bytes() {
        let json = Payload::Json(serde_json::json!({"a": 1}));
        let text = Payload::Text("héllo".into());
        let raw = Payload::Raw(Bytes::from_static(b"\x00\xff"));
        let cases: [(Schema, &Payload, Option<&[u8]>); 9] = [
            (Schema::Json, &json, Some(br#"{"a":1}"#)),
            (Schema::Json, &text, Some("\"héllo\"".as_bytes())),
            (Schema::Json, &raw, None),
            (Schema::Text, &json, Some(br#"{"a":1}"#)),
            (Schema::Text, &text, Some("héllo".as_bytes())),
            (Schema::Text, &raw, None),
            (Schema::Raw, &json, Some(br#"{"a":1}"#)),
            (Schema::Raw, &text, Some("héllo".as_bytes())),
            (Schema::Raw, &raw, Some(b"\x00\xff")),
        ];
        for (schema, payload, expected) in cases {
            let encoded = schema.encode(payload).ok();
            assert_eq!(encoded.as_deref(), expected, "{schema} {payload:?}");
        }
    }

    #[test]
    fn given_stored_bytes_when_decoded_should_give_the_schema_payload_kind() {
        let bytes = Bytes::from_static(br#"{"a":1}"#);
        assert_eq!(
            Schema::Json.decode(bytes.clone()).unwrap(),
            Payload::Json(serde_json::json!({"a": 1}))
        );
        assert_eq!(
            Schema::Text.decode(bytes.clone()).unwrap(),
            Payload::Text(r#"{"a":1}"#.into())
        );
        assert_eq!(
            Schema::Raw.decode(bytes.clone()).unwrap(),
            Payload::Raw(bytes)
        );
    }

    #[test]
    fn given_json_bytes_when_encoded_under_each_schema_should_store_them_as_they_are() {
        let bytes = Bytes::from_static(br#"{"a": 1}"#);
        for schema in [Schema::Json, Schema::Text, Schema::Raw] {
            let encoded = schema.encode(&Payload::JsonBytes(bytes.clone())).unwrap();
            assert_eq!(encoded, bytes, "{schema}");
        }
    }

    #[test]
    fn given_stored_json_when_decoded_keeping_text_should_keep_the_bytes_or_refuse_what_is_not_json()
     {
        let bytes = Bytes::from_static(br#"{"a": [1, "x"]}"#);
        assert_eq!(
            Schema::Json
                .decode_keeping_json_text(bytes.clone())
                .unwrap(),
            Payload::JsonBytes(bytes)
        );
        for invalid in [
            &b"{nope"[..],
            b"{\"a\":1} trailing",
            b"",
            b"\"\xff\"",
            b"\"tab\there\"",
        ] {
            assert!(
                Schema::Json
                    .decode_keeping_json_text(Bytes::copy_from_slice(invalid))
                    .is_err(),
                "{invalid:?}"
            );
        }
        let text = Bytes::from_static(b"plain");
        assert_eq!(
            Schema::Text.decode_keeping_json_text(text.clone()).unwrap(),
            Payload::Text("plain".into())
        );
    }

    #[test]
    fn given_schemas_that_need_options_when_parsed_alone_should_say_what_is_missing() {
        let error = "flat_buffer".parse::<Schema>().unwrap_err();
        assert!(error.contains("flatbuffer_schema_path"), "{error}");
        let error = "avro".parse::<Schema>().unwrap_err();
        assert!(error.contains("avro_schema_json"), "{error}");
        let error = "proto".parse::<Schema>().unwrap_err();
        assert!(error.contains("proto_schema_path"), "{error}");
        assert!("yaml".parse::<Schema>().is_err());
    }
}
