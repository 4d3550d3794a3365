//! Turns a request body into message payloads: one JSON document, a JSON array
//! (one message per element), NDJSON (one message per line), text or raw bytes,
//! chosen by the request's `Content-Type`.

use std::io;

use bytes::Bytes;

use crate::message::Payload;

/// How a body is read, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json` or `application/*+json`: a document, or an array of them.
    Json,
    /// `application/x-ndjson`, `application/ndjson`, `application/jsonl`, ...
    Ndjson,
    /// `text/*`: one UTF-8 text message.
    Text,
    /// Anything else, or no `Content-Type`: one message holding the bytes as sent.
    Raw,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is empty")]
    Empty,
    #[error("the body is not valid JSON: {0}")]
    Json(String),
    #[error("line {line} of the NDJSON body is not valid JSON: {message}")]
    NdjsonLine { line: usize, message: String },
    #[error("a text/* body must be valid UTF-8")]
    Utf8,
    #[error("message {index} is {size} bytes, more than max_message_bytes ({limit})")]
    MessageTooLarge {
        index: usize,
        size: usize,
        limit: usize,
    },
}

impl BodyError {
    /// A stable name for the JSON error body and logs.
    pub fn code(&self) -> &'static str {
        match self {
            BodyError::Empty => "empty_body",
            BodyError::Json(_) => "malformed_json",
            BodyError::NdjsonLine { .. } => "malformed_ndjson",
            BodyError::Utf8 => "malformed_text",
            BodyError::MessageTooLarge { .. } => "message_too_large",
        }
    }
}

impl BodyFormat {
    pub fn from_content_type(content_type: Option<&str>) -> Self {
        let Some(content_type) = content_type else {
            return BodyFormat::Raw;
        };
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json" => BodyFormat::Json,
            "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/x-jsonlines"
            | "application/jsonlines" => BodyFormat::Ndjson,
            other if other.starts_with("application/") && other.ends_with("+json") => {
                BodyFormat::Json
            }
            other if other.starts_with("text/") => BodyFormat::Text,
            _ => BodyFormat::Raw,
        }
    }
}

/// Splits a body into payloads, checking each against `max_message_bytes` (the
/// size it will have once stored).
pub fn parse(
    format: BodyFormat,
    body: Bytes,
    max_message_bytes: usize,
) -> Result<Vec<Payload>, BodyError> {
    if body.is_empty() {
        return Err(BodyError::Empty);
    }
    match format {
        BodyFormat::Json => parse_json(&body, max_message_bytes),
        BodyFormat::Ndjson => parse_ndjson(&body, max_message_bytes),
        BodyFormat::Text => {
            check_size(0, body.len(), max_message_bytes)?;
            let text = String::from_utf8(body.into()).map_err(|_| BodyError::Utf8)?;
            Ok(vec![Payload::Text(text)])
        }
        BodyFormat::Raw => {
            check_size(0, body.len(), max_message_bytes)?;
            Ok(vec![Payload::Raw(body)])
        }
    }
}

fn parse_json(body: &[u8], max_message_bytes: usize) -> Result<Vec<Payload>, BodyError> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| BodyError::Json(error.to_string()))?;
    let values = match value {
        serde_json::Value::Array(elements) => elements,
        single => vec![single],
    };
    // Stored messages are re-serialized compactly, so no message can be larger
    // than the whole body: only a body over the limit needs measuring.
    if body.len() > max_message_bytes {
        for (index, value) in values.iter().enumerate() {
            check_size(index, serialized_len(value), max_message_bytes)?;
        }
    }
    Ok(values.into_iter().map(Payload::Json).collect())
}

fn parse_ndjson(body: &[u8], max_message_bytes: usize) -> Result<Vec<Payload>, BodyError> {
    let mut payloads = Vec::new();
    for (line_index, line) in body.split(|byte| *byte == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        check_size(payloads.len(), line.len(), max_message_bytes)?;
        let value = serde_json::from_slice(line).map_err(|error| BodyError::NdjsonLine {
            line: line_index + 1,
            message: error.to_string(),
        })?;
        payloads.push(Payload::Json(value));
    }
    if payloads.is_empty() {
        return Err(BodyError::Empty);
    }
    Ok(payloads)
}

