//! Delivering selected dead letters again: to a fresh instance of the sink,
//! fed by [`ReplayConsumer`] through the engine's own sink pipeline, or back
//! to the topic each came from.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Runtime;
use super::dlq::{DeadLetter, DlqError};
use super::prepared::SetupError;
use super::setup::build_transforms;
use super::slot::Slot;
use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::Degraded;
use crate::engine::Shutdown;
use crate::engine::dead_letter;
use crate::engine::sink::{SinkPipeline, TopicReader};
use crate::engine::source::Ended;
use crate::engine::status::StatusCell;
use crate::iggy::{BusError, ConsumedBatch, Consumer, ProducerTarget};
use crate::lag::LagCell;
use crate::message::{ConsumedMessage, OutgoingMessage, TopicRef};

impl Runtime {
    /// Delivers dead letters to a fresh instance of the sink, one reader per
    /// origin topic, and returns the dead-letter offsets it delivered.
    pub(super) async fn replay_to_sink(
        &self,
        config: &Arc<ConnectorConfig>,
        chosen: Vec<DeadLetter>,
        timeout: Duration,
    ) -> Result<Delivery, DlqError> {
        if chosen.is_empty() {
            return Ok(Delivery::default());
        }
        let KindConfig::Sink { streams, on_error } = &config.kind_config else {
            return Err(DlqError::Refused("not a sink".into()));
        };
        let slot = replay_slot(self, config)?;
        let shutdown = Shutdown::new(CancellationToken::new(), self.options.shutdown_timeout);
        let deadline = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                shutdown.request();
            })
        };
        let progress = Arc::new(Progress::new(chosen.len(), shutdown.clone()));
        let mut by_topic: BTreeMap<(String, String), Vec<DeadLetter>> = BTreeMap::new();
        for dead in chosen {
            let Some(origin) = dead.context.origin.clone() else {
                continue;
            };
            by_topic
                .entry((origin.stream, origin.topic))
                .or_default()
                .push(dead);
        }
        let mut readers = Vec::new();
        for ((stream, topic), dead) in by_topic {
            let Some(entry) = streams
                .iter()
                .find(|entry| entry.stream == stream && entry.topics.contains(&topic))
            else {
                continue;
            };
            readers.push(TopicReader {
                topic: TopicRef { stream, topic },
                schema: entry.schema.clone(),
                consumer: Box::new(ReplayConsumer::new(
                    dead,
                    entry.batch_length.max(1) as usize,
                    progress.clone(),
                )),
            });
        }
        let opened = async {
            let transforms = build_transforms(config)?;
            // The producer first: a sink opened is closed by its pipeline.
            let dead_letter = self.dead_letter_producer(&slot, config, &shutdown).await?;
            let sink = self.open_sink(&slot, config, &shutdown).await?;
            Ok::<_, SetupError>(self.sink_context(
                &slot,
                config,
                *on_error,
                transforms,
                sink,
                dead_letter,
            ))
        }
        .await;
        let context = match opened {
            Ok(context) => context,
            Err(SetupError::Shutdown) => {
                deadline.abort();
                return Ok(Delivery {
                    delivered: Vec::new(),
                    stopped: Some(format!("the sink did not open within {timeout:?}")),
                });
            }
            Err(error) => {
                deadline.abort();
                return Err(error.into());
            }
        };
        let ended = SinkPipeline {
            readers,
            shutdown,
            context,
        }
        .run()
        .await;
        deadline.abort();
        let delivered = progress.delivered();
        let stopped = match ended {
            _ if delivered.len() == progress.total => None,
            Ended::Shutdown => Some(format!("not all delivered within {timeout:?}")),
            Ended::Disconnected(reason) | Ended::Stopped(_, reason) => Some(reason),
        };
        Ok(Delivery { delivered, stopped })
    }

    /// Sends dead letters back to the topics they came from, one send per
    /// topic; what the bus acknowledged counts as delivered.
    pub(super) async fn replay_to_origin(&self, chosen: Vec<DeadLetter>) -> Delivery {
        let mut by_topic: BTreeMap<(String, String), Vec<DeadLetter>> = BTreeMap::new();
        for dead in chosen {
            let Some(origin) = dead.context.origin.clone() else {
                continue;
            };
            by_topic
                .entry((origin.stream, origin.topic))
                .or_default()
                .push(dead);
        }
        let mut delivery = Delivery::default();
        for ((stream, topic), dead) in by_topic {
            let target = ProducerTarget {
                stream: stream.clone(),
                topic: topic.clone(),
                partitions: 1,
                batch_length: crate::config::connector::DEFAULT_BATCH_LENGTH,
                linger_time: Duration::ZERO,
            };
            let messages: Vec<OutgoingMessage> = dead
                .iter()
                .map(|dead| OutgoingMessage {
                    id: Some(dead.id),
                    headers: dead_letter::replay_headers(&dead.headers),
                    payload: dead.payload.clone(),
                    partition: dead.context.partition_id,
                    origin_timestamp: Some(dead.origin_timestamp),
                })
                .collect();
            let sent = match self.bus.producer(&target).await {
                Ok(producer) => producer.send(&messages).await,
                Err(error) => Err(error),
            };
            match sent {
                Ok(()) => delivery
                    .delivered
                    .extend(dead.iter().map(|dead| dead.offset)),
                Err(error) => {
                    warn!(%stream, %topic, %error, "replay to the origin topic failed");
                    delivery
                        .stopped
                        .get_or_insert(format!("send to {stream}/{topic} failed: {error}"));
                }
            }
        }
        delivery.delivered.sort_unstable();
        delivery
    }
}

