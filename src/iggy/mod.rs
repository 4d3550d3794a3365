//! The engine's narrow view of the message bus (Apache Iggy), and its
//! implementations. This module is the only code that names the `iggy` crate.

pub mod bus;
pub mod connection;
mod consumer;
mod group_lag;
mod headers;
pub mod memory;
mod producer;
mod reader;
pub mod settings;
mod tls;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::connectors::Degraded;
use crate::lag::LagCell;
use crate::message::{ConsumedMessage, OutgoingMessage};

pub use bus::IggyBus;
pub use connection::ConnectionSettings;
pub use memory::MemoryBus;

/// The message bus as the engine uses it.
#[async_trait]
pub trait Bus: Send + Sync {
    /// Makes sure the target stream and topic exist (creating them when missing)
    /// and returns a producer for that topic.
    async fn producer(&self, target: &ProducerTarget) -> Result<Box<dyn Producer>, BusError>;

    /// Joins (creating when missing) the consumer group on one topic and returns
    /// a consumer that resumes after the group's last committed offsets.
    async fn consumer(&self, spec: &ConsumerSpec) -> Result<Box<dyn Consumer>, BusError>;

    /// Moves the consumer group's position on every partition of the spec's
    /// topic (for a stopped sink: it resumes from there). Checks every
    /// requested partition before it changes any.
    async fn reset_offsets(
        &self,
        spec: &ConsumerSpec,
        to: &OffsetReset,
    ) -> Result<Vec<OffsetMove>, BusError>;

    /// Up to `count` messages of one partition, from offset `from` on, read
    /// without a consumer group and storing nothing (the dead-letter list
    /// and replay). A topic or partition that does not exist reads as empty.
    async fn read(
        &self,
        stream: &str,
        topic: &str,
        partition_id: u32,
        from: u64,
        count: u32,
    ) -> Result<Vec<ConsumedMessage>, BusError>;

    /// Whether the broker answers now (`/health` asks; the caller bounds
    /// the wait).
    async fn ping(&self) -> Result<(), BusError> {
        Ok(())
    }

    /// Measures the spec's group on its topic without joining it (a stopped
    /// sink), as a running consumer's watcher does: into `spec.lag` and the
    /// lag gauges. A bus that cannot say leaves the last measurement.
    async fn measure_lag(&self, _spec: &ConsumerSpec) -> Result<(), BusError> {
        Ok(())
    }
}

/// Where [`Bus::reset_offsets`] moves a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetReset {
    /// Before the first message: everything is read again.
    Earliest,
    /// After the last message: only new messages are read.
    Latest,
    /// Before the first message stamped at or after this time (microseconds
    /// since the epoch); after the last one when none is.
    Timestamp(u64),
    /// The next offset to read, per partition (past the end: the end);
    /// partitions not named keep their position.
    Offsets(std::collections::BTreeMap<u32, u64>),
}

/// One partition's move: the next offset the group reads, before and after.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OffsetMove {
    pub partition_id: u32,
    pub before: u64,
    pub after: u64,
}

impl OffsetReset {
    /// The next offset to read on a partition whose next offset is `before`
    /// and whose next message gets `end`; `first_at` finds the first offset
    /// stamped at or after a time.
    fn target(&self, partition_id: u32, before: u64, end: u64, first_at: Option<u64>) -> u64 {
        match self {
            OffsetReset::Earliest => 0,
            OffsetReset::Latest => end,
            OffsetReset::Timestamp(_) => first_at.unwrap_or(end),
            OffsetReset::Offsets(offsets) => offsets
                .get(&partition_id)
                .map_or(before, |&next| next.min(end)),
        }
    }

    /// Refuses partitions the topic does not have.
    fn check(&self, partitions: &[u32]) -> Result<(), String> {
        let OffsetReset::Offsets(offsets) = self else {
            return Ok(());
        };
        match offsets.keys().find(|id| !partitions.contains(id)) {
            Some(id) => Err(format!(
                "the topic has no partition {id} (its partitions: {partitions:?})"
            )),
            None => Ok(()),
        }
    }
}

/// Messages made ready for a send ahead of it ([`Producer::prepare`]).
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    pub messages: Vec<OutgoingMessage>,
    /// The requests the producer encoded for `messages`; empty when it
    /// encodes them at the send.
    requests: Vec<Bytes>,
}

