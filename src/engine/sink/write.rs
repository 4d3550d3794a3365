//! A batch's write: the sink's answer settles what is durable and what is
//! refused, the rest is written again (rule K3); dead letters and a
//! deferred sink's flushes.

use std::time::Instant;

use tracing::warn;

use crate::connectors::{ConnectorKind, Flush, Partial, Rejection, SinkError};
use crate::delivery::OnError;
use crate::engine::metrics::{ConnectorMetrics, ErrorStage, Stage};
use crate::engine::retry::{Attempt, Until, retry, retry_with};
use crate::engine::source::Ended;
use crate::engine::status::StopReason;
use crate::engine::tap::TapStage;
use crate::engine::{catch_panic, dead_letter};
use crate::message::{OutgoingMessage, SinkMessage, TopicRef};
use crate::telemetry::{BatchSpan, Outcome};

use super::{Delivered, Prepared, TopicLoop};

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

/// What a write's answer says of one message.
#[derive(Clone)]
enum Fate {
    /// Not settled: written again.
    Left,
    Stored,
    Refused(String),
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
        let mut fates = vec![Fate::Left; count];
        for index in durable.into_iter().filter(|index| *index < count) {
            fates[index] = Fate::Stored;
        }
        for rejection in rejected {
            fates[rejection.index] = Fate::Refused(rejection.reason);
        }
        let tap = &topic_loop.pipeline.tap;
        if tap.is_tapped(TapStage::Out) {
            let stored = self.messages.iter().zip(&fates);
            let stored = stored.filter(|(_, fate)| matches!(fate, Fate::Stored));
            let stored: Vec<&SinkMessage> = stored.map(|(message, _)| message).collect();
            tap.sink_messages(TapStage::Out, topic, stored.into_iter());
        }
        let mut stored = 0;
        for (message, fate) in std::mem::take(&mut self.messages).into_iter().zip(fates) {
            match fate {
                Fate::Left => self.messages.push(message),
                Fate::Stored => {
                    stored += 1;
                    self.last_written = self.last_written.max(Some(message.offset));
                }
                Fate::Refused(reason) => {
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

impl TopicLoop<'_> {
    /// [`deliver`](Self::deliver), for the queue of writes in flight.
    pub(super) async fn deliver_batch(
        &self,
        topic: &TopicRef,
        prepared: Prepared,
    ) -> Result<Option<Delivered>, Ended> {
        self.deliver(topic, prepared).await.map(Some)
    }

    /// Writes one batch and dead-letters what was set aside. `Err` ends the
    /// loop without committing it or anything polled after it.
    pub(super) async fn deliver(
        &self,
        topic: &TopicRef,
        prepared: Prepared,
    ) -> Result<Delivered, Ended> {
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
            Ok(()) => {
                self.after_write(topic, &writing.dead, &mut trace, &mut nacks)
                    .await
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

    /// What follows a write that settled every message: the dead letters it
    /// set aside are sent, and a deferred sink (which holds the batch now)
    /// uploads what its own triggers sealed.
    async fn after_write(
        &self,
        topic: &TopicRef,
        dead: &[OutgoingMessage],
        trace: &mut BatchSpan,
        nacks: &mut u32,
    ) -> Result<(), Ended> {
        if !dead.is_empty() {
            let sending = Instant::now();
            let sent = self.send_dead_letters(dead).await;
            let failed = sent.as_ref().err().map(|_| "the dead-letter send gave up");
            trace.stage("dead_letter", sending, Instant::now(), failed);
            sent?;
        }
        if self.pipeline.sink.deferred().is_some() {
            let flushing = Instant::now();
            let flushed = self.flush(topic, Flush::Due, nacks).await;
            let failed = flushed.as_ref().err().map(|_| "the flush gave up");
            trace.stage("flush", flushing, Instant::now(), failed);
            flushed?;
        }
        Ok(())
    }

    /// A deferred sink's flush of everything it holds for `topic` (age, stop).
    pub(super) async fn flush_all(&self, topic: &TopicRef) -> Result<Option<Delivered>, Ended> {
        let mut nacks = 0;
        self.flush(topic, Flush::All, &mut nacks)
            .await
            .map(|()| None)
    }

    /// Flushes a deferred sink, retrying transient failures (counted in
    /// `nacks`) until the grace period after a stop ran out.
    pub(super) async fn flush(
        &self,
        topic: &TopicRef,
        scope: Flush,
        nacks: &mut u32,
    ) -> Result<(), Ended> {
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
                (pipeline.tap).sink_messages(TapStage::Out, topic, writing.messages.iter());
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
    pub(super) fn reject(
        &self,
        topic: &TopicRef,
        message: SinkMessage,
        reason: &str,
        dead: &mut Vec<OutgoingMessage>,
    ) {
        let pipeline = self.pipeline;
        warn!(connector_key = %pipeline.key, partition_id = message.partition_id, offset = message.offset, %reason, "message rejected by the backend");
        if pipeline.on_error == OnError::Dlq {
            let origin = dead_letter::Origin::at(topic, message.partition_id, message.offset);
            let payload = message.payload.to_bytes();
            let failure = dead_letter::Failure {
                connector_key: &pipeline.key,
                connector_type: ConnectorKind::Sink,
                stage: "write",
                class: dead_letter::ErrorClass::Rejected,
                error: reason,
            };
            dead.push(dead_letter::message(
                &failure,
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
    pub(super) fn rejected_stop(
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
    pub(super) async fn send_dead_letters(&self, dead: &[OutgoingMessage]) -> Result<(), Ended> {
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
        pipeline.tap.outgoing(TapStage::Dlq, None, dead);
        Ok(())
    }
}
