//! Stream schemas: how a payload becomes the bytes stored in Iggy (sources) and
//! how stored bytes become a payload again (sinks). Names follow upstream's
//! `schema` values.
//!
//! JSON is parsed once into the `serde_json::Value` that transforms change in
//! place, and serialized once. serde_json stays over simd-json
//! (`benches/codec.rs`, simd-json vs serde_json): producing our `Value`,
//! simd-json decoded a 300-byte record in 824 vs 569 ns and a database row in
//! 2.95 vs 2.69 µs, and was 3% faster only on a 5 KiB order (35.7 vs 36.9 µs);
//! it encoded the row in 640 vs 509 ns and the order in 7.4 vs 5.0 µs, and was
//! faster only on the string-heavy record (124 vs 179 ns).

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use crate::message::Payload;

/// Initial size of the buffer a JSON payload is serialized into.
const JSON_ENCODE_CAPACITY: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Schema {
    Json,
    Raw,
    Text,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("payload is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("payload is not valid UTF-8 text")]
    InvalidText,
}

impl Schema {
    /// Turns a payload into the bytes stored under this schema.
    ///
    /// `json` accepts JSON values, text (stored as a JSON string, as upstream does)
    /// and raw bytes that already hold valid JSON; `text` accepts text, JSON
    /// (serialized) and raw UTF-8; `raw` stores whatever bytes the payload has.
    pub fn encode(self, payload: &Payload) -> Result<Bytes, CodecError> {
        match (self, payload) {
            (Schema::Json, Payload::Json(value)) => {
                // serde_json's `to_vec` starts at 128 bytes and regrows for a
                // typical record; starting at 512 measured ~25% faster on a
                // 300-byte record and no slower on a 5 KiB one (benches/codec.rs).
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
        }
    }

    /// Like [`decode`](Self::decode), but JSON stays the stored text
    /// ([`Payload::JsonBytes`]), checked without building a value: UTF-8 and
    /// one document of JSON's grammar (RFC 8259). For a sink that writes JSON
    /// as text when there are no transforms to run: 114 vs 601 ns on a
    /// 200-byte record, 0.37 vs 2.57 µs on a 19-field row (`cargo bench
    /// --bench codec`, `kept_as_text`), and a payload that is not JSON is
    /// still refused here, message by message.
    pub fn decode_keeping_json_text(self, bytes: Bytes) -> Result<Payload, CodecError> {
        match self {
            Schema::Json => {
                let text = std::str::from_utf8(&bytes)
                    .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
                serde_json::from_str::<serde::de::IgnoredAny>(text)
                    .map_err(|error| CodecError::InvalidJson(error.to_string()))?;
                Ok(Payload::JsonBytes(bytes))
            }
            Schema::Text | Schema::Raw => self.decode(bytes),
        }
    }

    /// Turns stored bytes into a payload, checking they fit the schema.
    pub fn decode(self, bytes: Bytes) -> Result<Payload, CodecError> {
        match self {
            Schema::Json => serde_json::from_slice(&bytes)
                .map(Payload::Json)
                .map_err(|error| CodecError::InvalidJson(error.to_string())),
            Schema::Text => String::from_utf8(bytes.into())
                .map(Payload::Text)
                .map_err(|_| CodecError::InvalidText),
            Schema::Raw => Ok(Payload::Raw(bytes)),
        }
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Schema::Json => "json",
            Schema::Raw => "raw",
            Schema::Text => "text",
        })
    }
}

impl FromStr for Schema {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "json" => Ok(Schema::Json),
            "raw" => Ok(Schema::Raw),
            "text" => Ok(Schema::Text),
            "proto" | "flat_buffer" | "avro" => Err(format!(
                "schema \"{value}\" is not supported by iggy-connect yet; use json, raw or text"
            )),
            other => Err(format!(
                "expected one of json, raw, text; found \"{other}\""
            )),
        }
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
    fn given_upstream_only_schemas_when_parsed_should_say_not_supported() {
        let error = "avro".parse::<Schema>().unwrap_err();
        assert!(error.contains("not supported"), "{error}");
    }
}
