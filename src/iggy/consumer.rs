//! The sink side of the Iggy bus: a consumer-group member that polls batches
//! and stores offsets only when the engine commits them.
//!
//! Polls go straight to the client's group poll (the client picks one of the
//! member's partitions and re-syncs the assignment after a rebalance). A
//! partition this member has polled since it joined is read from its own
//! position, just after the last message polled, so the engine can poll the
//! next batch while the previous one is still being written (committed or
//! not); any other partition is read with the `next` strategy, after the
//! group's stored offset. Joining again (a new session, a rebuilt group)
//! forgets the positions, and a failed commit forgets its partition's: the
//! next poll there reads after the stored offset again (at-least-once).
//! `poll_interval` is waited only after a poll that found nothing, so a busy
//! topic is read back to back.
//!
//! A watcher task beside the consumer measures the group's lag (messages past
//! its stored offsets, per partition, exported as `iggy_connector_lag`, and
//! the age of the first of them, read with a one-message peek by a
//! standalone consumer that stores nothing, as
//! `iggy_connector_lag_oldest_age_seconds`) into the sink's
//! [`LagCell`](crate::lag::LagCell) for the status answer. When
//! there is lag and no offset was stored for the stall timeout, the sink is
//! reported degraded. If the consumer's own polls come back empty meanwhile,
//! the lag sits on partitions other members hold without committing: after a
//! broker restart those are ghosts, members whose sessions died with the
//! server (the server replays their journaled joins, and the client signs in
//! again under a new id), which nothing ever evicts. The consumer then
//! rebuilds the group: reads its stored offsets, deletes and recreates it,
//! joins and stores them again. Live members join the new group on their next
//! request; a stored offset that could not be restored only causes redelivery.
//!
//! A member that had to join again (its session is gone: the broker
//! restarted) does not wait the stall timeout for that: if, a few seconds
//! after it joined again, its polls come back empty while messages wait and
//! the group stored no offset meanwhile, the partitions are held by ghosts
//! (a live member would have stored one), and it rebuilds the group then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use iggy::prelude::{
    Client, Consumer as IggyConsumerId, ConsumerGroupClient, ConsumerOffsetClient, Identifier,
    IggyClient, IggyError, IggyTimestamp, MessageClient, PollingStrategy,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::connectors::Degraded;
use crate::iggy::group_lag::{GroupLag, partitions, stored_offset};
use crate::iggy::headers;
use crate::iggy::{BusError, ConsumedBatch, Consumer, ConsumerSpec, OffsetMove, OffsetReset};
use crate::message::ConsumedMessage;

/// How long after joining again the group's stored offsets may stand still
/// while messages wait and this member's polls come back empty, before the
/// members holding those partitions count as ghosts (at most the stall
/// timeout).
const REJOIN_SETTLE: Duration = Duration::from_secs(3);

/// The shortest wait after an empty poll, so an idle consumer with
/// `poll_interval = 0` does not spin.
const MIN_IDLE_WAIT: Duration = Duration::from_millis(1);

pub struct IggyBusConsumer {
    client: Arc<IggyClient>,
    stream: Identifier,
    topic: Identifier,
    group: Identifier,
    consumer: IggyConsumerId,
    /// `group on stream/topic`, for messages.
    name: String,
    batch_length: u32,
    idle_wait: Duration,
    request_timeout: Duration,
    joined: bool,
    /// Per partition, the offset after the last message polled since joining.
    positions: HashMap<u32, u64>,
    progress: Arc<Progress>,
    stall_timeout: Duration,
    last_rebuild: Option<Instant>,
    /// When this member joined again after losing its membership, and the
    /// group's stored offsets then.
    rejoined: Option<(Instant, Vec<(u32, u64)>)>,
    watcher: JoinHandle<()>,
}

/// Shared by the consumer (which stores offsets) and its watcher.
struct Progress {
    /// When the consumer last stored an offset (or opened, or rebuilt).
    last_store: Mutex<Instant>,
    /// The watcher saw lag and no store for the stall timeout.
    stalled: AtomicBool,
}

