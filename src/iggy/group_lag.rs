//! A consumer group's lag on one topic: messages past its stored offset per
//! partition and the age of the first of them, exported as
//! `iggy_connector_lag` and `iggy_connector_lag_oldest_age_seconds` and left
//! in the sink's [`LagCell`]. A running sink's consumer measures it every few
//! seconds (its watcher); the engine measures a stopped sink's through
//! [`Bus::measure_lag`](crate::iggy::Bus::measure_lag), with the same code.

use std::sync::Arc;
use std::time::Duration;

use iggy::prelude::{
    Consumer as IggyConsumerId, ConsumerOffsetClient, Identifier, IggyClient, MessageClient,
    PollingStrategy, TopicClient,
};
use metrics::Label;

use crate::clock::now_micros;
use crate::iggy::{BusError, ConsumerSpec};
use crate::lag::{LagCell, PartitionLag};

/// Measures one group on one topic through `client` (which stores nothing).
pub(super) struct GroupLag {
    client: Arc<IggyClient>,
    stream: Identifier,
    topic: Identifier,
    consumer: IggyConsumerId,
    /// connector key, stream, topic.
    labels: [String; 3],
    lag: LagCell,
    request_timeout: Duration,
}

/// One partition's measurement.
pub(super) struct Measured {
    pub(super) partition_id: u32,
    pub(super) messages: u64,
    /// The server's append time of the first message past the stored offset.
    oldest_micros: Option<u64>,
}

impl GroupLag {
    pub(super) fn new(
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
        Ok(Self {
            client,
            stream: identifier(&spec.stream)?,
            topic: identifier(&spec.topic)?,
            consumer: IggyConsumerId::group(identifier(&spec.group)?),
            labels: [
                spec.connector_key.clone(),
                spec.stream.clone(),
                spec.topic.clone(),
            ],
            lag: spec.lag.clone(),
            request_timeout,
        })
    }

    /// Measures, exports and leaves the measurement in the lag cell.
    pub(super) async fn measure(&self) -> Result<Vec<Measured>, BusError> {
        let lags = self.lags().await?;
        self.publish(&lags);
        Ok(lags)
    }

    /// Exports a measurement as gauges and into the sink's lag cell.
    fn publish(&self, lags: &[Measured]) {
        let [key, stream, topic] = &self.labels;
        let now = now_micros();
        let mut partitions = Vec::with_capacity(lags.len());
        for measured in lags {
            let labels = [
                Label::new("connector_key", key.clone()),
                Label::new("stream", stream.clone()),
                Label::new("topic", topic.clone()),
                Label::new("partition", measured.partition_id.to_string()),
            ];
            let age_micros = measured
                .oldest_micros
                .map(|micros| now.saturating_sub(micros));
            metrics::gauge!("iggy_connector_lag", labels.iter()).set(measured.messages as f64);
            metrics::gauge!("iggy_connector_lag_oldest_age_seconds", labels.iter())
                .set(age_micros.map_or(0.0, |micros| micros as f64 / 1e6));
            partitions.push(PartitionLag {
                stream: stream.clone(),
                topic: topic.clone(),
                partition: measured.partition_id,
                messages: measured.messages,
                oldest_age_ms: age_micros.map(|micros| micros / 1000),
            });
        }
        self.lag.set_topic(stream, topic, partitions);
    }

    /// Messages past the group's stored offset, per partition, and when the
    /// first of them was appended.
    async fn lags(&self) -> Result<Vec<Measured>, BusError> {
        let timeout = self.request_timeout;
        let mut lags = Vec::new();
        for (partition_id, end) in
            partitions(&self.client, &self.stream, &self.topic, timeout).await?
        {
            let mut measured = Measured {
                partition_id,
                messages: 0,
                oldest_micros: None,
            };
            if let Some(current) = end {
                let stored = stored_offset(
                    &self.client,
                    &self.consumer,
                    &self.stream,
                    &self.topic,
                    partition_id,
                    timeout,
                )
                .await?;
                let first_waiting = stored.map_or(0, |stored| stored + 1);
                measured.messages = (current + 1).saturating_sub(first_waiting);
                if measured.messages > 0 {
                    measured.oldest_micros = self.appended_at(partition_id, first_waiting).await;
                }
            }
            lags.push(measured);
        }
        Ok(lags)
    }

    /// When the message at `offset` was appended, read by a standalone
    /// consumer that stores nothing (a group's poll would count as the
    /// member's). `None` when it cannot be read now.
    async fn appended_at(&self, partition_id: u32, offset: u64) -> Option<u64> {
        let peeker = IggyConsumerId::new(Identifier::named(LAG_PEEKER).ok()?);
        let polled = tokio::time::timeout(
            self.request_timeout,
            self.client.poll_messages(
                &self.stream,
                &self.topic,
                Some(partition_id),
                &peeker,
                &PollingStrategy::offset(offset),
                1,
                false,
            ),
        )
        .await
        .ok()?
        .ok()?;
        polled
            .messages
            .first()
            .map(|message| message.header.timestamp)
    }
}

/// The standalone consumer the watcher peeks with; it never stores an offset.
const LAG_PEEKER: &str = "iggy-connect-lag";

/// Every partition of the topic with its last offset (`None` when empty).
pub(super) async fn partitions(
    client: &IggyClient,
    stream: &Identifier,
    topic: &Identifier,
    timeout: Duration,
) -> Result<Vec<(u32, Option<u64>)>, BusError> {
    let details = tokio::time::timeout(timeout, client.get_topic(stream, topic))
        .await
        .map_err(|_| BusError::Unavailable("reading the topic timed out".into()))?
        .map_err(|error| BusError::Unavailable(format!("cannot read the topic: {error}")))?;
    Ok(details
        .map(|details| {
            details
                .partitions
                .iter()
                .map(|partition| {
                    let end = (partition.messages_count > 0).then_some(partition.current_offset);
                    (partition.id, end)
                })
                .collect()
        })
        .unwrap_or_default())
}

pub(super) async fn stored_offset(
    client: &IggyClient,
    consumer: &IggyConsumerId,
    stream: &Identifier,
    topic: &Identifier,
    partition_id: u32,
    timeout: Duration,
) -> Result<Option<u64>, BusError> {
    let info = tokio::time::timeout(
        timeout,
        client.get_consumer_offset(consumer, stream, topic, Some(partition_id)),
    )
    .await
    .map_err(|_| BusError::Unavailable("reading a stored offset timed out".into()))?
    .map_err(|error| BusError::Unavailable(format!("cannot read a stored offset: {error}")))?;
    Ok(info.map(|info| info.stored_offset))
}
