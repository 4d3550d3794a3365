//! How far a connector is behind: a sink behind its Iggy topics, a source
//! behind its backend. Measured every few seconds off the hot path (a sink's
//! consumer watcher, a source's [`LagProbe`](crate::connectors::LagProbe)),
//! kept here for the status answer and exported as Prometheus gauges by the
//! same code that measures it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// A connector's lag, as the status answer shows it (`"lag"`): each field is
/// `None` when the connector cannot say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Lag {
    /// Messages (a sink: past its group's stored offsets; a source: records
    /// the backend has that the source has not committed).
    pub messages: Option<u64>,
    /// Bytes the source is behind its backend (a WAL or binlog position).
    pub bytes: Option<u64>,
    /// Age of the oldest message not committed yet, in milliseconds.
    pub oldest_age_ms: Option<u64>,
    /// A sink's Iggy partitions; empty for sources.
    pub partitions: Vec<PartitionLag>,
}

/// One Iggy partition a sink reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionLag {
    pub stream: String,
    pub topic: String,
    pub partition: u32,
    /// Messages past the group's stored offset.
    pub messages: u64,
    /// Age of the first message past the stored offset, in milliseconds;
    /// `None` when nothing waits.
    pub oldest_age_ms: Option<u64>,
}

/// What a source's [`LagProbe`](crate::connectors::LagProbe) measures: each
/// figure `None` where the backend cannot say it cheaply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceLag {
    /// Records the backend has that the source has not committed.
    pub messages: Option<u64>,
    /// Bytes between the backend's position and the source's committed one.
    pub bytes: Option<u64>,
    /// Age of the oldest record not committed yet, in milliseconds.
    pub oldest_age_ms: Option<u64>,
    /// Per partition of the backend, where it has partitions (Kafka).
    pub partitions: Vec<BackendPartitionLag>,
}

/// One partition of a source's backend (a Kafka topic's partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendPartitionLag {
    pub topic: String,
    pub partition: i32,
    pub messages: u64,
}

impl From<&SourceLag> for Lag {
    /// The status answer's partitions are Iggy's: a backend's are left to
    /// the metrics.
    fn from(lag: &SourceLag) -> Self {
        Lag {
            messages: lag.messages,
            bytes: lag.bytes,
            oldest_age_ms: lag.oldest_age_ms,
            partitions: Vec::new(),
        }
    }
}

/// The latest measurement of one connector, shared by what measures it and the
/// API. A sink's topics are measured each by its own consumer, so the cell
/// keeps them apart and sums them when read.
#[derive(Debug, Clone, Default)]
pub struct LagCell(Arc<Mutex<Measured>>);

#[derive(Debug, Default)]
struct Measured {
    /// A sink's partitions by `(stream, topic)`.
    topics: BTreeMap<(String, String), Vec<PartitionLag>>,
    /// A source's own figures.
    source: Option<Lag>,
}

impl LagCell {
    /// Replaces one topic's partitions (a sink's consumer of that topic).
    pub fn set_topic(&self, stream: &str, topic: &str, partitions: Vec<PartitionLag>) {
        self.lock()
            .topics
            .insert((stream.to_owned(), topic.to_owned()), partitions);
    }

    /// Replaces a source's measurement.
    pub fn set_source(&self, lag: Lag) {
        self.lock().source = Some(lag);
    }

    /// Forgets every measurement (a connector starting again, perhaps on
    /// other topics).
    pub fn clear(&self) {
        let mut measured = self.lock();
        measured.topics.clear();
        measured.source = None;
    }

    /// The latest measurement; `None` before the first one.
    pub fn get(&self) -> Option<Lag> {
        let measured = self.lock();
        if let Some(source) = &measured.source {
            return Some(source.clone());
        }
        if measured.topics.is_empty() {
            return None;
        }
        let partitions: Vec<PartitionLag> = measured.topics.values().flatten().cloned().collect();
        Some(Lag {
            messages: Some(partitions.iter().map(|partition| partition.messages).sum()),
            bytes: None,
            oldest_age_ms: partitions
                .iter()
                .filter_map(|partition| partition.oldest_age_ms)
                .max(),
            partitions,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Measured> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(topic: &str, partition: u32, messages: u64, age: Option<u64>) -> PartitionLag {
        PartitionLag {
            stream: "s".into(),
            topic: topic.into(),
            partition,
            messages,
            oldest_age_ms: age,
        }
    }

    #[test]
    fn given_nothing_measured_when_read_should_be_unknown() {
        assert_eq!(LagCell::default().get(), None);
    }

    #[test]
    fn given_two_topics_when_read_should_sum_messages_and_take_the_oldest_age() {
        let cell = LagCell::default();
        cell.set_topic(
            "s",
            "a",
            vec![partition("a", 0, 3, Some(40)), partition("a", 1, 0, None)],
        );
        cell.set_topic("s", "b", vec![partition("b", 0, 2, Some(90))]);
        cell.set_topic(
            "s",
            "a",
            vec![partition("a", 0, 4, Some(50)), partition("a", 1, 0, None)],
        );
        let lag = cell.get().unwrap();
        assert_eq!(lag.messages, Some(6));
        assert_eq!(lag.oldest_age_ms, Some(90));
        assert_eq!(lag.bytes, None);
        assert_eq!(lag.partitions.len(), 3);
    }
}