impl From<Vec<OutgoingMessage>> for Prepared {
    fn from(messages: Vec<OutgoingMessage>) -> Self {
        Self {
            messages,
            requests: Vec::new(),
        }
    }
}

/// Sends batches to one topic.
#[async_trait]
pub trait Producer: Send + Sync {
    /// Sends every message; `Ok` only once the bus acknowledged all of them.
    /// After an error some of them may be stored; the caller retries the whole
    /// slice (at-least-once).
    async fn send(&self, messages: &[OutgoingMessage]) -> Result<(), BusError>;

    /// Does what a send of `messages` needs before it talks to the bus
    /// (encoding its requests), so that a pipeline can do it while the send
    /// before it waits for its answer. Sent with [`Producer::send_prepared`],
    /// as often as it takes: the same requests each time.
    fn prepare(&self, messages: Vec<OutgoingMessage>) -> Prepared {
        Prepared::from(messages)
    }

    /// [`Producer::send`] of what [`Producer::prepare`] made ready.
    async fn send_prepared(&self, prepared: &Prepared) -> Result<(), BusError> {
        self.send(&prepared.messages).await
    }

    /// Whether the bus can ever store this message (size limits, header rules).
    /// A message it cannot is a per-message error, not a failed send.
    fn check(&self, message: &OutgoingMessage) -> Result<(), String> {
        let _ = message;
        Ok(())
    }

    /// Whether this producer created its topic with a durability that
    /// acknowledges messages before they are on disk.
    fn created_volatile_topic(&self) -> bool {
        false
    }
}

/// Reads one topic through a consumer group. Offsets move only on `commit`.
#[async_trait]
pub trait Consumer: Send {
    /// Waits for the next non-empty batch (messages of one partition, in offset
    /// order), read after the last batch polled, committed or not. Cancel-safe.
    async fn poll(&mut self) -> Result<ConsumedBatch, BusError>;

    /// One poll that does not wait for messages: the next batch if one is
    /// there now, `None` otherwise. Bounded by one request, so the sink
    /// engine can prefetch while it writes and still commit soon after.
    async fn poll_available(&mut self) -> Result<Option<ConsumedBatch>, BusError>;

    /// Stores `offset` (the last message handled) as the group's position in
    /// `partition_id`.
    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError>;

    /// Leaves the group. Commits nothing.
    async fn close(&mut self) -> Result<(), BusError>;
}

/// Where a source's stream entry sends its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerTarget {
    pub stream: String,
    pub topic: String,
    /// Partitions to create the topic with when it does not exist.
    pub partitions: u32,
    /// Most messages per send request.
    pub batch_length: u32,
    pub linger_time: Duration,
}

/// What a sink's consumer reads.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub stream: String,
    pub topic: String,
    pub group: String,
    /// Most messages per poll.
    pub batch_length: u32,
    /// How long to wait after a poll that found nothing (at least 1 ms). A
    /// busy topic is polled again as soon as the previous batch is committed.
    pub poll_interval: Duration,
    /// The sink this consumer feeds: its lag gauge is labelled with the key,
    /// and a stall (messages past the stored offsets, none stored for the
    /// stall timeout) is reported through its degraded flag.
    pub connector_key: String,
    pub degraded: Degraded,
    /// Where the consumer's watcher leaves the lag it measures.
    pub lag: LagCell,
}

/// Messages of one partition, in offset order.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumedBatch {
    pub partition_id: u32,
    pub messages: Vec<ConsumedMessage>,
}

impl ConsumedBatch {
    pub fn last_offset(&self) -> Option<u64> {
        self.messages.last().map(|message| message.offset)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The bus cannot serve this now (unreachable, the topic does not exist
    /// yet); setup is retried.
    #[error("bus unavailable: {0}")]
    Unavailable(String),
    #[error("cannot prepare {stream}/{topic}: {reason}")]
    Setup {
        stream: String,
        topic: String,
        reason: String,
    },
    #[error("send refused: {0}")]
    Send(String),
    #[error("poll failed: {0}")]
    Poll(String),
    #[error("offset commit failed: {0}")]
    Commit(String),
}
