//! The sink pipeline: consume -> decode -> transform -> write -> commit offsets.
//!
//! The next batch is polled while the current one is written (rule K5), and
//! offsets move only after `write` succeeded for the batch and for every
//! batch polled before it. Transient write
//! errors retry the same batch with capped backoff; messages the backend refuses
//! go through the sink's `on_error` policy; a message that does not decode under
//! its schema is counted and skipped (or dead-lettered), never failing the batch.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
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
use crate::iggy::{BusError, ConsumedBatch, Consumer, Producer};
use crate::message::{ConsumedMessage, OutgoingMessage, Payload, SinkMessage, TopicRef};
use crate::telemetry::{BatchSpan, Outcome};
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

/// Writes in flight per topic for a sink that writes concurrently.
const CONCURRENT_WRITES: usize = 2;

/// A prefetch: the poll that runs while batches are written, holding the
/// consumer until it returns it.
type PrefetchFuture<'a> = BoxFuture<
    'a,
    (
        &'a mut Box<dyn Consumer>,
        Result<Option<ConsumedBatch>, BusError>,
    ),
>;

/// A polled batch, decoded and transformed, on its way to the sink.
struct Prepared {
    partition_id: u32,
    last_offset: u64,
    consumed: usize,
    messages: Vec<SinkMessage>,
    dead: Vec<OutgoingMessage>,
    started: Instant,
    decoded: Duration,
    /// Messages that failed to decode or transform.
    rejected: usize,
    trace: BatchSpan,
}

/// A batch the sink stored (written or set aside), ready to commit.
struct Delivered {
    partition_id: u32,
    last_offset: u64,
    consumed: usize,
    processed: usize,
    started: Instant,
    decoded: Duration,
    written: Duration,
    /// Messages not written: failed to decode, or refused by the backend.
    rejected: usize,
    nacks: u32,
    trace: BatchSpan,
}

