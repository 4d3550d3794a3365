//! `kafka` source: consumes Kafka topics with a consumer group (or an
//! explicit partition assignment without one) and stores a record's offset
//! only once Iggy acknowledged its batch.
//!
//! With a group, the group's committed offsets are the position: librdkafka
//! runs with `enable.auto.offset.store=false`, `commit` stores each
//! partition's next offset of the batch the engine reports durable, and
//! librdkafka commits what is stored every `commit_interval`, and before it
//! gives partitions up: on a revoke, and in `close`, which waits for that
//! commit (the engine stops waiting for a close after `CLOSE_WAIT`). What
//! was polled and never committed (Iggy refusing it until the engine gives
//! up, a crash, a rebalance) is read again by whoever owns the partition
//! next: duplicates, never a gap. On a revoke, records buffered for the
//! revoked partitions are dropped and the batches in flight stop storing
//! offsets for them, so an offset is never stored past a record that was
//! not delivered.
//!
//! With `partitions` (no group), the source's state holds each partition's
//! next offset, saved by the engine with every batch.
//!
//! Cancel-safe: a poll moves each record it receives into the source's own
//! buffer before awaiting the next, so a poll dropped while waiting loses
//! nothing; the next poll starts from that buffer.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::connectors::kafka::lag::ConsumerLag;
use crate::connectors::kafka::{Logging, blocking, classify, client_fields, is_fatal};
use crate::connectors::kit::row_id::hash_id;
use crate::connectors::{
    ConnectorContext, ConnectorError, LagProbe, PluginConfigError, Source, SourceBatch,
    SourceEntry, decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Headers, Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "kafka",
    feature: "kafka-source",
    description: "consumes Kafka topics with a consumer group, offsets stored once Iggy has the batch",
    secret_fields: &["sasl_password"],
    sample_config: "bootstrap_servers = \"localhost:9092\"\ntopics = [\"orders\"]\ngroup_id = \"iggy-connect\"\nauto_offset_reset = \"earliest\"\nsasl_mechanism = \"SCRAM-SHA-256\"\nsasl_username = \"iggy\"\nsasl_password = \"secret\"\n\n[client_options]\n\"session.timeout.ms\" = \"6000\"\n",
    config_schema: schema_of::<KafkaSourceConfig>,
    build: |config| Ok(Box::new(KafkaSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

client_fields! {
    /// What to consume and how.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct KafkaSourceConfig {
        /// The topics to subscribe to with `group_id`; a name starting with
        /// `^` is a regular expression matching topics.
        #[serde(default)]
        pub topics: Vec<String>,
        /// The consumer group (required with `topics`): instances sharing it
        /// split the partitions, and its committed offsets are the position.
        #[serde(default)]
        pub group_id: Option<String>,
        /// An explicit assignment instead of `topics`: these partitions are
        /// read without a group, their positions kept in the source's state.
        #[serde(default)]
        pub partitions: Vec<AssignedPartition>,
        /// Where to start in a partition without a committed offset:
        /// `earliest` or `latest`.
        #[serde(default)]
        pub auto_offset_reset: OffsetReset,
        /// Which Iggy partition a record goes to: `key` (records with one
        /// Kafka key share a partition; keyless ones are balanced),
        /// `kafka_partition` (the Kafka partition's number) or `balanced`.
        #[serde(default)]
        pub partitioning: Partitioning,
        /// Most records per batch.
        #[serde(default = "default_batch_size")]
        pub batch_size: usize,
        /// How long a poll waits for more records after the first one, up
        /// to `batch_size`.
        #[serde(default = "default_batch_linger", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub batch_linger: Duration,
        /// How often the stored offsets are committed to the group (they
        /// are also committed on a revoke and at a stop).
        #[serde(default = "default_commit_interval", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub commit_interval: Duration,
    }
}

/// One partition of an explicit assignment.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignedPartition {
    /// The topic.
    pub topic: String,
    /// The partition's number.
    pub partition: i32,
}

/// Where to start without a committed offset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OffsetReset {
    #[default]
    Earliest,
    Latest,
}

