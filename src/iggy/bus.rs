//! The bus on a real Iggy server: one TCP connection per producer and per
//! consumer, so connectors never wait on each other's requests and a broken
//! connection affects one pipeline only.

use std::sync::Arc;

use async_trait::async_trait;
use iggy::prelude::{IggyClient, SystemClient};

use crate::iggy::connection::ConnectionSettings;
use crate::iggy::consumer::IggyBusConsumer;
use crate::iggy::group_lag::GroupLag;
use crate::iggy::producer::IggyProducer;
use crate::iggy::reader;
use crate::iggy::{
    Bus, BusError, Consumer, ConsumerSpec, OffsetMove, OffsetReset, Producer, ProducerTarget,
};
use crate::message::ConsumedMessage;

pub struct IggyBus {
    settings: ConnectionSettings,
    /// The health check's own connection, opened on first use and again
    /// after a failed ping.
    health: tokio::sync::Mutex<Option<Arc<IggyClient>>>,
    /// The dead-letter reader's connection, likewise kept between reads.
    reader: tokio::sync::Mutex<Option<Arc<IggyClient>>>,
    /// Stopped sinks' lag measurements' connection, likewise.
    lag: tokio::sync::Mutex<Option<Arc<IggyClient>>>,
}

impl IggyBus {
    pub fn new(settings: ConnectionSettings) -> Self {
        Self {
            settings,
            health: tokio::sync::Mutex::new(None),
            reader: tokio::sync::Mutex::new(None),
            lag: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl Bus for IggyBus {
    async fn ping(&self) -> Result<(), BusError> {
        let mut health = self.health.lock().await;
        let client = match health.as_ref() {
            Some(client) => client.clone(),
            None => health.insert(self.settings.connect().await?).clone(),
        };
        let answer = tokio::time::timeout(self.settings.request_timeout, client.ping()).await;
        let failure = match answer {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => format!("Iggy did not answer a ping: {error}"),
            Err(_) => format!(
                "Iggy did not answer a ping within {:?}",
                self.settings.request_timeout
            ),
        };
        health.take();
        Err(BusError::Unavailable(failure))
    }

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

    async fn measure_lag(&self, spec: &ConsumerSpec) -> Result<(), BusError> {
        let client = {
            let mut connection = self.lag.lock().await;
            match connection.as_ref() {
                Some(client) => client.clone(),
                None => connection.insert(self.settings.connect().await?).clone(),
            }
        };
        let measured = GroupLag::new(client, spec, self.settings.request_timeout)?
            .measure()
            .await;
        if measured.is_err() {
            // Connected afresh at the next measurement.
            self.lag.lock().await.take();
        }
        measured.map(drop)
    }

    async fn read(
        &self,
        stream: &str,
        topic: &str,
        partition_id: u32,
        from: u64,
        count: u32,
    ) -> Result<Vec<ConsumedMessage>, BusError> {
        let mut connection = self.reader.lock().await;
        let client = match connection.as_ref() {
            Some(client) => client.clone(),
            None => connection.insert(self.settings.connect().await?).clone(),
        };
        let read = reader::read(
            &client,
            (stream, topic),
            partition_id,
            from,
            count,
            self.settings.request_timeout,
        )
        .await;
        if read.is_err() {
            // Connected afresh at the next read.
            connection.take();
        }
        read
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