impl Progress {
    fn stored(&self) {
        *self
            .last_store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Instant::now();
        self.stalled.store(false, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        self.last_store
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .elapsed()
    }
}

impl IggyBusConsumer {
    /// Joins the group (creating it when missing) on `client`.
    pub async fn open(
        client: Arc<IggyClient>,
        spec: &ConsumerSpec,
        request_timeout: Duration,
        stall_timeout: Duration,
    ) -> Result<Self, BusError> {
        let identifier = |name: &str| {
            Identifier::named(name).map_err(|error| BusError::Setup {
                stream: spec.stream.clone(),
                topic: spec.topic.clone(),
                reason: format!("invalid name \"{name}\": {error}"),
            })
        };
        let group = identifier(&spec.group)?;
        let stream = identifier(&spec.stream)?;
        let topic = identifier(&spec.topic)?;
        let name = format!("{} on {}/{}", spec.group, spec.stream, spec.topic);
        let progress = Arc::new(Progress {
            last_store: Mutex::new(Instant::now()),
            stalled: AtomicBool::new(false),
        });
        let consumer_id = IggyConsumerId::group(group.clone());
        let watcher = Watcher {
            group_lag: GroupLag::new(Arc::clone(&client), spec, request_timeout)?,
            name: name.clone(),
            degraded: spec.degraded.clone(),
            progress: Arc::clone(&progress),
            stall_timeout,
        };
        let mut consumer = Self {
            stream,
            topic,
            consumer: consumer_id,
            group,
            client,
            name,
            batch_length: spec.batch_length.max(1),
            idle_wait: spec.poll_interval.max(MIN_IDLE_WAIT),
            request_timeout,
            joined: false,
            positions: HashMap::new(),
            progress,
            stall_timeout,
            last_rebuild: None,
            rejoined: None,
            watcher: tokio::spawn(watcher.run()),
        };
        consumer.join().await?;
        Ok(consumer)
    }

    /// The group's stored offset per partition (partitions without one are
    /// left out).
    async fn stored_offsets(&self) -> Result<Vec<(u32, u64)>, BusError> {
        let partitions = partitions(
            &self.client,
            &self.stream,
            &self.topic,
            self.request_timeout,
        )
        .await?;
        let mut offsets = Vec::new();
        for (partition_id, _) in partitions {
            if let Some(stored) = stored_offset(
                &self.client,
                &self.consumer,
                &self.stream,
                &self.topic,
                partition_id,
                self.request_timeout,
            )
            .await?
            {
                offsets.push((partition_id, stored));
            }
        }
        Ok(offsets)
    }

    /// Deletes and recreates the group, keeping its stored offsets, so members
    /// that hold partitions without ever committing (ghosts of sessions a
    /// broker restart ended) are gone. See the module documentation.
    async fn rebuild(&mut self, why: &str) -> Result<(), BusError> {
        self.last_rebuild = Some(Instant::now());
        let offsets = self.stored_offsets().await?;
        warn!(
            consumer_group = %self.name,
            stall_timeout = ?self.stall_timeout,
            "messages wait past the group's stored offsets on partitions this member does not \
             hold, and {why}; rebuilding the consumer group with its offsets (a broker restart \
             leaves members behind that never commit)"
        );
        match self
            .timed(
                self.client
                    .delete_consumer_group(&self.stream, &self.topic, &self.group),
            )
            .await?
        {
            Ok(()) | Err(IggyError::ConsumerGroupIdNotFound(..)) => {}
            Err(IggyError::ConsumerGroupNameNotFound(..)) => {}
            Err(error) => {
                return Err(BusError::Poll(format!(
                    "{}: cannot delete the stalled consumer group: {error}",
                    self.name
                )));
            }
        }
        self.joined = false;
        self.join().await?;
        for (partition_id, offset) in offsets {
            let stored = self.store(partition_id, offset).await?;
            if let Err(error) = stored {
                // Another member owns it already: it reads the partition
                // again from the start (at-least-once).
                warn!(consumer_group = %self.name, partition_id, offset, %error, "cannot restore the stored offset of the rebuilt consumer group");
            }
        }
        self.progress.stored();
        info!(consumer_group = %self.name, "consumer group rebuilt");
        Ok(())
    }