/// How records are spread over the Iggy topic's partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Partitioning {
    #[default]
    Key,
    KafkaPartition,
    Balanced,
}

fn default_batch_size() -> usize {
    1000
}

fn default_batch_linger() -> Duration {
    Duration::from_millis(5)
}

fn default_commit_interval() -> Duration {
    Duration::from_secs(5)
}

/// How long a poll waiting for its first record waits between looks at
/// what was revoked.
const LIVENESS: Duration = Duration::from_millis(500);

/// How long an empty consumer queue is waited on when serving its
/// events after a failed open.
const QUEUE_DRAINED: Duration = Duration::from_millis(20);

/// How many batches of records librdkafka keeps prefetched per partition
/// (`queued.min.messages`), and at most how many kilobytes in all
/// (`queued.max.messages.kbytes`); `client_options` override both.
const PREFETCH_BATCHES: usize = 10;
const PREFETCH_KBYTES: usize = 16 * 1024;
/// How long librdkafka waits to fetch a partition whose prefetch is full.
const FETCH_QUEUE_BACKOFF_MS: u32 = 10;

/// The `kafka_*` headers the source adds to a record's own.
const OWN_HEADERS: usize = 5;

/// How many records a poll takes from librdkafka's queue before it lets
/// the task's other work (the send before it) run.
const YIELD_EVERY: usize = 128;

/// How many batches may be polled and not yet committed.
const MAX_IN_FLIGHT: usize = 4;

type PartitionKey = (String, i32);

/// The next offset of each partition a batch read from.
type Positions = HashMap<PartitionKey, i64>;

/// What the rebalance callback and the source share.
#[derive(Default)]
struct Shared {
    /// Per batch polled and not committed, oldest first: the offsets to store.
    staged: Mutex<VecDeque<Positions>>,
    /// Partitions revoked since a poll last looked: their buffered records
    /// are dropped.
    revoked: Mutex<Vec<PartitionKey>>,
}

/// librdkafka's callbacks: logging, and on a revoke, forgetting what the
/// revoked partitions have in flight and committing what is stored.
struct SourceContext {
    logging: Logging,
    shared: Arc<Shared>,
}

impl ClientContext for SourceContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.logging.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.logging.error(error, reason);
    }
}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(partitions) = rebalance else {
            return;
        };
        let revoked: Vec<PartitionKey> = partitions
            .elements()
            .iter()
            .map(|element| (element.topic().to_owned(), element.partition()))
            .collect();
        for positions in lock(&self.shared.staged).iter_mut() {
            for partition in &revoked {
                positions.remove(partition);
            }
        }
        // librdkafka itself commits the offsets stored for the revoked
        // partitions (auto commit is on) before it gives them up. A
        // synchronous commit here would wait for ever on a broker that is
        // gone, inside the close of the consumer too.
        tracing::info!(connector_key = %self.logging.key, partitions = ?revoked, "kafka partitions revoked; librdkafka commits their stored offsets");
        lock(&self.shared.revoked).extend(revoked);
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            let assigned: Vec<String> = partitions
                .elements()
                .iter()
                .map(|element| format!("{}/{}", element.topic(), element.partition()))
                .collect();
            tracing::info!(connector_key = %self.logging.key, partitions = ?assigned, "kafka partitions assigned");
        }
    }
}

/// A record received and not yet handed to the engine.
struct Polled {
    record: SourceRecord,
    /// Its partition, an index into [`Buffer::partitions`]: a topic name
    /// per record, hashed into the batch's positions, was an allocation and
    /// a hash per record.
    partition: usize,
    offset: i64,
}

/// What polls received and the engine has not taken yet.
#[derive(Default)]
struct Buffer {
    records: Vec<Polled>,
    /// The partitions `records` come from.
    partitions: Vec<PartitionKey>,
}

