//! The sink pipeline: consume -> decode -> transform -> write -> commit offsets.
//!
//! The next batch is polled while the current one is written (rule K5), and
//! offsets move only after `write` succeeded for the batch and for every
//! batch polled before it. Transient write
//! errors retry the same batch with capped backoff; messages the backend refuses
//! go through the sink's `on_error` policy; a message that does not decode under
//! its schema is counted and skipped (or dead-lettered), never failing the batch.
//! A sink that defers acknowledgement (rule K6) has its offsets committed only
//! as far as it reports durable, with flushes at its own triggers, at
//! `flush_interval` and at a stop.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Either};
use futures::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use tracing::{debug, error, info, warn};

use crate::codec::Schema;
use crate::connectors::{Degraded, Flush, Partial, Rejection, Sink, SinkError};
use crate::delivery::OnError;
use crate::engine::backoff::Backoff;
use crate::engine::deferral::Deferral;
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
    /// The longest wait a backend's `Retry-After` is honoured for.
    pub max_retry_after: Duration,
    /// Where write retries report that the sink cannot make progress.
    pub degraded: Degraded,
    /// Consecutive failed writes after which the sink reports itself
    /// degraded (the connector's `max_retries`).
    pub degraded_after: Option<u32>,
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
    /// The last offset of the messages the sink took (`None`: it got none).
    last_written: Option<u64>,
}

/// A batch being written: what is left to write, the dead letters set
/// aside, and what the sink has settled so far.
struct Writing {
    messages: Vec<SinkMessage>,
    dead: Vec<OutgoingMessage>,
    /// Messages the sink made durable (or, deferring, accepted).
    written: usize,
    /// Messages the backend refused.
    rejected: usize,
    /// The highest offset the sink took.
    last_written: Option<u64>,
}

impl Writing {
    /// Every message left is durable.
    fn all_durable(&mut self, metrics: &ConnectorMetrics) {
        self.written += self.messages.len();
        metrics.processed.add(self.messages.len() as u64);
        let last = self.messages.iter().map(|message| message.offset).max();
        self.last_written = self.last_written.max(last);
        self.messages.clear();
    }