/// What a replay delivered (dead-letter offsets, ascending) and why it
/// stopped short.
#[derive(Debug, Default)]
pub(super) struct Delivery {
    pub(super) delivered: Vec<u64>,
    pub(super) stopped: Option<String>,
}

/// A slot of its own for a replay: the connector's config, metrics and tap,
/// but its own status, so the replay's start and end do not show as the
/// connector's.
fn replay_slot(runtime: &Runtime, config: &Arc<ConnectorConfig>) -> Result<Slot, DlqError> {
    let real = runtime
        .slot(config.kind, &config.key)
        .map_err(|_| DlqError::NotFound {
            kind: config.kind,
            key: config.key.clone(),
        })?;
    Ok(Slot {
        kind: config.kind,
        key: config.key.clone(),
        config: RwLock::new(config.clone()),
        status: Arc::new(StatusCell::new(config.kind)),
        metrics: real.metrics.clone(),
        tap: real.tap.clone(),
        degraded: Degraded::default(),
        lag: LagCell::default(),
        stopped_lag: Default::default(),
        reload_refusal: Mutex::new(None),
        task: tokio::sync::Mutex::new(None),
    })
}

/// The replay's progress across its readers: which dead letters are
/// durable again; once all are, the replay pipeline is stopped.
struct Progress {
    total: usize,
    delivered: Mutex<Vec<u64>>,
    shutdown: Shutdown,
}

impl Progress {
    fn new(total: usize, shutdown: Shutdown) -> Self {
        Self {
            total,
            delivered: Mutex::new(Vec::with_capacity(total)),
            shutdown,
        }
    }

    fn committed(&self, offsets: &[u64]) {
        let mut delivered = self
            .delivered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        delivered.extend_from_slice(offsets);
        if delivered.len() >= self.total {
            self.shutdown.request();
        }
    }

    fn delivered(&self) -> Vec<u64> {
        let mut delivered = self
            .delivered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        delivered.sort_unstable();
        delivered
    }
}

/// A batch handed to the engine: its origin partition, last origin offset
/// and the dead-letter offsets it holds.
struct Handed {
    partition_id: u32,
    last_offset: u64,
    dead_offsets: Vec<u64>,
}

/// Feeds the engine's topic loop with dead letters as if read from their
/// origin partition and offset; the loop's commits say which are durable.
struct ReplayConsumer {
    batches: VecDeque<(ConsumedBatch, Vec<u64>)>,
    handed: VecDeque<Handed>,
    progress: Arc<Progress>,
}

impl ReplayConsumer {
    /// `dead` in dead-letter order, each origin partition in rising offsets.
    fn new(dead: Vec<DeadLetter>, batch_length: usize, progress: Arc<Progress>) -> Self {
        let mut batches: VecDeque<(ConsumedBatch, Vec<u64>)> = VecDeque::new();
        for dead in dead {
            let partition_id = dead.context.partition_id.unwrap_or(0);
            let message = ConsumedMessage {
                id: dead.id,
                offset: dead.context.offset.unwrap_or(0),
                partition_id,
                timestamp: dead.timestamp,
                origin_timestamp: dead.origin_timestamp,
                checksum: dead.checksum,
                headers: dead_letter::replay_headers(&dead.headers),
                payload: dead.payload,
            };
            match batches.back_mut() {
                Some((batch, offsets))
                    if batch.partition_id == partition_id
                        && batch.messages.len() < batch_length =>
                {
                    batch.messages.push(message);
                    offsets.push(dead.offset);
                }
                _ => batches.push_back((
                    ConsumedBatch {
                        partition_id,
                        messages: vec![message],
                    },
                    vec![dead.offset],
                )),
            }
        }
        Self {
            batches,
            handed: VecDeque::new(),
            progress,
        }
    }

    fn hand(&mut self) -> Option<ConsumedBatch> {
        let (batch, dead_offsets) = self.batches.pop_front()?;
        self.handed.push_back(Handed {
            partition_id: batch.partition_id,
            last_offset: batch.last_offset().unwrap_or(0),
            dead_offsets,
        });
        Some(batch)
    }
}

#[async_trait]
impl Consumer for ReplayConsumer {
    async fn poll(&mut self) -> Result<ConsumedBatch, BusError> {
        match self.hand() {
            Some(batch) => Ok(batch),
            // Everything is handed out: the replay ends when it is durable.
            None => std::future::pending().await,
        }
    }

    async fn poll_available(&mut self) -> Result<Option<ConsumedBatch>, BusError> {
        Ok(self.hand())
    }

    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError> {
        let mut durable = Vec::new();
        self.handed.retain(|handed| {
            let covered = handed.partition_id == partition_id && handed.last_offset <= offset;
            if covered {
                durable.extend_from_slice(&handed.dead_offsets);
            }
            !covered
        });
        self.progress.committed(&durable);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), BusError> {
        Ok(())
    }
}
