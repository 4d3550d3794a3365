//! The sink side of the Iggy bus: a consumer-group member that polls batches
//! and stores offsets only when the engine commits them.
//!
//! Polls go straight to the client's group poll (the client picks one of the
//! member's partitions and re-syncs the assignment after a rebalance) with the
//! `next` strategy, so every poll reads after the group's stored offset. The
//! engine commits a batch before it polls again; if a commit fails, the next
//! poll reads the batch again (at-least-once). `poll_interval` is waited only
//! after a poll that found nothing, so a busy topic is read back to back.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iggy::prelude::{
    Client, Consumer as IggyConsumerId, ConsumerGroupClient, ConsumerOffsetClient, Identifier,
    IggyClient, IggyError, MessageClient, PollingStrategy,
};
use tracing::{info, warn};

use crate::iggy::headers;
use crate::iggy::{BusError, ConsumedBatch, Consumer, ConsumerSpec};
use crate::message::ConsumedMessage;

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
}

impl IggyBusConsumer {
    /// Joins the group (creating it when missing) on `client`.
    pub async fn open(
        client: Arc<IggyClient>,
        spec: &ConsumerSpec,
        request_timeout: Duration,
    ) -> Result<Self, BusError> {
        let identifier = |name: &str| {
            Identifier::named(name).map_err(|error| BusError::Setup {
                stream: spec.stream.clone(),
                topic: spec.topic.clone(),
                reason: format!("invalid name \"{name}\": {error}"),
            })
        };
        let group = identifier(&spec.group)?;
        let mut consumer = Self {
            stream: identifier(&spec.stream)?,
            topic: identifier(&spec.topic)?,
            consumer: IggyConsumerId::group(group.clone()),
            group,
            client,
            name: format!("{} on {}/{}", spec.group, spec.stream, spec.topic),
            batch_length: spec.batch_length.max(1),
            idle_wait: spec.poll_interval.max(MIN_IDLE_WAIT),
            request_timeout,
            joined: false,
        };
        consumer.join().await?;
        Ok(consumer)
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
        Ok(())
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
            if !self.joined {
                self.join()
                    .await
                    .map_err(|error| BusError::Poll(error.to_string()))?;
            }
            let polled = self
                .timed(self.client.poll_messages(
                    &self.stream,
                    &self.topic,
                    None,
                    &self.consumer,
                    &PollingStrategy::next(),
                    self.batch_length,
                    false,
                ))
                .await
                .map_err(|error| BusError::Poll(error.to_string()))?;
            let polled = match polled {
                Ok(polled) => polled,
                // Not a member any more (a reconnect starts a new session, the
                // group was recreated): join again and poll.
                Err(IggyError::ConsumerGroupMemberNotFound(..)) => {
                    warn!(consumer_group = %self.name, "no longer a member of the consumer group; joining again");
                    self.joined = false;
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
            if polled.messages.is_empty() {
                tokio::time::sleep(self.idle_wait).await;
                continue;
            }
            let partition_id = polled.partition_id;
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
            return Ok(ConsumedBatch {
                partition_id,
                messages,
            });
        }
    }

    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError> {
        let stored = self
            .timed(self.client.store_consumer_offset(
                &self.consumer,
                &self.stream,
                &self.topic,
                Some(partition_id),
                offset,
            ))
            .await
            .map_err(|error| BusError::Commit(error.to_string()))?;
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
        let _ = self.client.shutdown().await;
        left
    }
}
