//! Avro stream schema (`schema = "avro"`): one datum per message, no container
//! header, as upstream stores it. Sinks decode a datum into JSON; sources encode
//! JSON into a datum. With a reader schema given apart from the writer's, the
//! datum is resolved from one to the other (Avro's schema resolution rules).

use std::sync::Arc;

use apache_avro::Schema as AvroSchema;
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value as AvroValue;
use apache_avro::writer::datum::GenericDatumWriter;
use bytes::Bytes;

use super::CodecError;
use crate::message::Payload;

/// A parsed Avro schema and the text it was parsed from (compared by text).
#[derive(Clone)]
pub struct AvroCodec {
    inner: Arc<Inner>,
}

struct Inner {
    text: String,
    schema: AvroSchema,
    #[cfg(feature = "schema-registry")]
    registry: Option<super::registry::Registry>,
}

impl AvroCodec {
    /// Parses an Avro schema given as JSON text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let schema = AvroSchema::parse_str(text).map_err(|error| error.to_string())?;
        Ok(Self {
            inner: Arc::new(Inner {
                text: text.to_owned(),
                schema,
                #[cfg(feature = "schema-registry")]
                registry: None,
            }),
        })
    }

    /// Like [`parse`](Self::parse), for messages in a schema registry's wire
    /// format (see [`super::registry`]); `text` is the stream's own schema.
    #[cfg(feature = "schema-registry")]
    pub fn with_registry(
        text: &str,
        options: super::registry::RegistryOptions,
    ) -> Result<Self, String> {
        let schema = AvroSchema::parse_str(text).map_err(|error| error.to_string())?;
        let registry = super::registry::Registry::new(options, &schema)?;
        Ok(Self {
            inner: Arc::new(Inner {
                text: text.to_owned(),
                schema,
                registry: Some(registry),
            }),
        })
    }

    pub fn schema(&self) -> &AvroSchema {
        &self.inner.schema
    }

    /// Decodes one datum written with this schema into JSON.
    pub fn decode(&self, bytes: &[u8]) -> Result<Payload, CodecError> {
        #[cfg(feature = "schema-registry")]
        if let Some(registry) = &self.inner.registry {
            use super::registry::Registry;
            let (id, datum) = Registry::split(bytes).ok_or_else(|| {
                invalid("not in the schema registry's wire format (a zero byte, then a 4-byte schema id)")
            })?;
            let writer = registry
                .writer(id)
                .map_err(|error| CodecError::Registry(error.to_string()))?;
            return match writer {
                Some(writer) => decode_datum(&writer, Some(self.schema()), datum),
                None => decode_datum(self.schema(), None, datum),
            }
            .map(Payload::Json);
        }
        decode_datum(self.schema(), None, bytes).map(Payload::Json)
    }

    /// Encodes JSON (a value, JSON text, or text holding JSON) as one datum;
    /// raw bytes must already be one datum of this schema and are stored as
    /// they are.
    pub fn encode(&self, payload: &Payload) -> Result<Bytes, CodecError> {
        #[cfg(feature = "schema-registry")]
        if let Some(registry) = &self.inner.registry {
            use super::registry::{HEADER_LEN, Registry};
            let id = registry
                .own_id(&self.inner.text)
                .map_err(|error| CodecError::Registry(error.to_string()))?;
            let datum = encode_datum(self.schema(), payload)?;
            let mut bytes = Vec::with_capacity(HEADER_LEN + datum.len());
            bytes.extend_from_slice(&Registry::header(id));
            bytes.extend_from_slice(&datum);
            return Ok(Bytes::from(bytes));
        }
        encode_datum(self.schema(), payload).map(Bytes::from)
    }

    /// The registry's URL, when messages use its wire format.
    fn registry_url(&self) -> Option<&str> {
        #[cfg(feature = "schema-registry")]
        if let Some(registry) = &self.inner.registry {
            return Some(registry.url());
        }
        None
    }
}

/// Decodes one datum written with `writer`, resolved into `reader` when given;
/// bytes left over after the datum are an error (they are not this schema).
pub fn decode_datum(
    writer: &AvroSchema,
    reader: Option<&AvroSchema>,
    bytes: &[u8],
) -> Result<serde_json::Value, CodecError> {
    if bytes.is_empty() {
        return Err(invalid("empty payload"));
    }
    let datum_reader = GenericDatumReader::builder(writer)
        .maybe_reader_schema(reader)
        .build()
        .map_err(|error| invalid(error.to_string()))?;
    let mut rest = bytes;
    let value = datum_reader
        .read_value(&mut rest)
        .map_err(|error| invalid(error.to_string()))?;
    if !rest.is_empty() {
        return Err(invalid(format!(
            "{} bytes left after the datum",
            rest.len()
        )));
    }
    // apache-avro reads a string cut short by the end of the payload as a
    // null; resolving into a reader schema refuses that, and so does this.
    if reader.is_none() && !value.validate(writer) {
        return Err(invalid("the datum ends early"));
    }
    serde_json::Value::try_from(value).map_err(|error| invalid(error.to_string()))
}

