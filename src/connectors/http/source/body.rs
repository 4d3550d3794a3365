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
    #[error("the JSON is nested deeper than max_json_depth ({limit})")]
    TooDeep { limit: usize },
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
            BodyError::TooDeep { .. } => "json_too_deep",
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
    max_json_depth: usize,
) -> Result<Vec<Payload>, BodyError> {
    if body.is_empty() {
        return Err(BodyError::Empty);
    }
    match format {
        BodyFormat::Json => parse_json(&body, max_message_bytes, max_json_depth),
        BodyFormat::Ndjson => parse_ndjson(&body, max_message_bytes, max_json_depth),
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

fn parse_json(
    body: &[u8],
    max_message_bytes: usize,
    max_json_depth: usize,
) -> Result<Vec<Payload>, BodyError> {
    let value = parse_document(body, max_json_depth).map_err(|error| match error {
        DocumentError::TooDeep => BodyError::TooDeep {
            limit: max_json_depth,
        },
        DocumentError::Invalid(message) => BodyError::Json(message),
    })?;
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

fn parse_ndjson(
    body: &[u8],
    max_message_bytes: usize,
    max_json_depth: usize,
) -> Result<Vec<Payload>, BodyError> {
    let mut payloads = Vec::new();
    for (line_index, line) in body.split(|byte| *byte == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        check_size(payloads.len(), line.len(), max_message_bytes)?;
        let value = parse_document(line, max_json_depth).map_err(|error| match error {
            DocumentError::TooDeep => BodyError::TooDeep {
                limit: max_json_depth,
            },
            DocumentError::Invalid(message) => BodyError::NdjsonLine {
                line: line_index + 1,
                message,
            },
        })?;
        payloads.push(Payload::Json(value));
    }
    if payloads.is_empty() {
        return Err(BodyError::Empty);
    }
    Ok(payloads)
}

enum DocumentError {
    TooDeep,
    Invalid(String),
}

/// serde_json's parser recurses and stops at 128 levels. A document it
/// refuses for that reason (rare) is parsed again without recursion, so any
/// depth up to `max_depth` is accepted without risking the stack.
fn parse_document(bytes: &[u8], max_depth: usize) -> Result<serde_json::Value, DocumentError> {
    match serde_json::from_slice(bytes) {
        Ok(value) if max_depth >= SERDE_JSON_DEPTH || depth(&value) <= max_depth => Ok(value),
        Ok(_) => Err(DocumentError::TooDeep),
        Err(error) if error.to_string().starts_with("recursion limit exceeded") => {
            deep::parse(bytes, max_depth)
        }
        Err(error) => Err(DocumentError::Invalid(error.to_string())),
    }
}

/// serde_json's own nesting limit.
const SERDE_JSON_DEPTH: usize = 128;

/// How deeply `value` nests arrays and objects (a scalar is 0), without recursion.
fn depth(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 0)];
    while let Some((value, level)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(fields) => Box::new(fields.values()),
            _ => continue,
        };
        deepest = deepest.max(level + 1);
        pending.extend(children.map(|child| (child, level + 1)));
    }
    deepest
}

/// A JSON parser that keeps its open arrays and objects on a heap stack; the
/// strings and numbers are handed to serde_json token by token.
mod deep {
    use serde_json::{Map, Value};

    use super::DocumentError;

    enum Open {
        Array(Vec<Value>),
        /// The fields so far and the key of the value being read.
        Object(Map<String, Value>, String),
    }

