//! Messages sent to a dead-letter topic carry the original payload and headers
//! plus headers that say where they came from and why they failed (after
//! Kafka Connect's `__connect.errors.*` context headers). Their names are
//! documented in docs/operations.md ("Dead letters"); a replay reads them
//! back with [`Context::of`].

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

use crate::clock::now_micros;
use crate::connectors::ConnectorKind;
use crate::message::{HeaderValue, Headers, OutgoingMessage, TopicRef};

/// The error message.
pub const HEADER_ERROR: &str = "iggy_connect_error";
/// What kind of failure it was: see [`ErrorClass`].
pub const HEADER_ERROR_CLASS: &str = "iggy_connect_error_class";
/// Where in the pipeline it failed (`decode`, `transform`, `encode`, `write`).
pub const HEADER_STAGE: &str = "iggy_connect_error_stage";
/// How many times this message was dead-lettered: 1, then one more each
/// time a replay of it fails again.
pub const HEADER_ATTEMPTS: &str = "iggy_connect_error_attempts";
/// When it was dead-lettered, RFC 3339 in UTC.
pub const HEADER_TIME: &str = "iggy_connect_error_time";
pub const HEADER_CONNECTOR: &str = "iggy_connect_connector_key";
/// `source` or `sink`.
pub const HEADER_CONNECTOR_TYPE: &str = "iggy_connect_connector_type";
/// Sink: the topic the message was read from. Source: the topic the record
/// was meant for.
pub const HEADER_ORIGIN_STREAM: &str = "iggy_connect_origin_stream";
pub const HEADER_ORIGIN_TOPIC: &str = "iggy_connect_origin_topic";
/// Sink only: where in the origin topic the message is.
pub const HEADER_ORIGIN_PARTITION: &str = "iggy_connect_origin_partition";
pub const HEADER_ORIGIN_OFFSET: &str = "iggy_connect_origin_offset";

/// Every header this module sets; a replay removes them all but
/// [`HEADER_ATTEMPTS`] before the message is delivered again.
pub const HEADERS: [&str; 11] = [
    HEADER_ERROR,
    HEADER_ERROR_CLASS,
    HEADER_STAGE,
    HEADER_ATTEMPTS,
    HEADER_TIME,
    HEADER_CONNECTOR,
    HEADER_CONNECTOR_TYPE,
    HEADER_ORIGIN_STREAM,
    HEADER_ORIGIN_TOPIC,
    HEADER_ORIGIN_PARTITION,
    HEADER_ORIGIN_OFFSET,
];

/// What kind of failure set a message aside; a replay can pick by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The payload does not decode under its stream's schema (sinks), or a
    /// source could not decode what it read (an object, set aside by the
    /// source).
    Decode,
    /// A transform failed on it.
    Transform,
    /// It does not encode under its stream's schema, or names no stream
    /// entry (sources).
    Encode,
    /// The bus can never store it (too large, bad headers; sources).
    Unstorable,
    /// The backend refused it for good (sinks).
    Rejected,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Decode => "decode",
            ErrorClass::Transform => "transform",
            ErrorClass::Encode => "encode",
            ErrorClass::Unstorable => "unstorable",
            ErrorClass::Rejected => "rejected",
        }
    }
}

/// Why and by whom a message is dead-lettered.
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    pub connector_key: &'a str,
    pub connector_type: ConnectorKind,
    pub stage: &'a str,
    pub class: ErrorClass,
    pub error: &'a str,
}

/// Where a dead-lettered message came from.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub stream: &'a str,
    pub topic: &'a str,
    /// Sinks: the partition and offset it was read at.
    pub position: Option<(u32, u64)>,
}

impl<'a> Origin<'a> {
    pub fn topic(topic: &'a TopicRef) -> Self {
        Self {
            stream: &topic.stream,
            topic: &topic.topic,
            position: None,
        }
    }

    pub fn at(topic: &'a TopicRef, partition_id: u32, offset: u64) -> Self {
        Self {
            position: Some((partition_id, offset)),
            ..Self::topic(topic)
        }
    }
}