/// Encodes a payload as one datum of `schema` (see [`AvroCodec::encode`]).
pub fn encode_datum(schema: &AvroSchema, payload: &Payload) -> Result<Vec<u8>, CodecError> {
    let json = match payload {
        Payload::Json(value) => value.clone(),
        Payload::JsonBytes(bytes) => parse_json(bytes)?,
        Payload::Text(text) => parse_json(text.as_bytes())?,
        Payload::Raw(bytes) => {
            decode_datum(schema, None, bytes)?;
            return Ok(bytes.to_vec());
        }
    };
    let value = AvroValue::try_from(json)
        .and_then(|value| value.resolve(schema))
        .map_err(|error| invalid(error.to_string()))?;
    GenericDatumWriter::builder(schema)
        // `resolve` has checked the value against the schema.
        .validate(false)
        .build()
        .and_then(|writer| writer.write_value_to_vec(value))
        .map_err(|error| invalid(error.to_string()))
}

fn parse_json(bytes: &[u8]) -> Result<serde_json::Value, CodecError> {
    serde_json::from_slice(bytes).map_err(|error| CodecError::InvalidJson(error.to_string()))
}

fn invalid(message: impl Into<String>) -> CodecError {
    CodecError::InvalidAvro(message.into())
}

impl PartialEq for AvroCodec {
    fn eq(&self, other: &Self) -> bool {
        self.inner.text == other.inner.text && self.registry_url() == other.registry_url()
    }
}

impl Eq for AvroCodec {}

impl std::fmt::Debug for AvroCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AvroCodec")
            .field("schema", &self.inner.text)
            .field("registry", &self.registry_url())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: &str = r#"{"type":"record","name":"User","fields":[
        {"name":"id","type":"long"},
        {"name":"name","type":"string"},
        {"name":"email","type":["null","string"],"default":null}]}"#;

    #[test]
    fn given_a_record_when_encoded_and_decoded_should_round_trip() {
        let codec = AvroCodec::parse(USER).unwrap();
        let value = serde_json::json!({"id": 7, "name": "ann", "email": "a@x"});
        let bytes = codec.encode(&Payload::Json(value.clone())).unwrap();
        // id 7 zig-zag is 14, "ann" is length 3 (6) then the bytes, then union
        // branch 1 (2) and "a@x".
        assert_eq!(&bytes[..], b"\x0e\x06ann\x02\x06a@x");
        assert_eq!(codec.decode(&bytes).unwrap(), Payload::Json(value));
    }

    #[test]
    fn given_json_not_matching_the_schema_when_encoded_should_fail() {
        let codec = AvroCodec::parse(USER).unwrap();
        for bad in [
            serde_json::json!({"id": "seven", "name": "ann"}),
            serde_json::json!({"name": "ann"}),
            serde_json::json!([1, 2]),
        ] {
            assert!(codec.encode(&Payload::Json(bad.clone())).is_err(), "{bad}");
        }
    }

    #[test]
    fn given_bytes_not_one_datum_when_decoded_should_fail() {
        let codec = AvroCodec::parse(USER).unwrap();
        for bad in [
            &b""[..],
            b"\x0e",
            b"\x0e\x06ann\x02\x06a@x\x00",
            b"\x0e\x06an",
        ] {
            assert!(codec.decode(bad).is_err(), "{bad:?}");
        }
        assert!(
            codec
                .encode(&Payload::Raw(Bytes::from_static(b"\x0e\x06an")))
                .is_err()
        );
    }

    #[test]
    fn given_a_newer_reader_schema_when_decoding_should_resolve_the_writer_datum() {
        let writer = AvroSchema::parse_str(USER).unwrap();
        let reader = AvroSchema::parse_str(
            r#"{"type":"record","name":"User","fields":[
            {"name":"id","type":"long"},
            {"name":"country","type":"string","default":"nz"}]}"#,
        )
        .unwrap();
        let bytes = encode_datum(
            &writer,
            &Payload::Json(serde_json::json!({"id": 1, "name": "b", "email": null})),
        )
        .unwrap();
        assert_eq!(
            decode_datum(&writer, Some(&reader), &bytes).unwrap(),
            serde_json::json!({"id": 1, "country": "nz"})
        );
    }
}
