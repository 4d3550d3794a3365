//! Protocol Buffers stream schema (`schema = "proto"`): one message per Iggy
//! message, of one type named by `message_type`. The type comes from `.proto`
//! files compiled at run time (protox, no `protoc`) or from a descriptor set
//! file (`protoc --descriptor_set_out --include_imports`). Sinks decode a
//! message into JSON (proto field names, 64-bit integers as numbers, default
//! values left out, as protobuf's JSON mapping does); sources encode JSON
//! (proto or JSON field names both accepted, unknown fields refused) into one
//! message.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use prost_reflect::prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};

use super::CodecError;
use crate::message::Payload;

/// Where a message type is described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoSource {
    /// A `.proto` file and the directories its imports are searched in.
    SchemaFile {
        path: PathBuf,
        include_paths: Vec<PathBuf>,
    },
    /// A serialized `google.protobuf.FileDescriptorSet`.
    DescriptorSet(PathBuf),
}

/// One message type, ready to decode and encode.
#[derive(Clone)]
pub struct ProtoCodec {
    inner: Arc<Inner>,
}

struct Inner {
    source: ProtoSource,
    message: MessageDescriptor,
}

impl ProtoCodec {
    /// Loads `message_type` (a full name such as `shop.v1.Order`, a leading
    /// dot allowed) from `source`.
    pub fn load(source: ProtoSource, message_type: &str) -> Result<Self, String> {
        let pool = match &source {
            ProtoSource::SchemaFile {
                path,
                include_paths,
            } => compile(path, include_paths)?,
            ProtoSource::DescriptorSet(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
                DescriptorPool::decode(bytes.as_slice()).map_err(|error| {
                    format!(
                        "{} is not a protobuf descriptor set: {error}",
                        path.display()
                    )
                })?
            }
        };
        let name = message_type.trim_start_matches('.');
        let message = pool.get_message_by_name(name).ok_or_else(|| {
            let known: Vec<_> = pool
                .all_messages()
                .map(|m| m.full_name().to_owned())
                .collect();
            format!(
                "message type \"{name}\" is not defined; defined: {}",
                known.join(", ")
            )
        })?;
        Ok(Self {
            inner: Arc::new(Inner { source, message }),
        })
    }

    pub fn message_type(&self) -> &str {
        self.inner.message.full_name()
    }

    /// Decodes one message into JSON.
    pub fn decode(&self, bytes: &[u8]) -> Result<Payload, CodecError> {
        let message = DynamicMessage::decode(self.inner.message.clone(), bytes)
            .map_err(|error| invalid(error.to_string()))?;
        let options = SerializeOptions::new()
            .use_proto_field_name(true)
            .stringify_64_bit_integers(false);
        message
            .serialize_with_options(serde_json::value::Serializer, &options)
            .map(Payload::Json)
            .map_err(|error| invalid(error.to_string()))
    }

    /// Encodes JSON (a value, JSON text, or text holding JSON) as one message;
    /// raw bytes must already be one message of this type and are stored as
    /// they are.
    pub fn encode(&self, payload: &Payload) -> Result<Bytes, CodecError> {
        let descriptor = self.inner.message.clone();
        let options = DeserializeOptions::new();
        let message = match payload {
            Payload::Json(value) => {
                DynamicMessage::deserialize_with_options(descriptor, value, &options)
                    .map_err(|error| invalid(error.to_string()))?
            }
            Payload::JsonBytes(bytes) => from_json_text(descriptor, bytes, &options)?,
            Payload::Text(text) => from_json_text(descriptor, text.as_bytes(), &options)?,
            Payload::Raw(bytes) => {
                DynamicMessage::decode(descriptor, bytes.as_ref())
                    .map_err(|error| invalid(error.to_string()))?;
                return Ok(bytes.clone());
            }
        };
        Ok(Bytes::from(message.encode_to_vec()))
    }
}

fn from_json_text(
    descriptor: MessageDescriptor,
    bytes: &[u8],
    options: &DeserializeOptions,
) -> Result<DynamicMessage, CodecError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let message = DynamicMessage::deserialize_with_options(descriptor, &mut deserializer, options)
        .map_err(|error| invalid(error.to_string()))?;
    deserializer
        .end()
        .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
    Ok(message)
}

/// Compiles a `.proto` file and its imports. The file's own directory is
/// searched after `include_paths`, so a lone file needs no include path.
fn compile(path: &Path, include_paths: &[PathBuf]) -> Result<DescriptorPool, String> {
    let mut includes = include_paths.to_vec();
    if let Some(parent) = path.parent() {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        includes.push(parent.to_path_buf());
    }
    let files = protox::compile([path], &includes)
        .map_err(|error| format!("cannot compile {}: {error}", path.display()))?;
    DescriptorPool::from_file_descriptor_set(files).map_err(|error| error.to_string())
}

fn invalid(message: impl Into<String>) -> CodecError {
    CodecError::InvalidProto(message.into())
}

impl PartialEq for ProtoCodec {
    fn eq(&self, other: &Self) -> bool {
        self.inner.source == other.inner.source && self.message_type() == other.message_type()
    }
}

impl Eq for ProtoCodec {}

impl std::fmt::Debug for ProtoCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtoCodec")
            .field("source", &self.inner.source)
            .field("message_type", &self.message_type())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"syntax = "proto3";
package shop.v1;
message Order {
  int64 id = 1;
  string customer = 2;
  repeated Line lines = 3;
}
message Line {
  string sku = 1;
  uint32 quantity = 2;
}
"#;

    fn order_codec(dir: &Path) -> ProtoCodec {
        let path = dir.join("order.proto");
        std::fs::write(&path, ORDER).unwrap();
        let source = ProtoSource::SchemaFile {
            path,
            include_paths: Vec::new(),
        };
        ProtoCodec::load(source, "shop.v1.Order").unwrap()
    }

    #[test]
    fn given_a_proto_file_when_json_is_encoded_and_decoded_should_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let codec = order_codec(dir.path());
        let value =
            serde_json::json!({"id": 5, "customer": "c", "lines": [{"sku": "a", "quantity": 2}]});
        let bytes = codec.encode(&Payload::Json(value.clone())).unwrap();
        // field 1 varint 5, field 2 "c", field 3 a 7-byte Line.
        assert_eq!(&bytes[..], b"\x08\x05\x12\x01c\x1a\x05\x0a\x01a\x10\x02");
        assert_eq!(codec.decode(&bytes).unwrap(), Payload::Json(value));
    }

    #[test]
    fn given_json_or_bytes_not_of_the_type_when_coded_should_fail() {
        let dir = tempfile::tempdir().unwrap();
        let codec = order_codec(dir.path());
        for bad in [
            serde_json::json!({"id": "x"}),
            serde_json::json!({"nope": 1}),
            serde_json::json!([1]),
        ] {
            assert!(codec.encode(&Payload::Json(bad.clone())).is_err(), "{bad}");
        }
        // A truncated length-delimited field and a field of wire type 7.
        for bad in [&b"\x12\x05ab"[..], b"\x0f"] {
            assert!(codec.decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn given_an_unknown_message_type_when_loaded_should_name_the_defined_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("order.proto");
        std::fs::write(&path, ORDER).unwrap();
        let source = ProtoSource::SchemaFile {
            path,
            include_paths: Vec::new(),
        };
        let error = ProtoCodec::load(source, "shop.v1.Nope").unwrap_err();
        assert!(error.contains("shop.v1.Order"), "{error}");
    }
}
