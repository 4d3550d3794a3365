//! An in-process bus: topics live in memory and vanish with the process. Used by
//! the one-shot `pipe` command and by the engine's unit tests, which can make it
//! refuse sends or commits on demand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::clock::now_micros;
use crate::iggy::{Bus, BusError, ConsumedBatch, Consumer, ConsumerSpec, Producer, ProducerTarget};
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
    /// Every send waits this long (milliseconds) before it is stored.
    send_delay_ms: AtomicU64,
    sends: AtomicU64,
}

struct Topic {
    state: Mutex<TopicState>,
    appended: watch::Sender<u64>,
}

struct TopicState {
    partitions: Vec<Vec<ConsumedMessage>>,
    next_partition: usize,
    /// group -> partition -> last committed offset
    committed: HashMap<String, HashMap<u32, u64>>,
}

impl MemoryBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `count` sends fail without storing anything.
    pub fn refuse_sends(&self, count: u32) {
        self.inner.refuse_sends.store(count, Ordering::SeqCst);
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
                    .flatten()
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
            .all(|(partition, messages)| {
                let Some(last) = messages.last() else {
                    return true;
                };
                state
                    .committed
                    .get(group)
                    .and_then(|offsets| offsets.get(&(partition as u32)))
                    .is_some_and(|committed| *committed >= last.offset)
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
                        partitions: vec![Vec::new(); partitions.max(1) as usize],
                        next_partition: 0,
                        committed: HashMap::new(),
                    }),
                    appended: watch::channel(0).0,
                })
            })
            .clone()
    }
}

#[async_trait]
impl Bus for MemoryBus {
    async fn producer(&self, target: &ProducerTarget) -> Result<Box<dyn Producer>, BusError> {
        let topic = self.ensure_topic(&target.stream, &target.topic, target.partitions);
        Ok(Box::new(MemoryProducer {
            shared: self.inner.clone(),
            topic,
        }))
    }

    async fn consumer(&self, spec: &ConsumerSpec) -> Result<Box<dyn Consumer>, BusError> {
        let topic = self.ensure_topic(&spec.stream, &spec.topic, 1);
        let (positions, appended) = {
            let state = lock(&topic.state);
            let committed = state.committed.get(&spec.group);
            let positions = (0..state.partitions.len() as u32)
                .map(|partition| {
                    committed
                        .and_then(|offsets| offsets.get(&partition))
                        .map_or(0, |offset| offset + 1)
                })
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
}

struct MemoryProducer {
    shared: Arc<Shared>,
    topic: Arc<Topic>,
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
        {
            let mut state = lock(&self.topic.state);
            let partition = state.next_partition % state.partitions.len();
            state.next_partition = state.next_partition.wrapping_add(1);
            let stored = &mut state.partitions[partition];
            stored.reserve(messages.len());
            for message in messages {
                let offset = stored.len() as u64;
                stored.push(ConsumedMessage {
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
            let start = self.positions[partition] as usize;
            let stored = &state.partitions[partition];
            if start < stored.len() {
                let end = stored.len().min(start + self.batch_length);
                let messages = stored[start..end].to_vec();
                self.positions[partition] = end as u64;
                self.next_partition = partition + 1;
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

    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError> {
        if take_one(&self.shared.refuse_commits) {
            return Err(BusError::Commit(
                "the in-memory bus was told to refuse this commit".into(),
            ));
        }
        let mut state = lock(&self.topic.state);
        state
            .committed
            .entry(self.group.clone())
            .or_default()
            .insert(partition_id, offset);
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data stays consistent even if a holder panicked: every update
    // is a single push or insert.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
