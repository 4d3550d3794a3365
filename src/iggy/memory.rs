//! An in-process bus: topics live in memory and vanish with the process. Used by
//! the one-shot `pipe` command and by the engine's unit tests, which can make it
//! refuse sends or commits on demand.
//!
//! A [`MemoryBus::bounded`] bus (the one `pipe` uses) frees every message that
//! all consumer groups of its topic committed and makes a producer wait while
//! the topic holds `capacity` uncommitted messages, so memory stays flat however
//! many records pass through.

// Its guarded data stays consistent even if a holder panicked: every
// update is a single push, insert or drain.
use crate::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::clock::now_micros;
use crate::iggy::{
    Bus, BusError, ConsumedBatch, Consumer, ConsumerSpec, OffsetMove, OffsetReset, Producer,
    ProducerTarget,
};
use crate::message::{ConsumedMessage, OutgoingMessage};

#[derive(Default, Clone)]
pub struct MemoryBus {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    topics: Mutex<HashMap<(String, String), Arc<Topic>>>,
    refuse_sends: AtomicU32,
    refuse_commits: AtomicU32,
    /// `ping` fails while set.
    unreachable: AtomicBool,
    /// Every send waits this long (milliseconds) before it is stored.
    send_delay_ms: AtomicU64,
    sends: AtomicU64,
    /// Batches consumers were handed.
    polled: AtomicU64,
    /// Every offset commit, in order: (group, partition, offset).
    commits: Mutex<Vec<(String, u32, u64)>>,
    /// `Some`: trim committed messages and hold producers at this many retained.
    capacity: Option<usize>,
}

struct Topic {
    state: Mutex<TopicState>,
    appended: watch::Sender<u64>,
    /// Bumped whenever committed messages were freed.
    trimmed: watch::Sender<u64>,
}

struct TopicState {
    partitions: Vec<Partition>,
    next_partition: usize,
    /// group -> partition -> last committed offset; a group is listed from its
    /// first consumer on, committed or not.
    committed: HashMap<String, HashMap<u32, u64>>,
}

#[derive(Clone, Default)]
struct Partition {
    /// Offset of `messages[0]`: the messages before it were freed.
    base: u64,
    messages: VecDeque<ConsumedMessage>,
}

impl Partition {
    /// The offset the next message gets.
    fn end(&self) -> u64 {
        self.base + self.messages.len() as u64
    }
}

impl TopicState {
    fn retained(&self) -> usize {
        self.partitions.iter().map(|p| p.messages.len()).sum()
    }

    /// The next offset `group` has not committed, on `partition`.
    fn next_uncommitted(&self, group: &str, partition: u32) -> u64 {
        self.committed
            .get(group)
            .and_then(|offsets| offsets.get(&partition))
            .map_or(0, |offset| offset + 1)
    }

    /// Frees what every group committed. Returns whether anything was freed.
    fn trim(&mut self) -> bool {
        if self.committed.is_empty() {
            return false;
        }
        let mut freed = false;
        for index in 0..self.partitions.len() {
            let keep_from = self
                .committed
                .keys()
                .map(|group| self.next_uncommitted(group, index as u32))
                .min()
                .unwrap_or(0);
            let partition = &mut self.partitions[index];
            let drop = keep_from
                .saturating_sub(partition.base)
                .min(partition.messages.len() as u64);
            if drop > 0 {
                partition.messages.drain(..drop as usize);
                partition.base += drop;
                freed = true;
            }
        }
        freed
    }
}

