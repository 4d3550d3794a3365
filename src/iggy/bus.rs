//! The bus on a real Iggy server: one TCP connection per producer and per
//! consumer, so connectors never wait on each other's requests and a broken
//! connection affects one pipeline only.

use async_trait::async_trait;

use crate::iggy::connection::ConnectionSettings;
use crate::iggy::consumer::IggyBusConsumer;
use crate::iggy::producer::IggyProducer;
use crate::iggy::{Bus, BusError, Consumer, ConsumerSpec, Producer, ProducerTarget};

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
}
