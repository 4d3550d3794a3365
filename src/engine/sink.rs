//! The sink pipeline: consume -> decode -> transform -> write -> commit offsets.
//!
//! Offsets move only after `write` succeeded for the batch. Transient write
//! errors retry the same batch with capped backoff; messages the backend refuses
//! go through the sink's `on_error` policy; a message that does not decode under
//! its schema is counted and skipped (or dead-lettered), never failing the batch.

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use tracing::{debug, error, info, warn};

use crate::codec::Schema;
use crate::connectors::{Rejection, Sink, SinkError};
use crate::delivery::OnError;
use crate::engine::backoff::Backoff;
use crate::engine::metrics::{ConnectorMetrics, ErrorStage, Stage};
use crate::engine::retry::{Attempt, Until, retry, retry_with};
use crate::engine::source::Ended;
use crate::engine::status::{StatusCell, StopReason};
use crate::engine::{BENCHMARK_TARGET, Shutdown, catch_panic, dead_letter};
use crate::iggy::{ConsumedBatch, Consumer, Producer};
use crate::message::{ConsumedMessage, OutgoingMessage, Payload, SinkMessage, TopicRef};
use crate::transforms::{TransformChain, Verdict};

/// One topic a sink reads, through its own consumer.
pub struct TopicReader {
    pub topic: TopicRef,
    pub schema: Schema,
    pub consumer: Box<dyn Consumer>,
}

pub struct SinkPipeline {
    pub readers: Vec<TopicReader>,
    pub shutdown: Shutdown,
    pub context: SinkContext,
}

/// What every topic loop of a sink shares.
pub struct SinkContext {
    pub key: String,
    pub sink: Box<dyn Sink>,
    pub dead_letter: Option<Box<dyn Producer>>,
    pub on_error: OnError,
    pub transforms: Arc<TransformChain>,
    pub status: Arc<StatusCell>,
    pub metrics: Arc<ConnectorMetrics>,
    pub backoff: Backoff,
    pub verbose: bool,
    /// Emit upstream's per-batch `benchmark` event.
    pub benchmark: bool,
}

/// Runs one topic's loop; shares the sink and its settings with the others.
struct TopicLoop<'a> {
    pipeline: &'a SinkContext,
    /// Cancelled by the runtime, or by another topic of this sink that stopped.
    shutdown: Shutdown,
}

impl SinkPipeline {
    /// Runs every topic until a stop is requested or the sink stops on its own,
    /// then leaves the consumer groups, closes the sink and records the status.
    pub async fn run(self) -> Ended {
        let SinkPipeline {
            mut readers,
            shutdown,
            mut context,
        } = self;
        context.status.set_running();
        info!(connector_key = %context.key, topics = readers.len(), "sink running");
        let topic_shutdown = shutdown.child();
        let ended = {
            let mut loops: FuturesUnordered<_> = readers
                .iter_mut()
                .map(|reader| {
                    let topic_loop = TopicLoop {
                        pipeline: &context,
                        shutdown: topic_shutdown.clone(),
                    };
                    async move { topic_loop.run(reader).await }
                })
                .collect();
            let mut first_stop = None;
            while let Some(ended) = loops.next().await {
                if let Ended::Stopped(..) = ended {
                    // One topic stopping stops the sink: the others finish their
                    // batch in flight and end.
                    topic_shutdown.request();
                    first_stop.get_or_insert(ended);
                }
            }
            first_stop.unwrap_or(Ended::Shutdown)
        };
        for reader in &mut readers {
            if let Err(error) = reader.consumer.close().await {
                warn!(connector_key = %context.key, topic = %reader.topic, %error, "leaving the consumer group failed");
            }
        }
        match catch_panic(context.sink.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => warn!(connector_key = %context.key, %error, "sink close failed"),
            Err(panic) => warn!(connector_key = %context.key, %panic, "sink close panicked"),
        }
        match &ended {
            Ended::Shutdown => {
                info!(connector_key = %context.key, "sink stopped");
                context.status.set_stopped();
            }
            Ended::Stopped(reason, message) => {
                error!(connector_key = %context.key, stop_reason = %reason, %message, "sink stopped");
                metrics::counter!(
                    "iggy_connector_stops_total",
                    "connector_key" => context.key.clone(),
                    "connector_type" => "sink",
                    "reason" => reason.as_str()
                )
                .increment(1);
                context.status.set_stopped_by(*reason, message.clone());
            }
        }
        ended
    }
}