impl MemoryBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// A bus that frees committed messages and makes producers wait while a
    /// topic retains `capacity` uncommitted messages (a bigger batch still
    /// goes in once the topic is empty).
    pub fn bounded(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Shared {
                capacity: Some(capacity.max(1)),
                ..Shared::default()
            }),
        }
    }

    /// Messages the topic still holds (not yet freed).
    pub fn retained(&self, stream: &str, topic: &str) -> usize {
        self.topic(stream, topic)
            .map_or(0, |topic| lock(&topic.state).retained())
    }

    /// Messages stored in the topic that `group` has not committed.
    pub fn undelivered(&self, stream: &str, topic: &str, group: &str) -> u64 {
        let Some(topic) = self.topic(stream, topic) else {
            return 0;
        };
        let state = lock(&topic.state);
        state
            .partitions
            .iter()
            .enumerate()
            .map(|(index, partition)| {
                partition
                    .end()
                    .saturating_sub(state.next_uncommitted(group, index as u32))
            })
            .sum()
    }

    /// The next `count` sends fail without storing anything.
    pub fn refuse_sends(&self, count: u32) {
        self.inner.refuse_sends.store(count, Ordering::SeqCst);
    }

    /// Makes `ping` fail (a broker that does not answer) or answer again.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.inner.unreachable.store(unreachable, Ordering::SeqCst);
    }

    /// The next `count` offset commits fail without storing anything.
    pub fn refuse_commits(&self, count: u32) {
        self.inner.refuse_commits.store(count, Ordering::SeqCst);
    }

    /// Every send waits `delay` before it is stored (a slow broker).
    pub fn delay_sends(&self, delay: std::time::Duration) {
        self.inner
            .send_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Send requests that were accepted so far.
    /// How many batches consumers were handed so far.
    pub fn batches_polled(&self) -> u64 {
        self.inner.polled.load(Ordering::SeqCst)
    }

    /// The offsets `group` committed, in commit order: (partition, offset).
    pub fn commit_log(&self, group: &str) -> Vec<(u32, u64)> {
        lock(&self.inner.commits)
            .iter()
            .filter(|(committer, ..)| committer == group)
            .map(|&(_, partition, offset)| (partition, offset))
            .collect()
    }

    pub fn accepted_sends(&self) -> u64 {
        self.inner.sends.load(Ordering::SeqCst)
    }

    /// Every message of a topic, partition by partition, in offset order.
    pub fn messages(&self, stream: &str, topic: &str) -> Vec<ConsumedMessage> {
        self.topic(stream, topic)
            .map(|topic| {
                lock(&topic.state)
                    .partitions
                    .iter()
                    .flat_map(|partition| partition.messages.iter())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn committed_offset(
        &self,
        stream: &str,
        topic: &str,
        group: &str,
        partition: u32,
    ) -> Option<u64> {
        let topic = self.topic(stream, topic)?;
        let state = lock(&topic.state);
        state.committed.get(group)?.get(&partition).copied()
    }

    /// Whether the group has committed every message stored in the topic.
    pub fn is_drained(&self, stream: &str, topic: &str, group: &str) -> bool {
        let Some(topic) = self.topic(stream, topic) else {
            return true;
        };
        let state = lock(&topic.state);
        state
            .partitions
            .iter()
            .enumerate()
            .all(|(index, partition)| {
                state.next_uncommitted(group, index as u32) >= partition.end()
            })
    }

    fn topic(&self, stream: &str, topic: &str) -> Option<Arc<Topic>> {
        lock(&self.inner.topics)
            .get(&(stream.to_owned(), topic.to_owned()))
            .cloned()
    }

    fn ensure_topic(&self, stream: &str, topic: &str, partitions: u32) -> Arc<Topic> {
        let mut topics = lock(&self.inner.topics);
        topics
            .entry((stream.to_owned(), topic.to_owned()))
            .or_insert_with(|| {
                Arc::new(Topic {
                    state: Mutex::new(TopicState {
                        partitions: vec![Partition::default(); partitions.max(1) as usize],
                        next_partition: 0,
                        committed: HashMap::new(),
                    }),
                    appended: watch::channel(0).0,
                    trimmed: watch::channel(0).0,
                })
            })
            .clone()
    }
}

#[async_trait]
impl Bus for MemoryBus {
    async fn ping(&self) -> Result<(), BusError> {
        match self.inner.unreachable.load(Ordering::SeqCst) {
            true => Err(BusError::Unavailable(
                "the memory bus is set unreachable".into(),
            )),
            false => Ok(()),
        }
    }

    async fn producer(&self, target: &ProducerTarget) -> Result<Box<dyn Producer>, BusError> {
        let topic = self.ensure_topic(&target.stream, &target.topic, target.partitions);
        Ok(Box::new(MemoryProducer {
            shared: self.inner.clone(),
            topic,
        }))
    }

    async fn read(
        &self,
        stream: &str,
        topic: &str,
        partition_id: u32,
        from: u64,
        count: u32,
    ) -> Result<Vec<ConsumedMessage>, BusError> {
        let Some(topic) = self.topic(stream, topic) else {
            return Ok(Vec::new());
        };
        let state = lock(&topic.state);
        let Some(partition) = state.partitions.get(partition_id as usize) else {
            return Ok(Vec::new());
        };
        let skip = from.saturating_sub(partition.base) as usize;
        Ok(partition
            .messages
            .iter()
            .skip(skip)
            .take(count as usize)
            .cloned()
            .collect())
    }

    async fn consumer(&self, spec: &ConsumerSpec) -> Result<Box<dyn Consumer>, BusError> {
        let topic = self.ensure_topic(&spec.stream, &spec.topic, 1);
        let (positions, appended) = {
            let mut state = lock(&topic.state);
            state.committed.entry(spec.group.clone()).or_default();
            let positions = (0..state.partitions.len() as u32)
                .map(|partition| state.next_uncommitted(&spec.group, partition))
                .collect();
            (positions, topic.appended.subscribe())
        };
        Ok(Box::new(MemoryConsumer {
            shared: self.inner.clone(),
            topic,
            group: spec.group.clone(),
            batch_length: spec.batch_length.max(1) as usize,
            positions,
            next_partition: 0,
            appended,
        }))
    }

    async fn reset_offsets(
        &self,
        spec: &ConsumerSpec,
        to: &OffsetReset,
    ) -> Result<Vec<OffsetMove>, BusError> {
        let Some(topic) = self.topic(&spec.stream, &spec.topic) else {
            return Err(BusError::Setup {
                stream: spec.stream.clone(),
                topic: spec.topic.clone(),
                reason: "the topic does not exist".into(),
            });
        };
        let mut state = lock(&topic.state);
        let ids: Vec<u32> = (0..state.partitions.len() as u32).collect();
        to.check(&ids).map_err(|reason| BusError::Setup {
            stream: spec.stream.clone(),
            topic: spec.topic.clone(),
            reason,
        })?;
        let mut moves = Vec::new();
        for partition_id in ids {
            let partition = &state.partitions[partition_id as usize];
            let first_at = match to {
                OffsetReset::Timestamp(micros) => partition
                    .messages
                    .iter()
                    .find(|message| message.timestamp >= *micros)
                    .map(|message| message.offset),
                _ => None,
            };
            let before = state.next_uncommitted(&spec.group, partition_id);
            let after = to.target(partition_id, before, partition.end(), first_at);
            let offsets = state.committed.entry(spec.group.clone()).or_default();
            match after.checked_sub(1) {
                Some(last) => offsets.insert(partition_id, last),
                None => offsets.remove(&partition_id),
            };
            moves.push(OffsetMove {
                partition_id,
                before,
                after,
            });
        }
        Ok(moves)
    }
}

struct MemoryProducer {
    shared: Arc<Shared>,
    topic: Arc<Topic>,
}

impl MemoryProducer {
    /// Stores the batch unless the topic is at capacity.
    fn try_store(&self, messages: &[OutgoingMessage], timestamp: u64) -> bool {
        let mut state = lock(&self.topic.state);
        let retained = state.retained();
        let full = self
            .shared
            .capacity
            .is_some_and(|capacity| retained > 0 && retained + messages.len() > capacity);
        if full {
            return false;
        }
        let partition = state.next_partition % state.partitions.len();
        state.next_partition = state.next_partition.wrapping_add(1);
        let stored = &mut state.partitions[partition];
        stored.messages.reserve(messages.len());
        for message in messages {
            let offset = stored.end();
            stored.messages.push_back(ConsumedMessage {
                id: message.id.unwrap_or_else(|| uuid::Uuid::new_v4().as_u128()),
                offset,
                partition_id: partition as u32,
                timestamp,
                origin_timestamp: timestamp,
                checksum: 0,
                headers: message.headers.clone(),
                payload: message.payload.clone(),
            });
        }
        true
    }
}

#[async_trait]
impl Producer for MemoryProducer {
    async fn send(&self, messages: &[OutgoingMessage]) -> Result<(), BusError> {
        let delay = self.shared.send_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        if take_one(&self.shared.refuse_sends) {
            return Err(BusError::Send(
                "the in-memory bus was told to refuse this send".into(),
            ));
        }
        let timestamp = now_micros();
        let mut trimmed = self.topic.trimmed.subscribe();
        while !self.try_store(messages, timestamp) {
            // Dropping this future while it waits stores nothing.
            if trimmed.changed().await.is_err() {
                return Err(BusError::Send("the in-memory topic was dropped".into()));
            }
        }
        self.shared.sends.fetch_add(1, Ordering::SeqCst);
        self.topic.appended.send_modify(|version| *version += 1);
        Ok(())
    }
}

struct MemoryConsumer {
    shared: Arc<Shared>,
    topic: Arc<Topic>,
    group: String,
    batch_length: usize,
    /// Next offset to read, per partition.
    positions: Vec<u64>,
    next_partition: usize,
    appended: watch::Receiver<u64>,
}

impl MemoryConsumer {
    fn take_available(&mut self) -> Option<ConsumedBatch> {
        let state = lock(&self.topic.state);
        let partitions = state.partitions.len();
        self.positions.resize(partitions, 0);
        for step in 0..partitions {
            let partition = (self.next_partition + step) % partitions;
            let stored = &state.partitions[partition];
            let start = self.positions[partition].max(stored.base);
            if start < stored.end() {
                let end = stored.end().min(start + self.batch_length as u64);
                let messages = stored
                    .messages
                    .range((start - stored.base) as usize..(end - stored.base) as usize)
                    .cloned()
                    .collect();
                self.positions[partition] = end;
                self.next_partition = partition + 1;
                self.shared.polled.fetch_add(1, Ordering::SeqCst);
                return Some(ConsumedBatch {
                    partition_id: partition as u32,
                    messages,
                });
            }
        }
        None
    }
}

#[async_trait]
impl Consumer for MemoryConsumer {
    async fn poll(&mut self) -> Result<ConsumedBatch, BusError> {
        loop {
            self.appended.borrow_and_update();
            if let Some(batch) = self.take_available() {
                return Ok(batch);
            }
            if self.appended.changed().await.is_err() {
                return Err(BusError::Poll("the in-memory topic was dropped".into()));
            }
        }
    }

    async fn poll_available(&mut self) -> Result<Option<ConsumedBatch>, BusError> {
        Ok(self.take_available())
    }

    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError> {
        if take_one(&self.shared.refuse_commits) {
            return Err(BusError::Commit(
                "the in-memory bus was told to refuse this commit".into(),
            ));
        }
        lock(&self.shared.commits).push((self.group.clone(), partition_id, offset));
        let mut state = lock(&self.topic.state);
        state
            .committed
            .entry(self.group.clone())
            .or_default()
            .insert(partition_id, offset);
        if self.shared.capacity.is_some() && state.trim() {
            drop(state);
            self.topic.trimmed.send_modify(|version| *version += 1);
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), BusError> {
        Ok(())
    }
}

/// Consumes one unit of a fault budget, if any is left.
fn take_one(budget: &AtomicU32) -> bool {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn batch(count: usize) -> Vec<OutgoingMessage> {
        (0..count)
            .map(|index| OutgoingMessage {
                id: None,
                headers: Vec::new(),
                payload: bytes::Bytes::from(index.to_string()),
                partition: None,
                origin_timestamp: None,
            })
            .collect()
    }

    async fn open(bus: &MemoryBus) -> (Box<dyn Producer>, Box<dyn Consumer>) {
        let producer = bus
            .producer(&ProducerTarget {
                stream: "s".into(),
                topic: "t".into(),
                partitions: 1,
                batch_length: 100,
                linger_time: Duration::ZERO,
            })
            .await
            .unwrap();
        let consumer = bus
            .consumer(&ConsumerSpec {
                stream: "s".into(),
                topic: "t".into(),
                group: "g".into(),
                batch_length: 100,
                poll_interval: Duration::from_millis(1),
                connector_key: "k".into(),
                degraded: Default::default(),
                lag: Default::default(),
            })
            .await
            .unwrap();
        (producer, consumer)
    }

    #[tokio::test]
    async fn given_a_bounded_bus_when_the_group_commits_should_free_the_committed_messages() {
        let bus = MemoryBus::bounded(1000);
        let (producer, mut consumer) = open(&bus).await;
        producer.send(&batch(30)).await.unwrap();
        let polled = consumer.poll().await.unwrap();
        assert_eq!(polled.messages.len(), 30);
        consumer.commit(0, 19).await.unwrap();
        assert_eq!(bus.retained("s", "t"), 10);
        assert_eq!(bus.undelivered("s", "t", "g"), 10);
        // Offsets go on past the freed messages.
        producer.send(&batch(5)).await.unwrap();
        consumer.commit(0, 29).await.unwrap();
        let next = consumer.poll().await.unwrap();
        assert_eq!(next.messages.first().map(|m| m.offset), Some(30));
        consumer.commit(0, 34).await.unwrap();
        assert_eq!(bus.retained("s", "t"), 0);
        assert!(bus.is_drained("s", "t", "g"));
    }

    #[tokio::test]
    async fn given_a_full_bounded_topic_when_sending_should_wait_until_a_commit_frees_room() {
        let bus = MemoryBus::bounded(10);
        let (producer, mut consumer) = open(&bus).await;
        producer.send(&batch(10)).await.unwrap();
        let mut blocked = tokio::spawn(async move { producer.send(&batch(1)).await });
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut blocked)
                .await
                .is_err(),
            "a send into a full topic must wait"
        );
        consumer.poll().await.unwrap();
        consumer.commit(0, 9).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), blocked)
            .await
            .expect("the commit frees room")
            .unwrap()
            .unwrap();
        assert_eq!(bus.retained("s", "t"), 1);
    }

    #[tokio::test]
    async fn given_an_unbounded_bus_when_committed_should_keep_every_message() {
        let bus = MemoryBus::new();
        let (producer, mut consumer) = open(&bus).await;
        producer.send(&batch(30)).await.unwrap();
        consumer.poll().await.unwrap();
        consumer.commit(0, 29).await.unwrap();
        assert_eq!(bus.messages("s", "t").len(), 30);
    }
}
