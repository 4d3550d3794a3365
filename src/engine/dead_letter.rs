//! Messages sent to a dead-letter topic carry the original payload and headers
//! plus headers that say where and why they failed.

use bytes::Bytes;

use crate::message::{HeaderValue, Headers, OutgoingMessage};

pub const HEADER_ERROR: &str = "iggy_connect_error";
pub const HEADER_STAGE: &str = "iggy_connect_error_stage";
pub const HEADER_CONNECTOR: &str = "iggy_connect_connector_key";
pub const HEADER_ORIGIN_STREAM: &str = "iggy_connect_origin_stream";
pub const HEADER_ORIGIN_TOPIC: &str = "iggy_connect_origin_topic";
pub const HEADER_ORIGIN_PARTITION: &str = "iggy_connect_origin_partition";
pub const HEADER_ORIGIN_OFFSET: &str = "iggy_connect_origin_offset";

/// Where a dead-lettered message was read from (sinks only).
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub stream: &'a str,
    pub topic: &'a str,
    pub partition_id: u32,
    pub offset: u64,
}

/// Builds the dead-letter message for a failed message.
pub fn message(
    connector_key: &str,
    stage: &str,
    error: &str,
    id: Option<u128>,
    mut headers: Headers,
    payload: Bytes,
    origin: Option<Origin<'_>>,
) -> OutgoingMessage {
    let mut set = |key: &str, value: HeaderValue| {
        headers.retain(|(existing, _)| existing != key);
        headers.push((key.to_owned(), value));
    };
    set(HEADER_ERROR, error.into());
    set(HEADER_STAGE, stage.into());
    set(HEADER_CONNECTOR, connector_key.into());
    if let Some(origin) = origin {
        set(HEADER_ORIGIN_STREAM, origin.stream.into());
        set(HEADER_ORIGIN_TOPIC, origin.topic.into());
        set(
            HEADER_ORIGIN_PARTITION,
            HeaderValue::UInt(u64::from(origin.partition_id)),
        );
        set(HEADER_ORIGIN_OFFSET, HeaderValue::UInt(origin.offset));
    }
    OutgoingMessage::new(id, headers, payload)
}