impl Buffer {
    /// The index of `topic`'s `partition` in [`Buffer::partitions`].
    fn partition_index(&mut self, topic: &str, partition: i32) -> usize {
        match self
            .partitions
            .iter()
            .position(|(known, number)| *number == partition && known == topic)
        {
            Some(index) => index,
            None => {
                self.partitions.push((topic.to_owned(), partition));
                self.partitions.len() - 1
            }
        }
    }
}

/// The positions of an explicit assignment, as saved with each batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssignmentState {
    /// `(topic, partition, next offset)`.
    pub positions: Vec<(String, i32, i64)>,
}

pub struct KafkaSource {
    config: KafkaSourceConfig,
    key: String,
    consumer: Option<Arc<StreamConsumer<SourceContext>>>,
    shared: Arc<Shared>,
    buffer: tokio::sync::Mutex<Buffer>,
    /// Explicit assignment: each partition's next offset after the last poll.
    positions: Mutex<BTreeMap<PartitionKey, i64>>,
}

impl KafkaSource {
    pub fn new(config: KafkaSourceConfig) -> Result<Self, PluginConfigError> {
        match (config.topics.is_empty(), config.partitions.is_empty()) {
            (true, true) => {
                return Err(PluginConfigError::new(
                    "topics",
                    "expected the topics to subscribe to (or `partitions`)",
                ));
            }
            (false, false) => {
                return Err(PluginConfigError::new(
                    "partitions",
                    "expected either `topics` (with a group) or `partitions`, not both",
                ));
            }
            (false, true) if config.group_id.as_deref().is_none_or(str::is_empty) => {
                return Err(PluginConfigError::new(
                    "group_id",
                    "expected the consumer group to subscribe with",
                ));
            }
            _ => {}
        }
        if config.topics.iter().any(|topic| topic.is_empty()) {
            return Err(PluginConfigError::new(
                "topics",
                "expected no empty topic name",
            ));
        }
        if config.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        let source = Self {
            config,
            key: String::new(),
            consumer: None,
            shared: Arc::new(Shared::default()),
            buffer: tokio::sync::Mutex::new(Buffer::default()),
            positions: Mutex::new(BTreeMap::new()),
        };
        source.client_config()?;
        Ok(source)
    }

    fn grouped(&self) -> bool {
        self.config.partitions.is_empty()
    }

