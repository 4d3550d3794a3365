//! A connector's dead letters: read back from its dead-letter topic, and
//! replayed, to the sink (a fresh instance of it, through the engine's own
//! decode, transform, write and `on_error`) or to the topic each came from.
//!
//! `replay.rs` delivers them. What a replay delivered is recorded in the
//! runtime's state store (see [`super::replay_log`]), so a second replay
//! skips it unless asked `again`.
//! A dead letter counts as replayed once it is durable again: written by
//! the sink (its "offset" committed by the engine) or acknowledged by the bus.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::info;

use super::Runtime;
use super::prepared::SetupError;
use super::replay_log::ReplayLog;
use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::ConnectorKind;
use crate::engine::dead_letter::{self, Context};
use crate::iggy::BusError;
use crate::message::{ConsumedMessage, Headers, TopicRef};
use crate::state::StateError;

/// Messages read from the dead-letter topic per request to the bus.
const READ_CHUNK: u32 = 500;
/// The most dead-letter messages one list or replay request looks at.
pub const SCAN_LIMIT: usize = 10_000;

/// One dead letter of a connector.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub partition_id: u32,
    pub offset: u64,
    /// When the dead-letter topic stored it, microseconds since the epoch.
    pub timestamp: u64,
    pub headers: Headers,
    pub payload: Bytes,
    pub context: Context,
    /// A replay delivered it already.
    pub replayed: bool,
    pub(super) id: u128,
    pub(super) origin_timestamp: u64,
    pub(super) checksum: u64,
}

/// A page of a connector's dead letters.
#[derive(Debug, Clone)]
pub struct DeadLetterPage {
    pub topic: TopicRef,
    pub partition_id: u32,
    pub dead_letters: Vec<DeadLetter>,
    /// The offset to read on from; `None` when the topic's end was reached.
    pub next: Option<u64>,
}

/// Which dead letters a replay takes: the connector's, in
/// `partition_id` from `from` to `to` (inclusive), matching the filters, at
/// most `count`; those replayed before only with `again`.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub partition_id: u32,
    pub from: u64,
    pub to: Option<u64>,
    pub count: Option<usize>,
    /// `iggy_connect_error_class`, e.g. `rejected`.
    pub error_class: Option<String>,
    /// `iggy_connect_error_stage`, e.g. `write`.
    pub stage: Option<String>,
    pub again: bool,
}

/// Where a replay delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    /// A fresh instance of the sink, through its schema, transforms and
    /// `on_error` (sinks only).
    Sink,
    /// Back to the topic each dead letter came from (a sink's origin topic,
    /// read again by every consumer of it; the topic a source's record was
    /// meant for).
    Origin,
}