    /// After an empty poll: rebuild the group when ghosts hold its
    /// partitions since this member joined again, or when the watcher saw a
    /// stall (at most once per stall timeout).
    async fn recover_if_stalled(&mut self) -> Result<(), BusError> {
        let settle = REJOIN_SETTLE.min(self.stall_timeout);
        if let Some((_, before)) = self.rejoined.take_if(|(at, _)| at.elapsed() >= settle)
            && self.stored_offsets().await? == before
            && self.messages_wait(&before).await?
        {
            let why = format!(
                "the group stored no offset in the {settle:?} since this member joined again"
            );
            return self.rebuild(&why).await;
        }
        let due = self
            .last_rebuild
            .is_none_or(|at| at.elapsed() >= self.stall_timeout);
        if due && self.progress.stalled.load(Ordering::Relaxed) {
            self.rebuild("nothing was stored for the stall timeout")
                .await?;
        }
        Ok(())
    }

    /// Whether a partition has messages past `stored` (the group's stored
    /// offsets; a partition without one waits from its start).
    async fn messages_wait(&self, stored: &[(u32, u64)]) -> Result<bool, BusError> {
        let partitions = partitions(
            &self.client,
            &self.stream,
            &self.topic,
            self.request_timeout,
        )
        .await?;
        Ok(partitions.iter().any(|&(partition_id, end)| {
            let stored = stored
                .iter()
                .find(|(id, _)| *id == partition_id)
                .map(|(_, offset)| *offset);
            match (end, stored) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(current), Some(stored)) => current > stored,
            }
        }))
    }

    /// Creates the group when missing and joins it. A missing stream or topic is
    /// usually a source that has not created it yet: the caller retries.
    async fn join(&mut self) -> Result<(), BusError> {
        let unavailable = |what: &str, error: IggyError| {
            BusError::Unavailable(format!(
                "cannot {what} consumer group {}: {error}",
                self.name
            ))
        };
        let existing = self
            .timed(
                self.client
                    .get_consumer_group(&self.stream, &self.topic, &self.group),
            )
            .await?
            .map_err(|error| unavailable("read", error))?;
        if existing.is_none() {
            let name = self.group.get_string_value().unwrap_or_default();
            match self
                .timed(
                    self.client
                        .create_consumer_group(&self.stream, &self.topic, &name),
                )
                .await?
            {
                Ok(_) => info!(consumer_group = %self.name, "created consumer group"),
                // Another member created it in the meantime.
                Err(IggyError::ConsumerGroupNameAlreadyExists(..)) => {}
                Err(error) => return Err(unavailable("create", error)),
            }
        }
        self.timed(
            self.client
                .join_consumer_group(&self.stream, &self.topic, &self.group),
        )
        .await?
        .map_err(|error| unavailable("join", error))?;
        self.joined = true;
        // A new membership starts from the stored offsets.
        self.positions.clear();
        Ok(())
    }

    /// Stores the group's offset of a partition (the outer error: no answer).
    async fn store(
        &self,
        partition_id: u32,
        offset: u64,
    ) -> Result<Result<(), IggyError>, BusError> {
        self.timed(self.client.store_consumer_offset(
            &self.consumer,
            &self.stream,
            &self.topic,
            Some(partition_id),
            offset,
        ))
        .await
    }

    /// Moves the group's offsets (see [`Bus::reset_offsets`](crate::iggy::Bus::reset_offsets)).
    pub async fn reset(&mut self, to: &OffsetReset) -> Result<Vec<OffsetMove>, BusError> {
        if !self.joined {
            self.join().await?;
        }
        let partitions = partitions(
            &self.client,
            &self.stream,
            &self.topic,
            self.request_timeout,
        )
        .await?;
        let ids: Vec<u32> = partitions.iter().map(|&(id, _)| id).collect();
        to.check(&ids)
            .map_err(|reason| BusError::Commit(format!("{}: {reason}", self.name)))?;
        let mut moves = Vec::new();
        for (partition_id, last) in partitions {
            let end = last.map_or(0, |last| last + 1);
            let before = stored_offset(
                &self.client,
                &self.consumer,
                &self.stream,
                &self.topic,
                partition_id,
                self.request_timeout,
            )
            .await?
            .map_or(0, |stored| stored + 1);
            let first_at = match to {
                OffsetReset::Timestamp(micros) => self.first_at(partition_id, *micros).await?,
                _ => None,
            };
            let after = to.target(partition_id, before, end, first_at);
            let refused = |error: IggyError| {
                BusError::Commit(format!(
                    "{}: cannot move partition {partition_id} to offset {after}: {error}",
                    self.name
                ))
            };
            if after != before {
                // Stored is the last message handled; nothing stored reads
                // from the start.
                let answer = match after.checked_sub(1) {
                    Some(last) => self.store(partition_id, last).await?,
                    None => {
                        self.timed(self.client.delete_consumer_offset(
                            &self.consumer,
                            &self.stream,
                            &self.topic,
                            Some(partition_id),
                        ))
                        .await?
                    }
                };
                match answer {
                    Ok(()) | Err(IggyError::ConsumerOffsetNotFound(..)) => {}
                    Err(error) => return Err(refused(error)),
                }
            }
            info!(consumer_group = %self.name, partition_id, before, after, "consumer group offset moved");
            moves.push(OffsetMove {
                partition_id,
                before,
                after,
            });
        }
        Ok(moves)
    }

    /// The offset of the first message of a partition stamped at or after
    /// `micros`, read without storing anything.
    async fn first_at(&self, partition_id: u32, micros: u64) -> Result<Option<u64>, BusError> {
        let polled = self
            .timed(self.client.poll_messages(
                &self.stream,
                &self.topic,
                Some(partition_id),
                &self.consumer,
                &PollingStrategy::timestamp(IggyTimestamp::from(micros)),
                1,
                false,
            ))
            .await?
            .map_err(|error| {
                BusError::Poll(format!(
                    "{}: cannot read partition {partition_id} by timestamp: {error}",
                    self.name
                ))
            })?;
        Ok(polled.messages.first().map(|message| message.header.offset))
    }

    async fn timed<T>(&self, request: impl Future<Output = T>) -> Result<T, BusError> {
        tokio::time::timeout(self.request_timeout, request)
            .await
            .map_err(|_| {
                BusError::Unavailable(format!(
                    "no answer from Iggy within {:?} ({})",
                    self.request_timeout, self.name
                ))
            })
    }
}

