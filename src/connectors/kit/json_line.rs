//! Messages as JSON values, for the sinks that write JSON lines (the s3 and
//! file sinks): a payload and a header value each as one JSON value on one
//! line.

use serde_json::Value;

use crate::message::{HeaderValue, Payload};

/// The payload as JSON: JSON as is (on one line), text as a string, bytes
/// that are JSON as that JSON, other bytes as a base64 string.
pub fn payload_json(payload: &Payload, out: &mut Vec<u8>) {
    match payload {
        Payload::Json(value) => {
            let _ = serde_json::to_writer(&mut *out, value);
        }
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => {
            match serde_json::from_slice::<Value>(bytes) {
                // Stored text without line breaks goes in unchanged.
                Ok(_) if !bytes.iter().any(|byte| matches!(byte, b'\n' | b'\r')) => {
                    out.extend_from_slice(bytes.trim_ascii());
                }
                Ok(value) => {
                    let _ = serde_json::to_writer(&mut *out, &value);
                }
                Err(_) => {
                    use base64::Engine;
                    let text = base64::engine::general_purpose::STANDARD.encode(bytes);
                    let _ = serde_json::to_writer(&mut *out, &text);
                }
            }
        }
        Payload::Text(text) => {
            let _ = serde_json::to_writer(&mut *out, text);
        }
    }
}

pub fn header_json(value: &HeaderValue) -> Value {
    match value {
        HeaderValue::String(text) => Value::String(text.to_string()),
        HeaderValue::Bool(flag) => Value::Bool(*flag),
        HeaderValue::Int(number) => Value::from(*number),
        HeaderValue::UInt(number) => Value::from(*number),
        HeaderValue::Float(number) => Value::from(*number),
        HeaderValue::Raw(bytes) => {
            use base64::Engine;
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}