impl std::str::FromStr for ReplayTarget {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "sink" => Ok(ReplayTarget::Sink),
            "origin" => Ok(ReplayTarget::Origin),
            other => Err(format!(
                "unknown target \"{other}\": expected sink or origin"
            )),
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayReport {
    pub target: &'static str,
    /// Dead letters the selection took.
    pub selected: usize,
    /// Of them, delivered and recorded as replayed.
    pub replayed: usize,
    /// Dead-letter offsets replayed.
    pub offsets: Vec<u64>,
    /// Matching dead letters left out because a replay delivered them before.
    pub skipped_replayed: usize,
    /// Selected, but without an origin this target can deliver to.
    pub unroutable: usize,
    /// Where a next replay would go on from when this one stopped early
    /// (the request's limits, or a dead letter that must wait for a next
    /// replay to keep each origin partition in offset order).
    pub next: Option<u64>,
    /// Why the replay ended before delivering everything it selected.
    pub stopped: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("no {kind} with key \"{key}\"")]
    NotFound { kind: ConnectorKind, key: String },
    #[error("the {kind} \"{key}\" has no [dead_letter] topic")]
    NoDeadLetterTopic { kind: ConnectorKind, key: String },
    #[error("{0}")]
    Refused(String),
    #[error("a replay of \"{0}\" is running")]
    Busy(String),
    #[error("{0}")]
    Bus(#[from] BusError),
    #[error("replay record: {0}")]
    State(#[from] StateError),
    #[error("cannot start the replay: {0}")]
    Setup(String),
}

impl From<SetupError> for DlqError {
    fn from(error: SetupError) -> Self {
        DlqError::Setup(error.to_string())
    }
}

impl Runtime {
    /// Up to `limit` dead letters of the connector, in `partition_id` of its
    /// dead-letter topic from offset `from` on (looking at most at
    /// [`SCAN_LIMIT`] messages of the topic).
    pub async fn dead_letters(
        &self,
        kind: ConnectorKind,
        key: &str,
        partition_id: u32,
        from: u64,
        limit: usize,
    ) -> Result<DeadLetterPage, DlqError> {
        let config = self.config_of(kind, key)?;
        let topic = dead_letter_topic(&config)?;
        let log = ReplayLog::new(self.state.clone(), &config, &topic, partition_id);
        let record = log.load().await?;
        let (dead_letters, next) = self
            .scan(&config, &topic, partition_id, (from, None), limit, |_| true)
            .await?;
        let dead_letters = dead_letters
            .into_iter()
            .map(|mut dead| {
                dead.replayed = record.contains(dead.offset);
                dead
            })
            .collect();
        Ok(DeadLetterPage {
            topic,
            partition_id,
            dead_letters,
            next,
        })
    }

    /// Replays the selected dead letters of a connector to `target`, and
    /// records what it delivered. Waits until they are delivered or
    /// `timeout` passed (then what was delivered so far is recorded).
    pub async fn replay_dead_letters(
        &self,
        kind: ConnectorKind,
        key: &str,
        selection: &Selection,
        target: ReplayTarget,
        timeout: Duration,
    ) -> Result<ReplayReport, DlqError> {
        let config = self.config_of(kind, key)?;
        let topic = dead_letter_topic(&config)?;
        if target == ReplayTarget::Sink && kind == ConnectorKind::Source {
            return Err(DlqError::Refused(
                "a source's dead letters replay to their origin topic: use target=origin".into(),
            ));
        }
        // One replay of a connector at a time, and none while it is started,
        // stopped or reloaded.
        let lock = self.lifecycle_lock(kind, key);
        let Ok(_guard) = lock.try_lock() else {
            return Err(DlqError::Busy(key.to_owned()));
        };
        let log = ReplayLog::new(self.state.clone(), &config, &topic, selection.partition_id);
        let mut record = log.load().await?;
        let limit = selection.count.unwrap_or(SCAN_LIMIT).min(SCAN_LIMIT);
        let mut skipped_replayed = 0;
        let (mut chosen, mut next) = self
            .scan(
                &config,
                &topic,
                selection.partition_id,
                (selection.from, selection.to),
                limit,
                |dead| {
                    if !selection.matches(dead) {
                        return false;
                    }
                    let replayed = record.contains(dead.offset);
                    skipped_replayed += usize::from(replayed);
                    !replayed || selection.again
                },
            )
            .await?;
        let selected = chosen.len();
        let (positions, unroutable) = routable(&config, target, &mut chosen);
        if target == ReplayTarget::Sink
            && let Some(cut) = first_out_of_order(&positions)
        {
            next = Some(chosen[cut].offset);
            chosen.truncate(cut);
        }
        let outcome = match target {
            ReplayTarget::Sink => self.replay_to_sink(&config, chosen, timeout).await?,
            ReplayTarget::Origin => self.replay_to_origin(chosen).await,
        };
        record.add(&outcome.delivered);
        log.save(&record).await?;
        metrics::counter!(
            "iggy_connector_dead_letters_replayed_total",
            "connector_key" => key.to_owned(),
            "connector_type" => kind.to_string(),
        )
        .increment(outcome.delivered.len() as u64);
        info!(connector_key = %key, replayed = outcome.delivered.len(), selected, "dead letters replayed");
        Ok(ReplayReport {
            target: match target {
                ReplayTarget::Sink => "sink",
                ReplayTarget::Origin => "origin",
            },
            selected,
            replayed: outcome.delivered.len(),
            offsets: outcome.delivered,
            skipped_replayed: if selection.again { 0 } else { skipped_replayed },
            unroutable,
            next,
            stopped: outcome.stopped,
        })
    }

    fn config_of(&self, kind: ConnectorKind, key: &str) -> Result<Arc<ConnectorConfig>, DlqError> {
        self.view(kind, key)
            .map(|view| view.config)
            .map_err(|_| DlqError::NotFound {
                kind,
                key: key.to_owned(),
            })
    }

    /// The connector's dead letters from `from` on (to `until`, inclusive)
    /// that `keep` takes, at most `limit`, and the offset to go on from when
    /// the scan stopped before the end.
    async fn scan(
        &self,
        config: &ConnectorConfig,
        topic: &TopicRef,
        partition_id: u32,
        (from, until): (u64, Option<u64>),
        limit: usize,
        mut keep: impl FnMut(&DeadLetter) -> bool,
    ) -> Result<(Vec<DeadLetter>, Option<u64>), DlqError> {
        let mut found = Vec::new();
        let mut position = from;
        let mut scanned = 0;
        while found.len() < limit && scanned < SCAN_LIMIT {
            let chunk = self
                .bus
                .read(
                    &topic.stream,
                    &topic.topic,
                    partition_id,
                    position,
                    READ_CHUNK,
                )
                .await?;
            let at_end = chunk.len() < READ_CHUNK as usize;
            for message in chunk {
                if until.is_some_and(|until| message.offset > until) {
                    return Ok((found, None));
                }
                scanned += 1;
                position = message.offset + 1;
                let dead = DeadLetter::from(message);
                let ours = dead.context.connector_key.as_deref() == Some(config.key.as_str())
                    && dead
                        .headers
                        .iter()
                        .find(|(name, _)| name == dead_letter::HEADER_CONNECTOR_TYPE)
                        .is_none_or(|(_, value)| value.to_string() == config.kind.to_string());
                if ours && keep(&dead) {
                    found.push(dead);
                    if found.len() == limit {
                        return Ok((found, Some(position)));
                    }
                }
            }
            if at_end {
                return Ok((found, None));
            }
        }
        Ok((found, Some(position)))
    }
}

impl Selection {
    fn matches(&self, dead: &DeadLetter) -> bool {
        let wanted = |filter: &Option<String>, value: &Option<String>| {
            filter
                .as_ref()
                .is_none_or(|filter| value.as_deref() == Some(filter.as_str()))
        };
        wanted(&self.error_class, &dead.context.class) && wanted(&self.stage, &dead.context.stage)
    }
}

impl From<ConsumedMessage> for DeadLetter {
    fn from(message: ConsumedMessage) -> Self {
        Self {
            context: Context::of(&message.headers),
            partition_id: message.partition_id,
            offset: message.offset,
            timestamp: message.timestamp,
            headers: message.headers,
            payload: message.payload,
            replayed: false,
            id: message.id,
            origin_timestamp: message.origin_timestamp,
            checksum: message.checksum,
        }
    }
}

fn dead_letter_topic(config: &ConnectorConfig) -> Result<TopicRef, DlqError> {
    config
        .dead_letter
        .as_ref()
        .map(|target| TopicRef {
            stream: target.stream.clone(),
            topic: target.topic.clone(),
        })
        .ok_or_else(|| DlqError::NoDeadLetterTopic {
            kind: config.kind,
            key: config.key.clone(),
        })
}

/// Keeps the dead letters `target` can deliver (in `chosen`, in order) and
/// counts the others: a sink replay needs an origin topic the sink reads, at
/// a known partition and offset; an origin replay needs an origin topic.
fn routable(
    config: &ConnectorConfig,
    target: ReplayTarget,
    chosen: &mut Vec<DeadLetter>,
) -> (Vec<(u32, u64, TopicRef)>, usize) {
    let before = chosen.len();
    chosen.retain(|dead| {
        let Some(origin) = &dead.context.origin else {
            return false;
        };
        match (target, &config.kind_config) {
            (ReplayTarget::Origin, _) => true,
            (ReplayTarget::Sink, KindConfig::Sink { streams, .. }) => {
                dead.context.partition_id.is_some()
                    && dead.context.offset.is_some()
                    && streams.iter().any(|entry| {
                        entry.stream == origin.stream && entry.topics.contains(&origin.topic)
                    })
            }
            (ReplayTarget::Sink, _) => false,
        }
    });
    let positions = chosen
        .iter()
        .filter_map(|dead| {
            let origin = dead.context.origin.clone()?;
            Some((
                dead.context.partition_id.unwrap_or(0),
                dead.context.offset.unwrap_or(0),
                origin,
            ))
        })
        .collect();
    (positions, before - chosen.len())
}

/// The first dead letter whose origin offset is not past the one before it
/// in its origin partition: the engine reads each partition in offset order,
/// so it waits for a next replay.
fn first_out_of_order(positions: &[(u32, u64, TopicRef)]) -> Option<usize> {
    let mut last: HashMap<(&TopicRef, u32), u64> = HashMap::new();
    positions.iter().position(|(partition_id, offset, topic)| {
        match last.insert((topic, *partition_id), *offset) {
            Some(before) => *offset <= before,
            None => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(partition_id: u32, offset: u64) -> (u32, u64, TopicRef) {
        let topic = TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        };
        (partition_id, offset, topic)
    }

    #[test]
    fn given_an_origin_offset_seen_before_in_its_partition_should_cut_the_replay_there() {
        let positions = [
            position(0, 5),
            position(1, 2),
            position(0, 9),
            position(0, 7),
        ];
        assert_eq!(first_out_of_order(&positions), Some(3));
        assert_eq!(first_out_of_order(&positions[..3]), None);
    }
}