#[async_trait]
impl Consumer for IggyBusConsumer {
    async fn poll(&mut self) -> Result<ConsumedBatch, BusError> {
        loop {
            if let Some(batch) = self.poll_available().await? {
                return Ok(batch);
            }
            if let Err(error) = self.recover_if_stalled().await {
                warn!(consumer_group = %self.name, %error, "cannot rebuild the stalled consumer group");
            }
            tokio::time::sleep(self.idle_wait).await;
        }
    }

    async fn poll_available(&mut self) -> Result<Option<ConsumedBatch>, BusError> {
        loop {
            if !self.joined {
                self.join()
                    .await
                    .map_err(|error| BusError::Poll(error.to_string()))?;
            }
            let positions = &self.positions;
            let strategy_for = |partition_id: u32| match positions.get(&partition_id) {
                Some(&next) => PollingStrategy::offset(next),
                None => PollingStrategy::next(),
            };
            let polled = self
                .timed(self.client.poll_messages_with_strategy_for(
                    &self.stream,
                    &self.topic,
                    None,
                    &self.consumer,
                    &strategy_for,
                    self.batch_length,
                    false,
                ))
                .await
                .map_err(|error| BusError::Poll(error.to_string()))?;
            let polled = match polled {
                Ok(polled) => polled,
                // Not a member any more (a reconnect starts a new session, the
                // group was recreated): join again and poll.
                Err(
                    IggyError::ConsumerGroupMemberNotFound(..)
                    | IggyError::ConsumerGroupIdNotFound(..)
                    | IggyError::ConsumerGroupNameNotFound(..),
                ) => {
                    warn!(consumer_group = %self.name, "no longer a member of the consumer group; joining again");
                    self.joined = false;
                    let stored = self.stored_offsets().await.unwrap_or_default();
                    self.rejoined = Some((Instant::now(), stored));
                    continue;
                }
                Err(error) => {
                    return Err(BusError::Poll(format!(
                        "{}: {error} (code {})",
                        self.name,
                        error.as_code()
                    )));
                }
            };
            let Some(last) = polled.messages.last() else {
                return Ok(None);
            };
            let partition_id = polled.partition_id;
            self.positions.insert(partition_id, last.header.offset + 1);
            let messages = polled
                .messages
                .into_iter()
                .map(|message| {
                    let headers = headers::from_iggy(&message);
                    let header = message.header;
                    ConsumedMessage {
                        id: header.id,
                        offset: header.offset,
                        partition_id,
                        timestamp: header.timestamp,
                        origin_timestamp: header.origin_timestamp,
                        checksum: header.checksum,
                        headers,
                        payload: message.payload,
                    }
                })
                .collect();
            return Ok(Some(ConsumedBatch {
                partition_id,
                messages,
            }));
        }
    }

    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError> {
        let stored = self
            .store(partition_id, offset)
            .await
            .map_err(|error| BusError::Commit(error.to_string()))?;
        if stored.is_ok() {
            self.progress.stored();
        } else {
            // Read the partition again from what the group has stored.
            self.positions.remove(&partition_id);
        }
        stored.map_err(|error| {
            if matches!(error, IggyError::ResourceNotFound(_)) {
                // A store by a connection that is no longer a member: join again
                // before the next poll (which then reads the batch again).
                self.joined = false;
            }
            BusError::Commit(format!(
                "partition {partition_id} offset {offset}: {error} (code {})",
                error.as_code()
            ))
        })
    }