    fn client_config(&self) -> Result<ClientConfig, PluginConfigError> {
        let reset = match self.config.auto_offset_reset {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        };
        // librdkafka prefetches up to 100,000 records or 64 MB (its
        // defaults); a source slower than the broker keeps that queue full,
        // 50-90 MB of the process for small records. Ten batches ahead keep
        // the pipeline fed, provided a partition over the threshold is
        // fetched again soon: librdkafka waits a second by default
        // (`fetch.queue.backoff.ms`), which cut the rate to a tenth.
        let prefetch = self.config.batch_size.saturating_mul(PREFETCH_BATCHES);
        let mut settings = vec![
            ("enable.auto.offset.store", "false".to_owned()),
            ("enable.partition.eof", "false".to_owned()),
            ("auto.offset.reset", reset.to_owned()),
            (
                "queued.min.messages",
                prefetch.clamp(1, 10_000_000).to_string(),
            ),
            ("queued.max.messages.kbytes", PREFETCH_KBYTES.to_string()),
            ("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string()),
        ];
        if let Some(group) = self.config.group_id.as_ref().filter(|_| self.grouped()) {
            settings.push(("group.id", group.clone()));
            settings.push(("enable.auto.commit", "true".to_owned()));
            let interval = self.config.commit_interval.as_millis().max(1);
            settings.push(("auto.commit.interval.ms", interval.to_string()));
        } else {
            settings.push(("group.id", format!("iggy-connect-unused-{}", self.key)));
            settings.push(("enable.auto.commit", "false".to_owned()));
        }
        self.config.client().config(&self.key, &settings)
    }

    fn consumer(&self) -> Result<&Arc<StreamConsumer<SourceContext>>, ConnectorError> {
        self.consumer
            .as_ref()
            .ok_or_else(|| ConnectorError::transient("the kafka source is not open"))
    }

    /// The explicit assignment, each partition from its saved position or
    /// from `auto_offset_reset`.
    fn assignment(&self, state: &AssignmentState) -> Result<TopicPartitionList, ConnectorError> {
        let saved: HashMap<(&str, i32), i64> = state
            .positions
            .iter()
            .map(|(topic, partition, next)| ((topic.as_str(), *partition), *next))
            .collect();
        let mut list = TopicPartitionList::new();
        let mut positions = lock(&self.positions);
        for assigned in &self.config.partitions {
            let offset = match saved.get(&(assigned.topic.as_str(), assigned.partition)) {
                Some(next) => {
                    positions.insert((assigned.topic.clone(), assigned.partition), *next);
                    Offset::Offset(*next)
                }
                None if self.config.auto_offset_reset == OffsetReset::Latest => Offset::End,
                None => Offset::Beginning,
            };
            list.add_partition_offset(&assigned.topic, assigned.partition, offset)
                .map_err(|error| classify("assigning partitions", error))?;
        }
        Ok(list)
    }

    /// Drops buffered records of partitions revoked since the last look.
    fn drop_revoked(&self, buffer: &mut Buffer) {
        let revoked = std::mem::take(&mut *lock(&self.shared.revoked));
        if !revoked.is_empty() {
            let partitions = &buffer.partitions;
            buffer
                .records
                .retain(|polled| !revoked.contains(&partitions[polled.partition]));
        }
    }

    /// Receives into the buffer until it holds a batch or `batch_linger`
    /// passed since the first record. Records librdkafka already holds are
    /// taken without a wait (and without a timer each); only an empty queue
    /// is waited on.
    async fn fill(
        &self,
        consumer: &StreamConsumer<SourceContext>,
        buffer: &mut Buffer,
    ) -> Result<(), ConnectorError> {
        let mut stream = consumer.stream();
        let mut deadline =
            (!buffer.records.is_empty()).then(|| Instant::now() + self.config.batch_linger);
        let mut taken = 0;
        while buffer.records.len() < self.config.batch_size {
            if taken == YIELD_EVERY {
                // The engine runs this poll and the send of the batch
                // before it in one task: without a pause the send's
                // acknowledgement waits for the whole batch. Nothing is
                // held here but the buffer, so a poll dropped at this point
                // loses nothing.
                taken = 0;
                tokio::task::yield_now().await;
            }
            let received = match stream.next().now_or_never() {
                Some(ready) => Ok(ready),
                None => {
                    let wait = deadline
                        .map_or(LIVENESS, |at| at.saturating_duration_since(Instant::now()));
                    tokio::time::timeout(wait, stream.next()).await
                }
            };
            self.drop_revoked(buffer);
            match received {
                Ok(Some(Ok(message))) => {
                    let polled = self.polled(&message, buffer);
                    buffer.records.push(polled);
                    taken += 1;
                    deadline.get_or_insert_with(|| Instant::now() + self.config.batch_linger);
                }
                Ok(Some(Err(error))) if is_fatal(&error) => {
                    return Err(classify("consuming", error));
                }
                Ok(Some(Err(error))) if buffer.records.is_empty() => {
                    return Err(classify("consuming", error));
                }
                Ok(Some(Err(error))) => {
                    tracing::debug!(connector_key = %self.key, %error, "kafka consumer error");
                    return Ok(());
                }
                // A consumer's stream never ends.
                Ok(None) => return Ok(()),
                Err(_) if buffer.records.is_empty() => deadline = None,
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }

    fn polled(&self, message: &BorrowedMessage<'_>, buffer: &mut Buffer) -> Polled {
        let topic = message.topic();
        let (partition, offset) = (message.partition(), message.offset());
        let kafka_headers = message.headers();
        let mut headers = Headers::with_capacity(
            OWN_HEADERS + kafka_headers.as_ref().map_or(0, |headers| headers.count()),
        );
        // The connector's own headers have distinct names and values Iggy
        // carries (a topic name is 1 to 249 bytes): no check needed. Names
        // (and a topic name) of up to 24 bytes allocate nothing.
        headers.push(("kafka_topic".into(), HeaderValue::String(topic.into())));
        headers.push(("kafka_partition".into(), HeaderValue::Int(partition.into())));
        headers.push(("kafka_offset".into(), HeaderValue::Int(offset)));
        let timestamp = message.timestamp().to_millis();
        if let Some(millis) = timestamp {
            headers.push(("kafka_timestamp".into(), HeaderValue::Int(millis)));
        }
        if let Some(key) = message.key() {
            push_header(&mut headers, "kafka_key", bytes_value(key));
        }
        if let Some(kafka_headers) = kafka_headers {
            for header in kafka_headers.iter() {
                if let Some(value) = header.value {
                    push_header(&mut headers, header.key, bytes_value(value));
                }
            }
        }
        let iggy_partition = match self.config.partitioning {
            Partitioning::Key => message.key().map(crc32fast::hash),
            Partitioning::KafkaPartition => u32::try_from(partition).ok(),
            Partitioning::Balanced => None,
        };
        let record = SourceRecord {
            id: Some(record_id(topic, partition, offset)),
            stream_index: 0,
            headers,
            payload: Payload::Raw(Bytes::copy_from_slice(
                message.payload().unwrap_or_default(),
            )),
            partition: iggy_partition,
            origin_timestamp: timestamp
                .and_then(|millis| u64::try_from(millis).ok())
                .and_then(|millis| millis.checked_mul(1000)),
        };
        Polled {
            record,
            partition: buffer.partition_index(topic, partition),
            offset,
        }
    }

    /// Stores each partition's next offset of a durable batch (librdkafka
    /// commits it); a partition no longer assigned is skipped: its next
    /// owner reads the records again.
    fn store(&self, consumer: &StreamConsumer<SourceContext>, positions: Positions) {
        for ((topic, partition), next) in positions {
            let mut list = TopicPartitionList::new();
            let added = list.add_partition_offset(&topic, partition, Offset::Offset(next));
            if let Err(error) = added.and_then(|()| consumer.store_offsets(&list)) {
                tracing::debug!(connector_key = %self.key, topic, partition, offset = next, %error, "offset not stored; the partition's next owner reads it again");
            }
        }
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    /// With a group the state is ignored (the group's offsets are the
    /// position); with `partitions` it holds each partition's next offset.
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        let config = self.client_config().map_err(ConnectorError::fatal)?;
        let logging = Logging::new(&self.key);
        let context = SourceContext {
            logging: logging.clone(),
            shared: self.shared.clone(),
        };
        let consumer: StreamConsumer<SourceContext> = config
            .create_with_context(context)
            .map_err(|error| classify("creating the kafka consumer", error))?;
        let consumer = Arc::new(consumer);
        let timeout = self.config.open_timeout;
        let checking = consumer.clone();
        let checked = blocking("fetching the cluster's metadata", move || {
            checking.fetch_metadata(None, timeout).map(drop)
        })
        .await;
        if let Err(error) = checked {
            serve_queued_events(&consumer).await;
            return Err(logging.explain(error));
        }
        if self.grouped() {
            let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
            consumer
                .subscribe(&topics)
                .map_err(|error| classify("subscribing", error))?;
        } else {
            let state = match state {
                Some(bytes) => decode_state::<AssignmentState>(bytes)?,
                None => AssignmentState::default(),
            };
            consumer
                .assign(&self.assignment(&state)?)
                .map_err(|error| classify("assigning partitions", error))?;
        }
        self.consumer = Some(consumer);
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let consumer = self.consumer()?.clone();
        let mut buffer = self.buffer.lock().await;
        self.fill(&consumer, &mut buffer).await?;
        let Buffer {
            records: polled,
            partitions,
        } = std::mem::take(&mut *buffer);
        let mut ends = vec![None; partitions.len()];
        let mut records = Vec::with_capacity(polled.len());
        for Polled {
            record,
            partition,
            offset,
        } in polled
        {
            ends[partition] = Some(offset + 1);
            records.push(record);
        }
        let next: Positions = partitions
            .into_iter()
            .zip(ends)
            .filter_map(|(partition, end)| Some((partition, end?)))
            .collect();
        let state = if self.grouped() {
            None
        } else {
            let mut positions = lock(&self.positions);
            positions.extend(
                next.iter()
                    .map(|(partition, offset)| (partition.clone(), *offset)),
            );
            let state = AssignmentState {
                positions: positions
                    .iter()
                    .map(|((topic, partition), offset)| (topic.clone(), *partition, *offset))
                    .collect(),
            };
            Some(encode_state(&state)?)
        };
        lock(&self.shared.staged).push_back(next);
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let Some(positions) = lock(&self.shared.staged).pop_front() else {
            return Ok(());
        };
        if self.grouped() {
            self.store(self.consumer()?, positions);
        }
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        MAX_IN_FLIGHT
    }

    fn lag_probe(&self) -> Option<Arc<dyn LagProbe>> {
        Some(Arc::new(ConsumerLag {
            consumer: Arc::downgrade(self.consumer.as_ref()?),
            grouped: self.grouped(),
            timeout: self.config.open_timeout,
        }))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        lock(&self.shared.staged).clear();
        *self.buffer.get_mut() = Buffer::default();
        let Some(consumer) = self.consumer.take() else {
            return Ok(());
        };
        // librdkafka's close commits what is stored (only durable batches
        // are) and leaves the group. It waits for the broker (about
        // `session.timeout.ms` when the broker is gone, sometimes minutes;
        // the engine stops waiting after its `CLOSE_WAIT`), so off the async
        // threads. The lag probe holds the consumer only weakly: this is its
        // last owner, and the close happens now rather than whenever the
        // probe's task is dropped.
        blocking("closing the kafka consumer", move || {
            drop(consumer);
            Ok(())
        })
        .await
    }
}

/// Hands the events librdkafka queued for the consumer (its logs and
/// errors, such as the reason a SASL login was refused) to the context,
/// which remembers the last error: with a group, librdkafka queues them
/// beside the records and delivers them only when the consumer is polled.
/// Called before the subscription, so no record is taken from the queue.
async fn serve_queued_events(consumer: &StreamConsumer<SourceContext>) {
    const MOST: usize = 64;
    for _ in 0..MOST {
        // An error event is returned; a log event is served and the wait
        // goes on: the queue is empty when a short wait ends with nothing.
        let served = tokio::time::timeout(QUEUE_DRAINED, consumer.recv()).await;
        if served.is_err() {
            break;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The record's id: FNV-1a-128 of `topic \0 partition \0 offset` (the
/// numbers in decimal), as `hash_id` makes it, without a string per number.
fn record_id(topic: &str, partition: i32, offset: i64) -> u128 {
    let (mut partition_text, mut offset_text) = (itoa::Buffer::new(), itoa::Buffer::new());
    hash_id(&[
        topic,
        partition_text.format(partition),
        offset_text.format(offset),
    ])
}

/// Text when it is UTF-8, bytes otherwise.
fn bytes_value(bytes: &[u8]) -> HeaderValue {
    match std::str::from_utf8(bytes) {
        Ok(text) => HeaderValue::String(text.into()),
        Err(_) => HeaderValue::Raw(Bytes::copy_from_slice(bytes)),
    }
}

/// Adds a header Iggy can carry (a name not taken yet, a value of 1 to 255
/// bytes); the connector's own `kafka_*` headers come first and win.
fn push_header(headers: &mut Headers, name: &str, value: HeaderValue) {
    let length = match &value {
        HeaderValue::String(text) => text.len(),
        HeaderValue::Raw(bytes) => bytes.len(),
        _ => 1,
    };
    if !name.is_empty()
        && (1..=255).contains(&length)
        && !headers.iter().any(|(taken, _)| taken == name)
    {
        headers.push((name.into(), value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<KafkaSource, PluginConfigError> {
        KafkaSource::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_a_bad_field_when_built_should_name_it() {
        let field = |config| build(config).err().unwrap().field;
        assert_eq!(field(json!({"bootstrap_servers": "b:9092"})), "topics");
        assert_eq!(
            field(json!({"bootstrap_servers": "b:9092", "topics": ["t"]})),
            "group_id"
        );
        assert_eq!(
            field(json!({"topics": ["t"], "group_id": "g"})),
            "bootstrap_servers"
        );
        assert_eq!(
            field(
                json!({"bootstrap_servers": "b:9092", "topics": ["t"], "group_id": "g",
                "partitions": [{"topic": "t", "partition": 0}]})
            ),
            "partitions"
        );
        assert_eq!(
            field(
                json!({"bootstrap_servers": "b:9092", "topics": ["t"], "group_id": "g",
                "client_options": {"fetch.wait.max.ms": "never"}})
            ),
            "client_options"
        );
        assert!(
            build(json!({"bootstrap_servers": "b", "topics": ["t"], "group_id": "g", "nope": 1}))
                .is_err()
        );
    }

    #[test]
    fn given_a_group_or_an_assignment_when_built_should_be_accepted() {
        build(json!({"bootstrap_servers": "b:9092", "topics": ["^orders-.*"], "group_id": "g"}))
            .unwrap();
        build(
            json!({"bootstrap_servers": "b:9092", "partitions": [{"topic": "t", "partition": 1}]}),
        )
        .unwrap();
    }

    #[test]
    fn given_saved_positions_when_assigned_should_resume_there_and_reset_the_others() {
        let source = build(json!({"bootstrap_servers": "b:9092", "partitions": [
            {"topic": "t", "partition": 0}, {"topic": "t", "partition": 1}]}))
        .unwrap();
        let state = AssignmentState {
            positions: vec![("t".into(), 1, 42)],
        };
        let list = source.assignment(&state).unwrap();
        let offsets: Vec<_> = list
            .elements()
            .iter()
            .map(|element| (element.partition(), element.offset()))
            .collect();
        assert_eq!(offsets, [(0, Offset::Beginning), (1, Offset::Offset(42))]);
    }

    #[test]
    fn given_a_record_when_its_id_is_derived_should_match_the_id_of_its_text_parts() {
        for (partition, offset) in [(0, 0), (7, 123_456_789), (i32::MAX, i64::MAX), (-1, -1)] {
            assert_eq!(
                record_id("orders", partition, offset),
                hash_id(&["orders", &partition.to_string(), &offset.to_string()])
            );
        }
    }

    #[test]
    fn given_an_assignment_state_when_encoded_should_round_trip() {
        let state = AssignmentState {
            positions: vec![("orders".into(), 3, 17)],
        };
        let decoded: AssignmentState = decode_state(&encode_state(&state).unwrap()).unwrap();
        assert_eq!(decoded, state);
        assert!(decode_state::<AssignmentState>(b"\xc1 not msgpack").is_err());
    }

    #[test]
    fn given_kafka_headers_when_copied_should_keep_the_connectors_own_and_drop_what_iggy_cannot_carry()
     {
        let mut headers = Headers::new();
        push_header(&mut headers, "kafka_topic", HeaderValue::String("t".into()));
        push_header(&mut headers, "kafka_topic", bytes_value(b"user's"));
        push_header(&mut headers, "empty", bytes_value(b""));
        push_header(&mut headers, "long", bytes_value(&[b'x'; 300]));
        push_header(&mut headers, "binary", bytes_value(&[0xff, 0]));
        assert_eq!(
            headers,
            vec![
                ("kafka_topic".into(), HeaderValue::String("t".into())),
                (
                    "binary".into(),
                    HeaderValue::Raw(Bytes::from_static(&[0xff, 0]))
                ),
            ]
        );
    }
}