    struct Cursor<'a> {
        bytes: &'a [u8],
        at: usize,
    }

    fn invalid(message: String) -> DocumentError {
        DocumentError::Invalid(message)
    }

    impl Cursor<'_> {
        fn skip_whitespace(&mut self) {
            while self
                .bytes
                .get(self.at)
                .is_some_and(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
            {
                self.at += 1;
            }
        }

        /// The next byte after whitespace, consumed when it is `wanted`.
        fn eat(&mut self, wanted: u8) -> bool {
            self.skip_whitespace();
            let found = self.bytes.get(self.at) == Some(&wanted);
            if found {
                self.at += 1;
            }
            found
        }

        fn string(&mut self) -> Result<String, DocumentError> {
            self.skip_whitespace();
            let start = self.at;
            if self.bytes.get(start) != Some(&b'"') {
                return Err(invalid(format!("expected a string at byte {start}")));
            }
            let mut end = start + 1;
            loop {
                match self.bytes.get(end) {
                    Some(b'"') => break,
                    Some(b'\\') => end += 2,
                    Some(_) => end += 1,
                    None => return Err(invalid("unterminated string".into())),
                }
            }
            self.at = end + 1;
            serde_json::from_slice(&self.bytes[start..=end])
                .map_err(|error| invalid(format!("{error} in the string at byte {start}")))
        }

        fn key(&mut self) -> Result<String, DocumentError> {
            let key = self.string()?;
            if !self.eat(b':') {
                return Err(invalid(format!("expected ':' at byte {}", self.at)));
            }
            Ok(key)
        }

        /// A number, `true`, `false` or `null`.
        fn scalar(&mut self) -> Result<Value, DocumentError> {
            let start = self.at;
            while self.bytes.get(self.at).is_some_and(|byte| {
                !matches!(byte, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
            }) {
                self.at += 1;
            }
            let token = &self.bytes[start..self.at];
            match serde_json::from_slice::<Value>(token) {
                Ok(value) if !value.is_array() && !value.is_object() => Ok(value),
                _ => Err(invalid(format!("expected a value at byte {start}"))),
            }
        }
    }

    pub(super) fn parse(bytes: &[u8], max_depth: usize) -> Result<Value, DocumentError> {
        let mut cursor = Cursor { bytes, at: 0 };
        let mut open: Vec<Open> = Vec::new();
        loop {
            cursor.skip_whitespace();
            let mut value = match cursor.bytes.get(cursor.at) {
                Some(b'[') | Some(b'{') if open.len() >= max_depth => {
                    return Err(DocumentError::TooDeep);
                }
                Some(b'[') => {
                    cursor.at += 1;
                    if cursor.eat(b']') {
                        Value::Array(Vec::new())
                    } else {
                        open.push(Open::Array(Vec::new()));
                        continue;
                    }
                }
                Some(b'{') => {
                    cursor.at += 1;
                    if cursor.eat(b'}') {
                        Value::Object(Map::new())
                    } else {
                        open.push(Open::Object(Map::new(), cursor.key()?));
                        continue;
                    }
                }
                Some(b'"') => Value::String(cursor.string()?),
                Some(_) => cursor.scalar()?,
                None => return Err(invalid("unexpected end of the document".into())),
            };
            // Hand the value to the innermost open array or object, closing
            // every one that ends right after it.
            loop {
                let Some(innermost) = open.last_mut() else {
                    cursor.skip_whitespace();
                    if cursor.at != bytes.len() {
                        return Err(invalid(format!(
                            "trailing characters at byte {}",
                            cursor.at
                        )));
                    }
                    return Ok(value);
                };
                let closing = match innermost {
                    Open::Array(items) => {
                        items.push(value);
                        b']'
                    }
                    Open::Object(fields, key) => {
                        fields.insert(std::mem::take(key), value);
                        b'}'
                    }
                };
                if cursor.eat(b',') {
                    if let Open::Object(_, key) = innermost {
                        *key = cursor.key()?;
                    }
                    break;
                }
                if !cursor.eat(closing) {
                    return Err(invalid(format!(
                        "expected ',' or '{}' at byte {}",
                        closing as char, cursor.at
                    )));
                }
                value = match open.pop() {
                    Some(Open::Array(items)) => Value::Array(items),
                    Some(Open::Object(fields, _)) => Value::Object(fields),
                    None => return Err(invalid("unbalanced document".into())),
                };
            }
        }
    }
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

    const DEPTH: usize = 1024;
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
            DEPTH,
        )
        .unwrap();
        assert_eq!(
            payloads,
            vec![Payload::Json(json!({"a": 1})), Payload::Json(json!(2))]
        );
    }

    #[test]
    fn given_single_json_document_when_parsed_should_yield_one_message() {
        let payloads = parse(
            BodyFormat::Json,
            Bytes::from_static(b"{\"a\":1}"),
            LIMIT,
            DEPTH,
        )
        .unwrap();
        assert_eq!(payloads, vec![Payload::Json(json!({"a": 1}))]);
    }

    #[test]
    fn given_ndjson_with_blank_lines_when_parsed_should_skip_them() {
        let body = Bytes::from_static(b"{\"a\":1}\r\n\n{\"a\":2}\n");
        let payloads = parse(BodyFormat::Ndjson, body, LIMIT, DEPTH).unwrap();
        assert_eq!(payloads.len(), 2);
    }

    #[test]
    fn given_bad_ndjson_line_when_parsed_should_name_the_line() {
        let body = Bytes::from_static(b"{\"a\":1}\n{nope\n");
        let error = parse(BodyFormat::Ndjson, body, LIMIT, DEPTH).unwrap_err();
        assert!(
            matches!(error, BodyError::NdjsonLine { line: 2, .. }),
            "{error:?}"
        );
    }

    #[test]
    fn given_oversized_array_element_when_parsed_should_name_the_element() {
        let big = "x".repeat(LIMIT);
        let body = Bytes::from(serde_json::to_vec(&json!([1, big])).unwrap());
        let error = parse(BodyFormat::Json, body, LIMIT, DEPTH).unwrap_err();
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
        assert_eq!(
            parse(BodyFormat::Json, body, 64, DEPTH).unwrap().len(),
            1000
        );
    }

    #[test]
    fn given_empty_or_invalid_bodies_when_parsed_should_fail() {
        assert_eq!(
            parse(BodyFormat::Raw, Bytes::new(), LIMIT, DEPTH),
            Err(BodyError::Empty)
        );
        assert!(matches!(
            parse(BodyFormat::Json, Bytes::from_static(b"{"), LIMIT, DEPTH),
            Err(BodyError::Json(_))
        ));
        assert_eq!(
            parse(BodyFormat::Text, Bytes::from_static(&[0xff]), LIMIT, DEPTH),
            Err(BodyError::Utf8)
        );
    }

    /// Room for the deep documents below.
    const BIG: usize = 1 << 20;

    fn nested(depth: usize) -> String {
        let mut text = String::new();
        for level in 0..depth {
            text.push_str(if level % 2 == 0 { "[" } else { "{\"k\":" });
        }
        text.push_str("\"leaf\"");
        for level in (0..depth).rev() {
            text.push(if level % 2 == 0 { ']' } else { '}' });
        }
        text
    }

    #[test]
    fn given_json_nested_beyond_serde_jsons_limit_when_parsed_should_accept_it_up_to_the_limit() {
        for depth in [2, 127, 128, 129, 200, 1024] {
            let text = nested(depth);
            let payloads = parse(BodyFormat::Json, Bytes::from(text.clone()), BIG, DEPTH)
                .unwrap_or_else(|error| panic!("depth {depth}: {error}"));
            // The outer array is split into its one element.
            let [Payload::Json(value)] = payloads.as_slice() else {
                panic!("depth {depth}: {payloads:?}");
            };
            assert_eq!(
                serde_json::to_string(value).unwrap(),
                text[1..text.len() - 1],
                "depth {depth}"
            );
            assert_eq!(super::depth(value), depth - 1, "depth {depth}");
        }
        let line = format!("{}\n{}\n", nested(300), nested(2));
        let payloads = parse(BodyFormat::Ndjson, Bytes::from(line), BIG, DEPTH).unwrap();
        assert_eq!(payloads.len(), 2);
    }

    #[test]
    fn given_json_nested_beyond_max_json_depth_when_parsed_should_name_the_limit() {
        for (depth, limit) in [(1025, 1024), (100_000, 1024), (300, 200), (20, 10)] {
            for format in [BodyFormat::Json, BodyFormat::Ndjson] {
                let error = parse(format, Bytes::from(nested(depth)), BIG, limit).unwrap_err();
                assert_eq!(error, BodyError::TooDeep { limit }, "depth {depth}");
                assert!(
                    error
                        .to_string()
                        .contains(&format!("max_json_depth ({limit})"))
                );
                assert_eq!(error.code(), "json_too_deep");
            }
        }
    }

    #[test]
    fn given_malformed_deep_json_when_parsed_should_be_malformed_not_too_deep() {
        let deep = nested(300);
        let cases = [
            format!("{deep}x"),
            deep[..deep.len() - 1].to_owned(),
            deep.replacen("\"k\":", "\"k\"", 1),
            deep.replacen("\"leaf\"", "\"le\\qaf\"", 1),
            deep.replacen("\"leaf\"", "tru", 1),
            deep.replacen("\"leaf\"", "\"leaf\",", 1),
            format!("[{deep}"),
        ];
        for text in cases {
            let error = parse(BodyFormat::Json, Bytes::from(text.clone()), BIG, DEPTH).unwrap_err();
            assert!(
                matches!(error, BodyError::Json(_)),
                "{error}: {}",
                &text[290..]
            );
        }
    }

    #[test]
    fn given_deep_json_of_every_kind_of_value_when_parsed_should_match_serde_json() {
        let leaf = r#"{"s": "a\"b\\c\u00e9", "n": -1.5e3, "i": 18446744073709551615, "t": true, "f": false, "z": null, "e": [], "o": {}, "a": [1, "x", {"y": [null]}]}"#;
        let text = format!("{}{leaf}{}", "[".repeat(200), "]".repeat(200));
        let payloads = parse(BodyFormat::Json, Bytes::from(text), BIG, DEPTH).unwrap();
        let mut value = match payloads.as_slice() {
            [Payload::Json(value)] => value.clone(),
            other => panic!("{other:?}"),
        };
        for _ in 0..199 {
            value = value.as_array().unwrap()[0].clone();
        }
        assert_eq!(
            value,
            serde_json::from_str::<serde_json::Value>(leaf).unwrap()
        );
    }

    #[test]
    fn given_a_document_at_the_default_depth_when_stored_and_dropped_should_fit_a_worker_stack() {
        // Tokio's worker threads have 2 MiB stacks; what the engine does with
        // a payload (serialize it, drop it) recurses once per level.
        let worker = std::thread::Builder::new().stack_size(2 << 20);
        let handle = worker
            .spawn(|| {
                let text = nested(DEPTH);
                let payloads =
                    parse(BodyFormat::Json, Bytes::from(text.clone()), BIG, DEPTH).unwrap();
                let [Payload::Json(value)] = payloads.as_slice() else {
                    panic!("{payloads:?}");
                };
                let stored = serde_json::to_vec(value).unwrap();
                assert_eq!(stored.len(), text.len() - 2);
                drop(payloads);
            })
            .unwrap();
        handle.join().unwrap();
    }
}
