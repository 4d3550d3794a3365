//! Which dead letters of a connector were replayed: ranges of offsets of its
//! dead-letter topic's partition, kept in the runtime's state store under
//! `dlq_replay.{type}.{key}` (beside the sources' own states) so a second
//! replay does not deliver them again and the list marks them.
//!
//! A range set rather than a cursor: a replay with a filter takes some dead
//! letters of a range and leaves the others, which a later replay may take.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::ConnectorConfig;
use crate::message::TopicRef;
use crate::state::{StateError, StateStore, StoredState};

/// The name the record is stored under, in place of a connector's.
const WRITER: &str = "iggy-connect-dlq-replay";

/// One partition's replayed offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayRecord {
    /// Inclusive ranges, sorted, disjoint and not adjacent.
    ranges: Vec<(u64, u64)>,
}

/// Every record of a connector: one per dead-letter topic partition
/// (`stream/topic/partition`), so a changed `[dead_letter]` starts afresh.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    partitions: BTreeMap<String, ReplayRecord>,
}

pub struct ReplayLog {
    store: Arc<dyn StateStore>,
    key: String,
    partition: String,
}

impl ReplayLog {
    pub fn new(
        store: Arc<dyn StateStore>,
        config: &ConnectorConfig,
        topic: &TopicRef,
        partition_id: u32,
    ) -> Self {
        Self {
            store,
            key: format!("dlq_replay.{}.{}", config.kind, config.key),
            partition: format!("{}/{}/{partition_id}", topic.stream, topic.topic),
        }
    }

    pub async fn load(&self) -> Result<ReplayRecord, StateError> {
        Ok(self
            .load_all()
            .await?
            .partitions
            .remove(&self.partition)
            .unwrap_or_default())
    }

    pub async fn save(&self, record: &ReplayRecord) -> Result<(), StateError> {
        let mut stored = self.load_all().await?;
        stored
            .partitions
            .insert(self.partition.clone(), record.clone());
        let data = serde_json::to_vec(&stored).map_err(|error| {
            StateError::Unavailable(format!("encoding the replay record: {error}"))
        })?;
        let state = StoredState {
            connector: WRITER.to_owned(),
            data,
        };
        self.store.save(&self.key, &state).await
    }

    async fn load_all(&self) -> Result<Stored, StateError> {
        let Some(stored) = self.store.load(&self.key).await? else {
            return Ok(Stored::default());
        };
        // A record this build cannot read only means replays may repeat.
        Ok(serde_json::from_slice(&stored.data).unwrap_or_else(|error| {
            tracing::warn!(key = %self.key, %error, "unreadable dead-letter replay record; starting a new one");
            Stored::default()
        }))
    }
}

impl ReplayRecord {
    pub fn contains(&self, offset: u64) -> bool {
        let index = self.ranges.partition_point(|(_, end)| *end < offset);
        self.ranges
            .get(index)
            .is_some_and(|(start, _)| *start <= offset)
    }

    /// Adds offsets (in any order).
    pub fn add(&mut self, offsets: &[u64]) {
        self.ranges
            .extend(offsets.iter().map(|offset| (*offset, *offset)));
        self.ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len());
        for (start, end) in self.ranges.drain(..) {
            match merged.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        self.ranges = merged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_offsets_added_out_of_order_should_merge_into_ranges_and_answer_contains() {
        let mut record = ReplayRecord::default();
        record.add(&[5, 3, 4, 9]);
        record.add(&[10, 4, 1]);
        assert_eq!(record.ranges, vec![(1, 1), (3, 5), (9, 10)]);
        assert!(record.contains(4) && record.contains(10) && record.contains(1));
        assert!(!record.contains(2) && !record.contains(6) && !record.contains(11));
    }
}