    async fn close(&mut self) -> Result<(), BusError> {
        let left = if self.joined {
            self.joined = false;
            self.timed(
                self.client
                    .leave_consumer_group(&self.stream, &self.topic, &self.group),
            )
            .await
            .and_then(|left| {
                left.map_err(|error| BusError::Poll(format!("leaving the consumer group: {error}")))
            })
        } else {
            Ok(())
        };
        self.watcher.abort();
        let _ = self.client.shutdown().await;
        left
    }
}

impl Drop for IggyBusConsumer {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Measures the group's lag every few seconds, exports it and reports a stall.
struct Watcher {
    group_lag: GroupLag,
    name: String,
    degraded: Degraded,
    progress: Arc<Progress>,
    stall_timeout: Duration,
}

impl Watcher {
    async fn run(self) {
        let interval =
            (self.stall_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        // The reason this watcher set, so it clears only its own.
        let mut reported: Option<String> = None;
        loop {
            tokio::time::sleep(interval).await;
            // An unreachable broker is reported by the engine's own retries.
            let Ok(lags) = self.group_lag.measure().await else {
                continue;
            };
            let lags: Vec<(u32, u64)> = lags
                .iter()
                .map(|measured| (measured.partition_id, measured.messages))
                .collect();
            let total: u64 = lags.iter().map(|(_, lag)| lag).sum();
            let idle = self.progress.idle();
            if total > 0 && idle >= self.stall_timeout {
                self.progress.stalled.store(true, Ordering::Relaxed);
                let per_partition = lags
                    .iter()
                    .filter(|(_, lag)| *lag > 0)
                    .map(|(partition_id, lag)| format!("partition {partition_id}: {lag}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let reason = format!(
                    "consumer group {} stored no offset for {}s while {total} messages wait past its \
                     stored offsets (lag {per_partition})",
                    self.name,
                    idle.as_secs()
                );
                if reported.is_none() {
                    warn!(consumer_group = %self.name, lag = total, "{reason}");
                }
                self.degraded.set(reason.clone());
                reported = Some(reason);
            } else if let Some(ours) = reported.take() {
                self.progress.stalled.store(false, Ordering::Relaxed);
                if self.degraded.reason().as_deref() == Some(ours.as_str()) {
                    self.degraded.clear();
                }
                info!(consumer_group = %self.name, "the consumer group makes progress again");
            }
        }
    }
}
