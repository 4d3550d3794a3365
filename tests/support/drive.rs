//! Driving a source directly through the `Source` interface, for tests that
//! must stop between two batches (a batch polled and never committed, a
//! state taken mid-way).

use std::time::Duration;

use iggy_connect::connectors::{Registry, Source};
use serde_json::Value;

/// The registered source `name` built from `config`.
pub fn build(name: &str, config: Value) -> Box<dyn Source> {
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == name)
        .unwrap_or_else(|| panic!("no source {name} in this build"));
    (entry.build)(&config).unwrap()
}

/// Polls and commits until `done` holds for the JSON payloads produced so
/// far (within `wait`), waiting until a batch's `next_poll` as the engine
/// does; returns the last state a batch carried.
pub async fn drain(
    source: &dyn Source,
    payloads: &mut Vec<Value>,
    wait: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut state = None;
    while !done(payloads) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {} payloads",
            payloads.len()
        );
        let batch = source.poll().await.unwrap();
        payloads.extend(
            batch
                .records
                .iter()
                .map(|record| serde_json::from_slice(&record.payload.to_bytes()).unwrap()),
        );
        if batch.state.is_some() {
            state = batch.state;
        }
        source.commit().await.unwrap();
        // As the engine does: a caught-up source is polled again no sooner.
        if let Some(due) = batch.next_poll {
            tokio::time::sleep_until(due.min(deadline)).await;
        }
    }
    state
}
