//! The sink side of the Iggy bus: a consumer-group member that polls batches
//! and stores offsets only when the engine commits them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use iggy::prelude::{
    AutoCommit, Client, IggyClient, IggyConsumer, IggyDuration, PollingStrategy, ReceivedMessage,
};

use crate::iggy::headers;
use crate::iggy::{BusError, ConsumedBatch, Consumer, ConsumerSpec};
use crate::message::ConsumedMessage;

pub struct IggyBusConsumer {
    client: Arc<IggyClient>,
    consumer: IggyConsumer,
    batch_length: usize,
    /// How long to wait for more messages of a partially filled batch.
    linger: Duration,
    request_timeout: Duration,
    /// A message of another partition that ended the previous batch.
    peeked: Option<ReceivedMessage>,
    closed: bool,
}

impl IggyBusConsumer {
    /// Joins the group (creating it when missing) on `client`. Offsets are never
    /// stored on poll: only [`Consumer::commit`] stores them.
    pub async fn open(
        client: Arc<IggyClient>,
        spec: &ConsumerSpec,
        request_timeout: Duration,
    ) -> Result<Self, BusError> {
        let mut builder = client
            .consumer_group(&spec.group, &spec.stream, &spec.topic)
            .map_err(|error| BusError::Setup {
                stream: spec.stream.clone(),
                topic: spec.topic.clone(),
                reason: format!("invalid consumer group, stream or topic name: {error}"),
            })?
            .auto_commit(AutoCommit::Disabled)
            .polling_strategy(PollingStrategy::next())
            .batch_length(spec.batch_length.max(1))
            .create_consumer_group_if_not_exists()
            .auto_join_consumer_group();
        if !spec.poll_interval.is_zero() {
            builder = builder.poll_interval(IggyDuration::from(spec.poll_interval));
        }
        let mut consumer = builder.build();
        match tokio::time::timeout(request_timeout, consumer.init()).await {
            Ok(Ok(())) => {}
            // A missing stream or topic is usually a source that has not created
            // it yet: wait for it rather than fail the sink.
            Ok(Err(error)) => {
                return Err(BusError::Unavailable(format!(
                    "cannot join consumer group {} on {}/{}: {error}",
                    spec.group, spec.stream, spec.topic
                )));
            }
            Err(_) => {
                return Err(BusError::Unavailable(format!(
                    "joining consumer group {} on {}/{} timed out",
                    spec.group, spec.stream, spec.topic
                )));
            }
        }
        Ok(Self {
            client,
            consumer,
            batch_length: spec.batch_length.max(1) as usize,
            linger: (spec.poll_interval * 2).max(Duration::from_millis(10)),
            request_timeout,
            peeked: None,
            closed: false,
        })
    }

    async fn next_message(&mut self) -> Result<ReceivedMessage, BusError> {
        match self.consumer.next().await {
            Some(Ok(message)) => Ok(message),
            Some(Err(error)) => Err(BusError::Poll(format!(
                "{error} (code {})",
                error.as_code()
            ))),
            None => Err(BusError::Poll("the consumer was shut down".into())),
        }
    }
}

#[async_trait]
impl Consumer for IggyBusConsumer {
    async fn poll(&mut self) -> Result<ConsumedBatch, BusError> {
        let first = match self.peeked.take() {
            Some(message) => message,
            None => self.next_message().await?,
        };
        let partition_id = first.partition_id;
        let mut at_end = is_last(&first);
        let mut messages = Vec::with_capacity(self.batch_length);
        messages.push(convert(first));
        // Take what the consumer already holds, and what a quick follow-up poll
        // brings, until the batch is full or the partition's end is reached.
        while !at_end && messages.len() < self.batch_length {
            let next = match tokio::time::timeout(self.linger, self.consumer.next()).await {
                Ok(Some(Ok(message))) => message,
                // Nothing more right now, or an error the next poll reports again.
                Ok(Some(Err(_)) | None) | Err(_) => break,
            };
            if next.partition_id != partition_id {
                self.peeked = Some(next);
                break;
            }
            at_end = is_last(&next);
            messages.push(convert(next));
        }
        Ok(ConsumedBatch {
            partition_id,
            messages,
        })
    }

    async fn commit(&mut self, partition_id: u32, offset: u64) -> Result<(), BusError> {
        match tokio::time::timeout(
            self.request_timeout,
            self.consumer.store_offset(offset, Some(partition_id)),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(BusError::Commit(format!(
                "partition {partition_id} offset {offset}: {error} (code {})",
                error.as_code()
            ))),
            Err(_) => Err(BusError::Commit(format!(
                "partition {partition_id} offset {offset}: no acknowledgement within {:?}",
                self.request_timeout
            ))),
        }
    }

    async fn close(&mut self) -> Result<(), BusError> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        // With auto-commit disabled, shutting the consumer down stores nothing;
        // it leaves the group.
        let left = tokio::time::timeout(self.request_timeout, self.consumer.shutdown()).await;
        let _ = self.client.shutdown().await;
        match left {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(BusError::Poll(format!(
                "leaving the consumer group: {error}"
            ))),
            Err(_) => Err(BusError::Poll(
                "leaving the consumer group timed out".into(),
            )),
        }
    }
}

/// Whether this is the newest message the partition had when it was polled.
fn is_last(message: &ReceivedMessage) -> bool {
    message.message.header.offset >= message.current_offset
}

fn convert(received: ReceivedMessage) -> ConsumedMessage {
    let headers = headers::from_iggy(&received.message);
    let header = received.message.header;
    ConsumedMessage {
        id: header.id,
        offset: header.offset,
        partition_id: received.partition_id,
        timestamp: header.timestamp,
        origin_timestamp: header.origin_timestamp,
        checksum: header.checksum,
        headers,
        payload: received.message.payload,
    }
}
