//! The kafka source's lag for the engine's lag sampler: per assigned
//! partition, the high watermark minus the group's committed offset (with
//! `partitions` and no group: minus the consumer's position, as the source
//! saves it with each batch), read off the async threads. The probe holds
//! the consumer weakly: the source's `close` drops the last handle, which
//! closes the consumer, and never an async thread dropping the probe.

use std::sync::Weak;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::Offset;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;

use crate::connectors::kafka::blocking;
use crate::connectors::{ConnectorError, LagProbe};
use crate::lag::{BackendPartitionLag, SourceLag};

pub(crate) struct ConsumerLag<C: ConsumerContext + 'static> {
    pub(crate) consumer: Weak<StreamConsumer<C>>,
    pub(crate) grouped: bool,
    pub(crate) timeout: Duration,
}

#[async_trait]
impl<C: ConsumerContext + 'static> LagProbe for ConsumerLag<C> {
    async fn measure(&self) -> Result<SourceLag, ConnectorError> {
        let (consumer, grouped, timeout) = (self.consumer.clone(), self.grouped, self.timeout);
        let partitions = blocking("measuring the kafka lag", move || {
            let consumer = consumer.upgrade().ok_or(KafkaError::Canceled)?;
            partition_lags(&consumer, grouped, timeout)
        })
        .await?;
        Ok(SourceLag {
            messages: Some(partitions.iter().map(|partition| partition.messages).sum()),
            partitions,
            ..SourceLag::default()
        })
    }
}

fn partition_lags<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    grouped: bool,
    timeout: Duration,
) -> Result<Vec<BackendPartitionLag>, KafkaError> {
    let positions = if grouped {
        consumer.committed(timeout)?
    } else {
        consumer.position()?
    };
    let mut lags = Vec::new();
    for element in positions.elements() {
        let (topic, partition) = (element.topic(), element.partition());
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        // Nothing committed yet: everything the broker still has waits.
        let next = match element.offset() {
            Offset::Offset(next) => next,
            _ => low,
        };
        lags.push(BackendPartitionLag {
            topic: topic.to_owned(),
            partition,
            messages: u64::try_from(high - next.max(low)).unwrap_or(0),
        });
    }
    Ok(lags)
}
