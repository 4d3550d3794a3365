//! A registered sink built straight from its `plugin_config`, for tests that
//! drive one without the engine.

use iggy_connect::connectors::{Registry, Sink};
use iggy_connect::message::TopicRef;
use serde_json::Value;

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