/// Awaits the future if there is one; otherwise never completes.
async fn next<T>(future: &mut Option<BoxFuture<'_, T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
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
    /// Rule K5 (docs/ARCHITECTURE.md): while batches are being written the
    /// next one is polled (one poll at a time, never cancelled), so it is
    /// ready when the write ends; a sink that writes concurrently also gets
    /// the next write started. Writes finish in poll order and each commit
    /// follows its own write, so no commit passes a write that has not
    /// succeeded; the consumer commits only between polls.
    async fn run(&self, reader: &mut TopicReader) -> Ended {
        let TopicReader {
            topic,
            schema,
            consumer,
        } = reader;
        let (topic, schema) = (&*topic, &*schema);
        let writes = if self.pipeline.sink.writes_concurrently() {
            CONCURRENT_WRITES
        } else {
            1
        };
        let mut in_flight = FuturesOrdered::new();
        // Written, waiting for the consumer to be free to commit them.
        let mut written: VecDeque<Delivered> = VecDeque::new();
        let mut prefetched: Option<ConsumedBatch> = None;
        // The consumer is either idle here or lent to the running prefetch.
        let mut idle: Option<&mut Box<dyn Consumer>> = Some(consumer);
        let mut polling: Option<PrefetchFuture<'_>> = None;
        // The last prefetch found nothing: none again until a write ends.
        let mut found_nothing = false;
        let ended = loop {
            if let Some(consumer) = idle.as_deref_mut() {
                while let Some(delivered) = written.pop_front() {
                    self.commit(topic, consumer.as_mut(), delivered).await;
                }
            }
            let stopping = self.shutdown.is_requested();
            while !stopping && in_flight.len() < writes {
                let Some(batch) = prefetched.take() else {
                    break;
                };
                if let Some(prepared) = self.prepare_batch(topic, schema, batch) {
                    in_flight.push_back(self.deliver(topic, prepared));
                }
            }
            if in_flight.is_empty() && polling.is_none() && written.is_empty() {
                if stopping {
                    break Ended::Shutdown;
                }
                if prefetched.is_none()
                    && let Some(consumer) = idle.as_deref_mut()
                {
                    // Nothing in flight: wait for the next batch (a stop
                    // request ends the wait).
                    match self.poll(topic, consumer.as_mut()).await {
                        Ok(batch) => prefetched = Some(batch),
                        Err(ended) => break ended,
                    }
                }
                continue;
            }
            if !stopping
                && !found_nothing
                && prefetched.is_none()
                && !in_flight.is_empty()
                && let Some(consumer) = idle.take()
            {
                polling = Some(Box::pin(async move {
                    let polled = consumer.poll_available().await;
                    (consumer, polled)
                }));
            }
            tokio::select! {
                biased;
                Some(delivered) = in_flight.next() => match delivered {
                    Ok(delivered) => {
                        found_nothing = false;
                        written.push_back(delivered);
                    }
                    Err(ended) => break ended,
                },
                (consumer, polled) = next(&mut polling) => {
                    polling = None;
                    idle = Some(consumer);
                    match polled {
                        Ok(Some(batch)) => prefetched = Some(batch),
                        Ok(None) => found_nothing = true,
                        Err(error) => {
                            found_nothing = true;
                            self.poll_failed(topic, 0, &error);
                        }
                    }
                }
                () = self.shutdown.requested(), if !stopping => {}
            }
        };
        // The consumer is closed next: let a prefetch in progress finish
        // (one request) rather than cut it off mid-request.
        if let Some(polling) = polling {
            let _ = polling.await;
        }
        ended
    }

    /// Waits for the next batch, retrying failed polls until a stop is requested.
    async fn poll(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
    ) -> Result<ConsumedBatch, Ended> {
        retry_with(
            self.pipeline.backoff,
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
                self.poll_failed(topic, failure.attempt, &failure.error);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| Ended::Shutdown))
    }

    /// Reports a failed poll (`attempt` 0: a prefetch, not retried itself).
    fn poll_failed(&self, topic: &TopicRef, attempt: u32, error: &BusError) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(ErrorStage::Poll, 1);
        let message = format!("poll of {topic} failed: {error}");
        warn!(connector_key = %pipeline.key, attempt, %message, "retrying poll");
        pipeline.status.record_error(message);
    }

    /// Decodes and transforms a polled batch; `None` for an empty one.
    fn prepare_batch(
        &self,
        topic: &TopicRef,
        schema: &Schema,
        batch: ConsumedBatch,
    ) -> Option<Prepared> {
        let started = Instant::now();
        let last_offset = batch.last_offset()?;
        let consumed = batch.messages.len();
        self.pipeline.metrics.consumed.add(consumed as u64);
        let mut dead = Vec::new();
        let (messages, rejected) = self.prepare(topic, schema, batch.messages, &mut dead);
        let decoded = started.elapsed();
        self.pipeline
            .metrics
            .record_duration(Stage::Decode, decoded);
        let mut trace = BatchSpan::start("sink", &self.pipeline.key, started);
        trace.stage("decode", started, started + decoded, None);
        Some(Prepared {
            partition_id: batch.partition_id,
            last_offset,
            consumed,
            messages,
            dead,
            started,
            decoded,
            rejected,
            trace,
        })
    }

    /// Writes one batch and dead-letters what was set aside. `Err` ends the
    /// loop without committing it or anything polled after it.
    async fn deliver(&self, topic: &TopicRef, prepared: Prepared) -> Result<Delivered, Ended> {
        let Prepared {
            partition_id,
            last_offset,
            consumed,
            mut messages,
            mut dead,
            started,
            decoded,
            rejected,
            mut trace,
        } = prepared;
        let writing = Instant::now();
        let to_write = messages.len();
        let mut nacks = 0;
        let wrote = self
            .write(topic, &mut messages, &mut dead, &mut nacks)
            .await;
        let written = writing.elapsed();
        let failed = wrote.as_ref().err().map(|_| "the write gave up");
        trace.stage("write", writing, writing + written, failed);
        let stored = match wrote {
            Ok(()) if !dead.is_empty() => {
                let sending = Instant::now();
                let sent = self.send_dead_letters(&dead).await;
                let failed = sent.as_ref().err().map(|_| "the dead-letter send gave up");
                trace.stage("dead_letter", sending, Instant::now(), failed);
                sent
            }
            wrote => wrote,
        };
        if let Err(ended) = stored {
            trace.end(consumed, nacks, Outcome::Nack);
            return Err(ended);
        }
        Ok(Delivered {
            partition_id,
            last_offset,
            consumed,
            processed: messages.len(),
            started,
            decoded,
            written,
            rejected: rejected + (to_write - messages.len()),
            nacks,
            trace,
        })
    }

    /// Commits a delivered batch's offsets and reports it.
    async fn commit(&self, topic: &TopicRef, consumer: &mut dyn Consumer, delivered: Delivered) {
        let pipeline = self.pipeline;
        let Delivered {
            partition_id,
            last_offset,
            consumed: count,
            processed,
            started,
            decoded,
            written,
            rejected,
            nacks,
            mut trace,
        } = delivered;
        let committing = Instant::now();
        let committed = consumer.commit(partition_id, last_offset).await;
        let commit_time = committing.elapsed();
        pipeline.metrics.record_duration(Stage::Commit, commit_time);
        let failed = committed.as_ref().err().map(ToString::to_string);
        trace.stage(
            "commit",
            committing,
            committing + commit_time,
            failed.as_deref(),
        );
        let outcome = match rejected {
            0 => Outcome::Ok,
            _ => Outcome::Rejected,
        };
        trace.end(count, nacks, outcome);
        if let Err(error) = committed {
            // The batch is written; a later commit covers it, or it is redelivered
            // (at-least-once).
            pipeline.metrics.error(ErrorStage::OffsetCommit, 1);
            let message = format!("offset commit on {topic} failed: {error}");
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
                stream = %topic.stream,
                topic = %topic.topic,
                partition_id,
                current_offset = last_offset,
                batch_size = count,
                processed_count = processed,
                decode_us = decoded.as_micros() as u64,
                prepare_us = prepared.as_micros() as u64,
                ffi_us = written.as_micros() as u64,
                total_us = total.as_micros() as u64,
                "benchmark"
            );
        }
        let elapsed_us = total.as_micros() as u64;
        if pipeline.verbose {
            info!(connector_key = %pipeline.key, %topic, partition_id, offset = last_offset, consumed = count, written = processed, elapsed_us, "batch written");
        } else {
            debug!(connector_key = %pipeline.key, %topic, partition_id, offset = last_offset, consumed = count, written = processed, elapsed_us, "batch written");
        }
    }

    /// Decodes and transforms a polled batch. Messages that fail are counted and
    /// queued for the dead-letter topic (with `on_error = "dlq"`) or skipped.
    fn prepare(
        &self,
        topic: &TopicRef,
        schema: &Schema,
        consumed: Vec<ConsumedMessage>,
        dead: &mut Vec<OutgoingMessage>,
    ) -> (Vec<SinkMessage>, usize) {
        let pipeline = self.pipeline;
        let mut rejected = 0;
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
            let decoded = match self.decode_and_transform(schema, &payload, keep_json_text) {
                Ok(Some(decoded)) => decoded,
                Ok(None) => {
                    pipeline.metrics.filtered.add(1);
                    continue;
                }
                Err((stage, error)) => {
                    let origin = dead_letter::Origin {
                        stream: &topic.stream,
                        topic: &topic.topic,
                        partition_id,
                        offset,
                    };
                    self.drop_message(stage, &error, id, headers, payload, origin, dead);
                    rejected += 1;
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
        (messages, rejected)
    }

    /// One message's payload, decoded under its schema and transformed; `None`
    /// when a transform drops it.
    fn decode_and_transform(
        &self,
        schema: &Schema,
        payload: &bytes::Bytes,
        keep_json_text: bool,
    ) -> Result<Option<Payload>, (ErrorStage, String)> {
        let decoded = if keep_json_text {
            schema.decode_keeping_json_text(payload.clone())
        } else {
            schema.decode(payload.clone())
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

    /// Writes the batch, retrying transient failures (counted in `nacks`) and
    /// applying `on_error` to rejected messages, until everything left is
    /// written.
    async fn write(
        &self,
        topic: &TopicRef,
        messages: &mut Vec<SinkMessage>,
        dead: &mut Vec<OutgoingMessage>,
        nacks: &mut u32,
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
                *nacks += 1;
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