fn check_size(index: usize, size: usize, limit: usize) -> Result<(), BodyError> {
    if size > limit {
        Err(BodyError::MessageTooLarge { index, size, limit })
    } else {
        Ok(())
    }
}

fn serialized_len(value: &serde_json::Value) -> usize {
    let mut counter = ByteCounter(0);
    // Writing to a counter cannot fail; a value that cannot be serialized would
    // fail the engine's encoder anyway, so count it as empty here.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

struct ByteCounter(usize);

impl io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMIT: usize = 1024;

    #[test]
    fn given_content_types_when_mapped_should_pick_the_format() {
        let cases = [
            (Some("application/json"), BodyFormat::Json),
            (Some("Application/JSON; charset=utf-8"), BodyFormat::Json),
            (Some("application/cloudevents+json"), BodyFormat::Json),
            (Some("application/x-ndjson"), BodyFormat::Ndjson),
            (Some("text/plain"), BodyFormat::Text),
            (Some("application/octet-stream"), BodyFormat::Raw),
            (None, BodyFormat::Raw),
        ];
        for (content_type, format) in cases {
            assert_eq!(
                BodyFormat::from_content_type(content_type),
                format,
                "{content_type:?}"
            );
        }
    }

    #[test]
    fn given_json_array_when_parsed_should_yield_one_message_per_element() {
        let payloads = parse(
            BodyFormat::Json,
            Bytes::from_static(b"[{\"a\":1},2]"),
            LIMIT,
        )
        .unwrap();
        assert_eq!(
            payloads,
            vec![Payload::Json(json!({"a": 1})), Payload::Json(json!(2))]
        );
    }

    #[test]
    fn given_single_json_document_when_parsed_should_yield_one_message() {
        let payloads = parse(BodyFormat::Json, Bytes::from_static(b"{\"a\":1}"), LIMIT).unwrap();
        assert_eq!(payloads, vec![Payload::Json(json!({"a": 1}))]);
    }

    #[test]
    fn given_ndjson_with_blank_lines_when_parsed_should_skip_them() {
        let body = Bytes::from_static(b"{\"a\":1}\r\n\n{\"a\":2}\n");
        let payloads = parse(BodyFormat::Ndjson, body, LIMIT).unwrap();
        assert_eq!(payloads.len(), 2);
    }

    #[test]
    fn given_bad_ndjson_line_when_parsed_should_name_the_line() {
        let body = Bytes::from_static(b"{\"a\":1}\n{nope\n");
        let error = parse(BodyFormat::Ndjson, body, LIMIT).unwrap_err();
        assert!(
            matches!(error, BodyError::NdjsonLine { line: 2, .. }),
            "{error:?}"
        );
    }

    #[test]
    fn given_oversized_array_element_when_parsed_should_name_the_element() {
        let big = "x".repeat(LIMIT);
        let body = Bytes::from(serde_json::to_vec(&json!([1, big])).unwrap());
        let error = parse(BodyFormat::Json, body, LIMIT).unwrap_err();
        assert!(
            matches!(error, BodyError::MessageTooLarge { index: 1, .. }),
            "{error:?}"
        );
    }

    #[test]
    fn given_large_body_of_small_elements_when_parsed_should_accept_it() {
        let elements: Vec<u32> = (0..1000).collect();
        let body = Bytes::from(serde_json::to_vec(&elements).unwrap());
        assert!(body.len() > 64);
        assert_eq!(parse(BodyFormat::Json, body, 64).unwrap().len(), 1000);
    }

    #[test]
    fn given_empty_or_invalid_bodies_when_parsed_should_fail() {
        assert_eq!(
            parse(BodyFormat::Raw, Bytes::new(), LIMIT),
            Err(BodyError::Empty)
        );
        assert!(matches!(
            parse(BodyFormat::Json, Bytes::from_static(b"{"), LIMIT),
            Err(BodyError::Json(_))
        ));
        assert_eq!(
            parse(BodyFormat::Text, Bytes::from_static(&[0xff]), LIMIT),
            Err(BodyError::Utf8)
        );
    }
}