impl TopicLoop<'_> {
    async fn run(&self, reader: &mut TopicReader) -> Ended {
        loop {
            let batch = match self.poll(reader).await {
                Ok(batch) => batch,
                Err(ended) => return ended,
            };
            if let Err(ended) = self.handle(reader, batch).await {
                return ended;
            }
        }
    }

    /// Waits for the next batch, retrying failed polls until a stop is requested.
    async fn poll(&self, reader: &mut TopicReader) -> Result<ConsumedBatch, Ended> {
        let pipeline = self.pipeline;
        let TopicReader {
            topic, consumer, ..
        } = reader;
        retry_with(
            pipeline.backoff,
            &self.shutdown,
            Until::StopRequested,
            consumer,
            |consumer| async move {
                let outcome = match consumer.poll().await {
                    Ok(batch) => Attempt::Done(batch),
                    Err(error) => Attempt::Failed(error),
                };
                (consumer, outcome)
            },
            |failure| {
                pipeline.metrics.error(ErrorStage::Poll, 1);
                let message = format!("poll of {topic} failed: {}", failure.error);
                warn!(connector_key = %pipeline.key, attempt = failure.attempt, %message, "retrying poll");
                pipeline.status.record_error(message);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| Ended::Shutdown))
    }

    /// Writes one polled batch and commits its offsets. `Err` ends the loop
    /// without committing.
    async fn handle(&self, reader: &mut TopicReader, batch: ConsumedBatch) -> Result<(), Ended> {
        let pipeline = self.pipeline;
        let started = Instant::now();
        let Some(last_offset) = batch.last_offset() else {
            return Ok(());
        };
        let partition_id = batch.partition_id;
        let count = batch.messages.len();
        pipeline.metrics.consumed.add(count as u64);
        let mut dead = Vec::new();
        let mut messages = self.prepare(reader, batch.messages, &mut dead);
        let decoded = started.elapsed();
        pipeline.metrics.record_duration(Stage::Decode, decoded);
        let writing = Instant::now();
        self.write(&reader.topic, &mut messages, &mut dead).await?;
        let written = writing.elapsed();
        self.send_dead_letters(&dead).await?;
        let committing = Instant::now();
        let committed = reader.consumer.commit(partition_id, last_offset).await;
        pipeline
            .metrics
            .record_duration(Stage::Commit, committing.elapsed());
        if let Err(error) = committed {
            // The batch is written; a later commit covers it, or it is redelivered
            // (at-least-once).
            pipeline.metrics.error(ErrorStage::OffsetCommit, 1);
            let message = format!("offset commit on {} failed: {error}", reader.topic);
            warn!(connector_key = %pipeline.key, partition_id, offset = last_offset, %message);
            pipeline.status.record_error(message);
        }
        let total = started.elapsed();
        // Upstream's `prepare`: whatever is neither decoding nor the write.
        let prepared = total.saturating_sub(decoded + written);
        pipeline.metrics.record_duration(Stage::Prepare, prepared);
        pipeline.metrics.record_duration(Stage::Total, total);
        if pipeline.benchmark {
            info!(
                target: BENCHMARK_TARGET,
                connector_type = "sink",
                connector_key = %pipeline.key,
                stream = %reader.topic.stream,
                topic = %reader.topic.topic,
                partition_id,
                current_offset = last_offset,
                batch_size = count,
                processed_count = messages.len(),
                decode_us = decoded.as_micros() as u64,
                prepare_us = prepared.as_micros() as u64,
                ffi_us = written.as_micros() as u64,
                total_us = total.as_micros() as u64,
                "benchmark"
            );
        }
        let elapsed_us = total.as_micros() as u64;
        if pipeline.verbose {
            info!(connector_key = %pipeline.key, topic = %reader.topic, partition_id, offset = last_offset, consumed = count, written = messages.len(), elapsed_us, "batch written");
        } else {
            debug!(connector_key = %pipeline.key, topic = %reader.topic, partition_id, offset = last_offset, consumed = count, written = messages.len(), elapsed_us, "batch written");
        }
        Ok(())
    }

    /// Decodes and transforms a polled batch. Messages that fail are counted and
    /// queued for the dead-letter topic (with `on_error = "dlq"`) or skipped.
    fn prepare(
        &self,
        reader: &TopicReader,
        consumed: Vec<ConsumedMessage>,
        dead: &mut Vec<OutgoingMessage>,
    ) -> Vec<SinkMessage> {
        let pipeline = self.pipeline;
        let mut messages = Vec::with_capacity(consumed.len());
        // Without transforms, a sink that writes JSON as text gets the stored
        // bytes, checked, instead of a value it would serialize again.
        let keep_json_text = pipeline.transforms.is_empty() && pipeline.sink.accepts_json_bytes();
        for message in consumed {
            let ConsumedMessage {
                id,
                offset,
                partition_id,
                timestamp,
                origin_timestamp,
                checksum,
                headers,
                payload,
            } = message;
            let decoded = match self.decode_and_transform(reader, &payload, keep_json_text) {
                Ok(Some(decoded)) => decoded,
                Ok(None) => {
                    pipeline.metrics.filtered.add(1);
                    continue;
                }
                Err((stage, error)) => {
                    let origin = dead_letter::Origin {
                        stream: &reader.topic.stream,
                        topic: &reader.topic.topic,
                        partition_id,
                        offset,
                    };
                    self.drop_message(stage, &error, id, headers, payload, origin, dead);
                    continue;
                }
            };
            messages.push(SinkMessage {
                id,
                offset,
                partition_id,
                timestamp,
                origin_timestamp,
                checksum,
                headers,
                payload: decoded,
            });
        }
        messages
    }

    /// One message's payload, decoded under its schema and transformed; `None`
    /// when a transform drops it.
    fn decode_and_transform(
        &self,
        reader: &TopicReader,
        payload: &bytes::Bytes,
        keep_json_text: bool,
    ) -> Result<Option<Payload>, (ErrorStage, String)> {
        let decoded = if keep_json_text {
            reader.schema.decode_keeping_json_text(payload.clone())
        } else {
            reader.schema.decode(payload.clone())
        };
        let mut decoded = decoded.map_err(|error| (ErrorStage::Decode, error.to_string()))?;
        let transforms = &self.pipeline.transforms;
        if transforms.is_empty() {
            return Ok(Some(decoded));
        }
        match transforms.apply(&mut decoded) {
            Ok(Verdict::Keep) => Ok(Some(decoded)),
            Ok(Verdict::Drop) => Ok(None),
            Err(error) => Err((ErrorStage::Transform, error.to_string())),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn drop_message(
        &self,
        stage: ErrorStage,
        error: &str,
        id: u128,
        headers: crate::message::Headers,
        payload: bytes::Bytes,
        origin: dead_letter::Origin<'_>,
        dead: &mut Vec<OutgoingMessage>,
    ) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(stage, 1);
        warn!(connector_key = %pipeline.key, stage = stage.as_str(), partition_id = origin.partition_id, offset = origin.offset, %error, "dropping message");
        if pipeline.on_error == OnError::Dlq && pipeline.dead_letter.is_some() {
            dead.push(dead_letter::message(
                &pipeline.key,
                stage.as_str(),
                error,
                Some(id),
                headers,
                payload,
                Some(origin),
            ));
        } else {
            pipeline.metrics.skipped.add(1);
        }
    }

    /// Writes the batch, retrying transient failures and applying `on_error` to
    /// rejected messages, until everything left is written.
    async fn write(
        &self,
        topic: &TopicRef,
        messages: &mut Vec<SinkMessage>,
        dead: &mut Vec<OutgoingMessage>,
    ) -> Result<(), Ended> {
        let pipeline = self.pipeline;
        retry_with(
            pipeline.backoff,
            &self.shutdown,
            Until::GraceExpired,
            (messages, dead),
            |(messages, dead)| async move {
                let outcome = self.write_once(topic, messages, dead).await;
                ((messages, dead), outcome)
            },
            |failure| {
                let message = format!("write to {topic} failed: {}", failure.error);
                warn!(connector_key = %pipeline.key, attempt = failure.attempt, retry_in_ms = failure.delay.as_millis() as u64, %message, "retrying the same batch");
                pipeline.status.record_error(message);
                pipeline.metrics.retries.add(1);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| self.abandon()))
    }

    /// One write of what is left of the batch.
    async fn write_once(
        &self,
        topic: &TopicRef,
        messages: &mut Vec<SinkMessage>,
        dead: &mut Vec<OutgoingMessage>,
    ) -> Attempt<(), crate::connectors::BoxError, Ended> {
        let pipeline = self.pipeline;
        if messages.is_empty() {
            return Attempt::Done(());
        }
        let started = Instant::now();
        let error = match catch_panic(pipeline.sink.write(topic, messages)).await {
            Err(panic) => return Attempt::Stop(Ended::Stopped(StopReason::Panic, panic)),
            Ok(Ok(())) => {
                pipeline
                    .metrics
                    .record_duration(Stage::Write, started.elapsed());
                pipeline.metrics.processed.add(messages.len() as u64);
                return Attempt::Done(());
            }
            Ok(Err(error)) => error,
        };
        pipeline.metrics.error(ErrorStage::Write, 1);
        match error {
            SinkError::Transient(error) => Attempt::Failed(error),
            SinkError::Fatal(error) => Attempt::Stop(Ended::Stopped(
                StopReason::Fatal,
                format!("write to {topic} failed: {error}"),
            )),
            SinkError::Rejected(rejections) => match self.reject(topic, messages, rejections, dead)
            {
                Ok(()) => Attempt::Again,
                Err(ended) => Attempt::Stop(ended),
            },
        }
    }

    /// Applies `on_error` to rejected messages and removes them from the batch.
    fn reject(
        &self,
        topic: &TopicRef,
        messages: &mut Vec<SinkMessage>,
        mut rejections: Vec<Rejection>,
        dead: &mut Vec<OutgoingMessage>,
    ) -> Result<(), Ended> {
        let pipeline = self.pipeline;
        rejections.retain(|rejection| rejection.index < messages.len());
        rejections.sort_by_key(|rejection| std::cmp::Reverse(rejection.index));
        rejections.dedup_by_key(|rejection| rejection.index);
        let Some(first) = rejections.last() else {
            return Err(Ended::Stopped(
                StopReason::Fatal,
                format!("the sink rejected messages of {topic} without naming any in the batch"),
            ));
        };
        if pipeline.on_error == OnError::Stop {
            let message = &messages[first.index];
            return Err(Ended::Stopped(
                StopReason::Rejected,
                format!(
                    "{} message(s) of {topic} rejected, first at partition {} offset {}: {} (on_error = \"stop\")",
                    rejections.len(),
                    message.partition_id,
                    message.offset,
                    first.reason
                ),
            ));
        }
        for rejection in rejections {
            let message = messages.remove(rejection.index);
            warn!(connector_key = %pipeline.key, partition_id = message.partition_id, offset = message.offset, reason = %rejection.reason, "message rejected by the backend");
            if pipeline.on_error == OnError::Dlq {
                let origin = dead_letter::Origin {
                    stream: &topic.stream,
                    topic: &topic.topic,
                    partition_id: message.partition_id,
                    offset: message.offset,
                };
                let payload = message.payload.to_bytes();
                dead.push(dead_letter::message(
                    &pipeline.key,
                    "write",
                    &rejection.reason,
                    Some(message.id),
                    message.headers,
                    payload,
                    Some(origin),
                ));
            } else {
                pipeline.metrics.skipped.add(1);
            }
        }
        Ok(())
    }

    /// Sends the batch's dead letters, retrying until they are stored: the batch's
    /// offsets must not move past a message that is neither written nor
    /// dead-lettered.
    async fn send_dead_letters(&self, dead: &[OutgoingMessage]) -> Result<(), Ended> {
        let pipeline = self.pipeline;
        let (false, Some(producer)) = (dead.is_empty(), &pipeline.dead_letter) else {
            return Ok(());
        };
        retry(
            pipeline.backoff,
            &self.shutdown,
            Until::GraceExpired,
            async || match producer.send(dead).await {
                Ok(()) => Attempt::Done(()),
                Err(error) => Attempt::<_, _, Ended>::Failed(error),
            },
            |failure| {
                pipeline.metrics.error(ErrorStage::DeadLetter, 1);
                let message = format!("send to the dead-letter topic failed: {}", failure.error);
                warn!(connector_key = %pipeline.key, attempt = failure.attempt, %message);
                pipeline.status.record_error(message);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| self.abandon()))?;
        pipeline.metrics.dead_lettered.add(dead.len() as u64);
        Ok(())
    }

    fn abandon(&self) -> Ended {
        warn!(connector_key = %self.pipeline.key, "stop requested and the grace period ran out; the batch in flight stays uncommitted and will be redelivered");
        Ended::Shutdown
    }
}