    /// Takes the messages at `durable` (stored) and `rejected` (refused, set
    /// aside per `on_error`) out of what is left to write; indexes outside
    /// the batch are ignored, and a message both stored and refused counts
    /// as refused. `Err` when a rejection stops the sink.
    fn settle(
        &mut self,
        topic_loop: &TopicLoop<'_>,
        topic: &TopicRef,
        durable: Vec<usize>,
        mut rejected: Vec<Rejection>,
    ) -> Result<(), Ended> {
        let count = self.messages.len();
        rejected.retain(|rejection| rejection.index < count);
        rejected.sort_by_key(|rejection| rejection.index);
        rejected.dedup_by_key(|rejection| rejection.index);
        if let Some(first) = rejected.first()
            && topic_loop.pipeline.on_error == OnError::Stop
        {
            let message = &self.messages[first.index];
            return Err(topic_loop.rejected_stop(topic, rejected.len(), message, &first.reason));
        }
        let mut fates: Vec<Option<Option<String>>> = vec![None; count];
        for index in durable.into_iter().filter(|index| *index < count) {
            fates[index] = Some(None);
        }
        for rejection in rejected {
            fates[rejection.index] = Some(Some(rejection.reason));
        }
        let mut stored = 0;
        for (message, fate) in std::mem::take(&mut self.messages).into_iter().zip(fates) {
            match fate {
                None => self.messages.push(message),
                Some(None) => {
                    stored += 1;
                    self.last_written = self.last_written.max(Some(message.offset));
                }
                Some(Some(reason)) => {
                    self.rejected += 1;
                    topic_loop.reject(topic, message, &reason, &mut self.dead);
                }
            }
        }
        self.written += stored;
        topic_loop.pipeline.metrics.processed.add(stored as u64);
        Ok(())
    }
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
                if ended != Ended::Shutdown {
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
            // The runtime reopens it and reports the status meanwhile.
            Ended::Disconnected(_) => {}
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
        // Rule K6: a sink that defers acknowledgement gets one batch at a time
        // and its offsets move only as far as it reports durable.
        let mut deferral: Option<Deferral<Delivered>> = self
            .pipeline
            .sink
            .deferred()
            .map(|deferred| Deferral::new(deferred.flush_interval));
        // A stop's flush of what a deferred sink still holds has started.
        let mut flushed_for_stop = false;
        let writes = if deferral.is_none() && self.pipeline.sink.writes_concurrently() {
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
                match deferral.as_mut() {
                    None => {
                        while let Some(delivered) = written.pop_front() {
                            self.commit(topic, consumer.as_mut(), delivered).await;
                        }
                    }
                    Some(deferral) => {
                        self.commit_durable(topic, consumer.as_mut(), deferral, &mut written)
                            .await;
                    }
                }
            }
            let stopping = self.shutdown.is_requested();
            if let Some(deferral) = deferral.as_mut()
                && !stopping
                && in_flight.is_empty()
                && deferral
                    .flush_deadline()
                    .is_some_and(|due| due <= Instant::now())
            {
                // The oldest batch the sink holds is `flush_interval` old.
                deferral.flush_started();
                in_flight.push_back(Either::Right(self.flush_all(topic)));
            }
            while !stopping && in_flight.len() < writes {
                let Some(mut batch) = prefetched.take() else {
                    break;
                };
                if let Some(deferral) = deferral.as_mut() {
                    // Read again (a failed commit, a new session): what the
                    // sink already holds is not handed to it twice.
                    if let Some(accepted) = deferral.accepted(batch.partition_id) {
                        batch.messages.retain(|message| message.offset > accepted);
                    }
                    if let Some(last_offset) = batch.last_offset() {
                        deferral.handing(batch.partition_id, last_offset);
                    }
                }
                if let Some(prepared) = self.prepare_batch(topic, schema, batch) {
                    in_flight.push_back(Either::Left(self.deliver_batch(topic, prepared)));
                }
            }
            if in_flight.is_empty() && polling.is_none() && written.is_empty() {
                if stopping {
                    if let Some(deferral) = &deferral
                        && deferral.has_pending()
                        && !flushed_for_stop
                    {
                        // What the sink holds gets the grace period to become
                        // durable; what does not is read again after a restart.
                        flushed_for_stop = true;
                        in_flight.push_back(Either::Right(self.flush_all(topic)));
                        continue;
                    }
                    break Ended::Shutdown;
                }
                if prefetched.is_none()
                    && let Some(consumer) = idle.as_deref_mut()
                {
                    // Nothing in flight: wait for the next batch (a stop
                    // request ends the wait), or until a deferred sink's
                    // flush is due.
                    let due = deferral.as_ref().and_then(|deferral| {
                        // A refused commit of durable data is tried again soon.
                        let retry_commit = deferral
                            .commit_owed()
                            .then(|| Instant::now() + self.pipeline.backoff.delay(1));
                        deferral
                            .flush_deadline()
                            .into_iter()
                            .chain(retry_commit)
                            .min()
                    });
                    match self.poll_until(topic, consumer.as_mut(), due).await {
                        Ok(Some(batch)) => prefetched = Some(batch),
                        Ok(None) => {}
                        // A stop request: the next turn ends the loop (after
                        // a deferred sink's flush).
                        Err(Ended::Shutdown) if self.shutdown.is_requested() => {}
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
                        written.extend(delivered);
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
            idle = Some(polling.await.0);
        }
        // Batches written before a failure are durable: commit them, so a
        // reopened sink does not write them again.
        if deferral.is_none()
            && let Some(consumer) = idle
        {
            while let Some(delivered) = written.pop_front() {
                self.commit(topic, consumer.as_mut(), delivered).await;
            }
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

    /// [`poll`](Self::poll) until `due`, when it gives `None`.
    async fn poll_until(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
        due: Option<Instant>,
    ) -> Result<Option<ConsumedBatch>, Ended> {
        let Some(due) = due else {
            return self.poll(topic, consumer).await.map(Some);
        };
        tokio::select! {
            biased;
            polled = self.poll(topic, consumer) => polled.map(Some),
            () = tokio::time::sleep_until(due.into()) => Ok(None),
        }
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

    /// [`deliver`](Self::deliver), for the queue of writes in flight.
    async fn deliver_batch(
        &self,
        topic: &TopicRef,
        prepared: Prepared,
    ) -> Result<Option<Delivered>, Ended> {
        self.deliver(topic, prepared).await.map(Some)
    }

    /// Writes one batch and dead-letters what was set aside. `Err` ends the
    /// loop without committing it or anything polled after it.
    async fn deliver(&self, topic: &TopicRef, prepared: Prepared) -> Result<Delivered, Ended> {
        let Prepared {
            partition_id,
            last_offset,
            consumed,
            messages,
            dead,
            started,
            decoded,
            rejected,
            mut trace,
        } = prepared;
        let writing_started = Instant::now();
        let mut writing = Writing {
            messages,
            dead,
            written: 0,
            rejected: 0,
            last_written: None,
        };
        let mut nacks = 0;
        let wrote = self.write(topic, &mut writing, &mut nacks).await;
        let written = writing_started.elapsed();
        let failed = wrote.as_ref().err().map(|_| "the write gave up");
        trace.stage("write", writing_started, writing_started + written, failed);
        let stored = match wrote {
            Ok(()) if !writing.dead.is_empty() => {
                let sending = Instant::now();
                let sent = self.send_dead_letters(&writing.dead).await;
                let failed = sent.as_ref().err().map(|_| "the dead-letter send gave up");
                trace.stage("dead_letter", sending, Instant::now(), failed);
                sent
            }
            wrote => wrote,
        };
        // A deferred sink holds the batch now: it uploads what its own
        // triggers sealed.
        let stored = match stored {
            Ok(()) if self.pipeline.sink.deferred().is_some() => {
                let flushing = Instant::now();
                let flushed = self.flush(topic, Flush::Due, &mut nacks).await;
                let failed = flushed.as_ref().err().map(|_| "the flush gave up");
                trace.stage("flush", flushing, Instant::now(), failed);
                flushed
            }
            stored => stored,
        };
        if let Err(ended) = stored {
            trace.end(consumed, nacks, Outcome::Nack);
            return Err(ended);
        }
        Ok(Delivered {
            partition_id,
            last_offset,
            consumed,
            processed: writing.written,
            started,
            decoded,
            written,
            rejected: rejected + writing.rejected,
            nacks,
            trace,
            last_written: writing.last_written,
        })
    }

    /// A deferred sink's flush of everything it holds for `topic` (age, stop).
    async fn flush_all(&self, topic: &TopicRef) -> Result<Option<Delivered>, Ended> {
        let mut nacks = 0;
        self.flush(topic, Flush::All, &mut nacks)
            .await
            .map(|()| None)
    }

    /// Flushes a deferred sink, retrying transient failures (counted in
    /// `nacks`) until the grace period after a stop ran out.
    async fn flush(&self, topic: &TopicRef, scope: Flush, nacks: &mut u32) -> Result<(), Ended> {
        let pipeline = self.pipeline;
        retry(
            pipeline.backoff,
            &self.shutdown,
            Until::GraceExpired,
            async || {
                let error = match catch_panic(pipeline.sink.flush(topic, scope)).await {
                    Err(panic) => return Attempt::Stop(Ended::Stopped(StopReason::Panic, panic)),
                    Ok(Ok(())) => return Attempt::Done(()),
                    Ok(Err(error)) => error,
                };
                pipeline.metrics.error(ErrorStage::Write, 1);
                match error {
                    SinkError::Transient {
                        error,
                        retry_after: Some(wait),
                    } => Attempt::Throttled(error, wait.min(pipeline.max_retry_after)),
                    SinkError::Transient { error, .. } => Attempt::Failed(error),
                    SinkError::Disconnected(error) => Attempt::Stop(Ended::Disconnected(
                        format!("flush to {topic} failed: {error}"),
                    )),
                    error => Attempt::Stop(Ended::Stopped(
                        StopReason::Fatal,
                        format!("flush to {topic} failed: {error}"),
                    )),
                }
            },
            |failure| {
                *nacks += 1;
                let message = format!("flush to {topic} failed: {}", failure.error);
                warn!(connector_key = %pipeline.key, attempt = failure.attempt, retry_in_ms = failure.delay.as_millis() as u64, %message, "retrying the flush");
                pipeline.status.record_error(message);
                pipeline.metrics.retries.add(1);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| self.abandon()))
    }

    /// Rule K6: takes the batches a deferred sink accepted into its
    /// bookkeeping and commits each partition as far as the sink reports
    /// durable.
    async fn commit_durable(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
        deferral: &mut Deferral<Delivered>,
        written: &mut VecDeque<Delivered>,
    ) {
        for delivered in written.drain(..) {
            let (partition_id, last_offset, last_written) = (
                delivered.partition_id,
                delivered.last_offset,
                delivered.last_written,
            );
            deferral.accepted_batch(partition_id, last_offset, last_written, delivered);
        }
        if !deferral.has_pending() {
            return;
        }
        let durable = self.pipeline.sink.durable(topic);
        for ready in deferral.ready(&durable) {
            let committing = Instant::now();
            let committed = consumer.commit(ready.partition_id, ready.offset).await;
            let commit_time = committing.elapsed();
            self.pipeline
                .metrics
                .record_duration(Stage::Commit, commit_time);
            let failed = match committed {
                Ok(()) => {
                    deferral.committed(ready.partition_id, ready.offset);
                    None
                }
                Err(error) => {
                    self.commit_failed(topic, ready.partition_id, ready.offset, &error);
                    Some(error.to_string())
                }
            };
            for delivered in ready.batches {
                self.report(topic, delivered, committing, commit_time, failed.as_deref());
            }
        }
    }

    /// Commits a delivered batch's offsets and reports it.
    async fn commit(&self, topic: &TopicRef, consumer: &mut dyn Consumer, delivered: Delivered) {
        let committing = Instant::now();
        let committed = consumer
            .commit(delivered.partition_id, delivered.last_offset)
            .await;
        let commit_time = committing.elapsed();
        self.pipeline
            .metrics
            .record_duration(Stage::Commit, commit_time);
        let failed = match committed {
            Ok(()) => None,
            Err(error) => {
                // The batch is written; a later commit covers it, or it is
                // redelivered (at-least-once).
                self.commit_failed(topic, delivered.partition_id, delivered.last_offset, &error);
                Some(error.to_string())
            }
        };
        self.report(topic, delivered, committing, commit_time, failed.as_deref());
    }

    fn commit_failed(&self, topic: &TopicRef, partition_id: u32, offset: u64, error: &BusError) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(ErrorStage::OffsetCommit, 1);
        let message = format!("offset commit on {topic} failed: {error}");
        warn!(connector_key = %pipeline.key, partition_id, offset, %message);
        pipeline.status.record_error(message);
    }

    /// Reports a batch whose offsets were committed (`failed`: why the
    /// commit failed).
    fn report(
        &self,
        topic: &TopicRef,
        delivered: Delivered,
        committing: Instant,
        commit_time: Duration,
        failed: Option<&str>,
    ) {
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
            last_written: _,
        } = delivered;
        trace.stage("commit", committing, committing + commit_time, failed);
        let outcome = match rejected {
            0 => Outcome::Ok,
            _ => Outcome::Rejected,
        };
        trace.end(count, nacks, outcome);
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

    /// Writes the batch, retrying what is not durable yet (counted in
    /// `nacks`) after the backoff or the wait the backend asked for, and
    /// applying `on_error` to rejected messages, until every message is
    /// durable or set aside (rule K3).
    async fn write(
        &self,
        topic: &TopicRef,
        writing: &mut Writing,
        nacks: &mut u32,
    ) -> Result<(), Ended> {
        let pipeline = self.pipeline;
        retry_with(
            pipeline.backoff,
            &self.shutdown,
            Until::GraceExpired,
            writing,
            |writing| async move {
                let outcome = self.write_once(topic, writing).await;
                (writing, outcome)
            },
            |failure| {
                *nacks += 1;
                let message = format!("write to {topic} failed: {}", failure.error);
                warn!(connector_key = %pipeline.key, attempt = failure.attempt, retry_in_ms = failure.delay.as_millis() as u64, %message, "retrying what is not written yet");
                if pipeline.degraded_after.is_some_and(|limit| failure.attempt >= limit) {
                    pipeline.degraded.set(format!(
                        "{} consecutive failed writes, still retrying; last: {message}",
                        failure.attempt
                    ));
                }
                pipeline.status.record_error(message);
                pipeline.metrics.retries.add(1);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| self.abandon()))?;
        if pipeline.degraded_after.is_some_and(|limit| *nacks >= limit) {
            pipeline.degraded.clear();
        }
        Ok(())
    }

    /// One write of what is left of the batch.
    async fn write_once(
        &self,
        topic: &TopicRef,
        writing: &mut Writing,
    ) -> Attempt<(), crate::connectors::BoxError, Ended> {
        let pipeline = self.pipeline;
        if writing.messages.is_empty() {
            return Attempt::Done(());
        }
        let started = Instant::now();
        let error = match catch_panic(pipeline.sink.write(topic, &writing.messages)).await {
            Err(panic) => return Attempt::Stop(Ended::Stopped(StopReason::Panic, panic)),
            Ok(Ok(())) => {
                pipeline
                    .metrics
                    .record_duration(Stage::Write, started.elapsed());
                writing.all_durable(&pipeline.metrics);
                return Attempt::Done(());
            }
            Ok(Err(error)) => error,
        };
        pipeline.metrics.error(ErrorStage::Write, 1);
        self.answer(topic, writing, error)
    }

    /// What the engine does with a write's failure: keeps what is durable,
    /// sets aside what is rejected, and retries the rest as the sink said.
    fn answer(
        &self,
        topic: &TopicRef,
        writing: &mut Writing,
        error: SinkError,
    ) -> Attempt<(), crate::connectors::BoxError, Ended> {
        let rest = match error {
            SinkError::Partial(partial) => {
                let Partial {
                    durable,
                    rejected,
                    rest,
                } = *partial;
                if let Err(ended) = writing.settle(self, topic, durable, rejected) {
                    return Attempt::Stop(ended);
                }
                if writing.messages.is_empty() {
                    return Attempt::Done(());
                }
                rest
            }
            error => error,
        };
        match rest {
            SinkError::Transient {
                error,
                retry_after: Some(wait),
            } => Attempt::Throttled(error, wait.min(self.pipeline.max_retry_after)),
            SinkError::Transient { error, .. } => Attempt::Failed(error),
            SinkError::Disconnected(error) => Attempt::Stop(Ended::Disconnected(format!(
                "write to {topic} failed: {error}"
            ))),
            SinkError::Fatal(error) => Attempt::Stop(Ended::Stopped(
                StopReason::Fatal,
                format!("write to {topic} failed: {error}"),
            )),
            SinkError::Rejected(rejected) if rejected.is_empty() => Attempt::Stop(Ended::Stopped(
                StopReason::Fatal,
                format!("the sink rejected messages of {topic} without naming any in the batch"),
            )),
            SinkError::Rejected(rejected) => {
                match writing.settle(self, topic, Vec::new(), rejected) {
                    Ok(()) => Attempt::Again,
                    Err(ended) => Attempt::Stop(ended),
                }
            }
            // A per-message answer whose rest is itself settled in part:
            // write what is left again at once.
            SinkError::Partial(_) => Attempt::Again,
        }
    }

    /// Applies `on_error` to a rejected message: `Err` stops the sink
    /// (`stop`), otherwise it is counted and skipped or dead-lettered.
    fn reject(
        &self,
        topic: &TopicRef,
        message: SinkMessage,
        reason: &str,
        dead: &mut Vec<OutgoingMessage>,
    ) {
        let pipeline = self.pipeline;
        warn!(connector_key = %pipeline.key, partition_id = message.partition_id, offset = message.offset, %reason, "message rejected by the backend");
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
                reason,
                Some(message.id),
                message.headers,
                payload,
                Some(origin),
            ));
        } else {
            pipeline.metrics.skipped.add(1);
        }
    }

    /// The stop for rejected messages under `on_error = "stop"`.
    fn rejected_stop(
        &self,
        topic: &TopicRef,
        count: usize,
        first: &SinkMessage,
        reason: &str,
    ) -> Ended {
        Ended::Stopped(
            StopReason::Rejected,
            format!(
                "{count} message(s) of {topic} rejected, first at partition {} offset {}: {reason} (on_error = \"stop\")",
                first.partition_id, first.offset,
            ),
        )
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
