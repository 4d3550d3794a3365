//! The bus on a real Iggy server: one TCP connection per producer and per
//! consumer, so connectors never wait on each other's requests and a broken
//! connection affects one pipeline only.

use async_trait::async_trait;

use crate::iggy::connection::ConnectionSettings;
use crate::iggy::consumer::IggyBusConsumer;
use crate::iggy::producer::IggyProducer;
use crate::iggy::{
    Bus, BusError, Consumer, ConsumerSpec, OffsetMove, OffsetReset, Producer, ProducerTarget,
};

pub struct IggyBus {
    settings: ConnectionSettings,
}

impl IggyBus {
    pub fn new(settings: ConnectionSettings) -> Self {
        Self { settings }
    }
}

#[async_trait]
impl Bus for IggyBus {
    async fn producer(&self, target: &ProducerTarget) -> Result<Box<dyn Producer>, BusError> {
        let client = self.settings.connect().await?;
        let producer = IggyProducer::open(
            client,
            target,
            self.settings.request_timeout,
            self.settings.topic_durability,
        )
        .await?;
        Ok(Box::new(producer))
    }

    async fn consumer(&self, spec: &ConsumerSpec) -> Result<Box<dyn Consumer>, BusError> {
        let client = self.settings.connect().await?;
        let consumer = IggyBusConsumer::open(
            client,
            spec,
            self.settings.request_timeout,
            self.settings.stall_timeout,
        )
        .await?;
        Ok(Box::new(consumer))
    }

    /// Joins the group (a member may store its offsets), moves them, leaves.
    async fn reset_offsets(
        &self,
        spec: &ConsumerSpec,
        to: &OffsetReset,
    ) -> Result<Vec<OffsetMove>, BusError> {
        let client = self.settings.connect().await?;
        let mut consumer = IggyBusConsumer::open(
            client,
            spec,
            self.settings.request_timeout,
            self.settings.stall_timeout,
        )
        .await?;
        let moved = consumer.reset(to).await;
        let left = consumer.close().await;
        let moved = moved?;
        left?;
        Ok(moved)
    }
}