/// Builds the dead-letter message for a failed message. A message that was
/// dead-lettered before (and replayed) counts one more attempt.
pub fn message(
    failure: &Failure<'_>,
    id: Option<u128>,
    mut headers: Headers,
    payload: Bytes,
    origin: Option<Origin<'_>>,
) -> OutgoingMessage {
    let attempts = attempts(&headers) + 1;
    let mut set = |key: &str, value: HeaderValue| {
        headers.retain(|(existing, _)| existing != key);
        headers.push((key.into(), value));
    };
    set(HEADER_ERROR, failure.error.into());
    set(HEADER_ERROR_CLASS, failure.class.as_str().into());
    set(HEADER_STAGE, failure.stage.into());
    set(HEADER_ATTEMPTS, HeaderValue::UInt(attempts));
    let time = UNIX_EPOCH + Duration::from_micros(now_micros());
    let time = humantime::format_rfc3339_micros(time).to_string();
    set(HEADER_TIME, HeaderValue::String(time.into()));
    set(HEADER_CONNECTOR, failure.connector_key.into());
    set(
        HEADER_CONNECTOR_TYPE,
        failure.connector_type.to_string().into(),
    );
    if let Some(origin) = origin {
        set(HEADER_ORIGIN_STREAM, origin.stream.into());
        set(HEADER_ORIGIN_TOPIC, origin.topic.into());
        if let Some((partition_id, offset)) = origin.position {
            set(
                HEADER_ORIGIN_PARTITION,
                HeaderValue::UInt(u64::from(partition_id)),
            );
            set(HEADER_ORIGIN_OFFSET, HeaderValue::UInt(offset));
        }
    }
    OutgoingMessage::new(id, headers, payload)
}

/// What a dead letter's headers say about it, read back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Context {
    pub connector_key: Option<String>,
    pub error: Option<String>,
    pub class: Option<String>,
    pub stage: Option<String>,
    pub attempts: u64,
    pub origin: Option<TopicRef>,
    pub partition_id: Option<u32>,
    pub offset: Option<u64>,
}

impl Context {
    pub fn of(headers: &Headers) -> Self {
        let text = |name: &str| header(headers, name).map(ToString::to_string);
        let number = |name: &str| header(headers, name).and_then(as_u64);
        let origin = match (text(HEADER_ORIGIN_STREAM), text(HEADER_ORIGIN_TOPIC)) {
            (Some(stream), Some(topic)) => Some(TopicRef { stream, topic }),
            _ => None,
        };
        Self {
            connector_key: text(HEADER_CONNECTOR),
            error: text(HEADER_ERROR),
            class: text(HEADER_ERROR_CLASS),
            stage: text(HEADER_STAGE),
            attempts: attempts(headers),
            origin,
            partition_id: number(HEADER_ORIGIN_PARTITION)
                .and_then(|partition| u32::try_from(partition).ok()),
            offset: number(HEADER_ORIGIN_OFFSET),
        }
    }
}

/// A dead letter's headers for its delivery again: the original headers,
/// plus the attempt count so a second failure counts on.
pub fn replay_headers(headers: &Headers) -> Headers {
    headers
        .iter()
        .filter(|(name, _)| name == HEADER_ATTEMPTS || !HEADERS.contains(&name.as_str()))
        .cloned()
        .collect()
}

fn attempts(headers: &Headers) -> u64 {
    header(headers, HEADER_ATTEMPTS)
        .and_then(as_u64)
        .unwrap_or(0)
}

fn header<'h>(headers: &'h Headers, name: &str) -> Option<&'h HeaderValue> {
    headers
        .iter()
        .find(|(existing, _)| existing == name)
        .map(|(_, value)| value)
}

fn as_u64(value: &HeaderValue) -> Option<u64> {
    match value {
        HeaderValue::UInt(number) => Some(*number),
        HeaderValue::Int(number) => u64::try_from(*number).ok(),
        other => other.to_string().parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> Failure<'static> {
        Failure {
            connector_key: "out",
            connector_type: ConnectorKind::Sink,
            stage: "write",
            class: ErrorClass::Rejected,
            error: "400 Bad Request",
        }
    }

    #[test]
    fn given_a_refused_message_when_dead_lettered_should_say_where_from_and_why() {
        let topic = TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        };
        let original = vec![("trace".into(), HeaderValue::from("abc"))];
        let dead = message(
            &failure(),
            Some(7),
            original,
            Bytes::from_static(b"{}"),
            Some(Origin::at(&topic, 2, 41)),
        );
        let context = Context::of(&dead.headers);
        assert_eq!(
            context,
            Context {
                connector_key: Some("out".into()),
                error: Some("400 Bad Request".into()),
                class: Some("rejected".into()),
                stage: Some("write".into()),
                attempts: 1,
                origin: Some(topic),
                partition_id: Some(2),
                offset: Some(41),
            }
        );
        assert!(header(&dead.headers, HEADER_TIME).is_some());
        assert_eq!(
            header(&dead.headers, HEADER_CONNECTOR_TYPE).map(ToString::to_string),
            Some("sink".into())
        );
        assert_eq!(replay_headers(&dead.headers).len(), 2);
    }

    #[test]
    fn given_a_replayed_message_when_dead_lettered_again_should_count_the_attempt() {
        let first = message(&failure(), None, Headers::new(), Bytes::new(), None);
        let again = message(
            &failure(),
            None,
            replay_headers(&first.headers),
            Bytes::new(),
            None,
        );
        assert_eq!(Context::of(&again.headers).attempts, 2);
    }
}
