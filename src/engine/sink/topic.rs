//! One topic's loop (rule K5).

use std::collections::VecDeque;
use std::time::Instant;

use futures::future::{BoxFuture, Either};
use futures::stream::{FuturesOrdered, StreamExt};
use tracing::warn;

use crate::connectors::Sink;
use crate::engine::deferral::Deferral;
use crate::engine::metrics::ErrorStage;
use crate::engine::retry::{Attempt, Until, retry_with};
use crate::engine::source::Ended;
use crate::iggy::{BusError, ConsumedBatch, Consumer};
use crate::message::TopicRef;

use super::{CONCURRENT_WRITES, Delivered, TopicLoop, TopicReader};

/// A prefetch: the poll that runs while batches are written, holding the
/// consumer until it returns it.
type PrefetchFuture<'a> = BoxFuture<
    'a,
    (
        &'a mut Box<dyn Consumer>,
        Result<Option<ConsumedBatch>, BusError>,
    ),
>;

/// Awaits the future if there is one; otherwise never completes.
async fn next<T>(future: &mut Option<BoxFuture<'_, T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

impl TopicLoop<'_> {
    /// Rule K5 (docs/ARCHITECTURE.md): while batches are being written the
    /// next one is polled (one poll at a time, never cancelled), so it is
    /// ready when the write ends; a sink that writes concurrently also gets
    /// the next write started. Writes finish in poll order and each commit
    /// follows its own write, so no commit passes a write that has not
    /// succeeded; the consumer commits only between polls.
    pub(super) async fn run(&self, reader: &mut TopicReader) -> Ended {
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
    pub(super) async fn poll(
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
    pub(super) async fn poll_until(
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
    pub(super) fn poll_failed(&self, topic: &TopicRef, attempt: u32, error: &BusError) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(ErrorStage::Poll, 1);
        let message = format!("poll of {topic} failed: {error}");
        warn!(connector_key = %pipeline.key, attempt, %message, "retrying poll");
        pipeline.status.record_error(message);
    }
}
