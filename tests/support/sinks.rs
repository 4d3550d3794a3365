//! A registered sink built straight from its `plugin_config`, for tests that
//! drive one without the engine.

use std::collections::BTreeMap;

use iggy_connect::connectors::{Registry, Sink, SinkError};
use iggy_connect::message::{Headers, Payload, SinkMessage, TopicRef};
use serde_json::{Value, json};

/// The sink registered as `name`, built from `config` (which must be valid).
pub fn build(name: &str, config: &Value) -> Box<dyn Sink> {
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == name)
        .unwrap_or_else(|| panic!("no sink {name} in this build"));
    (entry.build)(config).expect("a valid config")
}

/// The same, opened.
pub async fn open(name: &str, config: &Value) -> Box<dyn Sink> {
    let mut sink = build(name, config);
    sink.open().await.expect("open");
    sink
}

/// The indexes a failed write reports stored and refused, each sorted:
/// `Rejected` stores nothing, `Partial` says both, anything else neither.
pub fn durable_and_rejected(error: &SinkError) -> (Vec<usize>, Vec<usize>) {
    let (mut durable, rejected) = match error {
        SinkError::Rejected(rejected) => (Vec::new(), rejected.as_slice()),
        SinkError::Partial(partial) => (partial.durable.clone(), partial.rejected.as_slice()),
        _ => (Vec::new(), &[][..]),
    };
    let mut rejected: Vec<usize> = rejected.iter().map(|rejection| rejection.index).collect();
    durable.sort();
    rejected.sort();
    (durable, rejected)
}

/// How the messages a failed write neither stored nor refused failed.
pub fn rest(error: &SinkError) -> &SinkError {
    match error {
        SinkError::Partial(partial) => &partial.rest,
        other => other,
    }
}

/// The topic the tests' messages come from.
pub fn topic() -> TopicRef {
    TopicRef {
        stream: "s".into(),
        topic: "t".into(),
    }
}

/// Sends `payloads` to `stream`/`topic` on the in-memory bus (one
/// partition) as one batch, with message ids counting up from `first_id`.
pub async fn send<P: Into<bytes::Bytes>>(
    bus: &iggy_connect::iggy::MemoryBus,
    stream: &str,
    topic: &str,
    first_id: u128,
    payloads: impl IntoIterator<Item = P>,
) {
    use iggy_connect::iggy::{Bus, ProducerTarget};
    let producer = bus
        .producer(&ProducerTarget {
            stream: stream.into(),
            topic: topic.into(),
            partitions: 1,
            batch_length: 1000,
            linger_time: std::time::Duration::ZERO,
        })
        .await
        .expect("an in-memory producer");
    let messages: Vec<iggy_connect::message::OutgoingMessage> = payloads
        .into_iter()
        .zip(first_id..)
        .map(|(payload, id)| iggy_connect::message::OutgoingMessage {
            id: Some(id),
            headers: Vec::new(),
            payload: payload.into(),
            partition: None,
            origin_timestamp: None,
        })
        .collect();
    producer
        .send(&messages)
        .await
        .expect("the in-memory bus takes the batch");
}

/// A message at `offset` of partition 0 with a JSON `payload` (id offset + 1).
pub fn message(offset: u64, payload: &str) -> SinkMessage {
    SinkMessage {
        id: u128::from(offset) + 1,
        offset,
        partition_id: 0,
        timestamp: 1,
        origin_timestamp: 1,
        checksum: 0,
        headers: Headers::default(),
        payload: Payload::JsonBytes(bytes::Bytes::from(payload.to_owned())),
    }
}

/// `{"n": offset + 1}` messages at `offsets`.
pub fn ns_messages(offsets: std::ops::Range<u64>) -> Vec<SinkMessage> {
    offsets
        .map(|offset| message(offset, &json!({"n": offset + 1}).to_string()))
        .collect()
}

/// The `n` of every row, sorted, checked to appear once each.
pub fn ns_once(rows: &[Value]) -> Vec<u64> {
    let mut seen = BTreeMap::new();
    for row in rows {
        let n = row["n"].as_u64().expect("a row with a number n");
        *seen.entry(n).or_insert(0) += 1;
    }
    let repeated: Vec<_> = seen.iter().filter(|(_, count)| **count > 1).collect();
    assert!(repeated.is_empty(), "rows repeated: {repeated:?}");
    seen.into_keys().collect()
}
